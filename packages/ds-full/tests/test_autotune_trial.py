"""The ds autotune trial hook: off without its variable, one clear error for a bad one."""

from __future__ import annotations

import pytest

from ds.full import autotune_trial
from ds.interfaces.errors import ConfigError
from ds.interfaces.telemetry import EventBus, StepMetrics


class _Engine:
    """What the hook uses of an engine: its real event bus."""

    def __init__(self) -> None:
        self.events = EventBus()


def test_outside_a_trial_nothing_is_attached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(autotune_trial.ENV, raising=False)
    engine = _Engine()
    autotune_trial.attach(engine)
    engine.events.publish(StepMetrics(step=100, loss=None, lr=0.0, step_time_s=0.1))  # no exit


@pytest.mark.parametrize("value", ["not json", '{"result": "x"}', '{"result": "x", "start": "a"}'])
def test_a_bad_trial_description_is_one_config_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(autotune_trial.ENV, value)
    with pytest.raises(ConfigError, match="is not a trial description"):
        autotune_trial.attach(_Engine())


def test_the_trial_ends_after_its_last_step_with_each_ranks_times(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    import json

    result = tmp_path / "t"
    monkeypatch.setenv(
        autotune_trial.ENV, json.dumps({"result": str(result), "start": 1, "end": 3})
    )
    engine = _Engine()
    autotune_trial.attach(engine)
    for step in (1, 2):
        engine.events.publish(StepMetrics(step=step, loss=None, lr=0.0, step_time_s=0.5 * step))
    with pytest.raises(SystemExit) as ended:
        engine.events.publish(StepMetrics(step=3, loss=None, lr=0.0, step_time_s=2.0, samples=8))
    assert ended.value.code == 0
    got = json.loads((tmp_path / "t.rank0").read_text())
    assert got["step_times_s"] == [1.0, 2.0] and got["samples_per_step"] == 8


def test_the_wired_harness_sets_what_the_hook_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from ds.full.planning import trial_harness

    harness = trial_harness()
    assert list(harness.launch[1:]) == ["-m", "ds.launcher", "run"]
    for key, value in harness.environment(str(tmp_path / "t"), 0, 1).items():
        monkeypatch.setenv(key, value)
    engine = _Engine()
    autotune_trial.attach(engine)
    with pytest.raises(SystemExit):
        engine.events.publish(StepMetrics(step=1, loss=None, lr=0.0, step_time_s=0.5, samples=2))
    assert (tmp_path / "t.rank0").exists()


def test_the_planning_verbs_are_the_composition_roots() -> None:
    from ds.full import planning
    from ds.interfaces import registry

    verbs = registry.list_providers(registry.CLI)
    for verb, main in (("estimate", planning.estimate_main), ("autotune", planning.autotune_main)):
        assert verbs[verb].distribution == "ds-full"
        assert registry.get(registry.CLI, verb) is main
