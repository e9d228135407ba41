from __future__ import annotations

import subprocess
import sys

import pytest

from ds.interfaces import registry
from ds.launcher import cli


def test_help_lists_builtin_and_plugin_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    registry.register(registry.CLI, "zz.test", lambda: lambda argv: 0)
    try:
        assert cli.main(["--help"]) == 0
    finally:
        registry.unregister(registry.CLI, "zz.test")
    out = capsys.readouterr().out
    assert "run" in out and "report" in out
    assert "zz test" in out


def test_longest_verb_path_wins(capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, list[str]]] = []
    registry.register(registry.CLI, "zz", lambda: lambda argv: calls.append(("zz", argv)) or 0)
    registry.register(
        registry.CLI, "zz.deep", lambda: lambda argv: calls.append(("deep", argv)) or 3
    )
    try:
        assert cli.main(["zz", "deep", "--x", "1"]) == 3
        assert cli.main(["zz", "other"]) == 0
    finally:
        registry.unregister(registry.CLI, "zz")
        registry.unregister(registry.CLI, "zz.deep")
    assert calls == [("deep", ["--x", "1"]), ("zz", ["other"])]


def test_unknown_verb_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown command 'frobnicate'" in err


def test_help_does_not_import_plugins_or_torch() -> None:
    code = (
        "import sys; from ds.launcher import cli; cli.main(['--help']); "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('ds.comm', "
        "'ds.inference', 'ds.checkpoint', 'structlog'))]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_report_json_has_every_section() -> None:
    import json

    out = subprocess.run(
        [sys.executable, "-m", "ds.launcher.cli", "report", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    data = json.loads(out.stdout)
    for key in (
        "python",
        "torch",
        "accelerator",
        "ds distributions",
        "kernels",
        "comm",
        "/dev/shm",
        "cpu",
    ):
        assert key in data
    assert data["ds distributions"]["ds-launcher"]
    assert data["torch"]["version"].startswith("2.")
    assert data["cpu"]["usable_cores"] >= 1
    assert data["/dev/shm"]["total_bytes"] > 0
    assert data["comm"]["torch"]["gloo"] is True


def test_report_text() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ds.launcher.cli", "report"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.startswith("python\n  version: ")
    assert "\ntorch\n" in out.stdout and "\ncpu\n" in out.stdout


def test_launcher_parent_never_imports_torch_or_structlog(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "job.py"
    script.write_text("print('hello')\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "ds.launcher.cli",
            "run",
            "--nproc",
            "1",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[rank0] hello" in proc.stdout
    parent = [
        ln.rsplit("|", 1)[-1].strip()
        for ln in proc.stderr.splitlines()
        if ln.startswith("import time:")
    ]
    assert "ds.launcher.run_cmd" in parent
    assert "torch" not in parent and "structlog" not in parent


def test_report_reads_kernel_and_accelerator_providers() -> None:
    from ds.launcher import report

    try:
        from ds.ops.provider import CpuKernelProvider
    except ImportError as exc:  # pragma: no cover - depends on the installed distributions
        pytest.skip(f"ds-ops-kernels is not importable here: {exc}")
    registry.register(registry.KERNELS, "cpu", lambda: CpuKernelProvider)
    try:
        kernels = report.kernels_info()
    finally:
        registry.unregister(registry.KERNELS, "cpu")
    assert kernels["cpu"]["simd_level"] in {"scalar", "avx2", "avx512", "avx512_bf16", "neon"}
    assert "build_flags" in kernels["cpu"]
    acc = report.accelerator_info()
    if "error" not in acc:  # ds-accel-abstraction installed: the cpu accelerator is always there
        assert acc["devices"]["cpu"]["available"] is True
        assert acc["devices"]["cpu"]["comm_backend"] == "gloo"


def test_report_survives_a_broken_provider() -> None:
    from ds.launcher import report

    def broken() -> object:
        raise RuntimeError("driver exploded")

    registry.register(registry.KERNELS, "zz-broken", broken)
    try:
        kernels = report.kernels_info()
    finally:
        registry.unregister(registry.KERNELS, "zz-broken")
    assert kernels["zz-broken"] == {"error": "RuntimeError: driver exploded"}
    text = report.render_text({"kernels": kernels})
    assert "error: RuntimeError: driver exploded" in text
