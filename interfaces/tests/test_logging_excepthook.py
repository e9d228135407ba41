import json
import logging
import subprocess
import sys

from ds.interfaces.logging import get_logger


def test_library_logger_is_silent_until_configured(capsys):
    get_logger("ds.test.silent").warning("should not print", x=1)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_library_logger_routes_through_stdlib(caplog):
    with caplog.at_level(logging.INFO, logger="ds.test.routed"):
        get_logger("ds.test.routed").info("hello", k=2)
    assert any("hello" in r.getMessage() and "k=2" in r.getMessage() for r in caplog.records)


def test_cli_logging_json_lines_rank_zero_only():
    code = (
        "from ds.interfaces.logging import configure_cli_logging, get_logger\n"
        "configure_cli_logging()\n"
        "get_logger('ds.cli.test').info('started', step=3)\n"
    )
    out0 = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"RANK": "0", "WORLD_SIZE": "2", "PATH": "/usr/bin:/bin"},
    )
    line = json.loads(out0.stderr.strip().splitlines()[-1])
    assert line["event"] == "started" and line["step"] == 3 and line["rank"] == 0
    out1 = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"RANK": "1", "WORLD_SIZE": "2", "PATH": "/usr/bin:/bin"},
    )
    assert out1.stderr.strip() == ""


def test_uncaught_dserror_is_one_line_and_traceback_on_request():
    code = "import ds.interfaces as i; raise i.ConfigError('bad key foo; did you mean bar')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "ds: ConfigError: bad key foo; did you mean bar (DS_TRACEBACK=1 shows the traceback)"
    ]
    full = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"DS_TRACEBACK": "1", "PATH": "/usr/bin:/bin"},
    )
    assert "Traceback" in full.stderr


def test_other_exceptions_keep_their_traceback():
    out = subprocess.run(
        [sys.executable, "-c", "import ds.interfaces; raise KeyError('x')"],
        capture_output=True,
        text=True,
    )
    assert "Traceback" in out.stderr and "KeyError" in out.stderr
