"""``ds compat enable | disable | status``: the opt-in, reversible ``deepspeed`` API route.

``enable`` writes one ``.pth`` file into this environment's site-packages; at interpreter start it
loads :mod:`ds.full.compat._hook` (a few microseconds, no ds or torch import) which serves
``import deepspeed`` and ``importlib.metadata`` for ``deepspeed`` from ds **only when no DeepSpeed is
installed** and says so in one line when it first does. It also writes a ``deepspeed`` launcher
command beside ``ds`` (DeepSpeed's launcher arguments, run by ``ds run``), unless a real DeepSpeed
is installed or a ``deepspeed`` command that is not ds's is already there. ``disable`` deletes both. Nothing else in the
environment changes; ``pip`` never sees a ``deepspeed`` distribution.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "ds_deepspeed_api.pth"
COMMAND_MARK = "# ds compat: the deepspeed launcher command, run by 'ds run'"


def pth_path(site_dir: str | None = None) -> Path:
    return Path(site_dir or sysconfig.get_paths()["purelib"]) / PTH_NAME


def pth_line(hook_file: str) -> str:
    # One ``import`` line (site.py executes those); it loads the hook by path, under its package
    # name, so enabling costs no import of ds.full (or torch) in processes that never use it.
    # importlib.machinery is already loaded at start-up (importlib.util would pull contextlib).
    code = (
        "try:\n"
        " import importlib.machinery as im\n"
        " n = 'ds.full.compat._hook'\n"
        f" m = type(sys)(n); m.__file__ = {hook_file!r}\n"
        " im.SourceFileLoader(n, m.__file__).exec_module(m)\n"
        " sys.modules.setdefault(n, m); m.activate()\n"
        "except Exception as e:\n"
        " print('ds: the deepspeed API hook could not start:', e, file=sys.stderr)\n"
    )
    return f"import sys; exec({code!r})\n"


def command_path(site_dir: str | None = None, bin_dir: str | None = None) -> Path | None:
    """Where the ``deepspeed`` command goes: ``bin_dir``, else this environment's scripts folder
    when ``site_dir`` is this environment's (None); with another ``site_dir`` and no ``bin_dir``,
    nowhere."""
    if bin_dir is None and site_dir is not None:
        return None
    return Path(bin_dir or sysconfig.get_paths()["scripts"]) / "deepspeed"


def _is_ours(path: Path) -> bool:
    try:
        return COMMAND_MARK in path.read_text(encoding="utf-8", errors="replace")[:400]
    except OSError:
        return False


def write_command(path: Path) -> bool:
    """Write the ``deepspeed`` command unless another program of that name is there."""
    if path.exists() and not _is_ours(path):
        return False
    path.write_text(
        f"#!{sys.executable}\n{COMMAND_MARK} ('ds compat disable' removes it)\n"
        "import sys\n\n"
        "from ds.full.compat.deepspeed.launcher.runner import main\n\n"
        "sys.exit(main())\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return True


def enable(site_dir: str | None = None, bin_dir: str | None = None) -> Path:
    from ds.full.compat import _hook

    path = pth_path(site_dir)
    path.write_text(pth_line(os.path.abspath(_hook.__file__)), encoding="utf-8")
    command = command_path(site_dir, bin_dir)
    if command is None:
        return path
    if _hook.DeepSpeedApiFinder().real_deepspeed_spec() is not None:
        # The hook stands aside for a real DeepSpeed; so does the command (its own is DeepSpeed's).
        print(
            "ds compat: a real DeepSpeed is installed; no deepspeed command written",
            file=sys.stderr,
        )
    elif not write_command(command):
        print(
            f"ds compat: {command} is not ds's; left as it is ('ds run' takes the same arguments)",
            file=sys.stderr,
        )
    return path


def disable(site_dir: str | None = None, bin_dir: str | None = None) -> bool:
    path = pth_path(site_dir)
    command = command_path(site_dir, bin_dir)
    if command is not None and _is_ours(command):
        command.unlink()
    if path.exists():
        path.unlink()
        return True
    return False


def status(site_dir: str | None = None) -> str:
    from ds.full.compat import _hook

    enabled = pth_path(site_dir).exists()
    finder = _hook.DeepSpeedApiFinder()
    real = finder.real_deepspeed_spec()
    if real is not None:
        where = real.origin or "?"
        state = f"a real DeepSpeed is installed ({where}): 'import deepspeed' gives it"
        if enabled:
            state += "; the ds hook is enabled but stands aside"
        return state
    if enabled:
        return (
            f"enabled ({pth_path(site_dir)}): 'import deepspeed' is served by ds, as "
            f"deepspeed {_hook.served_version()}"
        )
    return "disabled: 'import deepspeed' fails here (no DeepSpeed installed); 'ds compat enable'"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="ds compat",
        description="Serve the deepspeed API from ds in this environment (only where no DeepSpeed "
        "is installed), so unchanged scripts and transformers/accelerate use ds.",
    )
    p.add_argument("action", choices=["enable", "disable", "status"])
    p.add_argument("--site-dir", default=None, help="site-packages folder (default: this env's)")
    p.add_argument(
        "--bin-dir", default=None, help="where the deepspeed command goes (default: this env's)"
    )
    args = p.parse_args(argv)
    if args.action == "enable":
        path = enable(args.site_dir, args.bin_dir)
        print(f"enabled: {path}")
        command = command_path(args.site_dir, args.bin_dir)
        if command is not None and _is_ours(command):
            print(f"deepspeed command: {command} (runs 'ds run')")
        print(status(args.site_dir))
    elif args.action == "disable":
        print("disabled" if disable(args.site_dir, args.bin_dir) else "was not enabled")
    else:
        print(status(args.site_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
