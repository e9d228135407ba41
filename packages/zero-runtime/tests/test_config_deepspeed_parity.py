"""Differential test: ds's config loader against DeepSpeed 0.19.8's own verdicts.

``fixtures/deepspeed_verdicts.json`` holds DeepSpeed's documented example configs and seeded
mutations of them (dropped, renamed and misspelt keys, unknown keys, out-of-range values, "auto",
``1e9`` floats for integers, wrong types), each with the accept/reject verdict DeepSpeed 0.19.8
gave (``DeepSpeedConfig`` plus the optimizer and scheduler its engine builds from the config).
``tools/deepspeed_verdicts.py`` writes the file; CI has no DeepSpeed, so the verdicts are data.

ds must agree on every case, except where a documented rule (docs/training.md, "Where ds is
stricter than DeepSpeed") says why ds refuses a config DeepSpeed accepts. Each rule is a predicate
on the case; a disagreement no rule explains fails the test, and so does a rule nothing uses.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ds.interfaces.errors import ConfigError
from ds.zero.config import load_config, resolve

FIXTURE = Path(__file__).parent / "fixtures" / "deepspeed_verdicts.json"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "training.md"
CASES: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["cases"]

# Sections DeepSpeed reads with dict.get and never type-checks (its engine uses the values later).
UNCHECKED = ("activation_checkpointing.", "aio.", "checkpoint.", "flops_profiler.")
WRONG_TYPE = {"auto", "null", "string", "numeric-string", "list", "bool", "int-for-bool", "scalar"}
RANGE_KEYS = {
    "gradient_clipping",
    "gradient_predivide_factor",
    "steps_per_print",
    "fp16.hysteresis",
    "fp16.initial_scale_power",
    "aio.block_size",
    "aio.queue_depth",
    "optimizer.params.lr",
    "optimizer.params.betas",
}


def _value_mutation(case: dict[str, Any]) -> tuple[str, str] | None:
    m = re.match(r"value ([\w.\-]+): ([\w-]+) ", case["mutation"])
    return (m.group(1), m.group(2)) if m else None


def _unchecked_type(case: dict[str, Any]) -> bool:
    vm = _value_mutation(case)
    if vm is None or vm[1] not in WRONG_TYPE:
        return False
    path = vm[0]
    return (
        "." not in path
        or path.startswith(UNCHECKED)
        or path.startswith(("optimizer.params.", "scheduler.params."))
    )


def _unchecked_range(case: dict[str, Any]) -> bool:
    vm = _value_mutation(case)
    return vm is not None and vm[1] in {"negative", "zero"} and vm[0] in RANGE_KEYS


def _offload(case: dict[str, Any]) -> dict[str, Any]:
    zero = case["config"].get("zero_optimization")
    off = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    if isinstance(zero, dict) and zero.get("cpu_offload") is True:
        return {"device": "cpu"}  # the deprecated spelling
    return off if isinstance(off, dict) else {}


def _stage0_offload(case: dict[str, Any]) -> bool:
    zero = case["config"].get("zero_optimization")
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    return _offload(case).get("device", "none") != "none" and stage in (0, "auto")


def _nvme_without_path(case: dict[str, Any]) -> bool:
    off = _offload(case)
    return off.get("device") == "nvme" and off.get("nvme_path") in (None, "auto")


# rule name (as in the docs) -> predicate on a case DeepSpeed accepts and ds refuses
RULES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "unchecked-type": _unchecked_type,
    "unchecked-range": _unchecked_range,
    "stage-0-offload": _stage0_offload,
    "nvme-without-path": _nvme_without_path,
}


def _ds_verdict(config: dict[str, Any]) -> tuple[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            resolve(load_config(config), 1)
        except ConfigError as exc:
            return "reject", str(exc)
    return "accept", ""


def test_fixture_is_large_enough() -> None:
    documented = [c for c in CASES if c["mutation"] == "documented"]
    assert len(documented) >= 12
    assert len(CASES) - len(documented) >= 500
    assert {c["deepspeed"] for c in CASES} == {"accept", "reject"}


@pytest.mark.parametrize(
    "case", [c for c in CASES if c["mutation"] == "documented"], ids=lambda c: c["name"]
)
def test_documented_examples_are_accepted_by_both(case: dict[str, Any]) -> None:
    assert case["deepspeed"] == "accept"
    verdict, message = _ds_verdict(case["config"])
    assert verdict == "accept", message


def test_same_verdict_as_deepspeed_on_every_case() -> None:
    used: dict[str, int] = dict.fromkeys(RULES, 0)
    unexplained: list[str] = []
    for case in CASES:
        verdict, message = _ds_verdict(case["config"])
        if verdict == case["deepspeed"]:
            if verdict == "reject":
                assert message.startswith("invalid ds config"), message
            continue
        rules = [name for name, applies in RULES.items() if applies(case)]
        if case["deepspeed"] == "accept" and rules:
            used[rules[0]] += 1
            continue
        unexplained.append(
            f"{case['name']} [{case['mutation']}]: DeepSpeed {case['deepspeed']}s "
            f"({case['error'][:120]}), ds {verdict}s ({message[:200]})"
        )
    assert not unexplained, "\n".join(unexplained)
    assert all(used.values()), f"a documented exception no case needs: {used}"


def test_refusals_name_the_mutated_key() -> None:
    # Every refusal of a mutated key names that key (or, for a misspelt one, the key it ignored).
    for case in CASES:
        m = re.match(r"(?:value|drop|set|add unknown) ([\w.\-]+)", case["mutation"]) or re.match(
            r"rename [\w.]+ -> (\S+)", case["mutation"]
        )
        verdict, message = _ds_verdict(case["config"])
        if m is None or verdict == "accept":
            continue
        key = m.group(1).split("=")[0].split(".")[-1]
        assert key in message, (case["mutation"], message)


def test_deliberate_exceptions_are_documented() -> None:
    text = DOCS.read_text()
    for name in RULES:
        assert f"`{name}`" in text, f"docs/training.md does not list the exception {name!r}"
