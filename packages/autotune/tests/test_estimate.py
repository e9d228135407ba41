"""``ds estimate``: per-rank memory measured on the simulated world, against the closed forms."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ds.autotune import deepspeed_estimate, estimate, model_state_bytes
from ds.autotune.model_spec import from_hf_config
from ds.full import initialize  # the engine measured: ds-full hands it to `ds estimate`
from ds.interfaces.errors import ConfigError

# Every matrix above stage 3's default persistence threshold (1e5 elements), so it partitions.
TINY = {
    "model_type": "llama",
    "hidden_size": 384,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "vocab_size": 512,
}


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps(TINY))
    return from_hf_config(d, torch.bfloat16)


def test_deepspeed_formulae_as_in_its_source() -> None:
    p, big = 1_000_000, 100_000
    # stage 2, no offload, 8 GPUs on one node: 2 + 18/8 bytes per parameter on the device
    assert deepspeed_estimate(p, big, 2, 8, 1, offload_optimizer=False) == (
        int(p * 4 * 8 * 1.5),
        2 * p + int(18 * p / 8),
    )
    assert deepspeed_estimate(p, big, 2, 8, 1, offload_optimizer=True) == (int(p * 32 * 1.5), 2 * p)
    assert deepspeed_estimate(p, big, 3, 8, 2, offload_optimizer=True, offload_param=True) == (
        int(p * 18 * 0.5 * 1.5),
        4 * big,
    )
    assert deepspeed_estimate(p, big, 1, 8, 1, offload_optimizer=False) is None
    assert model_state_bytes(p, 3, 8) == 2 * p


@pytest.mark.simgpu
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_simulated_states_follow_the_stages(spec) -> None:  # type: ignore[no-untyped-def]
    psi = spec.params
    rows = {
        (r.stage, r.offload): r
        for r in estimate(
            spec,
            8,
            initialize=initialize,
            stages=(0, 1, 2, 3),
            offloads=("none", "cpu"),
            ranks=(0,),
        )
    }
    # ZeRO-2 with the optimizer on the host keeps the bf16 parameters on the device, no more:
    # DeepSpeed's estimator says the same.
    r = rows[(2, "cpu")]
    assert r.deepspeed_device == 2 * psi
    assert 0 <= r.device_states - 2 * psi < 1024  # plus a few scalars (step count, loss scale)
    assert r.host_peak >= 12 * psi // 8  # fp32 masters + Adam moments of this rank's shard
    # Each stage partitions more: fewer device bytes between steps (stage 3's reduce bucket and
    # gather pool, which do not shrink with the world, keep it above stage 2 on a small model).
    states = [rows[(s, "none")].device_states for s in (0, 1, 2, 3)]
    assert states[0] > states[1] > states[2] and states[3] < states[1]
    # What ds holds is at least the model states of the closed form.
    for r in rows.values():
        assert r.device_states >= 0.95 * r.formula_states, r
    # The step's peak is the states plus activations and buffers.
    assert all(x.device_peak >= x.device_states for x in rows.values())


@pytest.mark.simgpu
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stage3_shrinks_with_the_world(spec) -> None:  # type: ignore[no-untyped-def]
    at = {}
    for w in (2, 8):
        (row,) = estimate(
            spec, w, initialize=initialize, stages=(3,), offloads=("none",), ranks=(0,)
        )
        at[w] = row.device_states
    assert at[8] < at[2]


def test_bad_model_configs_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        from_hf_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read it as a JSON model config"):
        from_hf_config(tmp_path / "bad.json")
    (tmp_path / "nomt.json").write_text('{"hidden_size": 8}')
    with pytest.raises(ConfigError, match="no 'model_type'"):
        from_hf_config(tmp_path / "nomt.json")
    ds_cli = Path(sys.executable).parent / "ds"
    proc = subprocess.run(
        [str(ds_cli), "estimate", "--model", str(tmp_path / "bad.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "cannot read it" in proc.stderr
