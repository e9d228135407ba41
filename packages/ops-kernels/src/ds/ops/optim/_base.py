"""Shared machinery of the CPU optimizer classes: state creation, batching, the per-group fast
path, state_dict dtypes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

import torch

from ds.interfaces.errors import KernelError
from ds.ops._checks import check_beta, check_nonneg
from ds.ops._native import native, sync_threads
from ds.ops.optim._plan import GroupPlan, make_plan, plan_addresses
from ds.ops.placement import placed_copy, zeros_apart

Batch = tuple[list[torch.Tensor], list[torch.Tensor], list[dict[str, Any]]]


class CPUOptimizerBase(torch.optim.Optimizer):
    """Collects the params of each group that have grads and hands them to the native kernel in
    one call per (step count, dtypes) batch, so a list of many tensors costs one thread-pool
    dispatch rather than one per tensor. Steady-state steps take the fast path of
    :mod:`ds.ops.optim._plan`."""

    #: steps on the host's SIMD kernels: a ZeRO engine that offloads the optimizer accepts it as
    #: a client optimizer without ``"zero_force_ds_cpu_optimizer": false``
    host_kernels = True
    #: names of the per-parameter state tensors, in kernel argument order
    _state_names: tuple[str, ...] = ()
    #: the kernel (``ds.ops.cpu_optim.<name>``, native ``<name>_ptrs``) and whether it takes the
    #: step count (before the hyperparameters)
    _kernel = ""
    _takes_step = False
    #: whether a sparse gradient updates just the elements it names (element-wise updates whose
    #: untouched elements stay as they are, as in torch's sparse Adagrad)
    _takes_sparse = False

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self._plans: dict[int, GroupPlan] = {}
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.device.type != "cpu":
                    raise KernelError(
                        f"{type(self).__name__} updates CPU parameters; got one on {p.device}. "
                        "Keep the master parameters on CPU (ZeRO offload) or use a GPU optimizer."
                    )

    # -- subclass hooks -------------------------------------------------------------------------
    def _init_state(self, p: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _hyper(self, group: dict[str, Any], step: int) -> dict[str, Any]:
        """The kernel's hyperparameters for ``group`` at ``step``, in its argument order."""
        raise NotImplementedError

    @staticmethod
    def _lr_betas(group: dict[str, Any]) -> dict[str, Any]:
        """The leading hyperparameters of the kernels with momentum (Adam, Lion)."""
        beta1, beta2 = group["betas"]
        return {"lr": float(group["lr"]), "beta1": beta1, "beta2": beta2}

    def _run(
        self,
        group: dict[str, Any],
        step: int,
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        states: list[list[torch.Tensor]],
    ) -> None:
        """Checked path: the functional kernels of ds.ops.cpu_optim."""
        from ds.ops import cpu_optim

        kw = self._hyper(group, step)
        if self._takes_step:
            kw["step"] = step
        getattr(cpu_optim, self._kernel)(params, grads, *states, **kw)

    def _run_ptrs(
        self, kernels: Any, group: dict[str, Any], step: int, head: tuple[Any, ...]
    ) -> None:
        """Fast path: the address-list kernel; ``head`` = (codes, params, grads, *states, lowp,
        numels)."""
        lead = (step,) if self._takes_step else ()
        getattr(kernels, f"{self._kernel}_ptrs")(*head, *lead, *self._hyper(group, step).values())

    # -- shared ---------------------------------------------------------------------------------
    @staticmethod
    def _walked_with(p: torch.Tensor, state: dict[str, Any]) -> list[torch.Tensor]:
        """The buffers a state tensor of ``p`` is walked in lockstep with: the param, its grad and
        the state already made for it."""
        out = [p] if p.grad is None else [p, p.grad]
        return out + [v for v in state.values() if isinstance(v, torch.Tensor)]

    def _new_state(
        self, p: torch.Tensor, group: dict[str, Any], state: dict[str, Any], fill: float = 0.0
    ) -> torch.Tensor:
        """A state tensor for ``p``, placed apart from the buffers it is walked with
        (:mod:`ds.ops.placement`: congruent addresses slow the fused step down)."""
        dtype = self._state_dtype(p, group)
        return zeros_apart(p.shape, dtype, self._walked_with(p, state), fill)

    def _state_dtype(self, p: torch.Tensor, group: dict[str, Any]) -> torch.dtype:
        return torch.float32 if group["fp32_optimizer_states"] else p.dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            self._check_group(gi, group)
            params = group["params"]
            plan = self._plans.get(gi)
            if plan is not None:
                got = plan_addresses(plan, params)
                if got is not None:
                    self._fast_step(group, plan, got)
                    continue
                del self._plans[gi]
            self._general_step(group)
            states = [self.state.get(p) for p in params]
            if all(states):
                made = make_plan(params, states, self._state_names)  # type: ignore[arg-type]
                if made is not None:
                    self._plans[gi] = made
        return loss

    @staticmethod
    def _check_group(gi: int, group: dict[str, Any]) -> None:
        """The hyperparameters a step reads, checked at every step: a learning-rate scheduler or
        user code may have changed them since the constructor checked them."""
        where = f"param_groups[{gi}]"
        for key in ("lr", "eps", "weight_decay"):
            if key in group:
                check_nonneg(f"{where}['{key}']", group[key])
        if "betas" in group:
            for i, b in enumerate(group["betas"]):
                check_beta(f"{where}['betas'][{i}]", b)

    def _fast_step(
        self,
        group: dict[str, Any],
        plan: GroupPlan,
        got: tuple[list[int], list[int], list[torch.Tensor]],
    ) -> None:
        pptrs, gptrs, grads = got
        step = plan.step + 1
        sync_threads()
        head = (plan.codes, pptrs, gptrs, *plan.state_ptrs, [], plan.numels)
        try:
            self._run_ptrs(native(), group, step, head)
        except ValueError as e:
            raise KernelError(str(e)) from e
        del grads  # held until the kernel returned: the addresses point into them
        plan.step = step
        for s in plan.states:
            s["step"] = step

    def _general_step(self, group: dict[str, Any]) -> None:
        batches: dict[tuple[Any, ...], Batch] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad
            if grad.is_sparse and not self._takes_sparse:
                raise KernelError(
                    f"{type(self).__name__} does not take sparse gradients; densify them "
                    "(grad.to_dense()) or use torch.optim.SparseAdam"
                )
            state = self.state[p]
            if not state:
                state["step"] = 0
                self._init_state(p, group, state)
            state["step"] += 1
            if grad.is_sparse:
                self._sparse_step(group, p, grad, state)
                continue
            key = (state["step"], p.dtype, grad.dtype)
            batch = batches.setdefault(key, ([], [], []))
            batch[0].append(p.detach())
            batch[1].append(grad.detach().contiguous())
            batch[2].append(state)
        for (step, _, _), (params, grads, states) in batches.items():
            per_name = [[s[name] for s in states] for name in self._state_names]
            self._run(group, step, params, grads, per_name)

    def _sparse_step(
        self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]
    ) -> None:
        """Update only the elements a sparse gradient names (as torch's sparse Adagrad does):
        gather them and their state, run the element-wise kernel, scatter them back."""
        if group.get("weight_decay", 0.0):
            raise KernelError(
                f"{type(self).__name__}: weight_decay does not apply to sparse gradients (it "
                "would touch every element); set weight_decay=0 or densify the gradient"
            )
        grad = grad.coalesce()
        rows = grad.indices()  # [sparse_dim, nnz] over the leading dims
        lead = p.shape[: grad.sparse_dim()]
        row_size = grad.values()[0].numel() if grad.values().numel() else 1
        flat_rows = torch.zeros(rows.shape[1], dtype=torch.long)
        for d, size in enumerate(lead):
            flat_rows = flat_rows * size + rows[d]
        idx = (flat_rows[:, None] * row_size + torch.arange(row_size)).reshape(-1)
        flat_p = p.detach().view(-1)
        values = flat_p[idx]
        gathered = [state[name].view(-1)[idx] for name in self._state_names]
        grad_values = grad.values().reshape(-1).to(p.dtype).contiguous()
        self._run(group, state["step"], [values], [grad_values], [[t] for t in gathered])
        flat_p[idx] = values
        for name, t in zip(self._state_names, gathered, strict=True):
            state[name].view(-1)[idx] = t

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "_plans"):  # called by torch's __init__ before ours finished
            self._plans.clear()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # torch casts floating-point state to the param dtype on load; fp32 moments of bf16/fp16
        # params would lose their precision, so the saved tensors are restored as they were.
        saved = {k: dict(v) for k, v in state_dict["state"].items()}
        self._plans.clear()
        super().load_state_dict(state_dict)
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(ids, params, strict=True):
            state = self.state[p]
            for k, v in saved.get(pid, {}).items():
                if isinstance(v, torch.Tensor):
                    state.pop(k, None)  # so the placement avoids only the state restored before it
                    state[k] = placed_copy(v.detach().cpu(), self._walked_with(p, state))
