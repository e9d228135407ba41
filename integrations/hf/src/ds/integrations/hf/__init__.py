"""ds.integrations.hf: Hugging Face Transformers on the ds engine.

``DsTrainer(model, args, train_dataset=..., ds_config="ds.json")`` trains with ZeRO 0-3 and offload;
``from_pretrained_zero3`` builds a model partitioned under ``ds.zero.Init`` and loads its weights
without materialising the whole model on any rank.
"""

from ds.integrations.hf.config import fill_auto
from ds.integrations.hf.trainer import DsTrainer, EngineModule
from ds.integrations.hf.zero3 import SafetensorsFiles, from_pretrained_zero3

__all__ = [
    "DsTrainer",
    "EngineModule",
    "SafetensorsFiles",
    "fill_auto",
    "from_pretrained_zero3",
]
