"""The contract and the code cannot drift: Protocol coverage and torch.distributed drop-in names."""

from __future__ import annotations

import inspect

import pytest
import torch.distributed as tdist

from ds import comm as dc
from ds.comm.backends.torch_backend import TorchCommunicator
from ds.interfaces.comm import Communicator

_PROTOCOL_METHODS = [
    n for n, v in vars(Communicator).items() if callable(v) and not n.startswith("_")
]


@pytest.mark.parametrize("name", _PROTOCOL_METHODS)
def test_torch_communicator_covers_the_protocol(name):
    proto = list(inspect.signature(getattr(Communicator, name)).parameters)
    impl = list(inspect.signature(getattr(TorchCommunicator, name)).parameters)
    # Same parameters in the same order; an implementation may add optional ones at the end.
    assert impl[: len(proto)] == proto, (name, proto, impl)


DROP_IN = [
    "init_process_group",
    "get_rank",
    "get_world_size",
    "is_initialized",
    "is_available",
    "barrier",
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "new_group",
    "destroy_process_group",
    "get_backend",
    "get_process_group_ranks",
    "get_global_rank",
]


@pytest.mark.parametrize("name", DROP_IN)
def test_module_api_matches_torch_distributed_parameters(name):
    if name == "init_process_group":
        return  # forwards *args/**kwargs unchanged
    torch_params = list(inspect.signature(getattr(tdist, name)).parameters)
    ds_params = [
        p.name
        for p in inspect.signature(getattr(dc, name)).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    # Positional and keyword calls written for torch mean the same with ds.comm.
    assert torch_params[: len(ds_params)] == ds_params, (name, torch_params, ds_params)


def test_public_names_are_exported():
    missing = [n for n in [*DROP_IN, "ReduceOp", "group", "get_local_rank"] if not hasattr(dc, n)]
    assert not missing
    assert all(hasattr(dc, n) for n in dc.__all__)


def test_import_does_not_load_pydantic():
    import subprocess
    import sys

    code = "import sys; from ds import comm; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
