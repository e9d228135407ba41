"""AdamW on a selected subset of each parameter's columns (ZenFlow's selective update).

ZenFlow splits an optimizer step in two: the few columns with the largest gradients are updated
at once on the compute device, the rest later by the full (offloaded) optimizer. These classes do
the first part. The caller describes the selection on each parameter, as DeepSpeed's ZenFlow
engine does:

* ``selected_indices``: the chosen columns (1-D long tensor);
* ``selected_grad``: their gradient, already gathered to the selection's shape;
* ``temp_selected_param`` (optional): a snapshot of the selected values taken by
  :meth:`temp_copy_param` before the full optimizer rewrote the parameter; a step puts it back
  before updating, so the selected columns follow their own trajectory.

:class:`SelectiveAdamW` reads the selection as ``param.data[:, selected_indices]`` (a 1-D
parameter is selected whole). :class:`SelectiveAdamWPartitioned` works on a ZeRO-3 partition:
``param.ds_tensor`` holds the parameter transposed, ``param.ds_shape`` is ``(columns, rows)``, the
partition's slice starts at ``complete_column_offset`` and has ``complete_numel`` elements, so the
selection is a set of rows; a partition offloaded to NVMe (a 0-dim placeholder in
``ds_tensor.data``) is swapped in through ``param.nvme_swapper`` for the update and back out after.

With ``offload=True`` the moments live on the host in ``param.exp_avg_cpu_data`` /
``param.exp_avg_sq_cpu_data`` and visit the device one parameter at a time (``param.exp_avg`` /
``param.exp_avg_sq`` while they are there). The update is torch's AdamW (decoupled weight decay,
bias correction, optional AMSGrad), element for element.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

_Params = Iterable[torch.nn.Parameter]


class _SelectiveAdamWBase(torch.optim.AdamW):
    def __init__(
        self, params: Any, *args: Any, offload: bool = False, bucket_size: float = 5e8, **kw: Any
    ) -> None:
        super().__init__(params, *args, **kw)
        self.offload = offload
        # Moments visit the device one parameter at a time, which already keeps the device
        # footprint under any bucket; the size is kept for callers that read it.
        self.bucket_size = bucket_size
        self.step: Callable[..., Any] = (  # type: ignore[method-assign]
            self._step_with_offload if offload else self._step_without_offload
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for param_state in self.state.values():
            step = param_state.get("step")
            if torch.is_tensor(step) and step.dtype in (torch.float16, torch.bfloat16):
                param_state["step"] = step.float()

    # --- where the selection lives (per subclass) ---
    def _read(self, p: torch.Tensor, device: torch.device) -> torch.Tensor:
        raise NotImplementedError

    def _write(self, p: torch.Tensor, value: torch.Tensor) -> None:
        raise NotImplementedError

    def _acquire(self, p: torch.Tensor) -> bool:
        """Make the parameter's storage readable; True when the caller must release it."""
        return False

    def _release(self, p: torch.Tensor, acquired: bool, dirty: bool) -> None:
        pass

    # --- public API ---
    def _step_without_offload(self, closure: Callable[[], Any] | None = None) -> Any:
        return self._step_all(closure)

    def _step_with_offload(self, closure: Callable[[], Any] | None = None) -> Any:
        return self._step_all(closure)

    @torch.no_grad()
    def _step_all(self, closure: Callable[[], Any] | None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._update(group["params"], group, restore_snapshot=True)
        return loss

    @torch.no_grad()
    def _snapshot(self, params: _Params) -> None:
        for p in params:
            if getattr(p, "selected_grad", None) is None:
                continue
            acquired = self._acquire(p)
            snap = self._read(p, self._data(p).device).clone()
            p.temp_selected_param = snap.cpu() if self.offload else snap  # type: ignore[attr-defined]
            self._release(p, acquired, dirty=False)

    def clear_selected_mv(self) -> None:
        """Zero the moments of the selection (the selection changed: its history is moot)."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if not state:
                    continue
                if self.offload:
                    for name in ("exp_avg_cpu_data", "exp_avg_sq_cpu_data"):
                        if getattr(p, name, None) is not None:
                            getattr(p, name).zero_()
                else:
                    state["exp_avg"].zero_()
                    state["exp_avg_sq"].zero_()

    # --- the update ---
    def _data(self, p: torch.Tensor) -> torch.Tensor:
        return p.data

    def _update(self, params: _Params, group: Mapping[str, Any], restore_snapshot: bool) -> None:
        for p in params:
            grad = getattr(p, "selected_grad", None)
            if grad is None:
                continue
            acquired = self._acquire(p)
            sel = self._read(p, grad.device)
            snap = getattr(p, "temp_selected_param", None)
            if restore_snapshot and snap is not None:
                sel.copy_(snap.to(sel.device).view_as(sel))
            exp_avg, exp_avg_sq = self._moments(p, sel)
            _adamw(sel, grad.to(sel.dtype), exp_avg, exp_avg_sq, self.state[p], group)
            self._write(p, sel)
            if self.offload:
                p.exp_avg_cpu_data.copy_(exp_avg.view_as(p.exp_avg_cpu_data))  # type: ignore[attr-defined]
                p.exp_avg_sq_cpu_data.copy_(exp_avg_sq.view_as(p.exp_avg_sq_cpu_data))  # type: ignore[attr-defined]
                p.exp_avg = p.exp_avg_sq = None  # type: ignore[attr-defined]
            self._release(p, acquired, dirty=True)
            p.selected_grad = None  # type: ignore[attr-defined]
            if restore_snapshot:
                p.temp_selected_param = None  # type: ignore[attr-defined]

    def _moments(self, p: torch.Tensor, sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=sel.device)
        if not self.offload:
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(sel)
                state["exp_avg_sq"] = torch.zeros_like(sel)
            return state["exp_avg"], state["exp_avg_sq"]
        for name in ("exp_avg_cpu_data", "exp_avg_sq_cpu_data"):
            if getattr(p, name, None) is None:
                setattr(p, name, torch.zeros_like(sel, device="cpu"))
        p.exp_avg = p.exp_avg_cpu_data.to(sel.device).view_as(sel)  # type: ignore[attr-defined]
        p.exp_avg_sq = p.exp_avg_sq_cpu_data.to(sel.device).view_as(sel)  # type: ignore[attr-defined]
        return p.exp_avg, p.exp_avg_sq  # type: ignore[attr-defined]


def _adamw(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    state: dict[str, Any],
    group: Mapping[str, Any],
) -> None:
    """One AdamW step in place, the arithmetic of ``torch.optim.AdamW``'s single-tensor path."""
    lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
    beta1, beta2 = group["betas"]
    state["step"] += 1
    step = float(state["step"])
    if wd != 0:
        param.mul_(1 - lr * wd)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    second = exp_avg_sq
    if group.get("amsgrad"):
        if "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = torch.zeros_like(exp_avg_sq)
        torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
        second = state["max_exp_avg_sq"]
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    denom = (second.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))


class SelectiveAdamW(_SelectiveAdamWBase):
    """Selective AdamW on whole parameters (ZeRO stage 0-2): the selection is a set of columns."""

    def _read(self, p: torch.Tensor, device: torch.device) -> torch.Tensor:
        if p.dim() == 1:
            return p.data if p.device == device else p.data.to(device)
        return p.data[:, p.selected_indices.to(p.device)].to(device)  # type: ignore[attr-defined]

    def _write(self, p: torch.Tensor, value: torch.Tensor) -> None:
        if p.dim() == 1:
            if value.data_ptr() != p.data.data_ptr():
                p.data.copy_(value)
            return
        p.data[:, p.selected_indices.to(p.device)] = value.to(p.device)  # type: ignore[attr-defined]

    def temp_copy_param(self, group_to_paramlist: Mapping[int, _Params]) -> None:
        for params in group_to_paramlist.values():
            self._snapshot(params)

    @torch.no_grad()
    def group_step(self, group_to_paramlist: Mapping[int, _Params]) -> None:
        """Apply the selected gradients of the given parameters, per param group."""
        for group_id, params in group_to_paramlist.items():
            self._update(params, self.param_groups[group_id], restore_snapshot=False)


class SelectiveAdamWPartitioned(_SelectiveAdamWBase):
    """Selective AdamW on ZeRO-3 partitions (``ds_tensor``, stored transposed): the selection is
    a set of rows of the partition."""

    def _data(self, p: torch.Tensor) -> torch.Tensor:
        return p.ds_tensor.data  # type: ignore[attr-defined, no-any-return]

    def _rows(self, p: torch.Tensor) -> torch.Tensor | None:
        shape = p.ds_shape  # type: ignore[attr-defined]
        if len(shape) == 1:
            return None
        width = shape[1]
        part = self._data(p).narrow(0, p.complete_column_offset, p.complete_numel)  # type: ignore[attr-defined]
        return part.view(p.complete_numel // width, width)  # type: ignore[attr-defined]

    def _read(self, p: torch.Tensor, device: torch.device) -> torch.Tensor:
        rows = self._rows(p)
        if rows is None:
            data = self._data(p)
            return data if data.device == device else data.to(device)
        return rows[p.selected_indices.to(rows.device)].to(device)  # type: ignore[attr-defined]

    def _write(self, p: torch.Tensor, value: torch.Tensor) -> None:
        rows = self._rows(p)
        if rows is None:
            data = self._data(p)
            if value.data_ptr() != data.data_ptr():
                data.copy_(value)
            return
        rows[p.selected_indices.to(rows.device)] = value.to(rows.device)  # type: ignore[attr-defined]

    def _acquire(self, p: torch.Tensor) -> bool:
        swapper = getattr(p, "nvme_swapper", None)
        if self._data(p).dim() == 0 and swapper is not None:
            swapper.swap_in([p], async_op=False)
            return True
        return False

    def _release(self, p: torch.Tensor, acquired: bool, dirty: bool) -> None:
        if not acquired:
            return
        swapper = p.nvme_swapper  # type: ignore[attr-defined]
        if dirty:
            swapper.swap_out_and_release([p])
        else:  # read only: the copy on NVMe is still current
            swapper.remove_partition_and_release_buffers([p])

    def temp_copy_param(self, params: _Params) -> None:
        self._snapshot(params)

    @torch.no_grad()
    def group_step(self, params: _Params) -> None:
        """Apply the selected gradients of the given parameters; each names its ``group_id``."""
        by_group: dict[int, list[torch.Tensor]] = {}
        for p in params:
            by_group.setdefault(p.group_id, []).append(p)  # type: ignore[attr-defined]
        for group_id in sorted(by_group):
            self._update(by_group[group_id], self.param_groups[group_id], restore_snapshot=False)
