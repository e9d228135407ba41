"""ds.sim: simulated CUDA devices and a simulated world of ranks (see packages/sim/README.md).

Importing this package changes nothing in torch; a :class:`ds.sim.accelerator.SimDevice` patches
torch's CUDA hooks only while it is active.
"""
