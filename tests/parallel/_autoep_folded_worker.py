"""One rank of expert parallelism folded onto tensor parallelism (tp=2, autoep_size=2, world 2),
or alone (``:ep``: autoep_size=2, two data-parallel ranks reading the same batches).

Scenarios ``<route>:<stage>``: ``blocks`` is a model whose MoE blocks become DeepSpeed-layout
``AutoEPMoELayer``s (stacked experts), ``mixtral`` a tiny transformers Mixtral whose fused
experts become ds's per-expert modules and whose attention AutoTP splits. Both TP ranks read the
same batches (one data-parallel rank). Rank 0 saves each step's loss, the first step's gradients
and the final weights, every expert gathered from its rank, by parameter name of the plain model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from _parity import run_scenarios_as_rank
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "packages" / "ds-full" / "tests"))
from test_moe_autoep_blocks import H, _Net  # noqa: E402  # Mixtral routing, no act_fn
from tiny_models import llama_shape  # noqa: E402

STEPS = 3


class Net(_Net):
    """ds-full's AutoEP test model with a LayerNorm before each MoE block: a replicated weight
    whose gradient comes through the routed inputs."""

    def __init__(self) -> None:
        super().__init__()
        for layer in self.model.layers:
            layer.norm = nn.LayerNorm(H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.model.layers:
            x = x + layer.mlp(layer.norm(x))
        return self.head(x).square().mean()


def tiny_mixtral() -> nn.Module:
    import transformers

    shape = llama_shape(16, 24, heads=2, kv_heads=2, vocab=64, positions=64)
    cfg = transformers.MixtralConfig(
        **shape, num_local_experts=4, num_experts_per_tok=2, attn_implementation="eager"
    )
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg).float()


def inputs(route: str, step: int) -> dict:
    g = torch.Generator().manual_seed(100 + step)
    if route == "blocks":
        return {"x": torch.randn(2, 5, H, generator=g)}
    ids = torch.randint(0, 64, (2, 8), generator=g)
    return {"input_ids": ids, "labels": ids}


def build(route: str) -> nn.Module:
    return Net() if route == "blocks" else tiny_mixtral()


def loss_of(route: str, out: object) -> torch.Tensor:
    return out if route == "blocks" else out.loss  # type: ignore[attr-defined,return-value]


def config(route: str, stage: int, tp: bool = True) -> dict:
    cfg: dict = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 1.0,  # the norm counts replicated weights once, experts once
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
        "expert_parallel": {"enabled": True, "autoep_size": 2},
        "tensor_parallel": {"autotp_size": 2},
    }
    if not tp:  # expert parallelism alone: both ranks data parallel (same batches)
        del cfg["tensor_parallel"]
    elif route == "blocks":  # no linear of this model is split: TP only replicates it
        skip = {"patterns": [".*\\.weight$"], "partition_type": "skip"}
        cfg["tensor_parallel"]["partition_config"] = {
            "use_default_specs": False,
            "layer_specs": [skip],
        }
    if route == "blocks":
        cfg["expert_parallel"]["preset_model"] = "mixtral"
    return cfg


def whole(engine: object, comm: object) -> dict[str, torch.Tensor]:
    """Every parameter's full value (TP slices joined, experts gathered) by plain-model name."""
    from ds.parallel.moe.autoep import fused_state_dict

    mesh = engine.mesh  # type: ignore[attr-defined]
    state = mesh.full_state_dict(engine.module) if mesh is not None else engine.module.state_dict()  # type: ignore[attr-defined]
    mine = {n: v for n, v in state.items() if ".experts." in n}
    every: list = [None] * int(comm.get_world_size())  # type: ignore[attr-defined]
    comm.all_gather_object(every, mine)  # type: ignore[attr-defined]
    out = {n: v for n, v in state.items() if ".experts." not in n}
    stacks: dict[str, list] = {}
    for part in every:
        for n, v in part.items():
            if n.endswith(("experts.w1", "experts.w2", "experts.w3")):
                stacks.setdefault(n, []).append(v)
            else:
                out[n] = v
    for n, parts in stacks.items():
        out[n] = torch.cat(parts)  # ranks in expert-parallel order: rows 0..E
    for n in [n for n in out if n.endswith("experts.w1")]:  # DeepSpeed's layout: plain names
        base = n[: -len("w1")]
        w1, w2, w3 = (out.pop(base + w) for w in ("w1", "w2", "w3"))
        out[base + "gate_up_proj"], out[base + "down_proj"] = torch.cat([w1, w3], 1), w2
    out = {n.replace(".router.gate.", ".gate."): v for n, v in out.items()}
    return fused_state_dict(out)


def run(ds: object, dist: object, scenario: str, where: Path) -> dict:
    route, stage, *mode = scenario.split(":")
    cfg = config(route, int(stage), tp=mode != ["ep"])
    engine, *_ = ds.initialize(model=build(route), config=cfg)  # type: ignore[attr-defined]
    comm = dist.get_communicator()  # type: ignore[attr-defined]
    losses = []
    for step in range(STEPS):
        loss = loss_of(route, engine(**inputs(route, step)))
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    engine.save_16bit_model(str(where), "model.pt")  # one file: every rank's experts in it
    engine.save_checkpoint(str(where / "ckpt"), tag="t")
    torch.manual_seed(1)  # a differently initialised model takes every weight from the tag
    other = Net() if route == "blocks" else tiny_mixtral()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    resumed, *_ = ds.initialize(model=other, config=cfg)  # type: ignore[attr-defined]
    resumed.load_checkpoint(str(where / "ckpt"), tag="t")
    from ds.full.compat.deepspeed.utils import groups

    layout = {"tp": engine.autotp_size(), "tp_src": groups.get_tensor_model_parallel_src_rank()}
    return {
        "losses": losses,
        "weights": whole(engine, comm),
        "resumed": whole(resumed, comm),
        "layout": layout,
    }


if __name__ == "__main__":
    run_scenarios_as_rank(run, TRANSFORMERS_VERBOSITY="error")
