"""Every ds.comm collective at world sizes 2 and 3 over real gloo, vs single-process results.

Each (world size, mode) starts its ranks once and runs every check (see workers/collectives.py);
the tests below report each check separately. Modes: ``plain`` (the fast path), ``instrumented``
(comms logger + watchdog + consistency checks on) and ``emulated`` (AVG and reduce-scatter built
from SUM/all-reduce, the path for backends without them).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from .conftest import collect_checks

_spec = importlib.util.spec_from_file_location(
    "ds_comm_collectives_worker", Path(__file__).parent / "workers" / "collectives.py"
)
assert _spec is not None and _spec.loader is not None
_worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_worker)


class _Names:
    """Collect the check names the worker defines (the definitions only need a namespace)."""

    class ReduceOp:
        SUM = MAX = MIN = PRODUCT = AVG = None


_worker._define_checks(_Names, 0, 2)
CHECK_NAMES = list(_worker.CHECKS)
_worker.CHECKS.clear()

_cache: dict[tuple[int, str], dict[str, str]] = {}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    def get(world: int, mode: str) -> dict[str, str]:
        key = (world, mode)
        if key not in _cache:
            tmp = tmp_path_factory.mktemp(f"comm-{mode}-{world}")
            _cache[key] = collect_checks("collectives.py", world, tmp, [mode])
        return _cache[key]

    return get


def _assert_check(res: dict[str, str], name: str) -> None:
    crashed = {k: v for k, v in res.items() if k.startswith("<rank")}
    assert not crashed, f"a rank crashed: {crashed}"
    assert name in res, f"check {name} did not run; results: {sorted(res)}"
    assert res[name] == "ok", res[name]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", CHECK_NAMES)
def test_plain(results, world, name):
    _assert_check(results(world, "plain"), name)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", [*CHECK_NAMES, "logger_saw_ops"])
def test_instrumented(results, world, name):
    _assert_check(results(world, "instrumented"), name)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [n for n in CHECK_NAMES if n.startswith(("all_reduce", "reduce"))])
def test_emulated_avg_and_reduce_scatter(results, name):
    _assert_check(results(3, "emulated"), name)
