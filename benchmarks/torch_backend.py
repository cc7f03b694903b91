"""The mpicoll torch.distributed backend against gloo, same ranks, same run, interleaved.

    mpirun -np 2 python benchmarks/torch_backend.py [--sizes 1K,...,64M] [--dtypes float32,bfloat16]
                                                    [--reps 5] [--ddp-steps 6] [--no-ddp] [--no-allreduce]
                                                    [--widths 566,1024,1588] [--compile aot_eager]
                                                    [--overlap-sizes 1M,...,64M] [--work sleep|matmul]

Four tables (rank 0 prints; medians over ``--reps`` interleaved blocks, slowest rank per block):

1. ``dist.all_reduce`` on the mpicoll group / on the gloo group, per size and dtype (< 1: mpicoll faster).
2. Python overhead per backend call: ``dist.all_reduce(t, group=mpicoll)``, the group's method without
   ``dist``'s wrapper (``group.allreduce([t], opts)``; from torch 2.14 the group is torch's
   ProcessGroup, which routes it through its dispatcher to the backend), the mpicoll call it makes
   (``mpicoll.functional.all_reduce`` on the same memory), the same call with ``async_op=True`` and
   its ``wait()`` (the handoff to the group's worker thread and back), torch's floor (``dist.all_reduce`` on a
   backend that only makes the MPI calls, :class:`_Floor`; with and without the header agreement's
   ``Allgather``) and the raw mpi4py ``Allreduce``, 8 B float32; each over raw.
3. Overlap: ``dist.all_reduce(t, async_op=True)`` of 1-64 MiB float32, then the caller's own work
   for as long as the call alone takes, then ``wait()``; the whole over the call alone (1.0: the
   call fully hidden, 2.0: nothing hidden), per backend. ``--work sleep`` (the default) leaves the
   caller's core free, as a rank waiting on its accelerator or on I/O would; ``--work matmul`` computes
   on it (then the call's own CPU work competes with the caller's: on 2 cores with a rank per core,
   no backend can hide it all).
4. A DDP training step (forward, backward with the gradient all-reduces, SGD step) of 5-layer MLPs
   (``--widths``: 1.6 M, 5.2 M and 12.6 M parameters), mpicoll / gloo, with the time of the same step
   without DDP and of DDP moving no data (a communication hook that hands each bucket back at once:
   DDP's own work, buckets and copies: with one rank per core, the least any backend's step can
   take); ``--compile BACKEND`` adds the same models under ``torch.compile``.

gloo's group comes from a TCP store on 127.0.0.1 (one host); the mpicoll group is
``dist.new_group(backend="mpicoll")`` over the same ranks. BLAS runs one thread per rank.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from threadpoolctl import threadpool_limits

import mpicoll.torch  # registers the backend
from mpicoll import functional as F
from mpicoll._validate import H_LEN

W = MPI.COMM_WORLD
RANK, SIZE = W.Get_rank(), W.Get_size()
SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(text: str) -> int:
    return int(text[:-1]) * SUFFIX[text[-1]] if text[-1] in SUFFIX else int(text)


def label(n: int) -> str:
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k:
            return f"{n // k}{unit}"
    return str(n)


def mpicoll_beside_gloo() -> dict:
    """The process group of gloo (the world, from a TCP store on 127.0.0.1 at a free port) and an
    mpicoll group over the same ranks: ``{"mpicoll": ..., "gloo": ...}``."""
    port = None
    if RANK == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = W.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=RANK, world_size=SIZE)
    return {"mpicoll": dist.new_group(backend="mpicoll"), "gloo": dist.group.WORLD}


def block(fn, iters: int) -> float:
    """Slowest rank's seconds per call over ``iters`` calls."""
    W.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return W.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)


def interleaved(fns: dict, iters: int, reps: int, budget: float = 0.25) -> dict:
    """Median seconds per call of each of ``fns``, blocks interleaved, after 3 warm-up calls each;
    at most ``iters`` calls per block, fewer where the slowest would take over ``budget`` s."""
    slowest = max(block(fn, 3) for fn in fns.values())
    iters = max(2, min(iters, int(budget / max(slowest, 1e-9))))
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            times[k].append(block(fn, iters))
    return {k: statistics.median(v) for k, v in times.items()}


def allreduce_table(groups, sizes, dtypes, reps) -> None:
    if RANK == 0:
        print(f"# dist.all_reduce, {SIZE} ranks: mpicoll backend vs gloo (us per call, median of {reps})")
        print(f"{'dtype':<10}{'size':>6}{'mpicoll':>11}{'gloo':>11}{'ratio':>8}")
    worst = 0.0
    for dtype in dtypes:
        for n in sizes:
            t = torch.ones(n // torch.tensor([], dtype=getattr(torch, dtype)).element_size(), dtype=getattr(torch, dtype))
            iters = max(3, min(2000, int(2e8 // max(n, 1) // 20)))
            got = interleaved({k: (lambda g=g: dist.all_reduce(t, group=g)) for k, g in groups.items()}, iters, reps)
            ratio = got["mpicoll"] / got["gloo"]
            worst = max(worst, ratio)
            if RANK == 0:
                print(f"{dtype:<10}{label(n):>6}{got['mpicoll'] * 1e6:>11.1f}{got['gloo'] * 1e6:>11.1f}{ratio:>8.2f}",
                      flush=True)
    if RANK == 0:
        print(f"# worst ratio mpicoll/gloo: {worst:.2f}\n", flush=True)


@mpicoll.torch._eager_under_compile            # (as the real group's methods: ~0.2 us a call)
class _Floor(mpicoll.torch.ProcessGroupMpicoll):
    """torch's floor for a Python backend making mpicoll's MPI calls: ``dist.all_reduce`` on a
    backend whose method makes only the MPI calls of a validated small all-reduce at 2 ranks (the
    header agreement's ``Allgather`` of one row, then the ``Allreduce``; ``agree`` False: the
    ``Allreduce`` alone) on buffers made beforehand, and returns a Work made beforehand: what
    torch's route and MPI cost, with no Python of mpicoll's. (From 3 ranks mpicoll sums floats in
    rank order, an ``Allgather`` and a local reduction: the floor then is not its call.)"""

    agree = True

    def allreduce(self, tensors, opts=None):
        if _Floor.agree:
            self._comm.Allgather([self._row, MPI.INT64_T], [self._table, MPI.INT64_T])
        self._comm.Allreduce(MPI.IN_PLACE, self._buf)
        return self._done


def _floor(backend_opts, options) -> _Floor:
    pg = _Floor(backend_opts.group_rank, SIZE, list(range(SIZE)), W)
    t = torch.ones(2, dtype=torch.float32)
    pg._comm, pg._buf, pg._done = W.Dup(), t.numpy(), mpicoll._torch_work.Work((), [t], "all_reduce")
    pg._row, pg._table = np.zeros(H_LEN, np.int64), np.zeros((SIZE, H_LEN), np.int64)
    mpicoll.torch._GROUPS.append(pg)              # (torch keeps a Python backend's C++ half only)
    return pg


def overhead_table(mp, floor, reps) -> None:
    t = torch.ones(2, dtype=torch.float32)
    a = t.numpy()
    out = np.empty_like(a)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False                # (as dist.all_reduce without async_op sets it: the call runs inline)

    def floor_call(agree):
        _Floor.agree = agree
        dist.all_reduce(t, group=floor)
    fns = {"dist.all_reduce (mpicoll)": lambda: dist.all_reduce(t, group=mp),
           "async_op=True, then wait()": lambda: dist.all_reduce(t, group=mp, async_op=True).wait(),
           "the group's allreduce([t])": lambda: mp.allreduce([t], opts),
           "mpicoll.functional.all_reduce": lambda: F.all_reduce(a),
           "torch's floor, agreement": lambda: floor_call(True),
           "torch's floor, no agreement": lambda: floor_call(False),
           "raw mpi4py Allreduce": lambda: W.Allreduce(a, out)}
    got = interleaved(fns, 2000, reps)
    if RANK == 0:
        print(f"# Python overhead per call, 8 B float32, {SIZE} ranks (us per call, median of {reps})")
        raw = got["raw mpi4py Allreduce"]
        for k, v in got.items():
            print(f"{k:<32}{v * 1e6:>9.2f}{(v - raw) * 1e6:>+10.2f} over raw")
        print(flush=True)


def overlap_table(groups, sizes, reps: int, work: str) -> None:
    """The whole of async call + own work + wait over the call alone (see the module docstring)."""
    a = torch.randn(192, 192)
    matmul = block(lambda: a @ a, 50) if work == "matmul" else 0.0

    def own(seconds: float) -> None:
        if work == "sleep":
            time.sleep(seconds)
        else:
            for _ in range(max(1, round(seconds / matmul))):
                a @ a
    if RANK == 0:
        print(f"# overlap: all_reduce(async_op=True) + own work ({work}) as long as the call + wait(), float32, "
              f"{SIZE} ranks: the whole / the call alone (1.00: hidden), returned after (ms); median of {reps}")
        print(f"{'size':>6}" + "".join(f"{k + ' call':>14}{k + ' whole':>14}{'ratio':>7}{'returned':>10}"
                                       for k in groups))
    for n in sizes:
        t = torch.ones(n // 4)
        row = {}
        for k, g in groups.items():
            dist.all_reduce(t, group=g)
            alone = statistics.median(block(lambda: dist.all_reduce(t, group=g), 1) for _ in range(reps))
            wholes, back = [], []
            for _ in range(reps):
                W.Barrier()
                t0 = time.perf_counter()
                w = dist.all_reduce(t, group=g, async_op=True)
                back.append(time.perf_counter() - t0)
                own(alone)
                w.wait()
                wholes.append(W.allreduce(time.perf_counter() - t0, op=MPI.MAX))
            row[k] = (alone, statistics.median(wholes), statistics.median(back))
        if RANK == 0:
            print(f"{label(n):>6}" + "".join(f"{c * 1e3:>14.2f}{w * 1e3:>14.2f}{w / c:>7.2f}{b * 1e3:>10.2f}"
                                             for c, w, b in row.values()), flush=True)
    if RANK == 0:
        print(flush=True)


def mlp(width: int) -> torch.nn.Module:
    """5 linear layers of ``width`` x ``width`` with ReLUs between: 5 (w^2 + w) parameters."""
    torch.manual_seed(0)
    layers = []
    for _ in range(5):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _no_communication(state, bucket):  # (no annotation: DDP checks it, and this module's are strings)
    """A DDP communication hook that moves nothing: its step is DDP's own work (buckets, copies),
    the least any backend's DDP step can take."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def ddp_table(groups, width: int, steps: int, reps: int, compile_backend: str | None) -> None:
    x, y = torch.randn(32, width), torch.randn(32, width)
    models = {k: torch.nn.parallel.DistributedDataParallel(mlp(width), process_group=g) for k, g in groups.items()}
    if compile_backend:
        for k, g in groups.items():
            models[f"{k}, compiled"] = torch.compile(
                torch.nn.parallel.DistributedDataParallel(mlp(width), process_group=g), backend=compile_backend)
    models["no DDP (compute only)"] = mlp(width)
    models["DDP, no data moved"] = torch.nn.parallel.DistributedDataParallel(mlp(width), process_group=groups["gloo"])
    models["DDP, no data moved"].register_comm_hook(None, _no_communication)
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}

    def step(k):
        opts[k].zero_grad()
        torch.nn.functional.mse_loss(models[k](x), y).backward()
        opts[k].step()
    got = interleaved({k: (lambda k=k: step(k)) for k in models}, steps, reps)
    params = sum(p.numel() for p in models["no DDP (compute only)"].parameters())
    if RANK == 0:
        print(f"# DDP training step, MLP of {params / 1e6:.1f} M parameters (5 x {width}^2, float32), batch 32 "
              f"per rank, {SIZE} ranks (ms per step, median of {reps})")
        for k, v in got.items():
            print(f"{k:<24}{v * 1e3:>9.1f}")
        line = f"ratio mpicoll/gloo: {got['mpicoll'] / got['gloo']:.2f}"
        if compile_backend:
            line += f"; compiled ({compile_backend}): {got['mpicoll, compiled'] / got['gloo, compiled']:.2f}"
        line += f"; DDP moving no data / gloo: {got['DDP, no data moved'] / got['gloo']:.2f}"
        print(line + f"; communication (step - compute): mpicoll "
              f"{(got['mpicoll'] - got['no DDP (compute only)']) * 1e3:.1f} ms, gloo "
              f"{(got['gloo'] - got['no DDP (compute only)']) * 1e3:.1f} ms\n", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1K,4K,16K,64K,256K,1M,4M,16M,64M")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ddp-steps", type=int, default=6)
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--widths", default="566,1024,1588", help="DDP MLP widths (1.6 M, 5.2 M, 12.6 M parameters)")
    ap.add_argument("--compile", default=None, help="also a torch.compile'd DDP model, with this backend")
    ap.add_argument("--no-allreduce", action="store_true")
    ap.add_argument("--overlap-sizes", default="1M,4M,16M,64M")
    ap.add_argument("--work", default="sleep", choices=("sleep", "matmul"), help="the caller's own work (overlap)")
    ap.add_argument("--no-overlap", action="store_true")
    args = ap.parse_args()
    groups = mpicoll_beside_gloo()
    dist.Backend.register_backend("floor", _floor, extended_api=True, devices=["cpu"])
    floor = dist.new_group(backend="floor")
    with threadpool_limits(limits=1, user_api="blas"):
        torch.set_num_threads(1)
        if not args.no_allreduce:
            allreduce_table(groups, [size(s) for s in args.sizes.split(",")], args.dtypes.split(","), args.reps)
            overhead_table(groups["mpicoll"], floor, args.reps)
        if not args.no_overlap:
            overlap_table(groups, [size(s) for s in args.overlap_sizes.split(",")], args.reps, args.work)
        if not args.no_ddp:
            for width in map(int, args.widths.split(",")):
                ddp_table(groups, width, args.ddp_steps, args.reps, args.compile)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
