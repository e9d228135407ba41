"""Deterministic mutation boundaries: state-changing operations need a recorded approval.

An *intent* (what someone wants to do, to what, requested by whom) and an *approval* (who or which
policy allows it) are two different ledger records. :func:`never_equate_intent_to_approval` is the
rule every check applies: a request is never its own approval, an approval must name the intent it
approves, come after it, and be made by a named approver or a *registered* policy, never by the
requester (identities are compared canonically: case, width and surrounding space do not make a
second person). A mutation consumes its approval, so each approval allows one mutation.

The boundary's intents and approvals are readable, not writable: the mappings it exposes are
read-only views, and every record it keeps is sealed with a per-boundary key, so an entry planted
in its private state is refused at :meth:`MutationBoundary.require`.

Policies are functions registered by name (:func:`register_policy`); a policy approves an intent
only when its function says so. Built in: ``keep-last-N`` (N = 1, 2, 3, 5, 10: delete a checkpoint
only when N newer ones exist beside it), ``recorded-checkpoint`` (load a checkpoint whose manifest
this boundary's ledger recorded as saved; with a signing key, by a record the writer holds under a
signed head) and ``config`` (whatever the run's config, recorded in
the ledger at start, lists for it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ds.checkpoint._identity import check_identity, identity_key
from ds.interfaces.errors import ApprovalRequiredError, ConfigError

OVERWRITE_CHECKPOINT = "overwrite_checkpoint"
DELETE_CHECKPOINT = "delete_checkpoint"
LOAD_CHECKPOINT = "load_checkpoint"
LOAD_OPTIMIZER_STATE = "load_optimizer_state"
CHANGE_ENV = "change_env"
OPERATIONS = (
    OVERWRITE_CHECKPOINT,
    DELETE_CHECKPOINT,
    LOAD_CHECKPOINT,
    LOAD_OPTIMIZER_STATE,
    CHANGE_ENV,
)
POLICY_PREFIX = "policy:"


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


def canonical_identity(name: str) -> str:
    """The form identities are compared in (``_identity.identity_key``): NFKC, combining marks
    and Cyrillic/Greek look-alikes folded, trimmed, case-folded ("Alİce" is "alice")."""
    return identity_key(name)


# -- policies ------------------------------------------------------------------------------------
PolicyCheck = Callable[[Record, "MutationBoundary"], "str | None"]  # refusal reason, or None
_POLICIES: dict[str, PolicyCheck] = {}


def register_policy(name: str, check: PolicyCheck) -> None:
    """Make ``name`` usable as an approving policy; ``check`` returns why it refuses, or None."""
    if not name or canonical_identity(name) != name:
        raise ConfigError(f"policy name {name!r} must be lower-case with no surrounding space")
    _POLICIES[name] = check


def registered_policies() -> list[str]:
    return sorted(_POLICIES)


def _policy(name: str) -> PolicyCheck:
    check = _POLICIES.get(name)
    if check is None:
        raise ApprovalRequiredError(
            f"{name!r} is not a registered policy (registered: {', '.join(registered_policies())}); "
            "a policy approval names a policy registered with register_policy(), not free text"
        )
    return check


def _keep_last(n: int) -> PolicyCheck:
    def check(intent: Record, _b: MutationBoundary) -> str | None:
        if intent.operation != DELETE_CHECKPOINT:
            return f"keep-last-{n} approves only {DELETE_CHECKPOINT}"
        directory, tag = os.path.split(os.path.abspath(intent.target))
        try:
            mine = os.stat(os.path.join(directory, tag, "manifest.json")).st_mtime_ns
            newer = [
                t
                for t in os.listdir(directory)
                if t != tag
                and not t.startswith(".")
                and os.path.isfile(os.path.join(directory, t, "manifest.json"))
                and os.stat(os.path.join(directory, t, "manifest.json")).st_mtime_ns > mine
            ]
        except OSError as exc:
            return f"cannot list the checkpoints beside {intent.target}: {exc}"
        if len(newer) < n:
            return f"only {len(newer)} newer checkpoint(s) beside {tag}; keep-last-{n} keeps it"
        return None

    return check


def _recorded_checkpoint(intent: Record, b: MutationBoundary) -> str | None:
    if intent.operation not in (LOAD_CHECKPOINT, LOAD_OPTIMIZER_STATE):
        return "recorded-checkpoint approves only loads"
    path = getattr(b._ledger, "path", None)
    if path is None:
        return "recorded-checkpoint needs the boundary's ledger (on the writing rank)"
    try:
        with open(os.path.join(intent.target, "manifest.json"), "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
    except OSError as exc:
        return f"cannot read the manifest of {intent.target}: {exc}"
    from ds.checkpoint._ledger_check import trusted_save_record

    return trusted_save_record(b._ledger, sha)


def _config(intent: Record, b: MutationBoundary) -> str | None:
    allowed = b._config_allows.get(intent.operation)
    if allowed is None:
        return f"the run's config does not allow {intent.operation} by policy"
    return None


for _n in (1, 2, 3, 5, 10):
    register_policy(f"keep-last-{_n}", _keep_last(_n))
register_policy("recorded-checkpoint", _recorded_checkpoint)
register_policy("config", _config)


def _pin_keys(keys: Mapping[str, str]) -> dict[str, str]:
    from ds.checkpoint import signing

    pinned: dict[str, str] = {}
    for name, key in keys.items():
        try:
            who = check_identity(name, "approver")
        except ApprovalRequiredError as exc:
            raise ConfigError(f"ledger.approvals.approver_keys: {exc}") from None
        if who in pinned:
            raise ConfigError(
                f"ledger.approvals.approver_keys lists {name!r} twice (names compare as {who!r})"
            )
        pinned[who] = signing.check_public_hex(key, f"ledger.approvals.approver_keys[{name!r}]")
    return pinned


# -- the rule ------------------------------------------------------------------------------------
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
    if approval.target != intent.target:
        raise ApprovalRequiredError(
            f"{what}: approval #{approval.index} is for {approval.target!r}, not this target"
        )
    if approval.index < intent.index:
        raise ApprovalRequiredError(f"{what}: approval #{approval.index} predates its intent")
    approver = canonical_identity(approval.actor)
    if not approver and not approval.policy:
        raise ApprovalRequiredError(
            f"{what}: approval #{approval.index} names no approver or policy"
        )
    if approval.policy is not None:
        _policy(approval.policy)  # named a registered policy
        if approver != canonical_identity(POLICY_PREFIX + approval.policy):
            raise ApprovalRequiredError(
                f"{what}: a policy approval is made by the policy ({POLICY_PREFIX}"
                f"{approval.policy}), not by {approval.actor!r}"
            )
    elif approver.startswith(POLICY_PREFIX):
        raise ApprovalRequiredError(f"{what}: {approval.actor!r} is a policy name, not a person")
    if approver == canonical_identity(intent.actor):
        raise ApprovalRequiredError(
            f"{what}: {intent.actor!r} requested it and cannot approve it; ask another approver"
        )


class MutationBoundary:
    """Tracks intents and approvals (in the ledger when one is given) and enforces them.

    ``policies`` maps an operation to the name of a registered policy that approves it
    automatically when its check passes: the boundary then still writes an intent and a separate
    approval record naming the policy. ``config_allows`` lists, per operation, what the ``config``
    policy approves (the run config's own word, which the run ledger records at start).
    """

    def __init__(
        self,
        ledger: Any | None = None,
        *,
        policies: Mapping[str, str] | None = None,
        watched_env: Sequence[str] = (),
        actor: str = "ds",
        config_allows: Mapping[str, Any] | None = None,
        approver_keys: Mapping[str, str] | None = None,
    ) -> None:
        self._ledger = ledger
        self._approver_keys = _pin_keys(approver_keys or {})
        self._policies = dict(policies or {})
        for op, name in self._policies.items():
            if name not in _POLICIES:
                raise ConfigError(
                    f"policy {name!r} for {op!r} is not registered; registered policies: "
                    f"{', '.join(registered_policies())}"
                )
        self._config_allows = dict(config_allows or {})
        self._actor = actor
        self._seq = 0
        self._seal_key = secrets.token_bytes(32)
        self._intents: dict[int, tuple[Record, str]] = {}
        self._approvals: dict[int, tuple[Record, str]] = {}
        self._consumed: set[int] = set()
        self._env = {name: os.environ.get(name) for name in watched_env}

    # Read-only views: approvals are made through approve(), never by writing a mapping.
    @property
    def intents(self) -> Mapping[int, Record]:
        return MappingProxyType({k: r for k, (r, _) in self._intents.items()})

    @property
    def approvals(self) -> Mapping[int, Record]:
        return MappingProxyType({k: r for k, (r, _) in self._approvals.items()})

    def _seal(self, rec: Record) -> str:
        body = json.dumps(
            [rec.index, rec.kind, rec.operation, rec.target, rec.actor, rec.intent, rec.policy],
            separators=(",", ":"),
        )
        return hmac.new(self._seal_key, body.encode(), hashlib.sha256).hexdigest()

    def _unsealed(self, entry: tuple[Record, str] | Any) -> Record:
        rec, mac = entry if isinstance(entry, tuple) and len(entry) == 2 else (None, "")
        if not isinstance(rec, Record) or not hmac.compare_digest(str(mac), self._seal(rec)):
            raise ApprovalRequiredError(
                "the boundary's records were altered outside its API; approvals are made with "
                "MutationBoundary.approve()"
            )
        return rec

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
        if not str(requested_by).strip():
            raise ApprovalRequiredError(f"an intent to {operation} {target!r} needs a requester")
        check_identity(requested_by, "requester")
        rec = self._record(Record(-1, "intent", operation, target, requested_by, extra=extra))
        self._intents[rec.index] = (rec, self._seal(rec))
        return rec.index

    def approve(
        self,
        intent_id: int,
        approver: str = "",
        *,
        policy: str | None = None,
        reason: str = "",
        signature: str | None = None,
        key: Any = None,
    ) -> int:
        """Record an approval of intent ``intent_id`` by ``approver`` or by a registered ``policy``.

        With a signing key on the ledger a person's approval is signed by that person's key from
        ``approver_keys``: pass ``signature`` (``ds ledger sign-approval``) or the private ``key``.
        """
        entry = self._intents.get(intent_id)
        if entry is None:
            raise ApprovalRequiredError(f"no intent #{intent_id} to approve; request it first")
        intent = self._unsealed(entry)
        if policy is not None:
            check = _policy(policy)  # a registered policy, not free text
            if approver and canonical_identity(approver) != canonical_identity(
                POLICY_PREFIX + policy
            ):
                raise ApprovalRequiredError(
                    f"approve #{intent_id}: give an approver or a policy, not both"
                )
            approver = POLICY_PREFIX + policy
            refusal = check(intent, self)
            if refusal is not None:
                raise ApprovalRequiredError(
                    f"policy {policy!r} does not approve {intent.operation} of "
                    f"{intent.target!r}: {refusal}"
                )
        extra: dict[str, Any] = {"reason": reason} if reason else {}
        if policy is None:
            check_identity(approver, "approver")
            if getattr(self._ledger, "signed", False):
                extra.update(self._signed_by(intent, approver, signature, key))
        draft = Record(
            1 << 62,
            "approval",
            intent.operation,
            intent.target,
            approver,
            intent_id,
            policy,
            extra,
        )
        never_equate_intent_to_approval(intent, draft)  # invalid approvals are never recorded
        rec = self._record(draft)
        self._approvals[intent_id] = (rec, self._seal(rec))
        return rec.index

    def _signed_by(
        self, intent: Record, approver: str, signature: str | None, key: Any
    ) -> dict[str, Any]:
        """The approval's signature fields, checked against the approver's pinned key."""
        from ds.checkpoint import signing

        who = identity_key(approver)
        pinned = self._approver_keys.get(who)
        if pinned is None:
            raise ApprovalRequiredError(
                f"approver {approver!r} has no pinned public key: with a signing key configured, "
                "a person approves with their own key, listed in ledger.approvals.approver_keys "
                "(MutationBoundary(approver_keys=...))"
            )
        message = signing.approval_bytes(
            who,
            intent.index,
            str(self._ledger.leaf_hash(intent.index)),
            intent.operation,
            intent.target,
        )
        if key is not None:
            signature = signing.load_private_key(key).sign(message).hex()
        if signature is None:
            raise ApprovalRequiredError(
                f"approval of intent #{intent.index} by {approver!r} must be signed with their "
                f"key: `ds ledger sign-approval LEDGER {intent.index} --approver {who} --key "
                "KEY` prints the signature to pass as signature="
            )
        if not signing.verify_signature(pinned, str(signature), message):
            raise ApprovalRequiredError(
                f"approval of intent #{intent.index}: the signature is not by {approver!r}'s "
                f"pinned key {pinned[:16]}... (signed by someone else, or for another intent)"
            )
        return {"signature": str(signature), "public_key": pinned}

    def require(self, operation: str, target: str) -> int:
        """Allow one ``operation`` on ``target``: consumes an approved intent or raises."""
        pending = [
            self._unsealed(e)
            for e in self._intents.values()
            if e[0].operation == operation and e[0].target == target
        ]
        pending = [i for i in pending if i.index not in self._consumed]
        for intent in pending:
            entry = self._approvals.get(intent.index)
            if entry is not None:
                approval = self._unsealed(entry)
                never_equate_intent_to_approval(intent, approval)
                self._consumed.add(intent.index)
                self._record(Record(-1, "mutation", operation, target, intent.actor, intent.index))
                return intent.index
        policy = self._policies.get(operation)
        if policy is not None:
            intent_id = self.request(operation, target, self._actor)
            self.approve(intent_id, policy=policy)
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
