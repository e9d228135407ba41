"""The ZeRO-3 user surface of the ``deepspeed`` shim: leaf-module helpers, the stage-3 linear
function, ``zero.Init``'s DeepSpeed arguments and parameter attributes, tiling, ``OnDevice``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ds.full.compat.deepspeed import utils
from ds.full.compat.deepspeed.runtime.zero import linear


def test_leaf_helpers_mark_and_unmark() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    assert utils.set_z3_leaf_modules(m, ["Linear"]) == [m[0]]
    assert utils.get_z3_leaf_modules(m) == [m[0]]
    assert utils.unset_z3_leaf_modules(m, [torch.nn.Linear]) == [m[0]]
    assert not utils.z3_leaf_module(m[0])


def test_zero3_linear_function_and_module() -> None:
    lin = linear.LinearModuleForZeroStage3(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    out = lin(x)
    assert "LinearFunctionForZeroStage3" in type(out.grad_fn).__name__
    torch.testing.assert_close(out, torch.nn.functional.linear(x, lin.weight, lin.bias))
    assert linear.autocast_custom_fwd.func is torch.amp.custom_fwd


def test_on_device_builds_on_meta_in_half() -> None:
    import ds.full.compat.deepspeed as deepspeed

    with deepspeed.OnDevice(dtype=torch.half, device="meta"):
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        steps = torch.zeros(2, dtype=torch.long, device="cpu")
    assert {(p.device.type, p.dtype) for p in m.parameters()} == {("meta", torch.half)}
    assert (steps.device.type, steps.dtype) == ("cpu", torch.long)
    assert torch.empty(1).device.type == "cpu"  # the block ended


def test_zero_init_reads_deepspeed_arguments(tmp_path: Path) -> None:
    from ds.full.compat.deepspeed.runtime.zero import partition_parameters as pp
    from ds.full.compat.deepspeed.runtime.zero import zero_init

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}}))
    cfg = zero_init._config_dict(str(path))
    assert zero_init._dtype(cfg, None) is torch.bfloat16
    assert zero_init._dtype({"zero_optimization": {"stage": 3}}, None) is torch.float32
    assert zero_init._dtype(None, torch.float32) is torch.float32
    assert zero_init._dtype(None, None) is None  # no config: parameters keep their dtype
    assert pp.Init is zero_init.Init and pp.partitioned_param_data_shape == [0]
    assert "WORLD_SIZE=2" in pp._contradicting_single_rank_pg_error(1, None, {"WORLD_SIZE": "2"})


def test_multiple_all_gather_handles_waits_on_each() -> None:
    from ds.full.compat.deepspeed.runtime.zero.partition_parameters import (
        MultipleAllGatherHandles,
    )

    seen: list[bool] = []

    class Handle:
        def wait(self, *, handle_dependency: bool = True) -> None:
            seen.append(handle_dependency)

    MultipleAllGatherHandles([Handle(), Handle()]).wait(handle_dependency=False)
    assert seen == [False, False]


def test_ops_aio_names_the_async_io_builder() -> None:
    from ds.full.compat.deepspeed.ops.aio import AsyncIOBuilder
    from ds.full.compat.deepspeed.ops.op_builder import AsyncIOBuilder as from_builders

    assert AsyncIOBuilder is from_builders


def test_parameter_offload_names_the_parameter_container() -> None:
    from ds.full.compat.deepspeed.runtime.zero.parameter_offload import (
        ZeROOrderedDict,
        ensure_zero_ordered_dict,
    )

    lin = torch.nn.Linear(2, 2)
    ensure_zero_ordered_dict(lin)
    assert isinstance(lin._parameters, ZeROOrderedDict) and "weight" in lin._parameters


def test_zero_utils_names() -> None:
    import pytest

    from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
    from ds.full.compat.deepspeed.runtime.zero import utils as zu
    from ds.interfaces.errors import ConfigError
    from ds.zero.stage3.shard import partition_param

    p = torch.nn.Parameter(torch.randn(4))
    assert not zu.is_zero_param(p) and not zu.is_zero_param(3)
    partition_param(p, rank=0, world=1)
    assert zu.is_zero_param(p)
    assert zu.is_zero_supported_optimizer(torch.optim.AdamW([p]))
    assert not zu.is_zero_supported_optimizer(torch.optim.SGD([p], lr=0.1))
    assert torch.optim.Adagrad in zu.ZERO_SUPPORTED_OPTIMIZERS
    assert issubclass(ConfigError, zu.ZeRORuntimeException)
    with pytest.raises(FeatureNotAvailableError, match="get_lst_from_rank0"):
        zu.get_lst_from_rank0([1])
