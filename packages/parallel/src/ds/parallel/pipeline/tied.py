"""Tied weights across stages (a GPT's token embedding on the first stage, its LM head on the
last): one process group per tied key over the stages that hold it, the owner's (first stage's)
values broadcast at start, and the gradients summed over the group after every backward window,
so every copy takes the same step and stays equal."""

from __future__ import annotations

from typing import Any

import torch

from ds.interfaces.parallel import MeshShape
from ds.parallel.pipeline.module import PipelineModule


class TiedWeights:
    """Collective to build: every rank of the world constructs it, in the same order."""

    def __init__(self, module: PipelineModule, comm: Any, shape: MeshShape, rank: int) -> None:
        self.module = module
        self.comm = comm
        self._groups: dict[str, tuple[Any, int]] = {}  # key -> (group, owner's global rank)
        d, s, t = shape.coords(rank)
        for key, stages in sorted(module.tied_stages().items()):
            if len(stages) < 2:
                continue
            for dd in range(shape.dp):
                for ss in range(shape.sp):
                    for tt in range(shape.tp):
                        ranks = [shape.rank_of(dd, ss, tt, q) for q in stages]
                        handle = comm.new_group(ranks)
                        if (dd, ss, tt) == (d, s, t) and rank in ranks:
                            self._groups[key] = (handle, ranks[0])

    def _tensors(self, key: str) -> list[torch.nn.Parameter]:
        mod = self.module.tied_modules[key]
        return [getattr(mod, attr) for attr in self.module.tied_weight_attrs[key]]

    def broadcast(self) -> None:
        """Make every copy equal to the owner's (after the layers were built)."""
        with torch.no_grad():
            for key, (group, src) in self._groups.items():
                for p in self._tensors(key):
                    self.comm.broadcast(p.data, src=src, group=group)

    def all_reduce_grads(self, grad_of: Any) -> None:
        """Sum each tied weight's gradient over its stages; ``grad_of(param)`` is the tensor the
        optimizer will read (``param.grad``, or the engine's accumulation buffer)."""
        for key, (group, _) in self._groups.items():
            for p in self._tensors(key):
                g = grad_of(p)
                if g is not None:
                    self.comm.all_reduce(g, group=group)

    @property
    def keys(self) -> list[str]:
        return sorted(self._groups)


__all__ = ["TiedWeights"]
