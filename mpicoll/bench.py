"""The nccl-tests-style benchmark harness: ``mpirun -np N python -m mpicoll.run bench ...``.

It sweeps sizes for every registered operator (``mpicoll.checks.BENCHES``; it never names one), times out-of-place
and in-place forms as the slowest rank's mean per iteration, checks the results against the golden
(wrong elements summed over ranks), and optionally runs the same sweep through the raw mpi4py
buffer call and torch.distributed's gloo backend, interleaved per size so that drift on a shared
machine hits every implementation alike.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from . import __version__
from . import _shm
from ._cpus import node_affinities
from ._domains import declare_domains, domain, domain_members, lookup, world as lib_world
from ._dtypes import DTYPES, REDUCE_OPS
from .checks import BENCHES, BenchCase
from .checks._golden import count_wrong
from ._validate import validate_default
from .check import UsageError
from ._cli import Parser, epilog, kernels_summary, on_ctrl_c, version_text

_SUFFIX = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864; suffixes K, M, G (powers of 1024), optional trailing B."""
    t = str(text).strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in "KMG" and t[-1:] else ""
    num = t[:-1] if unit else t
    try:
        value = float(num) * _SUFFIX[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use a number with an optional K/M/G suffix") from None
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"bad size {text!r}: must be a whole number of bytes >= 0")
    return int(value)


def size_steps(begin: int, end: int, factor: int) -> list[int]:
    """nccl-tests' sweep: begin, begin*f, ... while <= end."""
    if factor < 2:
        raise UsageError("-f/--stepfactor must be >= 2")
    out, s = [], begin
    while s <= end:
        out.append(s)
        s = s * factor if s else 1
        if s == 0:
            break
    return out


def bus_factor(name: str, n: int) -> float:
    return BENCHES[name].bus_factor(n)


BENCH_EPILOG = """\
examples:
  mpirun -np 2 python -m mpicoll.run bench -b 8 -e 64M -f 4 --compare mpi4py
  mpirun -np 4 python -m mpicoll.run bench --op AllReduce -d float16 --plan --json rows.json --plot busbw.png
Ctrl-C: one line, the rows measured so far written to --json, exit status 130.
"""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m mpicoll.run bench", formatter_class=argparse.RawDescriptionHelpFormatter,
               description="nccl-tests-style sweep of mpicoll's operators (run under mpirun).",
               epilog=epilog(BENCH_EPILOG))
    p.add_argument("--version", action="version", version=version_text(),
                   help="print mpicoll's version and the numeric kernels in use, and exit")
    p.add_argument("--op", default="all", help="operator name(s), comma-separated, or all (default)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"), help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"), help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier (default 2)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per point (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("-c", "--check", type=int, default=1, help="check results against the golden (default 1)")
    p.add_argument("-d", "--datatype", default="float32", help="dtype(s), comma-separated, or all (default float32)")
    p.add_argument("-o", "--op_type", default="sum", help="reduce op(s): sum, prod, max, min or all (default sum)")
    p.add_argument("-r", "--root", type=int, default=0, help="root rank for rooted operators (default 0)")
    p.add_argument("--domain", default="", help="run on a sub-domain: its world ranks (e.g. 0,2), or a domain "
                                               "name from --domains; ranks not in it run nothing")
    p.add_argument("--domains", metavar="FILE", help="declare domains from a JSON file {name: [world ranks]}")
    p.add_argument("--split", default="", help='split the world like nccl-tests: "MOD k" or "DIV k"')
    p.add_argument("--validate", type=int, choices=(0, 1), default=None,
                   help="mpicoll's cross-rank checks (default: MPICOLL_VALIDATE, on)")
    p.add_argument("--plan", action="store_true",
                   help="time prepared plans (op.prepare(...).run()) instead of execute()")
    p.add_argument("--compare", default="", help="also time mpi4py, gloo and/or deepspeed (its CPU shared-memory "
                   "allreduce; AllReduce only): e.g. mpi4py,gloo")
    p.add_argument("--reps", type=int, default=None,
                   help="interleaved repetitions per point (median kept; default 1, or 3 with --compare; at least "
                        f"{SMALL_REPS} up to {SMALL_BYTES} B, where a block is short and noise large)")
    p.add_argument("--json", help="write every row to this JSON file (on Ctrl-C: the rows measured so far)")
    p.add_argument("--plot", help="draw busbw vs size to this PNG, log-log (needs matplotlib: the plot extra)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


@dataclass
class Row:
    op: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float | None = None
    algbw: float | None = None
    busbw: float | None = None
    wrong: int | None = None
    ip_time_us: float | None = None
    ip_algbw: float | None = None
    ip_busbw: float | None = None
    ip_wrong: int | None = None
    compare: dict = field(default_factory=dict)      # impl -> time_us (None = not available)
    ratio: dict = field(default_factory=dict)        # impl -> time mpicoll/impl, paired per repetition


def _select(value: str, known: list[str], what: str) -> list[str]:
    if value.lower() == "all":
        return list(known)
    lower = {k.lower(): k for k in known}
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in names if v.lower() not in lower]
    if bad:
        raise UsageError(f"unknown {what}: {', '.join(bad)}; known: {', '.join(known)}")
    return [lower[v.lower()] for v in names]


class _Gloo:
    """torch.distributed with the gloo backend over the same ranks, if torch is installed."""

    def __init__(self, world: MPI.Comm, colors: list[int]) -> None:
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        port = None
        if world.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = world.bcast(port, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.Get_rank(),
                                world_size=world.Get_size())
        self.group, self.deepspeed = None, None
        me = colors[world.Get_rank()]
        for color in sorted(c for c in set(colors) if c >= 0):   # new_group is collective: same order
            g = dist.new_group([r for r, c in enumerate(colors) if c == color])
            if color == me:
                self.group = g

    def close(self) -> None:
        self.dist.destroy_process_group()


class _DeepSpeed:
    """DeepSpeed's CPU shared-memory allreduce (``deepspeed.comm.inference_all_reduce``, built from
    its ``shm.cpp`` on first use) over the gloo process group of ``gloo``; only AllReduce. In the
    shape of torch.distributed for the operators' ``torch_call``: ``all_reduce`` is DeepSpeed's
    call, any other collective is missing (n/a)."""

    def __init__(self, gloo: _Gloo, world: MPI.Comm) -> None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ["LOCAL_SIZE"], os.environ["LOCAL_RANK"] = str(world.Get_size()), str(world.Get_rank())
        import deepspeed
        import deepspeed.comm
        deepspeed.init_distributed(dist_backend="gloo")     # (wraps the process group gloo made)
        self._comm, self.torch, self.ReduceOp = deepspeed.comm, gloo.torch, gloo.dist.ReduceOp

    def all_reduce(self, tensor, op, group=None):
        return self._comm.inference_all_reduce(tensor, op=op)


#: points up to this many bytes are timed in at least SMALL_REPS blocks by default (their median kept)
SMALL_BYTES, SMALL_REPS = 1024, 5


def _time(comm: MPI.Comm, fn, iters: int) -> float:
    """Slowest rank's mean seconds per call over ``iters`` calls."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return comm.allreduce((time.perf_counter() - t0) / max(iters, 1), op=MPI.MAX)


def run_bench(argv: list[str] | None = None) -> int:
    """Run the sweep; returns the exit status (1 if any result was wrong)."""
    args = build_parser().parse_args(argv)
    args.command_line = "python -m mpicoll.run bench " + " ".join(sys.argv[2:] if argv is None else argv)
    _check_counts(args)
    lib_world()                    # (made on every rank at once: the operations run on it)
    world = MPI.COMM_WORLD         # (the harness' own calls: timing, verdicts; never the library's communicator)
    me, nworld = world.Get_rank(), world.Get_size()
    ops = _select(args.op, list(BENCHES), "operator")
    dtypes = _select(args.datatype, list(DTYPES), "dtype")
    redops = _select(args.op_type, list(REDUCE_OPS), "reduce op")
    compare = [c for c in args.compare.split(",") if c]
    for c in compare:
        if c not in ("mpi4py", "gloo", "deepspeed"):
            raise UsageError(f"--compare: unknown implementation {c!r} (mpi4py, gloo, deepspeed)")
    reps = args.reps or (3 if compare else 1)
    validate = validate_default() if args.validate is None else bool(args.validate)
    colors, dom = _layout(args, me, nworld)
    smallest = min(colors.count(c) for c in set(colors) if c >= 0)
    if not 0 <= args.root < smallest:
        raise UsageError(f"-r/--root {args.root}: must be a rank of every benchmarked group, in [0, {smallest})")
    placement = _placement(world)
    active = colors[me] >= 0
    raw_comm = MPI.COMM_WORLD.Split(colors[me] if active else MPI.UNDEFINED, me)
    comm = (domain(dom) if dom else world) if active else None
    printer = active and comm.Get_rank() == 0 and colors[me] == min(c for c in colors if c >= 0)
    if args.json:
        unwritable = next((w for w in world.allgather(_unwritable(args.json) if printer else None) if w), None)
        if unwritable:
            raise UsageError(f"--json {args.json}: {unwritable}")
    if args.plot:
        _plot_usable(world, printer)
    hosts = list(dict.fromkeys(comm.allgather(MPI.Get_processor_name()))) if active else []
    gloo = None
    if "gloo" in compare or "deepspeed" in compare:
        try:
            gloo = _Gloo(MPI.COMM_WORLD, colors)
        except ImportError:
            if me == 0:
                sys.stderr.write(f"--compare {','.join(c for c in compare if c != 'mpi4py')}: torch is not installed: "
                                 "pip install '.[compare]' (torch==2.13.0, CPU build)\n")
            compare = [c for c in compare if c == "mpi4py"]
    if "deepspeed" in compare:
        why = None
        if any(c != 0 for c in colors):
            why = "its shared-memory allreduce spans every rank: not with --domain layouts"
        elif len(placement["hosts"]) > 1:
            why = "its shared-memory allreduce is for the ranks of one host"
        else:
            try:
                gloo.deepspeed = _DeepSpeed(gloo, MPI.COMM_WORLD)
            except ImportError as e:
                why = f"{e}: pip install deepspeed ninja"
        why = next((w for w in world.allgather(why) if w), None)     # (every rank drops it alike)
        if why:
            if me == 0:
                sys.stderr.write(f"--compare deepspeed: not available ({why})\n")
            compare.remove("deepspeed")
    kernels = kernels_summary(world)
    if printer:
        print(f"# mpicoll {__version__} bench: {nworld} ranks on {_hosts_text(placement['hosts'])}; "
              f"numeric kernels: {kernels}", flush=True)
        lib = lookup(dom) if dom else lib_world()
        print("# " + (f"one node: AllReduce, Reduce from {_shm.ALLREDUCE_BYTES // 1024} KiB (16-bit floats: "
                      f"{_shm.ALLREDUCE_16BIT_BYTES // 1024} KiB) and ReduceScatter(V) from "
                      f"{_shm.REDUCE_SCATTER_BYTES // 1024} KiB through the shared window (docs/shm.md)" if lib.local
                      else "no shared window (ranks on several hosts, or MPICOLL_SHM=0): MPI's collectives"),
              flush=True)
    if printer and placement["oversubscribed"] and not placement["bound"]:
        print(f"# note: {placement['local_ranks']} ranks share {placement['cores']} cores here and are not bound "
              "to cores: the scheduler moves them between calls, so the timings (and the ratios of synchronizing "
              "calls) change from run to run; bind them (MPICH: mpirun -bind-to core, Open MPI: --bind-to core)",
              flush=True)
    rows: list[Row] = []           # filled point by point: what Ctrl-C saves
    progress = printer and not args.quiet and sys.stderr.isatty()
    saving, saved = threading.Lock(), []

    def save(interrupted: bool) -> None:
        """Write the JSON once (the main thread after the sweep, or Ctrl-C's thread: whichever
        comes first; a write that Ctrl-C cut short is done again)."""
        with saving:
            if args.json and not saved:
                _write_json(args, list(rows), comm.Get_size(), compare, validate, placement, kernels, interrupted)
                saved.append(True)

    def last_words() -> str:       # Ctrl-C, on the printing rank, from _cli.ctrl_c_ends_the_job's thread
        count = len(rows)
        save(interrupted=True)
        where = f"; the rows measured so far are in {args.json}" if args.json else ""
        clear = "\r" + " " * 60 + "\r" if progress else ""      # (the progress line)
        return f"{clear}python -m mpicoll.run bench: interrupted (Ctrl-C) after {count} point(s){where}"
    on_ctrl_c(printer, last_words)
    if active:
        _sweep(args, ops, dtypes, redops, compare, reps, validate, comm, raw_comm, dom, gloo, printer, rows, progress)
    any_wrong = sum((r.wrong or 0) + (r.ip_wrong or 0) for r in rows)
    if printer:
        bws = [b for r in rows for b in (r.busbw, r.ip_busbw) if b is not None]
        print(f"# Out of bounds values : {any_wrong} {'OK' if any_wrong == 0 else 'FAILED'}")
        print(f"# Avg bus bandwidth    : {statistics.fmean(bws) if bws else 0:.4g}")
        print("#", flush=True)
        save(interrupted=False)
        if args.plot:
            _plot(args.plot, rows, comm.Get_size(), compare, mode=_mode(args.plan, validate), hosts=hosts)
    if gloo is not None:
        gloo.close()
    if raw_comm != MPI.COMM_NULL:
        raw_comm.Free()
    return 1 if world.allreduce(any_wrong, op=MPI.MAX) else 0


def _check_counts(args) -> None:
    """The flags whose values make no sweep (the same verdict on every rank: they hold the same)."""
    if args.iters < 1:
        raise UsageError(f"-n/--iters {args.iters}: must be >= 1 (the times are averages over the iterations)")
    if args.warmup_iters < 0:
        raise UsageError(f"-w/--warmup_iters {args.warmup_iters}: must be >= 0")
    if args.minbytes > args.maxbytes:
        raise UsageError(f"-b/--minbytes {args.minbytes} is larger than -e/--maxbytes {args.maxbytes}: no size to run")
    if args.reps is not None and args.reps < 1:
        raise UsageError(f"--reps {args.reps}: must be >= 1")


def _unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written here (None: it can), tried before the sweep, not after it."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"its folder {folder} does not exist"
    if os.path.isdir(path) or not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "cannot be written here"
    return None


def _layout(args, me: int, nworld: int) -> tuple[list[int], str]:
    """Per world rank: the group it benchmarks in (-1 = idle), and this rank's domain name."""
    if args.split and args.domain:
        raise UsageError("--split and --domain are exclusive")
    if args.split:
        kind, _, k = args.split.upper().partition(" ")
        if kind not in ("MOD", "DIV") or not k.strip().isdigit() or int(k) < 1:
            raise UsageError('--split must be "MOD k" or "DIV k"')
        k = int(k)
        colors = [r % k if kind == "MOD" else r // k for r in range(nworld)]
        tag = f"bench.split.{kind}{k}"
        declare_domains({f"{tag}.{c}": [r for r in range(nworld) if colors[r] == c] for c in set(colors)})
        return colors, f"{tag}.{colors[me]}"
    if args.domains:
        try:
            declare_domains(args.domains)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--domains {args.domains}: {exc}") from None
    if args.domain:
        if all(v.strip().lstrip("-").isdigit() for v in args.domain.split(",")):
            members = sorted({int(v) for v in args.domain.split(",")})
            name = "bench.domain." + "-".join(map(str, members))
        else:
            name = args.domain
            try:
                members = list(domain_members(name))
            except ValueError:
                raise UsageError(f"--domain {name!r}: not a list of world ranks (e.g. 0,2) nor a domain declared "
                                 "with --domains FILE") from None
        if not members or members[0] < 0 or members[-1] >= nworld:
            raise UsageError(f"--domain: ranks must be in [0, {nworld})")
        if me in members:
            declare_domains({name: members})
        return [0 if r in members else -1 for r in range(nworld)], name
    return [0] * nworld, ""


def _sweep(args, ops, dtypes, redops, compare, reps, validate, comm, raw_comm, dom, gloo, printer, rows,
           progress) -> None:
    """Time every point, appending its row to ``rows`` as soon as it is measured."""
    n, rank = comm.Get_size(), comm.Get_rank()
    for name in ops:
        spec = BENCHES[name]
        mult = max(spec.count_multiple(n), 1)
        why = spec.skip_at(n)
        if why:
            if printer:
                print(f"# {name}: skipped: {why}", flush=True)
            continue
        if printer and not any(d in spec.dtypes for d in dtypes):
            print(f"# {name}: skipped: it takes {', '.join(spec.dtypes)} only (add it with -d)", flush=True)
        for dname in [d for d in dtypes if d in spec.dtypes]:
            dt = DTYPES[dname]
            for rname in ([r for r in redops if REDUCE_OPS[r].refuses(dt) is None] if spec.uses_reduce else ["none"]):
                if printer:
                    print(_header(name, n, dname, rname, compare, validate, args), flush=True)
                for size in size_steps(args.minbytes, args.maxbytes, args.stepfactor):
                    count = size // dt.itemsize // mult * mult
                    if progress:
                        sys.stderr.write(f"\r[{name} {dname} {rname} {size} B]   ")
                        sys.stderr.flush()
                    case = BenchCase(count, dt, REDUCE_OPS.get(rname), args.root, n, rank, dom, validate, raw_comm,
                                     MPI.COMM_WORLD.Get_rank())
                    row = _point(spec, name, case, args, compare, gloo, reps, comm)
                    rows.append(row)
                    if printer:
                        print(_format(row, compare), flush=True)
    if progress:
        sys.stderr.write("\r" + " " * 60 + "\r")


def _point(spec, name, case, args, compare, gloo, reps, comm) -> Row:
    dt, n = case.dtype, case.n
    row = Row(name, case.count * dt.itemsize, case.count, dt.name, case.reduce.name if case.reduce else "none",
              args.root if spec.uses_root else -1)
    b = spec.setup(case)
    plans = []

    def form(call):               # execute(...) or, with --plan, a plan's run()
        if call is None:
            return None
        c_args, c_kwargs = call
        if args.plan:
            plans.append(b.op.prepare(*c_args, **c_kwargs))
            return plans[-1].run
        return lambda: b.op.execute(*c_args, **c_kwargs)
    impls = {"oop": form(None if b.args is None else (b.args, b.kwargs)), "ip": form(b.inplace)}
    if "mpi4py" in compare:
        impls["mpi4py"] = b.raw
    if "gloo" in compare:
        impls["gloo"] = _torch_fn(b, gloo.dist, gloo, comm) if gloo is not None else None
    if "deepspeed" in compare:
        impls["deepspeed"] = _torch_fn(b, gloo.deepspeed, gloo, comm)
    live = {k: fn for k, fn in impls.items() if fn is not None}     # the same keys on every rank
    for fn in live.values():
        for _ in range(args.warmup_iters):
            fn()
    times: dict[str, list[float]] = {k: [] for k in live}
    if not args.reps and row.size <= SMALL_BYTES:       # (a tiny point's block lasts a few ms: more of them)
        reps = max(reps, SMALL_REPS)
    torches = [k for k in ("gloo", "deepspeed") if k in live]
    order = [k for k in live if k not in torches]
    for rep in range(reps):        # interleaved, so drift on a shared machine hits every implementation alike,
        for k in order[rep % len(order):] + order[:rep % len(order)]:   # each in turn first
            times[k].append(_time(comm, live[k], args.iters))
        for k in torches:          # last, then a pause: whatever ran right after gloo measured 1.2-1.5x slower
            times[k].append(_time(comm, live[k], args.iters))
            _settle(comm)
    med = {k: statistics.median(v) for k, v in times.items()}
    factor = spec.bus_factor(n)
    for prefix, key in (("", "oop"), ("ip_", "ip")):
        t = med.get(key)
        if t is not None:
            alg = row.size / t / 1e9 if t > 0 else 0.0
            setattr(row, prefix + "time_us", t * 1e6)
            setattr(row, prefix + "algbw", alg)
            setattr(row, prefix + "busbw", alg * factor)
    mine = times.get("oop") or times.get("ip")
    for c in compare:
        row.compare[c] = None if med.get(c) is None else med[c] * 1e6
        if c in times and mine:   # the median of the ratios of one repetition's blocks, timed back to back
            pairs = [m / t for m, t in zip(mine, times[c]) if m > 0 and t > 0]
            row.ratio[c] = statistics.median(pairs) if pairs else None
    if args.check:
        for prefix, key in (("", "oop"), ("ip_", "ip")):
            fn = live.get(key)
            if fn is None:
                continue
            if key == "ip" and b.reset is not None:
                b.reset()
            wrong = count_wrong(_flat(fn()), _flat(b.expected), exact=b.exact, n=n)
            setattr(row, prefix + "wrong", int(comm.allreduce(wrong, op=MPI.SUM)))
    for plan in plans:
        plan.free()
    if b.close is not None:
        b.close()
    return row


def _flat(value):
    """An output (an array, a tuple of them, None) with each array flattened."""
    if isinstance(value, tuple):
        return tuple(_flat(v) for v in value)
    return None if value is None else np.asarray(value).reshape(-1)


def _settle(comm: MPI.Comm, seconds: float = 0.05) -> None:
    """Let torch/gloo's helper threads go idle before the next timed block."""
    comm.Barrier()
    time.sleep(seconds)
    comm.Barrier()


def _torch_fn(b, dist, gloo, comm: MPI.Comm):
    """The torch.distributed call (``dist``: torch.distributed over gloo, or DeepSpeed's) on this
    point's memory, or None (agreed on every rank) when the peer cannot run it (dtype or operation
    not supported)."""
    fn = None
    if b.torch_call is not None:
        try:
            fn = b.torch_call(dist, gloo.torch, gloo.group)
            fn()
        except Exception:  # noqa: BLE001 - unsupported by the peer: reported as n/a
            fn = None
    if comm.allreduce(fn is not None, op=MPI.LAND):
        return fn
    return None


def _placement(world: MPI.Comm) -> dict:
    """How the ranks sit on this rank's node (collective over ``world``): how many share it, how many
    cores they may run on together (the union of their CPU affinities, so taskset and cpusets
    count), whether each rank is bound (allowed fewer than those cores, as ``mpirun -bind-to core``
    does) and whether the ranks outnumber the cores."""
    sets, _ = node_affinities(world)
    cores = set().union(*sets)
    bound = all(len(s) < len(cores) for s in sets)
    hosts = list(dict.fromkeys(world.allgather(MPI.Get_processor_name())))
    return {"local_ranks": len(sets), "cores": len(cores), "bound": bound, "oversubscribed": len(sets) > len(cores),
            "hosts": hosts}


def _header(name, n, dtype, redop, compare, validate, args) -> str:
    extra = "".join(f" {c + '(us)':>11} {'mpicoll/' + c:>15}" for c in compare)
    lines = [f"# {name}: {n} rank(s), dtype {dtype}, redop {redop}, validation {'on' if validate else 'off'}, "
             f"{'plan.run()' if args.plan else 'execute()'}, "
             f"iters {args.iters}, warmup {args.warmup_iters}"
             + (f", compare {','.join(compare)} (mpicoll/<peer>: time ratio, < 1 = mpicoll faster)"
                if compare else ""),
             f"#{'':>62}out-of-place{'':>24}in-place",
             f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} "
             f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6} {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
             + extra,
             f"# {'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'':>5} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} "
             f"{'':>6} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"]
    return "\n".join(lines)


def _f(v, spec, width):
    return f"{'n/a':>{width}}" if v is None else f"{v:>{width}{spec}}"


def _format(r: Row, compare) -> str:
    s = (f"  {r.size:>10} {r.count:>12} {r.type:>8} {r.redop:>6} {r.root:>5} "
         f"{_f(r.time_us, '.2f', 9)} {_f(r.algbw, '.3f', 7)} {_f(r.busbw, '.3f', 7)} {_f(r.wrong, 'd', 6)} "
         f"{_f(r.ip_time_us, '.2f', 9)} {_f(r.ip_algbw, '.3f', 7)} {_f(r.ip_busbw, '.3f', 7)} {_f(r.ip_wrong, 'd', 6)}")
    for c in compare:
        s += f" {_f(r.compare.get(c), '.2f', 11)} {_f(r.ratio.get(c), '.3f', 15)}"
    return s


def _write_json(args, rows, n, compare, validate, placement, kernels, interrupted=False) -> None:
    import mpi4py
    doc = {"command": args.command_line, "ratio": "mpicoll/peer", "ranks": n, "validate": validate, "plan": args.plan, "compare": compare,
           "placement": placement, "interrupted": interrupted, "mpicoll": __version__, "kernels": kernels,
           "mpi": MPI.Get_library_version().splitlines()[0], "mpi4py": mpi4py.__version__, "numpy": np.__version__,
           "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
           "rows": [r.__dict__ for r in rows]}
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)


def _hosts_text(hosts: list[str], most: int = 8) -> str:
    """``vm``, ``2 hosts: a, b``; past ``most`` hosts the first ones and how many more."""
    if len(hosts) == 1:
        return hosts[0]
    names = ", ".join(hosts[:most]) + (f", ... ({len(hosts) - most} more)" if len(hosts) > most else "")
    return f"{len(hosts)} hosts: {names}"


def _mode(plan: bool, validate: bool) -> str:
    """What was timed: ``plan.run()`` or ``execute()``, and whether validation was on."""
    return f"{'plan.run()' if plan else 'execute()'}, validation {'on' if validate else 'off'}"


def size_label(nbytes: float) -> str:
    """A size for an axis: ``8 B``, ``1 KiB``, ``64 MiB``, ``1.5 GiB`` (powers of 1024)."""
    for unit, k in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= k:
            return f"{nbytes / k:g} {unit}"
    return f"{nbytes:g} B"


def _pyplot():
    """matplotlib's pyplot, drawing to files (Agg). Raises ImportError when it is not installed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _plot_usable(world: MPI.Comm, printer: bool) -> None:
    """Before the sweep (collective over ``world``): the rank that will draw ``--plot`` can import
    matplotlib, else a usage error on every rank."""
    why = None
    if printer:
        try:
            _pyplot()
            why = ""
        except ImportError as exc:
            why = (f"which world rank {world.Get_rank()} (on {MPI.Get_processor_name()}, where the plot is drawn) "
                   f"cannot import ({exc})")
    verdict = next((w for w in world.allgather(why) if w is not None), "")
    if verdict:
        raise UsageError(f"--plot needs matplotlib, {verdict}: pip install '.[plot]' (or pip install matplotlib)")


def _plot(path: str, rows: list[Row], n: int, compare: list[str], *, mode: str | None = None,
          hosts: list[str] | None = None) -> None:
    """Draw busbw vs size, one panel per operator, log-log, to the PNG ``path``; the title says
    ``mode`` (:func:`_mode`), the rank count ``n`` and the ``hosts`` when given."""
    plt = _pyplot()
    fig, title = _figure(plt, rows, n, compare, mode, hosts)
    fig.savefig(path, dpi=110, metadata={"Title": title, "Software": f"mpicoll {__version__}"})
    plt.close(fig)


def _figure(plt, rows: list[Row], n: int, compare: list[str], mode: str | None, hosts: list[str] | None):
    """The figure of :func:`_plot` and its title."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator
    ops = list(dict.fromkeys(r.op for r in rows))
    dtypes = sorted({r.type for r in rows})
    cols = max(1, min(3, len(ops)))
    nrows = max(1, -(-len(ops) // cols))
    # (constrained layout leaves the figure's title its own room: tight_layout ignores it, and it
    # overlapped the first row's panel titles)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False, layout="constrained")
    colors = {"mpicoll": "tab:blue", "mpicoll in-place": "tab:cyan", "mpi4py": "tab:orange", "gloo": "tab:green",
              "deepspeed": "tab:red"}
    for ax, op in zip(axes.flat, ops):
        mine = [r for r in rows if r.op == op and r.size > 0]
        factor = BENCHES[op].bus_factor(n) if op in BENCHES else None
        series: dict[str, dict[int, list[float]]] = {}      # implementation -> size -> busbw per dtype
        for r in mine:
            values = {"mpicoll": r.busbw, "mpicoll in-place": r.ip_busbw}
            for c in compare:
                t = r.compare.get(c)
                values[c] = r.size / (t * 1e-6) / 1e9 * factor if t and factor is not None else None
            for label, bw in values.items():
                if bw is not None and bw > 0:                 # (log scale: a 0 has no place; n/a is not drawn)
                    series.setdefault(label, {}).setdefault(r.size, []).append(bw)
        for label, by_size in series.items():
            sizes = sorted(by_size)
            kw = dict(color=colors.get(label), ls="--" if "in-place" in label else "-", lw=1.2, marker="o", ms=3)
            ax.plot(sizes, [statistics.median(by_size[s]) for s in sizes], label=label, **kw)
            if len(dtypes) > 1:   # one line per implementation: the median over the dtypes, their range shaded
                ax.fill_between(sizes, [min(by_size[s]) for s in sizes], [max(by_size[s]) for s in sizes],
                                color=colors.get(label), alpha=0.15, lw=0)
        ax.set_title(op)
        ax.set_xlabel("size")
        ax.set_ylabel("bus bandwidth (GB/s)")
        if not series:
            ax.text(0.5, 0.5, "no bus traffic to draw" + (" (bus factor 0 at 1 rank)" if n == 1 else ""),
                    ha="center", va="center", transform=ax.transAxes, fontsize=8)
            continue
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({s for by_size in series.values() for s in by_size})
        ax.xaxis.set_major_locator(FixedLocator(_size_ticks(sizes[0], sizes[-1])))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_label(v)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    what = dtypes[0] if len(dtypes) == 1 else f"median over {', '.join(dtypes)} (shaded: their range)"
    where = f"{n} ranks" + (f" on {_hosts_text(hosts)}" if hosts else "")
    title = (f"mpicoll vs {', '.join(compare) or 'itself'}: bus bandwidth vs size, "
             f"{mode + ', ' if mode else ''}{where}, {what}")
    fig.suptitle(title, fontsize=9)
    return fig, title


def _size_ticks(low: int, high: int, most: int = 8) -> list[int]:
    """Powers of 2 spanning ``low`` .. ``high``, at most ``most``: every one, or every 2nd, 5th,
    10th, ... exponent, aligned so that 1 KiB, 1 MiB and 1 GiB are among them."""
    first, last = max(int(low), 1).bit_length() - 1, (max(int(high), 1) - 1).bit_length()
    for step in (1, 2, 5, 10, 20, 50):
        exponents = range(first + (-first % step), last + 1, step)
        if len(exponents) <= most:
            break
    return [2 ** e for e in exponents]
