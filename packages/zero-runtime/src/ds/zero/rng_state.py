"""Each rank's random-number generators (torch, the device's, Python's, numpy's) as a checkpoint
saves and restores them, so a resumed run draws what the uninterrupted run would have."""

from __future__ import annotations

import random
from typing import Any

import torch

from ds.interfaces.accelerator import Accelerator
from ds.interfaces.logging import get_logger

log = get_logger(__name__)


def rng_state(accelerator: Accelerator | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {
        "rng.torch": torch.random.get_rng_state(),
        "rng.python": random.getstate(),
    }
    if accelerator is not None:
        # The rank's device generator (CUDA's on a GPU: dropout and random init on the device
        # draw from it), read through the accelerator's RNG API, with the device type it
        # belongs to so a load on another kind of device leaves it alone.
        state["rng.device"] = accelerator.get_rng_state().cpu()
        state["rng.device_type"] = accelerator.name()
    try:
        import numpy as np

        state["rng.numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def set_rng_state(state: dict[str, Any], accelerator: Accelerator | None = None) -> None:
    if "rng.torch" in state:
        torch.random.set_rng_state(state["rng.torch"])
    if accelerator is not None and "rng.device" in state:
        if state.get("rng.device_type") == accelerator.name():
            accelerator.set_rng_state(state["rng.device"])
        else:
            log.warning(
                "checkpoint's device RNG state not restored: it was saved on another device type",
                saved=state.get("rng.device_type"),
                current=accelerator.name(),
            )
    if "rng.python" in state:
        random.setstate(state["rng.python"])
    if "rng.numpy" in state:
        try:
            import numpy as np

            np.random.set_state(state["rng.numpy"])
        except ImportError:
            pass
