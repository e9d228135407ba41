"""Adam/AdamW, Adagrad and SGD on flat tensors, with the arithmetic of torch's single-tensor
implementations (same operations in the same order, so results match torch.optim elementwise).

Adam on host tensors steps through torch's fused CPU kernel by default (DeepSpeed's default,
``torch_adam: false``, is its fused Adam too): one pass over the four buffers instead of the
single-tensor path's eight, 4.5x less time on a 27M-parameter step (145 ms to 32 ms, 1 thread),
results within an ulp of the single-tensor path. ``torch_adam: true`` keeps torch's
single-tensor arithmetic bit for bit."""

from __future__ import annotations

from typing import Any

import torch

from ds.zero.optim.base import FlatOptimizer, next_step

_CHUNK = 1 << 20


def _chunks(*tensors: torch.Tensor) -> zip[tuple[torch.Tensor, ...]]:
    if tensors[0].numel() <= _CHUNK:
        return zip(*([t] for t in tensors))
    return zip(*(t.reshape(-1).split(_CHUNK) for t in tensors))


class Adam(FlatOptimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        adamw_mode: bool = True,
        bias_correction: bool = True,
        fused: bool = True,
    ) -> None:
        # Not a group key: checkpoints hold the same groups whichever kernel stepped them.
        self.fused = fused
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "adamw_mode": adamw_mode,
            "bias_correction": bias_correction,
        }
        super().__init__(params, defaults)

    def _update(
        self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]
    ) -> None:
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        step = next_step(state)
        lr, (beta1, beta2) = group["lr"], group["betas"]
        eps, wd = group["eps"], group["weight_decay"]
        # Without bias correction (DeepSpeed's bias_correction=false): step lr * m / (sqrt(v) + eps).
        corrected = group.get("bias_correction", True)
        # The kernel takes same-typed fp32 buffers of one shape; anything else keeps the loop.
        if (
            self.fused
            and corrected
            and p.device.type == "cpu"
            and p.dtype == grad.dtype == torch.float32
            and p.shape == grad.shape
        ):
            fused_step = torch._fused_adamw_ if group["adamw_mode"] else torch._fused_adam_
            fused_step(
                [p],
                [grad],
                [state["exp_avg"]],
                [state["exp_avg_sq"]],
                [],
                [torch.tensor(float(step))],
                lr=float(lr),  # a scheduler may have left a 0-dim tensor
                beta1=beta1,
                beta2=beta2,
                weight_decay=wd,
                eps=eps,
                amsgrad=False,
                maximize=False,
            )
            return
        step_size = lr / (1 - beta1**step) if corrected else lr
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5 if corrected else None
        # Elementwise, so chunks give the same bits as one pass while temporaries stay small.
        for p_c, g_c, m_c, v_c in _chunks(p, grad, state["exp_avg"], state["exp_avg_sq"]):
            if wd != 0:
                if group["adamw_mode"]:
                    p_c.mul_(1 - lr * wd)
                else:
                    g_c = g_c.add(p_c, alpha=wd)
            m_c.lerp_(g_c, 1 - beta1)
            v_c.mul_(beta2).addcmul_(g_c, g_c, value=1 - beta2)
            denom = v_c.sqrt()
            if bias_correction2_sqrt is not None:
                denom.div_(bias_correction2_sqrt)
            denom.add_(eps)
            p_c.addcdiv_(m_c, denom, value=-step_size)


class Adagrad(FlatOptimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
    ) -> None:
        defaults = {
            "lr": lr,
            "lr_decay": lr_decay,
            "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value,
            "eps": eps,
        }
        super().__init__(params, defaults)

    def _update(
        self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]
    ) -> None:
        if "sum" not in state:
            state["sum"] = torch.full_like(p, group["initial_accumulator_value"])
        step = next_step(state)
        if group["weight_decay"] != 0:
            grad = grad.add(p, alpha=group["weight_decay"])
        clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        state["sum"].addcmul_(grad, grad, value=1)
        std = state["sum"].sqrt().add_(group["eps"])
        p.addcdiv_(grad, std, value=-clr)


class SGD(FlatOptimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
        }
        super().__init__(params, defaults)

    def _update(
        self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]
    ) -> None:
        if group["weight_decay"] != 0:
            grad = grad.add(p, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = torch.clone(grad).detach()
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        p.add_(grad, alpha=-group["lr"])
