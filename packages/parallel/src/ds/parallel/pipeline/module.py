"""``PipelineModule``: a model given as a list of layers, cut into stages, each rank building only
its own stage's layers (DeepSpeed's ``deepspeed.pipe.PipelineModule``).

Part ``k`` of ``num_stages * num_virtual_stages`` parts lives on stage ``k % num_stages`` as its
chunk ``k // num_stages`` (interleaved schedules give each stage several non-adjacent chunks;
with one virtual stage, part ``k`` is stage ``k``). Layers keep their global index as their
module name (``"3.weight"``), so names are the same at every pipeline size; a tied module is
``tied_modules.<key>``. Which stage a rank is comes from the mesh layout (stages outermost:
``rank // (world // num_stages)``), so no topology object is needed.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.parallel import PP_REPLICA_ATTR
from ds.parallel.pipeline.partition import partition
from ds.parallel.pipeline.spec import LayerSpec, TiedLayerSpec


def _type_name(layer: Any) -> str:
    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    return type(layer).__name__ if isinstance(layer, torch.nn.Module) else "function"


def _param_count(layer: Any) -> int:
    if isinstance(layer, LayerSpec):
        # Built on the meta device: counted without allocating the weights.
        with torch.device("meta"):
            built = layer.build()
        return sum(p.numel() for p in built.parameters() if p.requires_grad)
    if isinstance(layer, torch.nn.Module):
        return sum(p.numel() for p in layer.parameters() if p.requires_grad)
    return 0


def _stage_from_environment(num_stages: int) -> int | None:
    """This process's stage when the world is known (process group, or the launcher's env)."""
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        rank, world = tdist.get_rank(), tdist.get_world_size()
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        return None
    check_stages(num_stages, world)
    return rank // (world // num_stages)


def check_stages(num_stages: int, world: int) -> None:
    if num_stages < 1 or world % num_stages:
        raise ConfigError(
            f"num_stages={num_stages} does not divide the world size {world}; choose a divisor "
            f"of {world} or launch a multiple of {num_stages} ranks"
        )


class PipelineModule(torch.nn.Module):
    """DeepSpeed's constructor; ``num_virtual_stages`` (ds) gives each stage that many chunks
    for the interleaved 1F1B schedule; ``stage_id`` builds a given stage (default: this rank's)."""

    def __init__(
        self,
        layers: list[Any],
        num_stages: int | None = None,
        topology: Any = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        seed_layers: bool = False,
        seed_fn: Callable[[int], None] | None = None,
        base_seed: int = 1234,
        partition_method: str = "parameters",
        activation_checkpoint_interval: int = 0,
        activation_checkpoint_func: Callable[..., Any] | None = None,
        checkpointable_layers: list[str] | None = None,
        dynamic_shape: bool = False,
        *,
        num_virtual_stages: int = 1,
        stage_id: int | None = None,
    ) -> None:
        super().__init__()
        if topology is not None:
            num_stages = int(topology.get_dim("pipe")) if num_stages is None else num_stages
        if not layers:
            raise ConfigError("PipelineModule needs layers=: a non-empty list of layers")
        self._layer_specs = list(layers)
        self.num_stages = num_stages
        self.num_virtual_stages = int(num_virtual_stages)
        self.loss_fn = loss_fn
        self.seed_layers = seed_layers
        self.seed_fn = seed_fn
        self.base_seed = base_seed
        self.partition_method = partition_method
        self.activation_checkpoint_interval = int(activation_checkpoint_interval or 0)
        self.activation_checkpoint_func = activation_checkpoint_func
        self.checkpointable_layers = checkpointable_layers
        self.stage_id: int | None = None
        self.parts: list[int] = []
        self.tied_modules = torch.nn.ModuleDict()
        self.tied_weight_attrs: dict[str, list[str]] = {}
        # Per local chunk: (global layer index, callable) in order.
        self._chunks: list[list[tuple[int, Callable[[Any], Any]]]] = []
        if num_stages is not None:
            if stage_id is None:
                stage_id = 0 if num_stages == 1 else _stage_from_environment(num_stages)
            if stage_id is not None:
                self.bind(int(num_stages), int(stage_id))

    # -- layout ----------------------------------------------------------------------------------
    @property
    def num_parts(self) -> int:
        assert self.num_stages is not None
        return self.num_stages * self.num_virtual_stages

    def part_of_layer(self, idx: int) -> int:
        for k in range(self.num_parts):
            if self.parts[k] <= idx < self.parts[k + 1]:
                return k
        raise IndexError(idx)

    def stage_of_layer(self, idx: int) -> int:
        assert self.num_stages is not None
        return self.part_of_layer(idx) % self.num_stages

    def local_parts(self) -> list[int]:
        """The parts this stage holds, chunk by chunk."""
        assert self.num_stages is not None and self.stage_id is not None
        return [c * self.num_stages + self.stage_id for c in range(self.num_virtual_stages)]

    def tied_stages(self) -> dict[str, list[int]]:
        """For each tied key, the stages holding it (ascending); the first one owns it."""
        out: dict[str, set[int]] = {}
        for idx, layer in enumerate(self._layer_specs):
            if isinstance(layer, TiedLayerSpec):
                out.setdefault(layer.key, set()).add(self.stage_of_layer(idx))
        return {k: sorted(v) for k, v in out.items()}

    def tied_first_layer(self) -> dict[str, int]:
        """For each tied key, the global index of its first layer (its checkpoint file)."""
        out: dict[str, int] = {}
        for idx, layer in enumerate(self._layer_specs):
            if isinstance(layer, TiedLayerSpec):
                out.setdefault(layer.key, idx)
        return out

    @property
    def is_built(self) -> bool:
        return self.stage_id is not None

    def bind(self, num_stages: int, stage_id: int) -> None:
        """Partition the layers into ``num_stages`` stages and build stage ``stage_id``'s."""
        if self.is_built:
            if (self.num_stages, self.stage_id) != (num_stages, stage_id):
                raise ConfigError(
                    f"the PipelineModule was built as stage {self.stage_id} of {self.num_stages} "
                    f"but the run needs stage {stage_id} of {num_stages}; make "
                    "PipelineModule(num_stages=) and pipeline.stages agree"
                )
            return
        if not 0 <= stage_id < num_stages:
            raise ConfigError(f"stage_id={stage_id} is not a stage of {num_stages}")
        self.num_stages = num_stages
        names = [_type_name(layer) for layer in self._layer_specs]
        counts = [_param_count(layer) for layer in self._layer_specs]
        self.parts = partition(self.partition_method, self.num_parts, names, counts)
        self.stage_id = stage_id
        self._build()

    def _build(self) -> None:
        self._chunks = []
        for part in self.local_parts():
            chunk: list[tuple[int, Callable[[Any], Any]]] = []
            for idx in range(self.parts[part], self.parts[part + 1]):
                layer = self._layer_specs[idx]
                if isinstance(layer, TiedLayerSpec):
                    if layer.key not in self.tied_modules:
                        with self._seeded(idx):
                            self.tied_modules[layer.key] = layer.build()
                        self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
                    module = self.tied_modules[layer.key]
                    fn: Callable[[Any], Any] = (
                        functools.partial(layer.forward_fn, module)
                        if layer.forward_fn is not None
                        else module
                    )
                elif isinstance(layer, LayerSpec):
                    with self._seeded(idx):
                        module = layer.build()
                    self.add_module(str(idx), module)
                    fn = module
                elif isinstance(layer, torch.nn.Module):
                    self.add_module(str(idx), layer)
                    fn = layer
                elif callable(layer):
                    fn = layer
                else:
                    raise ConfigError(
                        f"layer {idx} is {type(layer).__name__}: a PipelineModule layer is a "
                        "LayerSpec, a torch.nn.Module or a callable"
                    )
                chunk.append((idx, fn))
            self._chunks.append(chunk)
        self.mark_tied_replicas()

    def mark_tied_replicas(self) -> None:
        """Mark the tied weights an earlier stage holds (and counts in the gradient norm). Run
        again after AutoTP replaced parameters: a new slice has lost the mark."""
        tied_stages = self.tied_stages()
        for key, module in self.tied_modules.items():
            if tied_stages[key][0] != self.stage_id:
                for attr in self.tied_weight_attrs[key]:
                    setattr(getattr(module, attr), PP_REPLICA_ATTR, True)

    @contextlib.contextmanager
    def _seeded(self, idx: int) -> Iterator[None]:
        # Each layer's initialisation depends on its index alone (the same at any stage count);
        # the caller's random stream is left as it was.
        if not self.seed_layers:
            yield
            return
        with torch.random.fork_rng(devices=[]):
            if self.seed_fn is not None:
                self.seed_fn(self.base_seed + idx)
            else:
                torch.manual_seed(self.base_seed + idx)
            yield

    # -- forward ---------------------------------------------------------------------------------
    def _require_built(self) -> None:
        if not self.is_built:
            raise ConfigError(
                "this PipelineModule has no stage yet: pass num_stages= and create it after "
                "the process group (or let ds.initialize build it)"
            )

    def chunk_layers(self, chunk: int) -> list[tuple[int, Callable[[Any], Any]]]:
        self._require_built()
        return self._chunks[chunk]

    def forward_chunk(self, chunk: int, x: Any) -> Any:
        """Run local chunk ``chunk`` on ``x``; with ``activation_checkpoint_interval`` n > 0 and
        grad enabled, every n layers are one checkpointed segment (recomputed in backward)."""
        layers = self.chunk_layers(chunk)
        n = self.activation_checkpoint_interval
        if n <= 0 or not torch.is_grad_enabled():
            for _, fn in layers:
                x = fn(x)
            return x
        for start in range(0, len(layers), n):
            segment = layers[start : start + n]
            if not self._checkpointable(segment):
                for _, fn in segment:
                    x = fn(x)
                continue
            x = self._checkpoint(_run_segment(segment), x)
        return x

    def set_checkpoint_interval(self, interval: int) -> None:
        """Checkpoint every ``interval`` layers from the next forward on (0: none); forward()
        reads the interval each time, so nothing computed for the old one is kept."""
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
            raise ConfigError(
                f"activation_checkpoint_interval={interval!r}: use a whole number of layers "
                "per checkpointed segment, or 0 to turn activation checkpointing off"
            )
        self.activation_checkpoint_interval = interval

    def checkpoint_needs_input_grad(self) -> bool:
        """Whether forward() checkpoints with a function that may need its segment's input to
        require grad: any ``activation_checkpoint_func`` given (a reentrant one, torch's
        ``checkpoint(use_reentrant=True)`` or DeepSpeed's, cuts a segment whose input needs no
        grad out of autograd), not ds's default (torch's non-reentrant checkpoint). The pipeline
        engine then marks the first stage's floating-point inputs as requiring grad."""
        return (
            self.activation_checkpoint_interval > 0 and self.activation_checkpoint_func is not None
        )

    def _checkpointable(self, segment: list[tuple[int, Callable[[Any], Any]]]) -> bool:
        if self.checkpointable_layers is None:
            return any(isinstance(fn, torch.nn.Module) for _, fn in segment)
        names = {_type_name(self._layer_specs[idx]) for idx, _ in segment}
        return bool(names & set(self.checkpointable_layers))

    def _checkpoint(self, fn: Callable[[Any], Any], x: Any) -> Any:
        if self.activation_checkpoint_func is not None:
            return self.activation_checkpoint_func(fn, x)
        from torch.utils.checkpoint import checkpoint

        return checkpoint(fn, x, use_reentrant=False)

    def forward(self, x: Any) -> Any:
        """The stage's chunks in order: the whole model when there is one stage."""
        self._require_built()
        for chunk in range(len(self._chunks)):
            x = self.forward_chunk(chunk, x)
        return x

    # -- per-layer state (checkpoint files ``layer_XX-model_states.pt``) ---------------------------
    def layer_state_dicts(self, keep_vars: bool = False) -> dict[int, dict[str, torch.Tensor]]:
        """Global layer index -> the layer's state dict, for the layers this stage owns: its
        modules, and each tied module on the stage that owns it (under its first index).
        ``keep_vars``: the parameters themselves (their tensor-parallel marks with them)."""
        self._require_built()
        out: dict[int, dict[str, torch.Tensor]] = {}
        owners = self.tied_stages()
        first = self.tied_first_layer()
        for chunk in self._chunks:
            for idx, _ in chunk:
                module = self._modules.get(str(idx))
                if module is not None:
                    out[idx] = module.state_dict(keep_vars=keep_vars)
        for key, module in self.tied_modules.items():
            if owners[key][0] == self.stage_id:
                out[first[key]] = module.state_dict(keep_vars=keep_vars)
        return out

    def layer_files_needed(self) -> dict[str, int]:
        """Local module name prefix (``"3"``, ``"tied_modules.embed"``) -> the global layer index
        whose file holds its weights."""
        self._require_built()
        first = self.tied_first_layer()
        need = {
            str(idx): idx for chunk in self._chunks for idx, _ in chunk if str(idx) in self._modules
        }
        need.update({f"tied_modules.{key}": first[key] for key in self.tied_modules})
        return need

    def extra_repr(self) -> str:
        return f"num_stages={self.num_stages}, stage_id={self.stage_id}, parts={self.parts}"


def _run_segment(segment: list[tuple[int, Callable[[Any], Any]]]) -> Callable[[Any], Any]:
    def run(x: Any) -> Any:
        for _, fn in segment:
            x = fn(x)
        return x

    return run


__all__ = ["PipelineModule", "check_stages"]
