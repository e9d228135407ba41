"""Writes a marker file: proves a rank was started."""

import os
from pathlib import Path

Path(os.environ.get("MARKER", "marker")).write_text("started")
