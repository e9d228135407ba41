"""``deepspeed.ops.op_builder``: every builder DeepSpeed 0.19.8 names, answered from ds's
prebuilt kernels (see :mod:`.builder`): the CPU optimizers, async I/O, pinned memory and the
quantizer on ds's native CPU kernels, fused Adam and Lion on its Triton kernels where a GPU is;
the rest (inference, transformer, sparse attention, ...) are never compatible."""

from __future__ import annotations

from ds.full.compat.deepspeed.ops.op_builder.builder import (
    OpBuilder,
    _native_cpu,
    get_default_compute_capabilities,
)

__deepspeed__ = True
op_builder_dir = "deepspeed.ops.op_builder"


def _builder(cls_name: str, name: str, module: str | None, available=None, feature=""):  # type: ignore[no-untyped-def]
    attrs = {"NAME": name, "MODULE": module, "FEATURE": feature, "__module__": __name__}
    if available is not None:
        attrs["available"] = staticmethod(available)
    return type(cls_name, (OpBuilder,), attrs)


def _always() -> bool:
    return True


CPUAdamBuilder = _builder("CPUAdamBuilder", "cpu_adam", "ds.ops.optim.adam", _native_cpu)
CPUAdagradBuilder = _builder(
    "CPUAdagradBuilder", "cpu_adagrad", "ds.ops.optim.adagrad", _native_cpu
)
CPULionBuilder = _builder("CPULionBuilder", "cpu_lion", "ds.ops.optim.lion", _native_cpu)
# FusedAdam / FusedLion: torch's fused Adam and ds's Lion step (Triton on GPUs), on any device.
FusedAdamBuilder = _builder(
    "FusedAdamBuilder", "fused_adam", "ds.full.compat.deepspeed.ops.adam", _always
)
FusedLionBuilder = _builder(
    "FusedLionBuilder", "fused_lion", "ds.full.compat.deepspeed.ops.lion", _always
)
AsyncIOBuilder = _builder("AsyncIOBuilder", "async_io", "ds.ops.aio", _native_cpu)
QuantizerBuilder = _builder("QuantizerBuilder", "quantizer", "ds.ops.quant", _native_cpu)
PinMemoryBuilder = _builder(
    "PinMemoryBuilder", "pin_memory", "ds.full.compat.deepspeed.utils.pin_memory", _always
)
FusedLambBuilder = _builder("FusedLambBuilder", "fused_lamb", None, feature="fused LAMB")
GDSBuilder = _builder("GDSBuilder", "gds", None, feature="GPUDirect Storage")
FPQuantizerBuilder = _builder("FPQuantizerBuilder", "fp_quantizer", None, feature="FP8 quantizer")
InferenceBuilder = _builder(
    "InferenceBuilder", "transformer_inference", None, feature="DeepSpeed-Inference"
)
TransformerBuilder = _builder(
    "TransformerBuilder", "transformer", None, feature="fused transformer"
)
StochasticTransformerBuilder = _builder(
    "StochasticTransformerBuilder", "stochastic_transformer", None,
    feature="stochastic transformer",
)  # fmt: skip
SparseAttnBuilder = _builder("SparseAttnBuilder", "sparse_attn", None, feature="sparse attention")
EvoformerAttnBuilder = _builder(
    "EvoformerAttnBuilder", "evoformer_attn", None, feature="Evoformer attention"
)
RandomLTDBuilder = _builder("RandomLTDBuilder", "random_ltd", None, feature="random-LTD")
SpatialInferenceBuilder = _builder(
    "SpatialInferenceBuilder", "spatial_inference", None, feature="spatial inference"
)
InferenceCoreBuilder = _builder(
    "InferenceCoreBuilder", "inference_core_ops", None, feature="inference v2 core ops"
)
InferenceCutlassBuilder = _builder(
    "InferenceCutlassBuilder", "cutlass_ops", None, feature="CUTLASS inference ops"
)
RaggedOpsBuilder = _builder(
    "RaggedOpsBuilder", "ragged_device_ops", None, feature="inference v2 ragged ops"
)
RaggedUtilsBuilder = _builder(
    "RaggedUtilsBuilder", "ragged_ops", None, feature="inference v2 ragged utils"
)
DeepCompileBuilder = _builder("DeepCompileBuilder", "dc", None, feature="DeepCompile")
CCLCommBuilder = _builder("CCLCommBuilder", "deepspeed_ccl_comm", None, feature="oneCCL comm")
ShareMemCommBuilder = _builder(
    "ShareMemCommBuilder", "deepspeed_shm_comm", None, feature="shared-memory comm"
)
NotImplementedBuilder = _builder("NotImplementedBuilder", "deepspeed_not_implemented", None)

__all__ = [
    "OpBuilder",
    "get_default_compute_capabilities",
    *sorted(n for n in dir() if n.endswith("Builder") and n != "OpBuilder"),
]
