"""``deepspeed.launcher.runner``: ``ds run`` reads the same environment file (``.deepspeed_env``,
beside ds's own ``.ds_env``)."""

DEEPSPEED_ENVIRONMENT_NAME = ".deepspeed_env"
PDSH_LAUNCHER = "pdsh"
OPENMPI_LAUNCHER = "openmpi"
MPICH_LAUNCHER = "mpich"
SLURM_LAUNCHER = "slurm"

__all__ = ["DEEPSPEED_ENVIRONMENT_NAME"]
