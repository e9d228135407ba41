"""The one error hierarchy of ds. Every package raises subclasses of :class:`DsError`."""

from __future__ import annotations


class DsError(Exception):
    """Root of all errors raised by ds. Messages name what was wrong and how to fix it."""


class ConfigError(DsError, ValueError):
    """A configuration value is missing, malformed or inconsistent."""


class CommError(DsError, RuntimeError):
    """A collective failed, timed out, or the process group is unusable."""


class CollectiveTimeoutError(CommError, TimeoutError):
    """A collective did not complete within its timeout (raised by the watchdog)."""


class KernelError(DsError, RuntimeError):
    """A native or Triton kernel rejected its inputs or failed."""


class AsyncIOError(KernelError, OSError):
    """An asynchronous file read or write failed; the message names the file."""


class CheckpointError(DsError, RuntimeError):
    """A checkpoint could not be written, found, verified or loaded."""


class LedgerError(DsError, RuntimeError):
    """The run ledger is corrupt, tampered with, or cannot be appended."""


class ApprovalRequiredError(LedgerError, PermissionError):
    """A state-mutating operation was attempted without a recorded approval."""


class LaunchError(DsError, RuntimeError):
    """A job could not be launched, or one of its ranks failed."""


class AcceleratorError(DsError, RuntimeError):
    """The requested accelerator is unknown or unavailable on this machine."""


class InferenceError(DsError, RuntimeError):
    """An inference request cannot be served (for example the KV cache cannot hold it)."""


class ProviderNotFoundError(DsError, LookupError):
    """No implementation is registered for a plug-in group/name; names the distribution to install."""


__all__ = [
    "AcceleratorError",
    "ApprovalRequiredError",
    "AsyncIOError",
    "CheckpointError",
    "CollectiveTimeoutError",
    "CommError",
    "ConfigError",
    "DsError",
    "InferenceError",
    "KernelError",
    "LaunchError",
    "LedgerError",
    "ProviderNotFoundError",
]
