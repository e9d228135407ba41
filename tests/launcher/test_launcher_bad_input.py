"""Bad input: one clear line on stderr, exit code 2, no rank started."""

from __future__ import annotations

from pathlib import Path

import pytest


def _check(proc, marker: Path, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ds run: error: ")
    assert needle in lines[0]
    assert proc.stdout == ""
    assert not marker.exists(), "a rank was started despite bad input"


@pytest.mark.timeout(60)
def test_missing_script(run_ds, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = run_ds("--nproc", "2", str(tmp_path / "nope.py"))
    _check(proc, tmp_path / "marker", "nope.py' does not exist")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("hostfile", "extra", "needle"),
    [
        ("", [], "no hosts found"),
        ("# only a comment\n\n", [], "no hosts found"),
        ("localhost slots=2\nworker1 slots=two\n", [], "hostfile:2: expected 'slots=N'"),
        ("localhost slots=2\n", ["--include", "worker9"], "unknown host 'worker9'"),
        ("localhost slots=2\n", ["--include", "localhost:5"], "has no slot 5"),
        ("localhost slots=2\n", ["--num_nodes", "3"], "only 1 host(s)"),
    ],
)
def test_bad_hostfile_and_filters(  # type: ignore[no-untyped-def]
    run_ds, scripts: Path, env_for, tmp_path: Path, hostfile: str, extra: list[str], needle: str
) -> None:
    hf = tmp_path / "hostfile"
    hf.write_text(hostfile)
    marker = tmp_path / "marker"
    proc = run_ds(
        "--hostfile", str(hf), *extra, str(scripts / "marker.py"), env=env_for(MARKER=str(marker))
    )
    _check(proc, marker, needle)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--num_gpus", "2", "--nproc", "3"], "--num_gpus 2 and --nproc 3 conflict"),
        (["--hostfile", "/nonexistent/hosts"], "does not exist"),
        (["--include", "a", "--exclude", "b"], "mutually exclusive"),
        (["--nproc", "0"], "must be >= 1"),
        (["--env", "NOEQUALS"], "expected KEY=VAL"),
        (["--max_restarts", "-1"], "must be >= 0"),
        (["--launcher", "tcp"], "--launcher 'tcp': unknown runner (available: impi, mpich"),
        (["--bogus"], "unrecognized arguments"),
        (["--collective_timeout", "-1"], "--collective_timeout '-1': expected seconds > 0"),
        (["--collective-timeout", "soon"], "--collective_timeout 'soon': expected seconds > 0"),
        (
            ["--launcher", "openmpi", "--collective_timeout", "5"],
            "--collective_timeout (or $DS_COLLECTIVE_TIMEOUT) needs ranks started by ds: the "
            "openmpi runner starts them itself",
        ),
    ],
)
def test_bad_flags(
    run_ds, scripts: Path, env_for, tmp_path: Path, args: list[str], needle: str
) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    proc = run_ds(*args, str(scripts / "marker.py"), env=env_for(MARKER=str(marker)))
    _check(proc, marker, needle)


@pytest.mark.timeout(60)
def test_bad_collective_timeout_in_the_environment(
    run_ds, scripts: Path, env_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    env = env_for(MARKER=str(marker), DS_COLLECTIVE_TIMEOUT="inf")
    proc = run_ds("--nproc", "2", str(scripts / "marker.py"), env=env)
    _check(proc, marker, "DS_COLLECTIVE_TIMEOUT 'inf': expected seconds > 0 (e.g. 600), or 0")
