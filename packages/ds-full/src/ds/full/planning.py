"""``ds estimate`` and ``ds autotune``, wired: ds-autotune's commands with this root's parts.

ds-autotune plans runs but declares only ds-interfaces and ds-sim, so what its commands need of
the rest of ds is handed to them here: the engine an estimate measures (``initialize``) and how a
trial runs the user's script (``ds run`` from ds-launcher, and the trial description the engine
reads, :mod:`ds.full.autotune_trial`). Registered as the ``estimate`` and ``autotune`` verbs of
the ``ds.cli`` group in ds-full's pyproject.
"""

from __future__ import annotations

import sys

from ds.autotune.tune import TrialHarness


def trial_harness() -> TrialHarness:
    """``ds run`` (this interpreter's ds-launcher) started with an autotune trial's variables."""
    from ds.full import autotune_trial

    return TrialHarness(
        launch=(sys.executable, "-m", "ds.launcher", "run"),
        environment=autotune_trial.environment,
    )


def estimate_main(argv: list[str]) -> int:
    """``ds estimate``: ds-autotune's command measuring this root's ``initialize``."""
    from ds.autotune import estimate_cli
    from ds.full.training import initialize

    return estimate_cli.main(argv, initialize=initialize)


def autotune_main(argv: list[str]) -> int:
    """``ds autotune``: ds-autotune's command with this root's engine and trial harness."""
    from ds.autotune import tune_cli
    from ds.full.training import initialize

    return tune_cli.main(argv, initialize=initialize, harness=trial_harness())


__all__ = ["autotune_main", "estimate_main", "trial_harness"]
