"""Prints what the rank's interpreter looks like under ds run's hang reporting (no torch)."""

import os
import sys
import threading

import sitecustomize

print(
    "HOOK",
    f"pythonpath={os.environ.get('PYTHONPATH', '<unset>')}",
    f"heartbeat_env={any(k.startswith('DS_HEARTBEAT') for k in os.environ)}",
    f"hook_on_path={any('_rankhook' in p for p in sys.path)}",
    f"user_site={getattr(sitecustomize, 'USER_SITECUSTOMIZE', False)}",
    f"thread={'ds-heartbeat' in [t.name for t in threading.enumerate()]}",
    flush=True,
)
