"""Each rank starts a child that stays in its process group and a grandchild that escapes it
with setsid, records every pid, then waits forever (or ignores SIGTERM when asked)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
escaped = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
)
out = Path(os.environ["PID_DIR"]) / f"rank{os.environ['RANK']}.pids"
out.write_text(f"{os.getpid()} {child.pid} {escaped.pid}\n")
print("ready", flush=True)
while True:
    time.sleep(1)
