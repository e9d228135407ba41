"""Run DeepSpeed's own unit tests against DeepSpeed 0.19.8 and against ds's ``deepspeed`` shim.

    python tools/deepspeed_suite.py /path/to/DeepSpeed [--files runtime/pipe/test_topology.py ...]

The source checkout gives ``tests/unit``; it is copied into a work folder without the checkout's
``deepspeed/`` package (DeepSpeed's tests/conftest.py puts the checkout first on sys.path, which
would import the source tree instead of what is measured). Each file runs as DeepSpeed's CPU CI
runs it (``cd tests && pytest --forked unit/FILE`` with ``DS_ACCELERATOR=cpu``), twice:

- ``deepspeed``: a throwaway venv with ``deepspeed==0.19.8`` (``DS_BUILD_OPS=0``), torch, pytest
  and pytest-forked (made with pip on first use, reused after);
- ``ds``: a throwaway venv that sees this environment's packages (ds and its dependencies) with
  ``ds compat enable`` run in it, so ``import deepspeed`` is ds's shim, plus pytest-forked.

It prints, per file, passed/failed/skipped for both and the ratio of ds's passes to DeepSpeed's,
and writes the counts as JSON (``--json``, after every file; a file already there is not run
again, so a stopped run resumes). Files run one by one, each under both sides before the next.
A benchmark, not a test: CI does not run it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

DEEPSPEED_VERSION = "0.19.8"
TORCH_VERSION = "2.13.0"
# pytest-forked 1.7.5 reports every forked test of pytest 9 as "EXITED with status 3".
PYTEST = "pytest<8.4"
_HAS_RUNNER = "import pytest, pytest_forked; assert int(pytest.__version__.split('.')[0]) < 9"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def deepspeed_venv(root: Path) -> Path:
    """DeepSpeed 0.19.8 (no ops prebuilt, as a CPU install has) with pytest-forked."""
    py = _python(root)
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(root)])
    check = (
        f"{_HAS_RUNNER}; import deepspeed; assert deepspeed.__version__ == {DEEPSPEED_VERSION!r}"
    )
    ok = subprocess.run([str(py), "-c", check], capture_output=True).returncode == 0
    if not ok:
        env = dict(os.environ, DS_BUILD_OPS="0")
        _run([str(py), "-m", "pip", "install", "-q", f"deepspeed=={DEEPSPEED_VERSION}",
              f"torch=={TORCH_VERSION}", PYTEST, "pytest-forked"], env=env)  # fmt: skip
    return py


def ds_venv(root: Path) -> Path:
    """A venv seeing this environment's site-packages, with ``ds compat enable`` run in it."""
    py = _python(root)
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(root)])
        purelib = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirs = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
        lines = "".join(
            f"import site; site.addsitedir({d!r})\n"
            for d in dict.fromkeys(dirs)
            if Path(d).is_dir()
        )
        Path(purelib, "ds_suite_env.pth").write_text(lines)
    # DeepSpeed's tests import py-cpuinfo and hjson themselves (dependencies DeepSpeed installs).
    need = f"{_HAS_RUNNER}; import cpuinfo, hjson"
    if subprocess.run([str(py), "-c", need], capture_output=True).returncode:
        _run(
            [str(py), "-m", "pip", "install", "-q", PYTEST, "pytest-forked", "py-cpuinfo", "hjson"]
        )
    _run([str(py), "-m", "ds.launcher", "compat", "enable"], stdout=subprocess.DEVNULL)
    check = "import deepspeed; print(deepspeed.__name__)"
    name = subprocess.run([str(py), "-c", check], capture_output=True, text=True).stdout.strip()
    if name != "ds.full.compat.deepspeed":
        raise SystemExit(f"'import deepspeed' in {root} gives {name!r}, not ds's shim")
    return py


def copy_tests(source: Path, work: Path) -> Path:
    """``source``/tests without the checkout's deepspeed package beside it."""
    tests = source / "tests"
    if not (tests / "unit").is_dir():
        raise SystemExit(f"{source} has no tests/unit: give the root of a DeepSpeed checkout")
    dest = work / "tests"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tests, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def count(xml: Path) -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0}
    if not xml.exists():
        return out
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            out["failed"] += 1
        elif "skipped" in kinds:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def run_file(py: Path, tests: Path, rel: str, timeout: int, log_dir: Path, tag: str) -> dict:
    xml = log_dir / f"{tag}-{rel.replace('/', '__')}.xml"
    xml.unlink(missing_ok=True)
    cmd = [str(py), "-m", "pytest", "--forked", f"unit/{rel}", "-q", "-p", "no:cacheprovider",
           f"--junitxml={xml}", f"--torch_ver={TORCH_VERSION.rsplit('.', 1)[0]}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(DS_ACCELERATOR="cpu", HF_HOME=str(log_dir / "hf_home"), PYTHONUNBUFFERED="1")
    # As in an activated venv: the launcher tests run the `deepspeed` command by name.
    env["PATH"] = os.pathsep.join([str(py.parent), env.get("PATH", "")])
    log = log_dir / f"{tag}-{rel.replace('/', '__')}.log"
    with log.open("w") as f:
        # Its own session: on a timeout the whole tree goes (DeepSpeed's distributed tests leave
        # forkserver and worker processes behind otherwise).
        proc = subprocess.Popen(
            cmd, cwd=tests, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            # pytest stops on SIGINT and still writes its junit XML: the tests finished before the
            # time ran out count, instead of the whole file reading as nothing.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of a finished run too
            proc.wait()
    got = count(xml)
    got["timed_out"] = int(timed_out)
    return got


def cpu_files(tests: Path) -> list[str]:
    unit = tests / "unit"
    return sorted(str(p.relative_to(unit)) for p in unit.rglob("test_*.py"))


_ERROR = re.compile(r"\b(\w+(?:Error|Exception)): (.+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_error(log: Path) -> str:
    """The first ``SomethingError: message`` line of a run's log (what stopped ds's run of a
    file, most often an import), or "-"."""
    if not log.exists():
        return "-"
    for line in log.read_text(errors="replace").splitlines():
        m = _ERROR.search(_ANSI.sub("", line))
        if m:
            return f"{m.group(1)}: {m.group(2).strip()[:120]}"
    return "-"


def outcomes(xml: Path) -> dict[tuple[str, str], list[tuple[str, bool]]]:
    """Per (class, function): its cases in run order, as (test id, passed)."""
    out: dict[tuple[str, str], list[tuple[str, bool]]] = {}
    if not xml.exists():
        return out
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "")
        key = (case.get("classname", ""), name.split("[")[0])
        ok = not {child.tag for child in case} & {"failure", "error", "skipped"}
        out.setdefault(key, []).append((name, ok))
    return out


def shared_passes(deepspeed_xml: Path, ds_xml: Path) -> tuple[int, int]:
    """(tests DeepSpeed passes, how many of them ds passes too). A case is matched by its test
    id when ds ran a case of that id (parametrizations listed from the shim's own modules come in
    another order), else by its position among the function's cases (ids that print objects
    differ between the two runs)."""
    ref, mine = outcomes(deepspeed_xml), outcomes(ds_xml)
    total = both = 0
    for key, cases in ref.items():
        theirs = mine.get(key, [])
        by_id = dict(theirs)
        for i, (name, ok) in enumerate(cases):
            if not ok:
                continue
            total += 1
            if name in by_id:
                both += by_id[name]
            elif i < len(theirs) and theirs[i][0] not in {n for n, _ in cases}:
                both += theirs[i][1]
    return total, both


def table(rows: dict[str, dict[str, dict]], logs: Path | None = None) -> str:
    """Per file: both sides' counts and the ratio; with ``logs``, for each file where ds passes
    less than 80% of what DeepSpeed passes, the first error of ds's run."""
    head = "| file | DeepSpeed 0.19.8 pass/fail/skip | ds pass/fail/skip | ds / DeepSpeed |"
    sep = "|---|---|---|---|"
    if logs is not None:
        head, sep = head + " ds's first error (below 80%) |", sep + "---|"
    lines = [head, sep]
    tot = {"deepspeed": 0, "ds": 0}
    for rel, got in rows.items():
        cells = []
        for tag in ("deepspeed", "ds"):
            c = got.get(tag)
            if c is None:
                cells.append("-")
                continue
            tot[tag] += c["passed"]
            mark = " (timed out)" if c.get("timed_out") else ""
            cells.append(f"{c['passed']}/{c['failed']}/{c['skipped']}{mark}")
        ref = got.get("deepspeed", {}).get("passed", 0)
        mine = got.get("ds", {}).get("passed", 0)
        ratio = f"{mine / ref:.0%}" if ref else "-"
        row = f"| {rel} | {cells[0]} | {cells[1]} | {ratio} |"
        if logs is not None:
            why = "-"
            if ref and mine < 0.8 * ref:
                why = first_error(logs / f"ds-{rel.replace('/', '__')}.log").replace("|", "\\|")
            row += f" {why} |"
        lines.append(row)
    ratio = f"{tot['ds'] / tot['deepspeed']:.0%}" if tot["deepspeed"] else "-"
    total = f"| all | {tot['deepspeed']} passed | {tot['ds']} passed | {ratio} |"
    lines.append(total + (" |" if logs is not None else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="root of a DeepSpeed source checkout")
    p.add_argument("--files", nargs="*", default=None,
                   help="test files under tests/unit to run (default: all)")  # fmt: skip
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ds_suite",
                   help="where the venvs, the tests' copy and the logs go")  # fmt: skip
    p.add_argument("--deepspeed-venv", type=Path, default=None,
                   help="venv for DeepSpeed (default WORK/venv-deepspeed; made when absent)")  # fmt: skip
    p.add_argument("--ds-venv", type=Path, default=None,
                   help="venv for ds's shim (default WORK/venv-ds; made when absent)")  # fmt: skip
    p.add_argument("--only", choices=["deepspeed", "ds"], default=None,
                   help="run one side only (the other column reads '-')")  # fmt: skip
    p.add_argument("--timeout", type=int, default=900, help="seconds per file and side")
    p.add_argument("--json", type=Path, default=None,
                   help="write the counts here after every file; files already in it are not re-run")  # fmt: skip
    args = p.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    tests = copy_tests(args.source.resolve(), work)
    files = args.files or cpu_files(tests)
    missing = [f for f in files if not (tests / "unit" / f).is_file()]
    if missing:
        raise SystemExit(f"not under tests/unit: {', '.join(missing)}")
    sides = [args.only] if args.only else ["deepspeed", "ds"]
    pythons = {
        "deepspeed": lambda: deepspeed_venv(args.deepspeed_venv or work / "venv-deepspeed"),
        "ds": lambda: ds_venv(args.ds_venv or work / "venv-ds"),
    }
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    rows: dict[str, dict[str, dict]] = {f: {} for f in files}
    done = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    made = {tag: pythons[tag]() for tag in sides}
    # File by file, both sides before the next file: a run stopped part way still compares like
    # with like, and the JSON (rewritten after every file) lets a later run resume it.
    for rel in files:
        for tag in sides:
            got = done.get(rel, {}).get(tag)
            if got is None:
                got = run_file(made[tag], tests, rel, args.timeout, logs, tag)
                print(f"{tag:9s} {rel}: {got}", file=sys.stderr, flush=True)
            rows[rel][tag] = got
        if args.json:
            args.json.write_text(json.dumps({**done, **rows}, indent=1))
    print(table(rows, logs))
    if len(sides) == 2:
        pairs = [
            shared_passes(logs / f"deepspeed-{k}.xml", logs / f"ds-{k}.xml")
            for k in (rel.replace("/", "__") for rel in files)
        ]
        total, both = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        share = f" ({both / total:.1%})" if total else ""
        print(f"DeepSpeed's passing tests that ds also passes: {both} of {total}{share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
