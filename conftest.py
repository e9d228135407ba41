"""Suite-wide pytest setup: GPU tests skip with the reason when no CUDA device is present."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The suite's shared test support (one launcher for multi-process worlds, ``free_port``).
_ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(_ROOT / "tests" / "support"))

# Without a GPU, Triton kernels run through the interpreter. The switch is read when triton and
# the kernels are first imported, which any earlier test (or torch itself) may do, so it is set
# here, before any test module is collected.
if "TRITON_INTERPRET" not in os.environ:
    try:
        import torch as _torch

        if not _torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:
        pass


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# The files that take longest (measured with --durations on 2 cores) are collected first, and
# tools/test.sh passes `--no-loadscope-reorder` so xdist hands them out in this order: its default
# (files with the most tests first) started the one-test isolation file last, where it ran alone
# for four minutes while the other worker idled.
_LONGEST_FIRST = (
    "tests/isolation/test_isolation.py",
    "tests/inference/test_real_model_finetune.py",
    "tests/parallel/test_initialize_mesh.py",
    "tests/pipeline/test_pipeline_parity.py",
    "tests/zero/test_parity.py",
    "tests/checkpoint/test_main_job_exit.py",
    "tests/integrations/test_hf.py",
    "packages/autotune/tests/test_autotune.py",
    "tests/gate/test_gate_signals.py",
    "tests/integrations/test_lightning.py",
    "tests/tools/test_gpu_check.py",
    "tests/simgpu/test_pipeline_sim.py",
    "tests/zero/test_reduction.py",
)


def _start_rank(item: pytest.Item) -> int:
    path = Path(str(item.fspath)).resolve()
    for rank, name in enumerate(_LONGEST_FIRST):
        if path == _ROOT / name:
            return rank
    return len(_LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)  # stable: a file's tests keep their order
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Variables that describe "this process's place in a distributed job". A test that initialises a
# process group in the pytest process (ds.comm exports what it found, like torchrun's env://)
# must not hand them to the jobs later tests start: children would rendezvous on the pytest
# process's own, still-listening store.
_DIST_ENV = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "NODE_RANK", "GROUP_RANK", "CROSS_RANK", "CROSS_SIZE",
)


@pytest.fixture(autouse=True)
def _isolate_distributed_env():
    before = {k: os.environ.get(k) for k in _DIST_ENV}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _group_exists() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized())


@pytest.fixture(autouse=True)
def _end_process_groups_a_test_started():
    """A group a test started in the pytest process (``ds.initialize`` starts a world of one, as
    DeepSpeed does) ends with the test: later in-process worlds (the simulated GPU world refuses
    to start over a real group) must not inherit it."""
    existed = _group_exists()
    yield
    if not existed and _group_exists():
        import torch.distributed as dist

        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _restore_library_logging():
    """A test that runs a CLI in-process (``cli.main([...])``) configures logging for the whole
    process, as a CLI should; the tests after it, in whatever order the workers run them, must
    find the library's default again: the ``ds`` logger silent and structlog unconfigured."""
    import logging
    import sys

    ds_logger = logging.getLogger("ds")
    saved = (list(ds_logger.handlers), ds_logger.level, ds_logger.propagate)
    structlog = sys.modules.get("structlog")
    was_configured = bool(structlog is not None and structlog.is_configured())
    yield
    ds_logger.handlers[:] = saved[0]
    ds_logger.setLevel(saved[1])
    ds_logger.propagate = saved[2]
    structlog = sys.modules.get("structlog")
    if structlog is not None and not was_configured and structlog.is_configured():
        structlog.reset_defaults()
