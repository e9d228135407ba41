"""Parameters a forward reads from another module, found as they are read.

Stage 3 gathers a module's own parameters around its forward; a forward that reads another
module's weight (``F.linear(x, self.other.weight)``, a tied head) would find it released.
:func:`register_external_parameter` declares such reads up front; this finds them without it.
Every module under the engine reads its parameters through a :class:`ZeroParamDict` (its
``_parameters``, which is where ``module.weight`` looks); reading a released, partitioned
parameter while a module runs forward gathers it there and then, and makes it one of that
module's parameters from now on: released after the module's forward, gathered again for its
backward and, on later steps, before its forward.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Iterator, Set
from typing import Any, Protocol

import torch


class _Owner(Protocol):
    def on_param_access(self, param: torch.nn.Parameter) -> None: ...


class ZeroParamDict(OrderedDict[str, Any]):
    """A module's ``_parameters`` that reports reads to the stage-3 engine owning it."""

    def __init__(self, parent_module: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parent_module = parent_module
        self._in_forward = False
        self._owner: weakref.ref[Any] | None = None

    def __reduce__(self) -> Any:
        # The engine reference stays behind (a copy or pickle belongs to no engine).
        cls, args, state, items, mapping = super().__reduce__()
        state = {k: v for k, v in (state or {}).items() if k != "_owner"}
        return cls, args, state, items, mapping

    def __getitem__(self, key: str) -> Any:
        param = super().__getitem__(key)
        owner = self._owner() if self._owner is not None else None
        if owner is not None and param is not None:
            owner.on_param_access(param)
        return param


def ensure_param_dict(module: Any, owner: _Owner | None = None) -> None:
    """Give ``module`` a :class:`ZeroParamDict` (keeping the first container it replaces as
    ``module._original_parameters``), reporting to ``owner`` when given. Objects without
    ``_parameters`` are left alone."""
    params = getattr(module, "_parameters", None)
    if params is None:
        return
    if not isinstance(params, ZeroParamDict):
        if not hasattr(module, "_original_parameters"):
            module._original_parameters = params
        converted = ZeroParamDict(parent_module=module)
        converted.update(params)
        module._parameters = params = converted
    if owner is not None:
        params._owner = weakref.ref(owner)


def install(root: torch.nn.Module, owner: _Owner) -> None:
    for m in root.modules():
        ensure_param_dict(m, owner)


def uninstall(root: torch.nn.Module) -> None:
    for m in root.modules():
        params = m.__dict__.get("_parameters")
        if isinstance(params, ZeroParamDict):
            params._owner = None


class ExternalAccess:
    """The stage-3 partitioner's side: which module is running forward, and adopting a released
    parameter read there. Mixed into ``Stage3Partitioner`` (whose state it uses)."""

    module: torch.nn.Module
    _direct: dict[int, list[torch.nn.Parameter]]
    _in_use: dict[int, list[int]]
    _live: dict[int, torch.nn.Parameter]
    _external: dict[int, list[torch.nn.Parameter]]
    params: list[torch.nn.Parameter]
    _hooks: list[Any]
    _held: int
    _backward_end_queued: bool
    coll: Any

    def _hook(self, m: torch.nn.Module) -> None:
        self._hooked.add(id(m))
        self._hooks.append(m.register_forward_pre_hook(self._pre_forward))  # type: ignore[attr-defined]
        self._hooks.append(m.register_forward_hook(self._post_forward))  # type: ignore[attr-defined]

    def _watch(self) -> None:
        """Install the parameter dicts; the root always tracks its forward (a forward without
        own parameters may still read others')."""
        self._running: list[torch.nn.Module] = []
        install(self.module, self)
        if id(self.module) not in self._hooked:
            root = self.module
            self._hooks.append(root.register_forward_pre_hook(lambda m, a: self._enter(m)))
            self._hooks.append(root.register_forward_hook(lambda m, a, o: self._leave(m)))

    def _mirror_use(self) -> None:
        """Give every parameter DeepSpeed's names for what this records about it, which
        libraries read: ``ds_active_sub_modules`` and ``is_external_param``."""
        external = {id(p) for ps in self._external.values() for p in ps}
        for p in self.params:
            p.ds_active_sub_modules = ActiveModules(self, p)  # type: ignore[attr-defined]
            p.is_external_param = id(p) in external  # type: ignore[attr-defined]

    def _stop_using(self, p: torch.nn.Parameter, m: torch.nn.Module) -> None:
        users = self._in_use.get(id(p))
        if users and id(m) in users:  # absent once cleared (see _drain, ActiveModules.clear)
            users.remove(id(m))

    def _enter(self, m: torch.nn.Module) -> None:
        if m is self.module:
            install(m, self)  # submodules attached after the engine was built
            if not in_backward() and m not in self._running:
                self._drain()
        self._running.append(m)

    def _leave(self, m: torch.nn.Module) -> None:
        # Modules above ``m`` on the stack never saw their post-hook: their forward was cut
        # short (an early-stopped checkpoint recompute stops inside a module's forward).
        for i in range(len(self._running) - 1, -1, -1):
            if self._running[i] is m:
                del self._running[i:]
                return

    def _drain(self) -> None:
        """At the start of a root forward nothing runs and nothing needs to be whole: forget the
        modules and uses that an exception (in forward, in a checkpoint recompute, in backward)
        left behind and release what stayed gathered (after such an exception, or a backward
        called on the loss directly), so the step starts from partitioned parameters."""
        from ds.zero.stage3.shard import ParamStatus

        self._running.clear()
        self._in_use.clear()
        self._backward_end_queued = False  # a backward that raised never reached its end
        whole = [p for p in self._live.values() if p.ds_shard.status is ParamStatus.AVAILABLE]
        if whole:
            self.release(whole)  # type: ignore[attr-defined]

    def on_param_access(self, param: torch.nn.Parameter) -> None:
        from ds.zero.stage3.shard import ParamStatus

        s = getattr(param, "ds_shard", None)
        if (
            not self._running
            or self._held
            or s is None
            or s.status is not ParamStatus.NOT_AVAILABLE
        ):
            return
        m = self._running[-1]
        self._adopt(m, param)
        self.coll.context = f"forward of {type(m).__name__} (reads {s.name or s.ds_id})"
        self._gather([param]).wait()  # type: ignore[attr-defined]

    def adopt_returned(self, module: torch.nn.Module, output: Any) -> None:
        """A module that returns one of its own parameters (a linear handing back its bias for
        the caller to add) hands it to the module that called it: it stays gathered until that
        module's forward ends, and is gathered again for its backward."""
        if not self._running or self._held:
            return
        own = self._direct.get(id(module), [])
        for t in tensors_in(output):
            if any(t is p for p in own):
                self._adopt(self._running[-1], t)  # type: ignore[arg-type]

    def _adopt(self, m: torch.nn.Module, param: torch.nn.Parameter) -> None:
        own = self._direct.setdefault(id(m), [])
        if id(m) not in self._hooked:
            self._hook(m)
        param.is_external_param = True  # type: ignore[attr-defined]
        if all(q is not param for q in own):
            # Once it is one of ``m``'s parameters, ``m``'s forward pre-hook claims it.
            own.append(param)
            self._in_use.setdefault(id(param), []).append(id(m))


class ActiveModules(Set[int]):
    """``param.ds_active_sub_modules``: the ids of the running modules that use the parameter,
    a live view of the stage-3 engine's record (a parameter in use is not released).
    ``clear()`` drops its claims, as libraries do after cutting a pass short."""

    __slots__ = ("_key", "_owner")

    def __init__(self, owner: ExternalAccess, param: torch.nn.Parameter) -> None:
        self._owner = weakref.ref(owner)
        self._key = id(param)

    def _ids(self) -> list[int]:
        owner = self._owner()
        return [] if owner is None else owner._in_use.get(self._key, [])

    def __contains__(self, module_id: object) -> bool:
        return module_id in self._ids()

    def __iter__(self) -> Iterator[int]:
        return iter(dict.fromkeys(self._ids()))

    def __len__(self) -> int:
        return len(set(self._ids()))

    def __repr__(self) -> str:
        return repr(set(self))

    def clear(self) -> None:
        owner = self._owner()
        if owner is not None:
            owner._in_use.pop(self._key, None)


def in_backward() -> bool:
    """Whether autograd is running a backward on this thread: a module forward then is an
    activation-checkpoint recompute."""
    return bool(torch._C._current_graph_task_id() != -1)


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in a module's output (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


__all__ = [
    "ActiveModules",
    "ExternalAccess",
    "ZeroParamDict",
    "ensure_param_dict",
    "in_backward",
    "install",
    "tensors_in",
    "uninstall",
]
