"""Environment propagated to every rank and every node.

``.ds_env`` (or DeepSpeed's ``.deepspeed_env``) holds ``KEY=VALUE`` lines; it is looked up in the
current directory, then in the home directory (``DS_ENV_FILE`` names one explicitly). Variables of
the launching shell whose names start with a known prefix (NCCL, PYTHON, ...) are exported too, so
remote nodes see the same communication and interpreter settings as the launching node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ds.interfaces.errors import ConfigError

ENV_FILE_NAMES = (".ds_env", ".deepspeed_env")
EXPORT_PREFIXES = (
    "NCCL_",
    "PYTHON",
    "MV2_",
    "UCX_",
    "GLOO_",
    "TORCH_",
    "DS_",
    "OMP_",
    "MKL_",
    "CUDA_",
    "HF_",
    "TRANSFORMERS_",
)


def parse_env_lines(text: str, source: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key or not key.replace("_", "a").isalnum():
            raise ConfigError(f"{source}:{lineno}: expected KEY=VALUE, got {raw.strip()!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def find_env_file(cwd: Path | None = None) -> Path | None:
    explicit = os.environ.get("DS_ENV_FILE")
    if explicit:
        return Path(explicit)
    for folder in (cwd or Path.cwd(), Path.home()):
        for name in ENV_FILE_NAMES:
            p = folder / name
            if p.is_file():
                return p
    return None


def load_env_file(cwd: Path | None = None) -> dict[str, str]:
    path = find_env_file(cwd)
    if path is None:
        return {}
    try:
        return parse_env_lines(path.read_text(), str(path))
    except OSError as exc:
        raise ConfigError(
            f"environment file {str(path)!r} cannot be read: {exc.strerror}"
        ) from None


def parse_env_flags(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {item!r}: expected KEY=VAL")
        out[key] = value
    return out


def exported(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k.startswith(EXPORT_PREFIXES)}
