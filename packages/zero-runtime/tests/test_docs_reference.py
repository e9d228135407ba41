"""docs/training.md carries the config reference generated from the models, unchanged."""

from __future__ import annotations

from pathlib import Path

from ds.zero.config.reference import BEGIN, END, markdown

DOC = Path(__file__).resolve().parents[3] / "docs" / "training.md"


def test_training_doc_has_the_current_config_reference() -> None:
    text = DOC.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:stop] == markdown(), (
        "docs/training.md's config reference is stale; regenerate it with "
        "`python -m ds.zero.config.reference` and paste it between the markers"
    )


def test_reference_lists_every_section() -> None:
    ref = markdown()
    for key in (
        "`zero_optimization.stage3_prefetch_bucket_size`",
        "`fp16.hysteresis`",
        "`scheduler.type`",
        "`zero_optimization.offload_optimizer.device`",
        "WarmupCosineLR",
    ):
        assert key in ref or key.replace("stage3_", "") in ref
