"""The ``checkpoint`` and ``ledger`` sections of a ds config, and the factory that applies them.

``checkpoint: {writer: "python" | "aio", async: bool, checksum: bool}``: ``aio`` writes through
the asynchronous I/O handle of ds-ops-kernels and fails (naming it) when that is not installed.
``ledger: {path, signing_key, fsync, recover_torn_tail, approvals}``: the signing key may also come from
``$DS_LEDGER_SIGNING_KEY``. ``gate: {enabled, ...}``: the readiness gate's thresholds
(ds.interfaces.ledger.GateThresholds).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from ds.interfaces.errors import ConfigError
from ds.interfaces.ledger import GateThresholds, gate_fields


class CheckpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    writer: Literal["python", "aio"] = "python"
    async_save: bool = Field(False, alias="async")
    checksum: bool = True


class LedgerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = "ds-ledger.jsonl"
    signing_key: str | None = None
    fsync: bool = False
    recover_torn_tail: bool = False
    # {policies: {operation: registered policy}, allow: [operation], watched_env: [name]}: read by
    # the mutation boundary ds.initialize wires (docs/ledger.md, "Mutation boundaries").
    approvals: dict[str, Any] | None = None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GateConfig(create_model("_GateFields", __base__=_Strict, **gate_fields())):  # type: ignore[misc]
    """``gate``: ``enabled`` and the fields of ds.interfaces.ledger.GateThresholds."""

    enabled: bool = True

    @model_validator(mode="after")
    def _check(self) -> GateConfig:
        GateThresholds(**self.model_dump(exclude={"enabled"}))
        return self


def _parse(model: type[BaseModel], section: str, value: Any) -> Any:
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value or {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{section}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e.get('input')!r})"
            for e in exc.errors()
        )
        fields = ", ".join(f.alias or name for name, f in model.model_fields.items())
        raise ConfigError(f"invalid {section} config: {problems}; valid keys: {fields}") from exc


def parse_checkpoint_config(value: Any) -> CheckpointConfig:
    return _parse(CheckpointConfig, "checkpoint", value)  # type: ignore[no-any-return]


def parse_ledger_config(value: Any) -> LedgerConfig:
    return _parse(LedgerConfig, "ledger", value)  # type: ignore[no-any-return]


def parse_gate_config(value: Any) -> GateConfig:
    return _parse(GateConfig, "gate", value)  # type: ignore[no-any-return]


def build_gate(config: Any = None, ledger: Any | None = None, events: Any | None = None) -> Any:
    """A ReadinessGate with the ``gate`` section's thresholds, subscribed to ``events``."""
    from ds.checkpoint.gate import ReadinessGate

    cfg = parse_gate_config(config)
    gate = ReadinessGate(GateThresholds(**cfg.model_dump(exclude={"enabled"})), ledger=ledger)
    if events is not None:
        gate.attach(events)
    return gate


def build_engine(
    config: Any = None,
    comm: Any | None = None,
    *,
    kernels: Any | None = None,
    ledger: Any | None = None,
    events: Any | None = None,
    boundary: Any | None = None,
) -> Any:
    """A ShardedCheckpointEngine configured by the ``checkpoint`` section."""
    from ds.checkpoint._writers import make_writer
    from ds.checkpoint.engine import ShardedCheckpointEngine

    cfg = parse_checkpoint_config(config)
    return ShardedCheckpointEngine(
        comm,
        writer=make_writer(cfg.writer, kernels),
        checksum=cfg.checksum,
        ledger=ledger,
        events=events,
        boundary=boundary,
        async_save=cfg.async_save,
    )


def build_ledger(config: Any = None, comm: Any | None = None) -> Any:
    from ds.checkpoint.ledger import RunLedger

    cfg = parse_ledger_config(config)
    return RunLedger(
        cfg.path,
        signing_key=cfg.signing_key,
        comm=comm,
        fsync=cfg.fsync,
        recover_torn_tail=cfg.recover_torn_tail,
    )
