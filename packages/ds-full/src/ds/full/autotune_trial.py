"""One ``ds autotune`` trial inside the user's unchanged training script.

``ds autotune`` starts the script once per candidate config with ``DS_AUTOTUNE_TRIAL`` set to a
JSON object ``{"result": PATH, "start": S, "end": E}``. The engine then times optimizer steps
``S+1 .. E`` (the first ``S`` warm up: allocation, first gathers, caches), and after step ``E``
each rank writes ``PATH.rank<r>`` (its step times, samples per step, peak RSS) and the script
ends there with exit status 0, as DeepSpeed's autotuner ends its trials at
``end_profile_step``. Outside a trial nothing here runs.

Both sides of the variable live here: :func:`environment` writes it (``ds autotune`` runs each
trial with it, wired by :mod:`ds.full.planning`) and :func:`attach` reads it.
"""

from __future__ import annotations

import json
import os
from typing import Any

ENV = "DS_AUTOTUNE_TRIAL"


def environment(result: str, start: int, end: int) -> dict[str, str]:
    """The variables that make a run of the script one trial: steps ``start+1 .. end`` timed,
    ``<result>.rank<r>`` written after step ``end``, then the script ends."""
    return {ENV: json.dumps({"result": result, "start": start, "end": end})}


def attach(engine: Any) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    from ds.interfaces.errors import ConfigError
    from ds.interfaces.telemetry import StepMetrics

    try:
        trial = json.loads(spec)
        path, start, end = str(trial["result"]), int(trial["start"]), int(trial["end"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{ENV}={spec!r} is not a trial description (set by ds autotune): {e}"
        ) from e
    times: list[float] = []

    def record(m: StepMetrics) -> None:
        if m.step > start:
            times.append(float(m.step_time_s))
        if m.step < end:
            return
        out = {
            "rank": m.rank,
            "world_size": m.world_size,
            "step_times_s": times,
            "samples_per_step": m.samples,
            "tokens_per_step": m.tokens,
            "peak_host_rss_bytes": m.peak_host_rss_bytes,
            "peak_device_bytes": m.peak_device_bytes,
        }
        tmp = f"{path}.rank{m.rank}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(out, f)
        os.replace(tmp, f"{path}.rank{m.rank}")
        raise SystemExit(0)  # the trial is over; the exit hook tears the process group down

    engine.events.subscribe(record, StepMetrics)


__all__ = ["ENV", "attach", "environment"]
