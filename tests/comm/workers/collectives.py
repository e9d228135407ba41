"""Rank worker: every ds.comm collective vs the single-process computation of the same data.

Usage: collectives.py OUT_DIR MODE   (MODE: plain | instrumented | emulated)
Writes OUT_DIR/rank<R>.json: {check name: "ok" | failure text}. Data are small integers so that
bf16 sums are exact and results can be compared with torch.equal.
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as tdist

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int64": torch.int64}
CHECKS: dict[str, Callable[[], None]] = {}


def check(name: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def deco(fn: Callable[[], None]) -> Callable[[], None]:
        CHECKS[name] = fn
        return fn

    return deco


def data(r: int, n: int, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
    """Rank r's tensor: small distinct integers (exact in bf16)."""
    return ((torch.arange(n) * (r + 1) + r + offset) % 7).to(dtype)


def expect(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.tolist()} ({got.dtype}), want {want.tolist()}")


def _define_checks(dist, R: int, W: int) -> None:
    ranks = list(range(W))
    for dname, dt in DTYPES.items():

        def _ar(dt=dt, dname=dname):
            for op, fn in (
                (dist.ReduceOp.SUM, lambda xs: sum(xs)),
                (dist.ReduceOp.MAX, lambda xs: torch.stack(xs).amax(0)),
                (dist.ReduceOp.MIN, lambda xs: torch.stack(xs).amin(0)),
                (tdist.ReduceOp.SUM, lambda xs: sum(xs)),
                (tdist.ReduceOp.MAX, lambda xs: torch.stack(xs).amax(0)),
            ):
                t = data(R, 10, dt)
                dist.all_reduce(t, op=op)
                expect(t, fn([data(r, 10, dt) for r in ranks]).to(dt), f"all_reduce {op}")
            t = (data(R, 6, dt) % 2 + 1).to(dt)
            dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
            want = torch.stack([(data(r, 6, dt) % 2 + 1).to(dt) for r in ranks]).prod(0).to(dt)
            expect(t, want, "all_reduce PRODUCT")
            if dt.is_floating_point:
                t = data(R, 10, dt) * W
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
                expect(t, sum(data(r, 10, dt) for r in ranks).to(dt), "all_reduce AVG")
            t = data(R, 10, dt)
            assert dist.inference_all_reduce(t) is None  # DeepSpeed's name: in place, blocking
            expect(t, sum(data(r, 10, dt) for r in ranks).to(dt), "inference_all_reduce")
            t = data(R, 10, dt)
            h = dist.all_reduce(t, async_op=True)
            assert h is not None
            h.wait()
            assert h.is_completed()
            expect(t, sum(data(r, 10, dt) for r in ranks).to(dt), "async all_reduce")

        check(f"all_reduce[{dname}]")(_ar)

        def _bcast(dt=dt):
            src = W - 1
            t = data(R, 9, dt)
            dist.broadcast(t, src=src)
            expect(t, data(src, 9, dt), "broadcast")
            t = data(R, 9, dt)
            dist.broadcast(t, src=0, async_op=True).wait()
            expect(t, data(0, 9, dt), "async broadcast")

        check(f"broadcast[{dname}]")(_bcast)

        def _reduce(dt=dt):
            dst = 1
            t = data(R, 8, dt)
            dist.reduce(t, dst=dst)
            if dst == R:
                expect(t, sum(data(r, 8, dt) for r in ranks).to(dt), "reduce")
            t = data(R, 8, dt)
            dist.reduce(t, dst=0, op=dist.ReduceOp.MAX, async_op=True).wait()
            if R == 0:
                expect(t, torch.stack([data(r, 8, dt) for r in ranks]).amax(0), "reduce MAX")

        check(f"reduce[{dname}]")(_reduce)

        def _ag(dt=dt):
            outs = [torch.zeros(5, dtype=dt) for _ in ranks]
            dist.all_gather(outs, data(R, 5, dt))
            for r in ranks:
                expect(outs[r], data(r, 5, dt), f"all_gather part {r}")
            out = torch.zeros(W * 5, dtype=dt)
            dist.all_gather_into_tensor(out, data(R, 5, dt))
            expect(out, torch.cat([data(r, 5, dt) for r in ranks]), "all_gather_into_tensor")
            out2 = torch.zeros(W, 5, dtype=dt)
            dist.all_gather_into_tensor(out2, data(R, 5, dt), async_op=True).wait()
            expect(out2, torch.stack([data(r, 5, dt) for r in ranks]), "all_gather stacked")

        check(f"all_gather[{dname}]")(_ag)

        def _rs(dt=dt):
            full = [data(r, 4 * W, dt) for r in ranks]
            want = sum(full).to(dt)[R * 4 : (R + 1) * 4]
            out = torch.zeros(4, dtype=dt)
            dist.reduce_scatter(out, list(data(R, 4 * W, dt).chunk(W)))
            expect(out, want, "reduce_scatter")
            out = torch.zeros(4, dtype=dt)
            dist.reduce_scatter_tensor(out, data(R, 4 * W, dt))
            expect(out, want, "reduce_scatter_tensor")
            out = torch.zeros(4, dtype=dt)
            dist.reduce_scatter_tensor(out, data(R, 4 * W, dt), async_op=True).wait()
            expect(out, want, "async reduce_scatter_tensor")
            out = torch.zeros(4, dtype=dt)
            dist.reduce_scatter_tensor(out, data(R, 4 * W, dt), op=dist.ReduceOp.MAX)
            want_max = torch.stack(full).amax(0)[R * 4 : (R + 1) * 4]
            expect(out, want_max, "reduce_scatter_tensor MAX")
            if dt.is_floating_point:
                out = torch.zeros(4, dtype=dt)
                dist.reduce_scatter_tensor(out, data(R, 4 * W, dt) * W, op=dist.ReduceOp.AVG)
                expect(out, want, "reduce_scatter_tensor AVG")

        check(f"reduce_scatter[{dname}]")(_rs)

        def _a2a(dt=dt):
            inp = data(R, 3 * W, dt, offset=R)
            out = torch.zeros(3 * W, dtype=dt)
            dist.all_to_all_single(out, inp)
            want = torch.cat([data(r, 3 * W, dt, offset=r)[R * 3 : (R + 1) * 3] for r in ranks])
            expect(out, want, "all_to_all_single even")
            # Uneven: rank r sends (j + r + 1) elements to rank j.
            in_splits = [j + R + 1 for j in ranks]
            out_splits = [R + r + 1 for r in ranks]
            inp = data(R, sum(in_splits), dt)
            out = torch.zeros(sum(out_splits), dtype=dt)
            dist.all_to_all_single(out, inp, out_splits, in_splits, async_op=True).wait()
            pieces = []
            for r in ranks:
                splits = [j + r + 1 for j in ranks]
                pieces.append(data(r, sum(splits), dt).split(splits)[R])
            expect(out, torch.cat(pieces), "all_to_all_single uneven")

        check(f"all_to_all_single[{dname}]")(_a2a)

        def _gather_scatter(dt=dt):
            dst = W - 1
            glist = [torch.zeros(4, dtype=dt) for _ in ranks] if dst == R else None
            dist.gather(data(R, 4, dt), glist, dst=dst)
            if dst == R:
                for r in ranks:
                    expect(glist[r], data(r, 4, dt), "gather")
            slist = [data(100 + r, 4, dt) for r in ranks] if R == 0 else None
            out = torch.zeros(4, dtype=dt)
            dist.scatter(out, slist, src=0)
            expect(out, data(100 + R, 4, dt), "scatter")

        check(f"gather_scatter[{dname}]")(_gather_scatter)

        def _p2p(dt=dt):
            nxt, prv = (R + 1) % W, (R - 1) % W
            if R % 2 == 0:
                dist.send(data(R, 6, dt), dst=nxt)
                got = torch.zeros(6, dtype=dt)
                dist.recv(got, src=prv)
            else:
                got = torch.zeros(6, dtype=dt)
                dist.recv(got, src=prv)
                dist.send(data(R, 6, dt), dst=nxt)
            expect(got, data(prv, 6, dt), "send/recv ring")
            got = torch.zeros(6, dtype=dt)
            hs = [dist.isend(data(R, 6, dt), dst=nxt), dist.irecv(got, src=prv)]
            for h in hs:
                h.wait()
            expect(got, data(prv, 6, dt), "isend/irecv ring")

        check(f"send_recv[{dname}]")(_p2p)

        def _coalesced(dt=dt):
            sizes = [1, 5, 7, 13, 2 * W]
            full = {r: [data(r, n, dt, offset=i) for i, n in enumerate(sizes)] for r in ranks}
            chunks = dist.reduce_scatter_coalesced(full[R])
            for i, n in enumerate(sizes):
                c = -(-n // W)
                total = torch.zeros(W * c, dtype=dt)
                total[:n] = sum(full[r][i] for r in ranks).to(dt)
                expect(chunks[i], total[R * c : (R + 1) * c], f"reduce_scatter_coalesced {i}")
            work = dist.reduce_scatter_coalesced(full[R], async_op=True)
            work.wait()
            for a, b in zip(work.outputs, chunks):
                expect(a, b, "async reduce_scatter_coalesced")
            # all-gather of uneven partitions: rank r holds elements [r*c, min(n, (r+1)*c)).
            shards = []
            for i, n in enumerate(sizes):
                c = -(-n // W)
                shards.append(full[0][i][R * c : min(n, (R + 1) * c)])
            outs = dist.all_gather_coalesced(shards, sizes)
            for i in range(len(sizes)):
                expect(outs[i], full[0][i], f"all_gather_coalesced {i}")
            work = dist.all_gather_coalesced(shards, sizes, async_op=True)
            work.wait()
            for i in range(len(sizes)):
                expect(work.outputs[i], full[0][i], f"async all_gather_coalesced {i}")

        check(f"coalesced[{dname}]")(_coalesced)

    @check("objects")
    def _objects():
        objs = [{"rank": R, "x": [1, 2]}, "s"] if R == 0 else [None, None]
        dist.broadcast_object_list(objs, src=0)
        assert objs == [{"rank": 0, "x": [1, 2]}, "s"], objs
        out = [None] * W
        dist.all_gather_object(out, ("r", R))
        assert out == [("r", r) for r in ranks], out

    @check("sub_groups")
    def _sub_groups():
        members = [0, W - 1]  # world 2: both ranks; world 3: ranks 0 and 2 (rank 1 sits out)
        g = dist.new_group(members)
        odd = dist.new_group([r for r in ranks if r % 2 == 1])
        if R in members:
            assert dist.get_world_size(g) == 2
            assert dist.get_rank(g) == members.index(R)
            assert dist.get_process_group_ranks(g) == members
            t = data(R, 6, torch.float32)
            dist.all_reduce(t, group=g)
            expect(t, sum(data(r, 6, torch.float32) for r in members), "sub-group all_reduce")
            t = data(R, 6, torch.bfloat16)
            dist.broadcast(t, src=W - 1, group=g)
            expect(t, data(W - 1, 6, torch.bfloat16), "sub-group broadcast (global src)")
            out = torch.zeros(12, dtype=torch.int64)
            dist.all_gather_into_tensor(out, data(R, 6, torch.int64), group=g)
            want = torch.cat([data(r, 6, torch.int64) for r in members])
            expect(out, want, "sub-group all_gather_into_tensor")
            out = torch.zeros(3, dtype=torch.int64)
            dist.reduce_scatter_tensor(out, data(R, 6, torch.int64), group=g)
            gi = members.index(R)
            want = sum(data(r, 6, torch.int64) for r in members)[gi * 3 : (gi + 1) * 3]
            expect(out, want, "sub-group reduce_scatter_tensor")
            sizes = [3, 4]
            chunks = dist.reduce_scatter_coalesced(
                [data(R, n, torch.float32) for n in sizes], group=g
            )
            for i, n in enumerate(sizes):
                c = -(-n // 2)
                total = torch.zeros(2 * c)
                total[:n] = sum(data(r, n, torch.float32) for r in members)
                expect(chunks[i], total[gi * c : (gi + 1) * c], "sub-group coalesced")
            dist.barrier(group=g)
        else:
            assert dist.get_rank(g) < 0
            t = torch.ones(2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch notes the non-member call
                assert dist.all_reduce(t, group=g) is None
            expect(t, torch.ones(2), "non-member all_reduce is a no-op")
        if R % 2 == 1:
            t = torch.ones(2)
            dist.all_reduce(t, group=odd)
            expect(t, torch.full((2,), float(len(ranks) // 2)), "odd sub-group")
        dist.barrier()

    @check("barrier_and_ranks")
    def _barrier():
        assert dist.is_initialized()
        assert dist.get_rank() == R and dist.get_world_size() == W
        assert dist.get_local_rank() == R
        assert dist.get_backend() == "gloo"
        dist.barrier()
        dist.barrier(async_op=True).wait()
        dist.barrier(timeout=30)


def main() -> int:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    from ds import comm as dist

    dist.init_distributed(verbose=False)
    R, W = dist.get_rank(), dist.get_world_size()
    if mode == "instrumented":
        dist.configure(comms_logger=True, watchdog=60, check_consistency=True)
    elif mode == "emulated":
        c = dist.get_communicator()
        c.native_avg = False
        c.native_reduce_scatter = False
    _define_checks(dist, R, W)
    results: dict[str, str] = {}
    for name, fn in CHECKS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
        dist.barrier()  # keep ranks in step even after a failed check
    if mode == "instrumented":
        lg = dist.get_comms_logger()
        assert lg is not None
        ops = {row["op"] for row in lg.rows()}
        results["logger_saw_ops"] = (
            "ok"
            if {"all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"} <= ops
            else f"logger rows missing ops: {sorted(ops)}"
        )
    (out_dir / f"rank{R}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
