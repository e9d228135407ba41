"""Entry points resolve, and each implementation covers its Protocol (names and parameters)."""

from __future__ import annotations

import inspect

import pytest

from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.gate import ProductionDebtZeROGate
from ds.checkpoint.ledger import RunLedger
from ds.interfaces import registry
from ds.interfaces.checkpoint import CheckpointEngine
from ds.interfaces.ledger import Ledger, ReadinessGate


@pytest.mark.parametrize(
    ("group", "impl"),
    [
        (registry.CHECKPOINT_ENGINES, ShardedCheckpointEngine),
        (registry.LEDGERS, RunLedger),
        (registry.GATES, ProductionDebtZeROGate),
    ],
)
def test_default_entry_points(group: str, impl: type) -> None:
    assert registry.get(group, "default") is impl
    assert registry.list_providers(group)["default"].distribution == "ds-checkpoint-ledger"


@pytest.mark.parametrize(
    ("protocol", "impl"),
    [
        (CheckpointEngine, ShardedCheckpointEngine),
        (Ledger, RunLedger),
        (ReadinessGate, ProductionDebtZeROGate),
    ],
)
def test_implementation_covers_protocol_signatures(protocol: type, impl: type) -> None:
    for name, member in vars(protocol).items():
        if name.startswith("_") or not callable(member):
            continue
        assert hasattr(impl, name), f"{impl.__name__} lacks {name}"
        want = inspect.signature(member).parameters
        got = inspect.signature(getattr(impl, name)).parameters
        for pname, p in want.items():
            assert pname in got, f"{impl.__name__}.{name} lacks parameter {pname}"
            assert got[pname].kind == p.kind, f"{impl.__name__}.{name}({pname}) kind differs"
            if p.default is not inspect.Parameter.empty:
                assert got[pname].default is not inspect.Parameter.empty, (name, pname)


def test_package_exports_lazily() -> None:
    import subprocess
    import sys

    code = (
        "import sys, ds.checkpoint as c; assert 'torch' not in sys.modules; "
        "assert c.ShardedCheckpointEngine.__name__ == 'ShardedCheckpointEngine'; "
        "assert callable(c.never_equate_intent_to_approval); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
