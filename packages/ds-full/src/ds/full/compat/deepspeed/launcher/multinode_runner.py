"""``deepspeed.launcher.multinode_runner``: DeepSpeed's per-backend command builders. ds's
launcher has its own runners for the same back-ends (``ds run --launcher pdsh|openmpi|mpich|
impi|mvapich|slurm``, see docs/launcher.md), which the ``deepspeed`` command reaches through
``--launcher``; DeepSpeed's builder classes import here and say so when constructed."""

from ds.full.compat.deepspeed._missing import missing_class

_FEATURE = "DeepSpeed's multi-node command builders"
_HINT = "launch with 'deepspeed --launcher NAME ...' or 'ds run --launcher NAME ...' instead"


def _runner(name: str) -> type:
    return missing_class(f"deepspeed.launcher.multinode_runner.{name}", _FEATURE, _HINT)


MultiNodeRunner = _runner("MultiNodeRunner")
PDSHRunner = _runner("PDSHRunner")
OpenMPIRunner = _runner("OpenMPIRunner")
MPICHRunner = _runner("MPICHRunner")
IMPIRunner = _runner("IMPIRunner")
SlurmRunner = _runner("SlurmRunner")
MVAPICHRunner = _runner("MVAPICHRunner")

__all__ = [
    "IMPIRunner",
    "MPICHRunner",
    "MVAPICHRunner",
    "MultiNodeRunner",
    "OpenMPIRunner",
    "PDSHRunner",
    "SlurmRunner",
]
