"""``get_model_profile``: profile one forward pass of a model, as DeepSpeed's function does."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.monitor.flops.profiler import FlopsProfiler, number_to_string
from ds.monitor.flops.report import format_profile
from ds.monitor.peak import peak_flops


def get_model_profile(
    model: torch.nn.Module,
    input_shape: Sequence[int] | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    print_profile: bool = True,
    detailed: bool = True,
    module_depth: int = -1,
    top_modules: int = 1,
    warm_up: int = 1,
    as_string: bool = True,
    output_file: str | None = None,
    ignore_modules: list[type] | None = None,
) -> tuple[Any, Any, Any]:
    """Returns ``(flops, macs, params)`` of one forward pass (strings when ``as_string``).

    The input is ``args``/``kwargs``, or, with ``input_shape``, one tensor of ones of that shape
    in the model's first parameter's dtype and device (a model that takes token ids needs
    ``args`` or ``kwargs`` instead). ``warm_up`` forwards run unprofiled first.
    """
    kwargs = dict(kwargs or {})
    first = next(model.parameters(), None)
    if input_shape is not None:
        if args or kwargs:
            raise ConfigError("get_model_profile: give input_shape or args/kwargs, not both")
        dtype = first.dtype if first is not None else torch.float32
        device = first.device if first is not None else torch.device("cpu")
        args = (torch.ones(tuple(input_shape), dtype=dtype, device=device),)
    elif not args and not kwargs:
        raise ConfigError("get_model_profile needs input_shape=, or args=/kwargs= for forward")
    prof = FlopsProfiler(model)
    with torch.no_grad():
        for _ in range(max(0, int(warm_up))):
            model(*args, **kwargs)
        prof.start_profile(ignore_list=ignore_modules)
        try:
            model(*args, **kwargs)
        finally:
            prof.stop_profile()
    flops, macs, params = prof.root.flops, prof.root.macs, prof.root.params
    if print_profile or output_file:
        dtype = first.dtype if first is not None else torch.float32
        device = first.device if first is not None else torch.device("cpu")
        text = format_profile(
            prof,
            module_depth=module_depth,
            top_modules=top_modules,
            detailed=detailed,
            peak_flops=peak_flops(device, dtype),
        )
        if output_file:
            Path(output_file).write_text(text + "\n")
        else:
            print(text)
    if as_string:
        return (
            number_to_string(flops, "FLOPs"),
            number_to_string(macs, "MACs"),
            number_to_string(params, ""),
        )
    return flops, macs, params
