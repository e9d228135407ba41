"""ds's own sections for the run ledger, the readiness gate and checkpoint writing.

``ledger``, ``gate`` and ``checkpoint.{writer, async, checksum}`` are not DeepSpeed keys; ds.full
hands them to ds.checkpoint (``build_ledger``, ``build_gate``, the mutation boundary) unchanged.
The models here only check shape and types, so a misspelt key fails at load with the usual
message; ds.checkpoint.config holds the meaning (docs/ledger.md, docs/checkpoint.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, create_model, model_validator

from ds.interfaces.ledger import GateThresholds, gate_fields
from ds.zero.config.sections import CheckpointConfig, Section

Operation = Literal[
    "overwrite_checkpoint",
    "delete_checkpoint",
    "load_checkpoint",
    "load_optimizer_state",
    "change_env",
]


class ApprovalsSection(Section):
    """``ledger.approvals``: which registered policy approves an operation, what ``config`` allows."""

    policies: dict[Operation, str] | None = None  # None: the defaults of docs/ledger.md
    allow: list[Operation] = Field(default_factory=list)  # what the "config" policy approves
    watched_env: list[str] = Field(default_factory=list)
    approver_keys: dict[str, str] = Field(default_factory=dict)  # name -> Ed25519 public key hex


class LedgerSection(Section):
    path: str = "ds-ledger.jsonl"
    signing_key: str | None = None
    fsync: bool = False
    recover_torn_tail: bool = False
    approvals: ApprovalsSection = Field(default_factory=ApprovalsSection)


class GateSection(create_model("_GateFields", __base__=Section, **gate_fields())):  # type: ignore[misc]
    """``gate``: ``enabled`` and the fields of ds.interfaces.ledger.GateThresholds (defined there
    once, with their checks)."""

    enabled: bool = True

    @model_validator(mode="after")
    def _check(self) -> GateSection:
        GateThresholds(**self.model_dump(exclude={"enabled"}))
        return self


class DsCheckpointConfig(CheckpointConfig):
    """DeepSpeed's ``checkpoint`` section plus ds's writer keys (``async`` is ``async_save``)."""

    writer: Literal["python", "aio"] = "python"
    checksum: bool = True
    async_save: bool = Field(False, validation_alias=AliasChoices("async", "async_save"))
