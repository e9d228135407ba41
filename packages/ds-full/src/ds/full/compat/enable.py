"""``ds compat enable | disable | status``: the opt-in, reversible ``deepspeed`` API route.

``enable`` writes one ``.pth`` file into this environment's site-packages; at interpreter start it
loads :mod:`ds.full.compat._hook` (a few microseconds, no ds or torch import) which serves
``import deepspeed`` and ``importlib.metadata`` for ``deepspeed`` from ds **only when no DeepSpeed is
installed** and says so in one line when it first does. ``disable`` deletes the file. Nothing else
in the environment changes; ``pip`` never sees a ``deepspeed`` distribution.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "ds_deepspeed_api.pth"


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


def enable(site_dir: str | None = None) -> Path:
    from ds.full.compat import _hook

    path = pth_path(site_dir)
    path.write_text(pth_line(os.path.abspath(_hook.__file__)), encoding="utf-8")
    return path


def disable(site_dir: str | None = None) -> bool:
    path = pth_path(site_dir)
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
    args = p.parse_args(argv)
    if args.action == "enable":
        path = enable(args.site_dir)
        print(f"enabled: {path}")
        print(status(args.site_dir))
    elif args.action == "disable":
        print("disabled" if disable(args.site_dir) else "was not enabled")
    else:
        print(status(args.site_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
