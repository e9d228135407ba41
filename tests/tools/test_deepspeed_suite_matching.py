"""tools/deepspeed_suite.py counts, test by test, which of DeepSpeed's passing tests ds passes:
a case matches by its id when ds ran that id, else by its position among the function's cases."""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import quoteattr

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import deepspeed_suite as suite


def _xml(path: Path, cases: list[tuple[str, bool]]) -> Path:
    body = "".join(
        f'<testcase classname="unit.t" name={quoteattr(n)}>{"" if ok else "<failure/>"}</testcase>'
        for n, ok in cases
    )
    path.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


def test_cases_match_by_id_then_by_position(tmp_path: Path) -> None:
    deepspeed = _xml(
        tmp_path / "a.xml",
        [("f[npu]", True), ("f[cuda]", True), ("f[cpu]", True), ("g[<obj 1>]", True),
         ("g[<obj 2>]", True), ("h", False)],
    )  # fmt: skip
    ds = _xml(
        tmp_path / "b.xml",
        [("f[cuda]", True), ("f[cpu]", False), ("g[<obj 9>]", True), ("g[<obj 8>]", False),
         ("h", True)],
    )  # fmt: skip
    # f: cuda by id (pass), cpu by id (fail), npu: ds's first case is an id DeepSpeed has, so
    # no positional match; g: by position (pass, fail); h: DeepSpeed failed it, not counted.
    assert suite.shared_passes(deepspeed, ds) == (5, 2)
    assert suite.shared_passes(deepspeed, tmp_path / "missing.xml") == (5, 0)
