"""``deepspeed.autotuning.scheduler``: the experiment queue and the GPU slots of the nodes it runs
them on.

Queueing experiment files, reserving and returning slots and the resource status work as in
DeepSpeed. Launching the experiments (``run``) and ranking their metrics (``parse_results``) are
DeepSpeed's autotuner's, which ds does not have: ``ds autotune`` times its trials itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any, NoReturn

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError

_USE = "tune with 'ds autotune SCRIPT --config ds.json' (docs/planning.md)"


class Node:
    """A host and its GPU slots, handed out lowest first."""

    def __init__(self, host: str, max_slots: int) -> None:
        self.host = host
        self.max_slots = max_slots
        self.idle_slots = list(range(max_slots))

    def reserve_slots(self, slot_request: int) -> list[int] | None:
        if len(self.idle_slots) < slot_request:
            return None
        taken, self.idle_slots = self.idle_slots[:slot_request], self.idle_slots[slot_request:]
        return taken

    def restore_slots(self, slots: list[int]) -> None:
        self.idle_slots += slots


class Reservation:
    def __init__(self, node: Node, slots: list[int]) -> None:
        self.node = node
        self.slots = slots

    def restore_slots(self) -> None:
        self.node.restore_slots(self.slots)

    def desc(self) -> str:
        return f"{self.node.host}:{','.join(map(str, self.slots))}@"


def _hosts(hosts: str | Iterable[str]) -> list[str]:
    # A comma-separated string ("worker-0, worker-1") or any iterable of host names.
    names = hosts.split(",") if isinstance(hosts, str) else hosts
    return [h.strip() for h in names if h.strip()]


class ResourceManager:
    def __init__(
        self,
        args: Any,
        hosts: str | Iterable[str],
        num_gpus_per_node: int,
        results_dir: str | None,
        exps_dir: str | None,
        arg_mappings: dict[str, str] | None,
    ) -> None:
        self.args = args
        self.results_dir, self.exps_dir = results_dir, exps_dir
        self.num_gpus_per_node = num_gpus_per_node
        self.nodes = [Node(h, num_gpus_per_node) for h in _hosts(hosts)]
        self.experiment_queue: list[dict[str, Any]] = []
        self.running_experiments: dict[int, Any] = {}
        self.finished_experiments: dict[int, Any] = {}
        self.experiment_count = 0
        self.exp_paths: set[str] = set()
        # config key -> the script's command-line flag carrying it (first spelling wins)
        self.arg_mappings: dict[str, str] = {}
        for key, flag in (arg_mappings or {}).items():
            self.arg_mappings.setdefault(key.strip(), flag.strip())

    def schedule_experiments(self, exp_paths: Iterable[str]) -> None:
        """Queue the experiment files not queued before, numbering them in order."""
        for path in exp_paths:
            if path in self.exp_paths:
                continue
            self.exp_paths.add(path)
            with open(path) as f:
                exp = json.load(f)
            exp["exp_id"] = self.experiment_count
            self.experiment_count += 1
            if self.results_dir is not None:
                exp["result_dir"] = os.path.join(self.results_dir, exp["name"])
            self.experiment_queue.append(exp)

    def resource_request(self, exp: dict[str, Any]) -> list[Reservation] | None:
        """``exp["num_gpus"]`` slots on each of ``exp["num_nodes"]`` nodes, or None (nothing
        kept) when the idle slots do not allow it."""
        wanted, per_node = int(exp["num_nodes"]), int(exp["num_gpus"])
        reservations: list[Reservation] = []
        for node in self.nodes:
            if len(reservations) == wanted:
                break
            slots = node.reserve_slots(per_node)
            if slots:
                reservations.append(Reservation(node, slots))
        if len(reservations) == wanted:
            return reservations
        for r in reservations:
            r.restore_slots()
        return None

    def status(self) -> str:
        return ", ".join(f"{n.host} ({len(n.idle_slots)} idle gpus)" for n in self.nodes)

    def clear(self) -> None:
        """Empty the queue and the records (the experiment numbering continues)."""
        self.experiment_queue, self.exp_paths = [], set()
        self.running_experiments, self.finished_experiments = {}, {}

    def run(self) -> NoReturn:
        raise FeatureNotAvailableError(
            f"deepspeed.autotuning ResourceManager.run: launching DeepSpeed's autotuning "
            f"experiments is not available in ds; {_USE}"
        )

    def parse_results(self, metric: str) -> NoReturn:
        raise FeatureNotAvailableError(
            f"deepspeed.autotuning ResourceManager.parse_results: DeepSpeed's experiment metrics "
            f"are not produced by ds; {_USE}"
        )


__all__ = ["Node", "Reservation", "ResourceManager"]
