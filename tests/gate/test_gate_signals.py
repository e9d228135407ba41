"""The readiness gate on measured signals: real 2-rank runs where the host step or a peer is made
slow raise the term that measures it and fail the gate; a clean run passes; every assessment in
the ledger recomputes from its recorded inputs (``ds ledger rescore``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DS = Path(sys.executable).parent / "ds"


def _run(scenario: str, out: Path) -> dict:
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [str(DS), "run", "--nproc", "2", str(HERE / "_worker.py"), scenario, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads((out / "assessment.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, Path]]:
    base = tmp_path_factory.mktemp("gate")
    return {s: (_run(s, base / s), base / s) for s in ("clean", "slow_host", "slow_peer")}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_clean_run_passes_and_slow_runs_fail_on_their_term(runs) -> None:  # type: ignore[no-untyped-def]
    clean, host, peer = (runs[s][0] for s in ("clean", "slow_host", "slow_peer"))
    assert clean["passed"], clean
    assert clean["metrics"]["ddi.sync_wait"] > 0, "gradient all-reduce time was not measured"
    assert clean["metrics"]["ddi.offload"] == 0  # no offload configured
    assert clean["metrics"]["zomm"] > 0  # host RSS against the device's memory was measured

    assert host["metrics"]["ddi.offload"] > 0.25 > clean["metrics"]["ddi.offload"]
    assert not host["passed"] and host["metrics"]["ddi"] > 10.0, host

    assert peer["metrics"]["ddi.sync_wait"] > 0.25
    assert peer["metrics"]["ddi.sync_wait"] > 3 * clean["metrics"]["ddi.sync_wait"]
    assert not peer["passed"] and peer["metrics"]["ddi"] > 10.0, peer


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_assessment_recomputes_from_the_ledger(runs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for _, out in runs.values():
        proc = subprocess.run(
            [str(DS), "ledger", "rescore", str(out / "ledger.jsonl")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "recomputed, matches" in proc.stdout
    # An edited recorded score no longer follows from the inputs.
    from ds.checkpoint.rescore import rescore_record

    lines = (runs["slow_host"][1] / "ledger.jsonl").read_text().splitlines()
    rec = next(json.loads(x) for x in lines if json.loads(x)["kind"] == "readiness_assessment")
    assert rescore_record(rec["i"], rec["payload"]).ok
    forged = dict(rec["payload"], score=100.0, passed=True)
    result = rescore_record(rec["i"], forged)
    assert not result.ok and any(p.startswith("score") for p in result.problems)
