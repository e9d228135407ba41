"""A rank launcher that forks ranks from a process which has already imported torch.

Each rank of a test world used to be a fresh interpreter importing torch (and often
transformers): 1.5 to 3.5 s of CPU per rank, most of a small world's cost on a 2-core machine.
The zygote pays that once per test worker, then forks a rank per request. A rank is still a
real process with its own environment, arguments, working directory, output files and exit
status, running its script as ``__main__`` the way ``python script.py`` would; only the start
is shared.

The zygote is single-threaded: it forks a reaper per rank, the reaper forks the rank, waits for
it and writes its exit status back on the request's socket (the test process is not the rank's
parent, so it cannot wait for it itself). ``DS_TEST_ZYGOTE=0`` turns the zygote off.

What a fork cannot reproduce is read at library load: OpenMP reads ``OMP_NUM_THREADS`` when
libgomp loads, so a rank whose value differs from the zygote's gets ``torch.set_num_threads``.
``PYTHONWARNINGS`` is read at interpreter start: a rank that sets it gets the warning filters a
fresh interpreter would have after importing the preloaded libraries (theirs first, then its
options, then Python's defaults); only warnings raised while those libraries were imported, in
the zygote, went through other filters.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_PRELOAD = ("torch", "torch.distributed", "transformers.modeling_utils")
# Start-up variables a forked rank reproduces itself (see _replay_warnings).
_REPLAYED = ("PYTHONWARNINGS",)
_BASE_FILTERS: list = []  # the zygote's warning filters before the preload: Python's defaults


# -- the test side ---------------------------------------------------------------------------


class Rank:
    """A forked rank, with the part of ``subprocess.Popen`` the world launcher uses."""

    def __init__(self, conn: socket.socket, out: Path, err: Path | None) -> None:
        self._conn, self._out, self._err = conn, out, err
        self.pid = struct.unpack("!i", _recv_exact(conn, 4))[0]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._conn.setblocking(False)
            try:
                self._read_status()
            except BlockingIOError:
                pass
            finally:
                self._conn.setblocking(True)
        return self.returncode

    def _read_status(self) -> None:
        data = _recv_exact(self._conn, 4)
        self.returncode = struct.unpack("!i", data)[0]
        self._conn.close()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                self._read_status()
            except TimeoutError:
                raise subprocess.TimeoutExpired("rank", timeout or 0) from None
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def output(self) -> tuple[str, str]:
        out = self._out.read_text(errors="replace") if self._out.exists() else ""
        err = self._err.read_text(errors="replace") if self._err and self._err.exists() else ""
        return out, err


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the zygote closed the connection")
        buf += chunk
    return buf


class Zygote:
    """The zygote of this test process: started on first use, stopped at exit."""

    _instance: Zygote | None = None

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ds-zygote-"))
        self.path = self.dir / "sock"
        env = dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
        env.pop("PYTHONWARNINGS", None)  # each rank replays its own
        self.startup = {
            k: v for k, v in env.items() if k.startswith("PYTHON") and k not in _REPLAYED
        }
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(self.path), str(os.getpid())],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while not self.path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the rank zygote did not start")
            time.sleep(0.05)
        self.count = 0

    @classmethod
    def get(cls) -> Zygote | None:
        if os.environ.get("DS_TEST_ZYGOTE", "1") == "0":
            return None
        if cls._instance is None or cls._instance.proc.poll() is not None:
            cls._instance = Zygote()
        return cls._instance

    def can_run(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """A fork behaves as ``python argv`` would for a script file whose environment asks the
        interpreter for nothing different at start-up (PYTHONPATH, sitecustomize, flags)."""
        startup = {k: v for k, v in env.items() if k.startswith("PYTHON") and k not in _REPLAYED}
        return bool(argv) and str(argv[0]).endswith(".py") and startup == self.startup

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], *, merge_stderr: bool = True
    ) -> Rank:
        self.count += 1
        out = self.dir / f"{self.count}.out"
        err = None if merge_stderr else self.dir / f"{self.count}.err"
        request = {
            "argv": [str(a) for a in argv],
            "env": dict(env),
            "cwd": os.getcwd(),
            "out": str(out),
            "err": str(err) if err else None,
        }
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(self.path))
        body = json.dumps(request).encode()
        conn.sendall(struct.pack("!I", len(body)) + body)
        return Rank(conn, out, err)


# -- the zygote side -------------------------------------------------------------------------


def _replay_warnings(options: str) -> None:
    """The filters ``python`` started with ``PYTHONWARNINGS=options`` has once the preloaded
    libraries are imported: the filters they added, then the options (the last one first, as
    the interpreter inserts them), then Python's defaults."""
    import warnings

    added = warnings.filters[: len(warnings.filters) - len(_BASE_FILTERS)]
    opts = [o for o in options.split(",") if o.strip()]
    sys.warnoptions[:] = opts
    warnings.filters[:] = list(_BASE_FILTERS)
    for opt in opts:
        warnings._setoption(opt)  # type: ignore[attr-defined]
    warnings.filters[:] = added + warnings.filters
    warnings._filters_mutated()  # type: ignore[attr-defined]


def _run_rank(req: dict) -> int:
    """In the forked rank: become ``python argv...`` and run the script as ``__main__``."""
    import atexit
    import runpy
    import threading
    import traceback

    out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if req["err"] else out
    os.dup2(out, 1)
    os.dup2(err, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    _replay_warnings(req["env"].get("PYTHONWARNINGS", ""))
    threads = req["env"].get("OMP_NUM_THREADS")
    if threads and threads != "1" and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    argv = req["argv"]
    sys.argv = list(argv)
    code: int = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = str(Path(argv[0]).resolve().parent)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does at exit: join non-daemon threads, then the atexit handlers.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _serve(path: str, parent: int) -> None:
    import importlib
    import warnings

    if os.environ.get("PYTHONWARNINGS") or sys.warnoptions:
        raise SystemExit("the rank zygote starts without PYTHONWARNINGS or -W (ranks replay it)")
    _BASE_FILTERS[:] = warnings.filters
    for name in _PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if warnings.filters[len(warnings.filters) - len(_BASE_FILTERS) :] != _BASE_FILTERS:
        raise SystemExit("a preloaded library changed Python's default warning filters in place")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # reapers are reaped by the kernel
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".tmp")
    os.rename(path + ".tmp", path)
    srv.listen(64)
    srv.settimeout(2.0)
    while True:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            if os.getppid() != parent:
                return  # the test process is gone
            continue
        size = struct.unpack("!I", _recv_exact(conn, 4))[0]
        req = json.loads(_recv_exact(conn, size))
        if os.fork() == 0:  # the reaper
            srv.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            pid = os.fork()
            if pid == 0:
                conn.close()
                os._exit(_run_rank(req))
            conn.sendall(struct.pack("!i", pid))
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                conn.sendall(struct.pack("!i", code))
            os._exit(0)
        conn.close()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
