"""The ``deepspeed`` module layout integrations and DeepSpeed's own tests import, exercised:
version info, the accelerator package, the op builders, FusedLion."""

from __future__ import annotations

import pytest
import torch


def test_version_is_the_deepspeed_api_level_served() -> None:
    import ds.full.compat.deepspeed as deepspeed
    from ds.full.compat.deepspeed import git_version_info

    assert deepspeed.__version__ == git_version_info.version == "0.19.8"
    assert (deepspeed.__version_major__, deepspeed.__version_minor__) == (0, 19)
    assert git_version_info.ds_version and git_version_info.git_hash.startswith("ds-")
    assert git_version_info.torch_info["version"] == ".".join(torch.__version__.split(".")[:2])
    assert git_version_info.installed_ops["cpu_adam"] is True


def test_accelerator_package_speaks_deepspeeds_interface() -> None:
    import ds.full.compat.deepspeed as deepspeed
    from ds.full.compat.deepspeed.accelerator import abstract_accelerator, real_accelerator
    from ds.full.compat.deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    acc = deepspeed.get_accelerator()
    assert acc is real_accelerator.get_accelerator()
    assert isinstance(acc, abstract_accelerator.DeepSpeedAccelerator)
    assert acc.device_name() == "cpu" and acc.communication_backend_name() == "gloo"
    assert acc.is_synchronized_device() and acc.use_host_timers()
    t = acc.FloatTensor([1, 2])
    assert t.dtype == torch.float32 and t.device.type == "cpu"
    assert acc.LongTensor([1]).dtype == torch.int64
    event = acc.Event(enable_timing=True)
    event.record()
    stream = acc.Stream()
    with acc.stream(stream):
        acc.range_push("region")
        acc.range_pop()
    acc.manual_seed(3)
    a = torch.rand(2)
    acc.manual_seed(3)
    assert torch.equal(a, torch.rand(2))
    assert acc.memory_cached() >= 0 and acc.max_memory_cached() >= 0
    assert acc.is_pinned(acc.pin_memory(torch.ones(2))) in (True, False)
    called = []
    acc.lazy_call(lambda: called.append(1))
    assert called == [1]
    assert acc.create_op_builder("CPUAdamBuilder").NAME == "cpu_adam"
    assert acc.get_op_builder("NoSuchBuilder") is None
    with pytest.raises(ValueError, match="not a torch compile backend"):
        acc.set_compile_backend("no-such-backend")
    try:
        real_accelerator.set_accelerator(CPU_Accelerator())
        assert deepspeed.get_accelerator() is not acc
        with pytest.raises(ValueError, match="not an accelerator"):
            real_accelerator.set_accelerator(object())
    finally:
        real_accelerator.set_accelerator(acc)


def test_op_builders_answer_from_prebuilt_kernels_and_never_compile() -> None:
    import ds.full.compat.deepspeed.ops as ops
    from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
    from ds.full.compat.deepspeed.ops.op_builder import (
        AsyncIOBuilder,
        CPUAdamBuilder,
        FusedAdamBuilder,
        InferenceBuilder,
        OpBuilder,
    )
    from ds.full.compat.deepspeed.ops.op_builder.all_ops import ALL_OPS
    from ds.ops.optim.adam import CPUAdam

    assert issubclass(CPUAdamBuilder, OpBuilder) and CPUAdamBuilder.NAME in ALL_OPS
    assert CPUAdamBuilder().is_compatible() and CPUAdamBuilder().sources() == []
    assert CPUAdamBuilder().load().CPUAdam is CPUAdam
    assert AsyncIOBuilder().load().AsyncIOHandle is not None
    assert ops.__compatible_ops__[FusedAdamBuilder.NAME] is True
    assert ops.__compatible_ops__[InferenceBuilder.NAME] is False
    with pytest.raises(FeatureNotAvailableError, match="never compiles"):
        InferenceBuilder().load()
    with pytest.raises(FeatureNotAvailableError, match="prebuilt"):
        CPUAdamBuilder().builder()


def test_fused_lion_steps_as_lion_is_defined() -> None:
    from ds.full.compat.deepspeed.ops.lion import FusedLion

    torch.manual_seed(0)
    w = torch.randn(3, 4)
    p = torch.nn.Parameter(w.clone())
    opt = FusedLion([p], lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    m = torch.zeros_like(w)
    for _ in range(3):
        g = torch.randn(3, 4)
        p.grad = g.clone()
        opt.step()
        w = w - 0.01 * (torch.sign(0.9 * m + 0.1 * g) + 0.1 * w)
        m = 0.99 * m + 0.01 * g
    assert torch.allclose(p.detach(), w, atol=1e-6)
    assert torch.allclose(opt.state[p]["exp_avg"], m, atol=1e-6)
    assert isinstance(opt, torch.optim.Optimizer) and "exp_avg" in opt.state_dict()["state"][0]
    with pytest.raises(ValueError, match="beta"):
        FusedLion([p], betas=(1.5, 0.9))


def test_required_torch_version() -> None:
    from ds.full.compat.deepspeed.utils.torch import required_torch_version

    assert required_torch_version(min_version=1.8)
    assert not required_torch_version(max_version=1.8)
    with pytest.raises(ValueError, match="min_version"):
        required_torch_version()
