"""ds.full's feature report and the registry route adapters use to reach ds.full."""

from __future__ import annotations

import json

import pytest

import ds.full as ds
from ds.interfaces import registry
from ds.interfaces.errors import ProviderNotFoundError


def test_feature_report_lists_distributions_providers_and_integrations() -> None:
    report = ds.feature_report()
    json.dumps(report)  # JSON-ready
    assert report["version"] == ds.version() != "unknown"
    assert report["distributions"]["ds-zero-runtime"] is not None
    assert "default" in report["providers"][registry.INITIALIZE]
    assert "cpu" in report["providers"][registry.ACCELERATORS]
    hf = report["integrations"]["ds-hf"]
    assert hf["usable"] == (hf["installed"] and all(hf["frameworks"].values()))
    assert report["kernels"]["cpu"] == {"devices": ["cpu"]}
    assert report["kernels"]["cuda"]["devices"] == ["cuda"]
    assert report["kernels"]["cuda"]["optimizer_backend"] in ("triton", "torch")


def test_initialize_entry_points_resolve_to_ds_full() -> None:
    from ds.full import adapters

    assert registry.get(registry.INITIALIZE, "default") is ds.initialize
    for name in ("zero_init", "gathered_parameters", "load_state_dict_into_shards"):
        assert registry.get(registry.INITIALIZE, name) is getattr(adapters, name)


def test_missing_initializer_names_ds_full() -> None:
    with pytest.raises(ProviderNotFoundError, match=r"pip install ds-full"):
        registry.get(registry.INITIALIZE, "no-such-initializer")


def test_consolidated_state_dict_below_stage_3_is_the_module_state() -> None:
    import torch

    from ds.full.adapters import consolidated_state_dict

    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5))
    model[1].weight = model[0].weight  # tied, as a language model's head and embedding
    engine, *_ = ds.initialize(
        model=model,
        config={
            "train_batch_size": 2,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": 1},
        },
    )
    sd = consolidated_state_dict(engine, dtype=torch.float64)
    assert set(sd) == {"0.weight", "1.weight", "1.bias"}
    assert sd["1.weight"].dtype == torch.float64
    torch.testing.assert_close(sd["1.weight"], model[1].weight.detach().double())
    # One tensor under both names (save_pretrained writes a tied weight once).
    assert sd["0.weight"] is sd["1.weight"] and sd["1.bias"] is not sd["1.weight"]
