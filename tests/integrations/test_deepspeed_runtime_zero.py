"""``deepspeed.runtime.zero.partition_parameters`` through the shim, as transformers uses it: its
``prevent_arange_dtype_change()`` (entered before ``zero.Init`` whenever a ZeRO-3 model is built
from a config or ``from_pretrained``) imports the module and swaps its constructor wrapper."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import torch
    import ds.full.compat as compat
    compat.install()
    from transformers.integrations.deepspeed import prevent_arange_dtype_change
    from deepspeed.runtime.zero import partition_parameters as pp
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    original = pp.zero_wrapper_for_fp_tensor_constructor
    with prevent_arange_dtype_change():
        wrapper = pp.zero_wrapper_for_fp_tensor_constructor
        assert wrapper is not original
        # transformers keeps arange's explicit dtype; other constructors take the target dtype
        rope = wrapper(pp._orig_torch_arange, torch.float16, target_device="cpu")
        print("arange", rope(0, 4, dtype=torch.float32).dtype)
        print("ones", wrapper(torch.ones, torch.float16)(2).dtype)
    print("restored", pp.zero_wrapper_for_fp_tensor_constructor is original)
    print("status", ZeroParamStatus.AVAILABLE.name, pp.Init.__module__.split(".")[0])
    """
)


@pytest.mark.slow  # imports transformers in a fresh process
def test_transformers_prevent_arange_dtype_change_runs_on_the_shim() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "arange torch.float32" in proc.stdout and "ones torch.float16" in proc.stdout
    assert "restored True" in proc.stdout
    assert "status AVAILABLE ds" in proc.stdout
