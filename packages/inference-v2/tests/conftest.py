"""Fixtures: tiny random checkpoints saved locally (llama unsharded, qwen2 sharded)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

# The helpers module sits beside this file; tests import it by name.
sys.path.insert(0, str(Path(__file__).parent))

from inference_models import make_model


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """llama (unsharded) and qwen2 (sharded) checkpoints on disk."""
    out: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("models")
    llama = make_model("llama")
    out["llama"] = root / "llama"
    llama.save_pretrained(out["llama"], safe_serialization=True)
    qwen = make_model("qwen2", seed=1)
    out["qwen2"] = root / "qwen2"
    qwen.save_pretrained(out["qwen2"], safe_serialization=True, max_shard_size="100KB")
    assert (out["qwen2"] / "model.safetensors.index.json").is_file(), "expected a sharded save"
    return out


@pytest.fixture(scope="session")
def hf_models(tiny_dirs: dict[str, Path]) -> dict[str, Any]:
    import transformers

    return {
        name: transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for name, path in tiny_dirs.items()
    }
