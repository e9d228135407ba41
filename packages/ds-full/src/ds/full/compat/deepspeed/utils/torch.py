"""``deepspeed.utils.torch``: torch version checks (``required_torch_version``)."""

from __future__ import annotations

import torch
from packaging import version as pkg_version


def installed_torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def required_torch_version(
    min_version: float | None = None, max_version: float | None = None
) -> bool:
    """Whether the installed torch (major.minor) is within ``[min_version, max_version]``."""
    if min_version is None and max_version is None:
        raise ValueError("required_torch_version needs min_version, max_version or both")
    have = pkg_version.parse(".".join(map(str, installed_torch_version())))
    if min_version is not None and have < pkg_version.parse(str(min_version)):
        return False
    return not (max_version is not None and have > pkg_version.parse(str(max_version)))


def jit_script_compat(fn):  # type: ignore[no-untyped-def]
    return torch.jit.script(fn)


def register_grad_hook(param: torch.Tensor, hook):  # type: ignore[no-untyped-def]
    return param.register_post_accumulate_grad_hook(hook)


__all__ = [
    "installed_torch_version",
    "jit_script_compat",
    "register_grad_hook",
    "required_torch_version",
]
