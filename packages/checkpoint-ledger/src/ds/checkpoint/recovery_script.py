"""``zero_to_fp32.py`` beside a save directory's ``latest``: the consolidation script DeepSpeed's
users expect in every ZeRO checkpoint folder (``python zero_to_fp32.py . OUTPUT_DIR``).

The file written is :mod:`ds.checkpoint.zero_to_fp32`, a command line over ds's export. It sits
outside every tag folder, so no manifest lists it and verifying or resharding a tag never reads
it. Saves keep working on file systems that refuse ``chmod`` (some network shares): the script
then stays non-executable and runs with ``python zero_to_fp32.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ds.checkpoint._fsutil import atomic_write_bytes
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

SCRIPT_NAME = "zero_to_fp32.py"
_SOURCE = Path(__file__).with_name("zero_to_fp32.py")
_chmod_warned = False


def write_recovery_script(directory: str) -> str:
    """Write (or refresh) ``directory/zero_to_fp32.py`` and make it executable; returns its path."""
    data = _SOURCE.read_bytes()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, SCRIPT_NAME)
    try:
        current = Path(path).read_bytes()
    except OSError:
        current = None
    if current != data:  # saves every few steps rewrite nothing when the script is current
        atomic_write_bytes(path, data)
    _make_executable(path)
    return path


def _make_executable(path: str) -> None:
    global _chmod_warned
    try:
        mode = os.stat(path).st_mode
        wanted = mode | ((mode & 0o444) >> 2)  # executable by whoever may read it
        if wanted != mode:
            os.chmod(path, wanted)
    except OSError as exc:
        if not _chmod_warned:  # once per process, not at every save
            _chmod_warned = True
            log.warning(
                "could not make the checkpoint's zero_to_fp32.py executable; the checkpoint is "
                "saved, run the script with 'python zero_to_fp32.py'",
                path=path,
                error=f"{type(exc).__name__}: {exc}",
            )
