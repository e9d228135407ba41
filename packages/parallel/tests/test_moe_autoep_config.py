"""The expert_parallel section, the folded EP-over-TP rank layout and fused expert layouts."""

from __future__ import annotations

import pytest

from ds.parallel.moe.autoep_config import (
    AutoEPConfig,
    parse_autoep_config,
    validate_autoep_config,
    validate_autoep_post_detection,
)
from ds.parallel.moe.folding import (
    assert_group_matches_spec,
    build_folding_spec,
    expected_folding_group_tables,
    local_folding_ranks,
)
from ds.parallel.moe.fused_layout import classify_fused_gate_up_layout


def test_folded_tables_for_eight_ranks() -> None:
    spec = build_folding_spec(world_size=8, pp_size=1, tp_size=2, ep_size=4)
    assert (spec.dp_size, spec.edp_size) == (4, 2)
    t = expected_folding_group_tables(spec)
    assert t.tp_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert t.dense_dp_groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert t.ep_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert t.edp_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert local_folding_ranks(5, spec)["edp"] == (1, 5)
    with pytest.raises(RuntimeError, match="does not match"):
        assert_group_matches_spec({"ep": [(0, 2, 4, 6)]}, spec)
    with pytest.raises(ValueError, match="Valid autotp_size values: \\[1, 2, 4, 8\\]"):
        build_folding_spec(world_size=8, pp_size=1, tp_size=3, ep_size=1)


def test_section_is_parsed_and_checked() -> None:
    cfg = parse_autoep_config({"enabled": True, "autoep_size": 2, "load_balance_coeff": None})
    assert cfg.autoep_size == 2 and cfg._load_balance_coeff_explicit
    validate_autoep_config(cfg, world_size=4, pp_size=1, tp_size=2, sp_size=1)
    with pytest.raises(ValueError, match="expert_bias"):
        parse_autoep_config({"load_balance_coeff": 0.01})
    with pytest.raises(ValueError, match="mutually exclusive"):
        validate_autoep_config(cfg, world_size=4, pp_size=1, tp_size=2, sp_size=2)
    with pytest.raises(ValueError, match="score_apply"):
        validate_autoep_config(
            AutoEPConfig(enabled=True, score_apply="x"),
            world_size=1,
            pp_size=1,
            tp_size=1,
            sp_size=1,
        )

    class Layer:
        num_experts, moe_module_name = 6, "model.layers.0.mlp"

    with pytest.raises(ValueError, match="Valid autoep_size values: \\[1, 2, 3, 6\\]"):
        validate_autoep_post_detection(AutoEPConfig(enabled=True, autoep_size=4), [Layer()])


def test_fused_gate_up_layouts() -> None:
    first = classify_fused_gate_up_layout((8, 256, 64), (8, 64, 128))
    assert first is not None and (first.hidden_size, first.ffn_hidden_size) == (64, 128)
    hidden = classify_fused_gate_up_layout((8, 64, 256), (8, 128, 64))
    assert hidden is not None and hidden.needs_transpose
    assert classify_fused_gate_up_layout((8, 64, 64), (8, 64, 64)) is None
