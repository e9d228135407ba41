"""The base of the optimizers ds builds from a config: real ``torch.optim.Optimizer`` subclasses.

Frameworks hold the engine's optimizer as a torch optimizer: transformers builds torch's
``LambdaLR`` on it when the config has an ``optimizer`` and no ``scheduler``, and users register
step hooks on it. So these are ``torch.optim.Optimizer``s with torch's ``param_groups``/``state``
shape, step hooks and state-dict hooks.

Torch's own ``add_param_group``/``state_dict``/``load_state_dict``/``zero_grad`` import
``torch._dynamo`` on first call (seconds of start-up on a small CPU); the optimizers here step a
handful of flat buffers and override them with plain versions that fire the same hooks.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

_HOOK_TABLES = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


def empty_hook_tables(optimizer: torch.optim.Optimizer) -> None:
    """The hook tables ``Optimizer.__init__`` would have made, for optimizers that skip it."""
    for table in _HOOK_TABLES:
        setattr(optimizer, table, OrderedDict())


class FlatOptimizer(torch.optim.Optimizer):
    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        # Not Optimizer.__init__: it refuses an empty parameter list (a rank may own no partition
        # of a group) and reaches torch._dynamo through add_param_group.
        self.defaults = dict(defaults)
        empty_hook_tables(self)
        self._patch_step_function()  # step pre/post hooks fire around every step()
        self._warned_capturable_if_run_uncaptured = True
        self.state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        items = list(params)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        group = dict(param_group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        state_dict: dict[str, Any] = {"state": state, "param_groups": groups}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        params = [p for g in self.param_groups for p in g["params"]]
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.state = defaultdict(dict)
        self.state.update({params[int(i)]: dict(s) for i, s in state_dict["state"].items()})
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._update(group, p, p.grad, self.state[p])
        return loss

    def _update(
        self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]
    ) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        # torch keeps only defaults/state/param_groups; these optimizers also carry their kernels.
        return {k: v for k, v in self.__dict__.items() if k not in _HOOK_TABLES}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.defaults})"


def next_step(state: dict[str, Any]) -> int:
    step = int(state.get("step", 0)) + 1
    state["step"] = step
    return step
