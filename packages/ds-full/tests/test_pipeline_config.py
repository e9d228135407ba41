"""The pipeline section of the config, checked before anything is built: one-line errors."""

from __future__ import annotations

import pytest

from ds.full.pipeline import settings
from ds.interfaces.errors import ConfigError
from ds.zero.config import load_config


class _Model:
    def __init__(self, num_stages: int | None) -> None:
        self.num_stages = num_stages


def _cfg(**extra: object):  # type: ignore[no-untyped-def]
    return load_config({"train_micro_batch_size_per_gpu": 1, **extra})


def test_stages_from_the_config_or_the_module() -> None:
    assert settings(_cfg(pipeline={"stages": 2}), _Model(None)) == (2, "1f1b")
    assert settings(_cfg(pipeline={"schedule": "gpipe"}), _Model(4)) == (4, "gpipe")
    assert settings(_cfg(), _Model(2)) == (2, "1f1b")


@pytest.mark.parametrize(
    ("extra", "stages", "words"),
    [
        ({"pipeline": {"stages": 2}}, 4, ["pipeline.stages=2", "num_stages=4"]),
        ({"pipeline": {"schedule": "zb"}}, 2, ["'zb'", "interleaved_1f1b"]),
        ({"zero_optimization": {"stage": 2}}, 2, ["stage=2", "stage 0 or 1"]),
        ({}, None, ["num_stages", "pipeline.stages"]),
    ],
)
def test_bad_pipeline_settings_are_one_line(
    extra: dict, stages: int | None, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as e:
        settings(_cfg(**extra), _Model(stages))
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg
