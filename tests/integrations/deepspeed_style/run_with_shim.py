"""Run a DeepSpeed script unchanged on ds: register the shim as ``deepspeed``, then run it."""

import runpy
import sys

import ds.full.compat

ds.full.compat.install(shadow=True)  # this environment also has DeepSpeed installed as a peer
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
