"""Run governance for ``initialize``: the run ledger, the mutation boundary and the readiness gate.

From the ds config (docs/ledger.md):

* ``ledger`` (or ``initialize(ledger_path=...)`` / ``$DS_LEDGER_PATH``) opens the run ledger on
  every rank (rank 0 writes). Whenever there is a ledger, a mutation boundary records intents and
  approvals in it and the checkpoint engine enforces it: overwriting or deleting a checkpoint,
  loading model and optimizer state and changing a watched environment variable each need an
  approval. ``ledger.approvals.policies`` names the registered policy that approves an operation;
  by default loads of checkpoints this ledger recorded are approved (``recorded-checkpoint``);
  ``ledger.approvals.allow`` lists operations the ``config`` policy approves;
  ``ledger.approvals.approver_keys`` pins each approver's public key (with a signing key, a
  person's approval must be signed by their own key).
* ``gate`` sets the readiness gate's thresholds (``enabled: false`` turns it off).
* ``checkpoint.{writer, async, checksum}`` configure the checkpoint engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ds.interfaces import registry

DEFAULT_POLICIES = {
    "load_checkpoint": "recorded-checkpoint",
    "load_optimizer_state": "recorded-checkpoint",
}


@dataclass
class Governance:
    ledger: Any = None
    boundary: Any = None
    checkpoint_kwargs: dict[str, Any] = field(default_factory=dict)
    gate_thresholds: dict[str, Any] | None = None  # None: the gate's defaults
    gate_enabled: bool = True
    gate_configured: bool = False  # a ``gate`` block turns the gate on even without a ledger


def build(
    cfg: Any,
    communicator: Any,
    *,
    ledger: Any = None,
    ledger_path: str | None = None,
    kernels: Any = None,
) -> Governance:
    section = getattr(cfg, "ledger", None)
    gov = Governance()
    if ledger is None:
        path = ledger_path or os.environ.get("DS_LEDGER_PATH") or (section and section.path)
        if path:
            kwargs: dict[str, Any] = {"comm": communicator}
            if section is not None:
                kwargs.update(
                    signing_key=section.signing_key,
                    fsync=section.fsync,
                    recover_torn_tail=section.recover_torn_tail,
                )
            ledger = registry.get(registry.LEDGERS, "default")(path, **kwargs)
    gov.ledger = ledger
    if ledger is not None:
        from ds.checkpoint.boundary import MutationBoundary

        approvals = section.approvals if section is not None else None
        policies = dict(DEFAULT_POLICIES)
        allow = list(approvals.allow) if approvals is not None else []
        policies.update({op: "config" for op in allow})
        if approvals is not None and approvals.policies is not None:
            policies.update(approvals.policies)
        gov.boundary = MutationBoundary(
            ledger,
            policies=policies,
            watched_env=list(approvals.watched_env) if approvals is not None else [],
            actor="ds.initialize",
            config_allows={op: True for op in allow},
            approver_keys=dict(getattr(approvals, "approver_keys", None) or {}),
        )
    ckpt = cfg.checkpoint
    gov.checkpoint_kwargs = {
        "boundary": gov.boundary,
        "checksum": bool(getattr(ckpt, "checksum", True)),
    }
    if getattr(ckpt, "writer", "python") != "python":
        from ds.checkpoint._writers import make_writer

        gov.checkpoint_kwargs["writer"] = make_writer(ckpt.writer, kernels)
    gate = getattr(cfg, "gate", None)
    if gate is not None:
        gov.gate_enabled = bool(gate.enabled)
        gov.gate_configured = True
        gov.gate_thresholds = gate.model_dump(exclude={"enabled"})
    return gov


def gate_wanted(gov: Governance, readiness_gate: bool | None) -> bool:
    """Whether this run has a readiness gate (``make_gate`` builds it)."""
    wanted = readiness_gate if readiness_gate is not None else gov.gate_enabled
    if gov.ledger is None and not readiness_gate and not gov.gate_configured:
        return False  # without a ledger the gate is opt-in
    return bool(wanted) and registry.has_provider(registry.GATES, "default")


def make_gate(gov: Governance, readiness_gate: bool | None, events: Any) -> Any:
    """The readiness gate subscribed to ``events``, or None when it is off."""
    if not gate_wanted(gov, readiness_gate):
        return None
    gate = registry.get(registry.GATES, "default")(ledger=gov.ledger, **(gov.gate_thresholds or {}))
    gate.attach(events)
    return gate
