"""One hook point for every operation of a communicator.

:data:`OPERATIONS` names, once, what each operation of the Communicator surface is called with: the
arguments holding its tensors, the ones whose sizes are its traffic, its reduce op, its root or
peer. :func:`observed` wraps every one of them on a communicator class so that each call first
hands a :class:`Call` to the instance's ``observe`` method; a subclass that checks or records
calls (the simulation's strict communicator) writes that one method instead of overriding every
operation. :func:`forwarding` builds a module-level function with an operation's signature that
runs it for whatever communicator is active (``ds.comm``'s torch.distributed-shaped API).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Operation:
    """What the arguments of one operation mean.

    ``tensors``: the arguments holding a tensor or a list of tensors (a list may be None), in the
    order they are reported. ``counted``: those whose sizes are the operation's traffic (default:
    all of ``tensors``). ``reduce``/``root``: the arguments naming the reduce op and the root rank
    (src/dst; the peer of a point-to-point operation). ``whole_part``: for the single-tensor
    gather/scatter forms, the argument that holds the group's size times the other. ``p2p``:
    ``"send"`` or ``"recv"`` for point-to-point operations.
    """

    tensors: tuple[str, ...] = ()
    counted: tuple[str, ...] | None = None
    reduce: str | None = None
    root: str | None = None
    whole_part: tuple[str, str] | None = None
    p2p: str | None = None


_GATHER = Operation(("tensor", "gather_list"), counted=("tensor",), root="dst")
_SCATTER = Operation(("tensor", "scatter_list"), counted=("tensor",), root="src")

OPERATIONS: dict[str, Operation] = {
    "barrier": Operation(),
    "broadcast": Operation(("tensor",), root="src"),
    "all_reduce": Operation(("tensor",), reduce="op"),
    "reduce": Operation(("tensor",), reduce="op", root="dst"),
    "all_gather": Operation(("tensor", "tensor_list"), counted=("tensor",)),
    "all_gather_into_tensor": Operation(
        ("input_tensor", "output_tensor"),
        counted=("input_tensor",),
        whole_part=("output_tensor", "input_tensor"),
    ),
    "reduce_scatter": Operation(("output", "input_list"), counted=("output",), reduce="op"),
    "reduce_scatter_tensor": Operation(
        ("input", "output"), counted=("output",), reduce="op", whole_part=("input", "output")
    ),
    "all_to_all_single": Operation(("input", "output"), counted=("input",)),
    "all_to_all": Operation(
        ("input_tensor_list", "output_tensor_list"), counted=("input_tensor_list",)
    ),
    "gather": _GATHER,
    "scatter": _SCATTER,
    "send": Operation(("tensor",), root="dst", p2p="send"),
    "isend": Operation(("tensor",), root="dst", p2p="send"),
    "recv": Operation(("tensor",), root="src", p2p="recv"),
    "irecv": Operation(("tensor",), root="src", p2p="recv"),
    "broadcast_object_list": Operation(root="src"),
    "all_gather_object": Operation(),
    "gather_object": Operation(root="dst"),
    "scatter_object_list": Operation(root="src"),
}

# torch's other spellings of the same operations.
ALIASES = {
    "all_gather_single": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
}


def _flat(value: Any) -> tuple[torch.Tensor, ...]:
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        return (value,)
    return tuple(value)


@dataclass(frozen=True)
class Call:
    """One call of an operation: its name, what its arguments mean, and the arguments by name
    (defaults filled in)."""

    name: str
    operation: Operation
    args: Mapping[str, Any]

    def _collect(self, names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(t for n in names for t in _flat(self.args[n]))

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self._collect(self.operation.tensors)

    @property
    def counted(self) -> tuple[torch.Tensor, ...]:
        names = self.operation.counted
        return self.tensors if names is None else self._collect(names)

    @property
    def group(self) -> Any:
        return self.args.get("group")

    @property
    def reduce(self) -> Any:
        name = self.operation.reduce
        return None if name is None else self.args[name]

    @property
    def root(self) -> Any:
        name = self.operation.root
        return -1 if name is None else self.args[name]

    @property
    def whole_part(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        pair = self.operation.whole_part
        return None if pair is None else (self.args[pair[0]], self.args[pair[1]])


def _observing(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    operation = OPERATIONS[name]
    sig = inspect.signature(method)

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments[next(iter(sig.parameters))]
        self.observe(Call(name, operation, arguments))
        return method(self, *args, **kwargs)

    return call


def observed(cls: type) -> type:
    """Class decorator: every operation in :data:`OPERATIONS` (and its torch aliases) on ``cls``
    first calls ``self.observe(call)``, then runs as the class defines it."""
    for name in OPERATIONS:
        setattr(cls, name, _observing(name, getattr(cls, name)))
    for alias, name in ALIASES.items():
        setattr(cls, alias, getattr(cls, name))
    return cls


def forwarding(
    target: Callable[Concatenate[Any, P], R],
    active: Callable[[], Any],
    module: str,
    *,
    method: bool = True,
) -> Callable[P, R]:
    """A function ``module.<target's name>`` with ``target``'s signature less its first parameter
    (``self``, or a communicator) and its docstring, that runs ``target`` for ``active()``: calls
    the method of that name on it (``method=True``) or ``target(active(), ...)``; every argument
    goes positional, defaults filled in."""
    name = target.__name__
    sig = inspect.signature(target)
    sig = sig.replace(parameters=list(sig.parameters.values())[1:])

    def forward(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        comm = active()
        if method:
            return getattr(comm, name)(*bound.args)  # type: ignore[no-any-return]
        return target(comm, *bound.args)

    forward.__name__ = forward.__qualname__ = name
    forward.__module__ = module
    forward.__doc__ = target.__doc__
    forward.__signature__ = sig  # type: ignore[attr-defined]
    return forward


__all__ = ["ALIASES", "OPERATIONS", "Call", "Operation", "forwarding", "observed"]
