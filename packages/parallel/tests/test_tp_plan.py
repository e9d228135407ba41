"""Which module AutoTP gives which style, and what it refuses (before changing anything)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ds.interfaces.errors import ConfigError
from ds.interfaces.parallel import TP_DIM_ATTR, TP_FUSED_ATTR, tp_dim, tp_fused
from ds.parallel.tp import TPGroup, autotp, check_heads, plan_for, unshard
from ds.parallel.tp.layers import shard

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "parallel"))
import _tp_models as models


def tp2(rank: int = 0) -> TPGroup:
    # Splitting is local arithmetic: no collective runs until the model's forward.
    return TPGroup(comm=None, group=None, size=2, rank=rank)


def styles(kind: str, **cfg: object) -> dict[str, str]:
    return {n: p.style for n, p in plan_for(models.model(kind, **cfg)).items()}


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "qwen3"])
def test_llama_family_plan_comes_from_the_models_tp_plan(kind: str) -> None:
    m = models.model(kind)
    plan = plan_for(m)
    attn, mlp = "model.layers.1.self_attn", "model.layers.1.mlp"
    for leaf in ("q_proj", "k_proj", "v_proj"):
        assert plan[f"{attn}.{leaf}"].style == "colwise"
    assert plan[f"{attn}.o_proj"].style == "rowwise"
    assert plan[f"{mlp}.gate_proj"].style == "colwise"
    assert plan[f"{mlp}.up_proj"].style == "colwise"
    assert plan[f"{mlp}.down_proj"].style == "rowwise"
    assert plan["model.embed_tokens"].style == "vocab_embedding"
    assert plan["lm_head"].style == "colwise_gather"
    assert {p.source for p in plan.values()} == {"tp_plan"}
    if kind == "qwen3":  # per-head norms see only this rank's heads: their grads are summed
        assert plan[f"{attn}.q_norm"].style == "replicate_grad_allreduce"
    # norms are not in the plan: left replicated
    assert not any("layernorm" in n for n in plan)


def test_gpt2_fused_qkv_and_conv1d_by_name_rules() -> None:
    plan = plan_for(models.model("gpt2"))
    h = "transformer.h.0"
    assert (plan[f"{h}.attn.c_attn"].style, plan[f"{h}.attn.c_attn"].fused) == ("colwise", 3)
    assert plan[f"{h}.attn.c_attn"].transposed
    assert plan[f"{h}.attn.c_proj"].style == "rowwise"
    assert plan[f"{h}.mlp.c_fc"].style == "colwise"  # 4*32 = the vocabulary: name wins over shape
    assert plan[f"{h}.mlp.c_proj"].style == "rowwise"
    assert plan["transformer.wte"].style == "vocab_embedding"
    assert plan["transformer.wpe"].style == "replicate"
    assert plan["lm_head"].style == "colwise_gather"
    assert {p.source for p in plan.values()} == {"rules"}


def test_rules_place_a_model_without_a_tp_plan() -> None:
    m = models.model("llama")
    m._tp_plan = {}  # as a model whose config has no base_model_tp_plan
    m.config.base_model_tp_plan = None
    plan = plan_for(m)
    assert plan["model.layers.0.self_attn.q_proj"].source == "rules"
    assert plan["model.layers.0.self_attn.o_proj"].style == "rowwise"
    assert plan["model.layers.0.mlp.down_proj"].style == "rowwise"
    assert plan["lm_head"].style == "colwise_gather"
    assert plan["model.embed_tokens"].style == "vocab_embedding"


class _Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mixer = nn.Linear(8, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.mixer(x))


def test_unplaceable_module_is_one_line_naming_it_and_the_fix() -> None:
    with pytest.raises(ConfigError) as e:
        plan_for(_Odd())
    msg = str(e.value)
    assert "\n" not in msg
    assert "'mixer'" in msg and "(and 1 more)" in msg and "partition_config={'mixer$'" in msg


def test_partition_config_places_and_overrides() -> None:
    plan = plan_for(_Odd(), {r"mixer$": "colwise", r"proj$": "rowwise"})
    assert (plan["mixer"].style, plan["proj"].style) == ("colwise", "rowwise")
    assert plan["mixer"].source == "partition_config"
    # DeepSpeed's layer_specs form
    spec = {"layer_specs": [{"patterns": ["mixer"], "partition_type": "column"},
                            {"patterns": ["proj"], "partition_type": "skip"}]}  # fmt: skip
    plan = plan_for(_Odd(), spec)
    assert (plan["mixer"].style, plan["proj"].style) == ("colwise", "replicate")
    # an explicit choice beats the model's own plan
    plan = plan_for(models.model("llama"), {r"\.o_proj$": "replicate"})
    assert plan["model.layers.0.self_attn.o_proj"].style == "replicate"
    assert plan["model.layers.0.self_attn.q_proj"].source == "tp_plan"


def test_partition_config_bad_style_and_regex() -> None:
    with pytest.raises(ConfigError, match=r"partition_config\['mixer'\] = 'diagonal'.*'colwise'"):
        plan_for(_Odd(), {"mixer": "diagonal"})
    with pytest.raises(ConfigError, match="not a valid regex"):
        plan_for(_Odd(), {"(": "colwise"})


def test_unsupported_tp_plan_style_names_the_module() -> None:
    m = models.model("llama")
    m._tp_plan = {**m.tp_plan, "model.layers.*.mlp.down_proj": "moe_tp_experts"}
    with pytest.raises(ConfigError, match=r"'model.layers.0.mlp.down_proj'.*moe_tp_experts"):
        plan_for(m)


def _unchanged(before: nn.Module, after: nn.Module) -> bool:
    a, b = before.state_dict(), after.state_dict()
    same_types = [type(x) for x in before.modules()] == [type(x) for x in after.modules()]
    return same_types and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "words"),
    [
        (4, 2, 4, ["num_key_value_heads=2", "autotp_size=4", "divides 2"]),
        (6, 6, 4, ["num_attention_heads=6", "autotp_size=4"]),
    ],
)
def test_gqa_heads_that_do_not_divide_are_refused_before_any_change(
    heads: int, kv: int, tp: int, words: list[str]
) -> None:
    m = models.model("llama", num_attention_heads=heads, num_key_value_heads=kv, hidden_size=48)
    before = copy.deepcopy(m)
    with pytest.raises(ConfigError) as e:
        autotp(m, TPGroup(None, None, tp, 0), None)
    for w in words:
        assert w in str(e.value)
    assert _unchanged(before, m)


def test_split_dim_that_does_not_divide_names_module_and_numbers() -> None:
    m = models.model("llama", intermediate_size=63)
    before = copy.deepcopy(m)
    with pytest.raises(ConfigError) as e:
        autotp(m, tp2(), None)
    msg = str(e.value)
    assert "'model.layers.0.mlp.gate_proj'" in msg and "output features 63" in msg
    assert _unchanged(before, m)


def test_slices_hold_their_part_and_are_marked() -> None:
    full = models.model("gpt2")
    for rank in (0, 1):
        m = copy.deepcopy(full)
        result = autotp(m, tp2(rank), None)
        assert result.size == 2 and result.rank == rank
        attn = m.transformer.h[0].attn
        assert (attn.num_heads, attn.split_size) == (2, 16)
        w = attn.c_attn.weight
        assert (tp_dim(w), tp_fused(w), tuple(w.shape)) == (1, 3, (32, 48))
        ref = full.transformer.h[0].attn.c_attn.weight.detach()
        assert torch.equal(w.detach(), shard(ref, 1, tp2(rank), 3))
        # row-parallel bias and norms stay whole and unmarked
        assert tp_dim(attn.c_proj.bias) is None and tuple(attn.c_proj.weight.shape) == (16, 32)
        assert getattr(m.transformer.ln_f.weight, TP_DIM_ATTR, None) is None
        # the tied LM head still shares the (sliced) embedding
        assert m.lm_head.weight is m.transformer.wte.weight
        assert tuple(m.lm_head.weight.shape) == (64, 32)
        assert getattr(attn.c_proj.weight, TP_FUSED_ATTR, None) is None


def test_unshard_inverts_shard_for_fused_segments() -> None:
    t = torch.arange(24.0).reshape(2, 12)
    pieces = [shard(t, 1, tp2(r), 3) for r in (0, 1)]
    assert torch.equal(pieces[0], t[:, [0, 1, 4, 5, 8, 9]])
    assert torch.equal(unshard(pieces, 1, 3), t)
    assert torch.equal(unshard([shard(t, 0, tp2(r)) for r in (0, 1)], 0), t)


def test_vocab_that_does_not_divide_stays_replicated_with_its_tie() -> None:
    m = models.model("gpt2", vocab_size=127)
    result = autotp(m, tp2(), None)
    assert result.plan["transformer.wte"].style == "replicate"
    assert result.plan["lm_head"].style == "replicate"
    assert isinstance(m.transformer.wte, nn.Embedding) and m.lm_head.weight.shape[0] == 127


def test_tp_size_one_changes_nothing() -> None:
    m = models.model("llama")
    before = copy.deepcopy(m)
    autotp(m, TPGroup(None, None, 1, 0), None)
    assert _unchanged(before, m)


def test_heads_are_checked_from_a_config_before_any_model_exists() -> None:
    cfg = models.config("qwen2", num_attention_heads=4, num_key_value_heads=2)
    check_heads(cfg, 2)
    with pytest.raises(ConfigError, match="num_key_value_heads=2 does not divide by"):
        check_heads(cfg, 4)
    check_heads(models.config("gpt2"), 4)  # n_head=4
    with pytest.raises(ConfigError, match=r"num_attention_heads=4 .*autotp_size=8"):
        check_heads(models.config("gpt2"), 8)
