"""The nccl-tests-style benchmark harness: ``mpirun -np N python -m mpicoll.run bench ...``.

It sweeps sizes for every registered operator (``mpicoll.checks.BENCHES``; it never names one), times out-of-place
and in-place forms as the slowest rank's mean per iteration, checks the results against the golden
(wrong elements summed over ranks), and optionally runs the same sweep through the raw mpi4py
buffer call and torch.distributed's gloo backend (:mod:`mpicoll._bench_peers`), interleaved per size
so that drift on a shared machine hits every implementation alike. Its rows, their table, JSON and
plot: :mod:`mpicoll._bench_report`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from . import __version__
from ._cpus import node_affinities
from ._domains import declare_domains, domain, domain_members, lookup, world as lib_world
from ._dtypes import DTYPES, REDUCE_OPS
from .checks import BENCHES, BenchCase
from .checks._golden import count_wrong
from ._validate import validate_default
from ._thresholds import value
from .check import UsageError
from ._cli import Parser, epilog, kernels_summary, on_ctrl_c, version_text
from ._bench_peers import DeepSpeed, Gloo, settle_threads, torch_fn
from ._bench_report import Row, header, hosts_text, mode_text, plot, plot_usable, row_text, write_json

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


def _select(value: str, known: list[str], what: str) -> list[str]:
    if value.lower() == "all":
        return list(known)
    lower = {k.lower(): k for k in known}
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in names if v.lower() not in lower]
    if bad:
        raise UsageError(f"unknown {what}: {', '.join(bad)}; known: {', '.join(known)}")
    return [lower[v.lower()] for v in names]


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
        plot_usable(world, printer)
    hosts = list(dict.fromkeys(comm.allgather(MPI.Get_processor_name()))) if active else []
    gloo = None
    if "gloo" in compare or "deepspeed" in compare:
        try:
            gloo = Gloo(MPI.COMM_WORLD, colors)
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
                gloo.deepspeed = DeepSpeed(gloo, MPI.COMM_WORLD)
            except ImportError as e:
                why = f"{e}: pip install deepspeed ninja"
        why = next((w for w in world.allgather(why) if w), None)     # (every rank drops it alike)
        if why:
            if me == 0:
                sys.stderr.write(f"--compare deepspeed: not available ({why})\n")
            compare.remove("deepspeed")
    kernels = kernels_summary(world)
    if printer:
        print(f"# mpicoll {__version__} bench: {nworld} ranks on {hosts_text(placement['hosts'])}; "
              f"numeric kernels: {kernels}", flush=True)
        lib = lookup(dom) if dom else lib_world()
        print("# " + (f"one node: AllReduce, Reduce from {value('window.allreduce') // 1024} KiB (16-bit floats: "
                      f"{value('window.allreduce.16bit') // 1024} KiB) and ReduceScatter(V) from "
                      f"{value('window.reduce_scatter') // 1024} KiB through the shared window (docs/shm.md)" if lib.local
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
                write_json(args, list(rows), comm.Get_size(), compare, validate, placement, kernels, interrupted)
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
            plot(args.plot, rows, comm.Get_size(), compare, mode=mode_text(args.plan, validate), hosts=hosts)
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
                    print(header(name, n, dname, rname, compare, validate, args), flush=True)
                for size in size_steps(args.minbytes, args.maxbytes, args.stepfactor):
                    count = size // dt.itemsize // mult * mult
                    if progress:
                        sys.stderr.write(f"\r[{name} {dname} {rname} {size} B]   ")
                        sys.stderr.flush()
                    case = BenchCase(count, dt, REDUCE_OPS.get(rname), args.root, n, rank, dom, validate, raw_comm,
                                     MPI.COMM_WORLD.Get_rank())
                    row = _point(spec, name, case, args, compare, gloo, reps, comm)
                    if printer:                # (printed first: a row saved at Ctrl-C was always printed)
                        print(row_text(row, compare), flush=True)
                    rows.append(row)
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
        impls["gloo"] = torch_fn(b, gloo.dist, gloo, comm) if gloo is not None else None
    if "deepspeed" in compare:
        impls["deepspeed"] = torch_fn(b, gloo.deepspeed, gloo, comm)
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
            settle_threads(comm)
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


