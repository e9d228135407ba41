"""Deterministic mutation boundaries: state-changing operations need a recorded approval.

An *intent* (what someone wants to do, to what, requested by whom) and an *approval* (who or which
policy allows it) are two different ledger records. :func:`never_equate_intent_to_approval` is the
rule every check applies: a request is never its own approval, an approval must name the intent it
approves, come after it, and be made by a named approver or policy other than the requester.
A mutation consumes its approval, so each approval allows one mutation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ds.interfaces.errors import ApprovalRequiredError

OVERWRITE_CHECKPOINT = "overwrite_checkpoint"
DELETE_CHECKPOINT = "delete_checkpoint"
LOAD_OPTIMIZER_STATE = "load_optimizer_state"
CHANGE_ENV = "change_env"


@dataclass(frozen=True)
class Record:
    index: int  # ledger index (or local sequence number without a ledger)
    kind: str  # "intent" | "approval"
    operation: str
    target: str
    actor: str  # requester for an intent, approver for an approval
    intent: int | None = None  # for an approval: the index of the intent it approves
    policy: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def never_equate_intent_to_approval(intent: Record, approval: Record | None) -> None:
    """Raise ApprovalRequiredError unless ``approval`` is a distinct, valid approval of ``intent``."""
    what = f"{intent.operation} of {intent.target!r}"
    if approval is None:
        raise ApprovalRequiredError(
            f"{what} (intent #{intent.index} by {intent.actor}) has no approval; record one with "
            f"MutationBoundary.approve({intent.index}, approver='<name>') or configure a policy"
        )
    if approval is intent or approval.index == intent.index or approval.kind != "approval":
        raise ApprovalRequiredError(
            f"{what}: the intent #{intent.index} was presented as its own approval; a request is "
            "never an approval"
        )
    if intent.kind != "intent":
        raise ApprovalRequiredError(f"{what}: record #{intent.index} is not an intent")
    if approval.intent != intent.index or approval.operation != intent.operation:
        raise ApprovalRequiredError(
            f"{what}: approval #{approval.index} approves intent #{approval.intent} "
            f"({approval.operation}), not this one"
        )
    if approval.index < intent.index:
        raise ApprovalRequiredError(f"{what}: approval #{approval.index} predates its intent")
    if not approval.actor and not approval.policy:
        raise ApprovalRequiredError(
            f"{what}: approval #{approval.index} names no approver or policy"
        )
    if approval.actor == intent.actor and approval.policy is None:
        raise ApprovalRequiredError(
            f"{what}: {intent.actor!r} requested it and cannot approve it; ask another approver"
        )


class MutationBoundary:
    """Tracks intents and approvals (in the ledger when one is given) and enforces them.

    ``policies`` maps an operation to a policy name that approves it automatically: the boundary
    then still writes an intent and a separate approval record naming the policy.
    """

    def __init__(
        self,
        ledger: Any | None = None,
        *,
        policies: Mapping[str, str] | None = None,
        watched_env: Sequence[str] = (),
        actor: str = "ds",
    ) -> None:
        self._ledger = ledger
        self._policies = dict(policies or {})
        self._actor = actor
        self._seq = 0
        self.intents: dict[int, Record] = {}
        self.approvals: dict[int, Record] = {}
        self._consumed: set[int] = set()
        self._env = {name: os.environ.get(name) for name in watched_env}

    def _record(self, rec: Record) -> Record:
        payload = {
            "operation": rec.operation,
            "target": rec.target,
            "actor": rec.actor,
            "intent": rec.intent,
            "policy": rec.policy,
            **rec.extra,
        }
        if self._ledger is not None:
            index = self._ledger.record_training_event(rec.kind, payload)
        else:
            index = self._seq
            self._seq += 1
        return Record(
            index, rec.kind, rec.operation, rec.target, rec.actor, rec.intent, rec.policy, rec.extra
        )

    def request(self, operation: str, target: str, requested_by: str, **extra: Any) -> int:
        """Record an intent; returns its id (ledger index)."""
        rec = self._record(Record(-1, "intent", operation, target, requested_by, extra=extra))
        self.intents[rec.index] = rec
        return rec.index

    def approve(
        self, intent_id: int, approver: str = "", *, policy: str | None = None, reason: str = ""
    ) -> int:
        intent = self.intents.get(intent_id)
        if intent is None:
            raise ApprovalRequiredError(f"no intent #{intent_id} to approve; request it first")
        draft = Record(
            1 << 62,
            "approval",
            intent.operation,
            intent.target,
            approver,
            intent_id,
            policy,
            {"reason": reason} if reason else {},
        )
        never_equate_intent_to_approval(intent, draft)  # invalid approvals are never recorded
        rec = self._record(draft)
        self.approvals[intent_id] = rec
        return rec.index

    def require(self, operation: str, target: str) -> int:
        """Allow one ``operation`` on ``target``: consumes an approved intent or raises."""
        pending = [
            i
            for i in self.intents.values()
            if i.operation == operation and i.target == target and i.index not in self._consumed
        ]
        for intent in pending:
            approval = self.approvals.get(intent.index)
            if approval is not None:
                never_equate_intent_to_approval(intent, approval)
                self._consumed.add(intent.index)
                self._record(Record(-1, "mutation", operation, target, intent.actor, intent.index))
                return intent.index
        policy = self._policies.get(operation)
        if policy is not None:
            intent_id = self.request(operation, target, self._actor)
            self.approve(intent_id, f"policy:{policy}", policy=policy)
            return self.require(operation, target)
        if pending:
            never_equate_intent_to_approval(pending[0], None)
        raise ApprovalRequiredError(
            f"{operation} of {target!r} needs an approval: record an intent "
            f"(MutationBoundary.request({operation!r}, {target!r}, requested_by=...)) and an "
            "approval by someone else, or configure a policy for it"
        )

    @contextmanager
    def guard(self, operation: str, target: str) -> Iterator[int]:
        yield self.require(operation, target)

    def check_env(self) -> list[str]:
        """Watched variables that changed since the boundary was made; each needs an approval."""
        changed = []
        for name, old in self._env.items():
            new = os.environ.get(name)
            if new != old:
                self.require(CHANGE_ENV, name)
                if self._ledger is not None:
                    self._ledger.record_training_event(
                        "env_change", {"name": name, "old": old, "new": new}
                    )
                self._env[name] = new
                changed.append(name)
        return changed
