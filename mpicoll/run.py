"""The mpicoll command line: ``mpirun -np N python -m mpicoll.run [check|demo|list|bench] ...``.

With no sub-command it checks every operator x dtype x case family against the numpy golden and
prints one table on rank 0; the exit status is non-zero on any wrong element. An unhandled error
on any rank aborts the whole job (``MPI_Abort``) instead of leaving the other ranks waiting; Ctrl-C
ends it with one line and status 130 (:func:`ctrl_c_ends_the_job`).
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from mpi4py import MPI

from .info import run_info
from ._cli import (Parser, ctrl_c_ends_the_job, epilog, kernels_summary, launcher_note, refused_settings,
                   settings_help, version_text)

USAGE_EPILOG = """\
examples:
  mpirun -np 4 python -m mpicoll.run                      check everything (the default)
  mpirun -np 4 python -m mpicoll.run --op AllReduce --dtype float16,bfloat16
  mpirun -np 4 python -m mpicoll.run --demo               the documented examples, per rank
  mpirun -np 2 python -m mpicoll.run --log-dir logs       one log per rank: logs/rank.N
  mpirun -np 4 python -m mpicoll.run --rank-table rt.json each rank on its table's host? then check
  python -m mpicoll.run list                              operators and dtypes
  python -m mpicoll.run --info                            what this installation is: versions, MPI, settings
  mpirun -np 2 python -m mpicoll.run bench -b 8 -e 64M -f 4 --compare mpi4py
  python -m mpicoll.run trace mpicoll-trace               what a trace or the flight recorders say
"""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m mpicoll.run", formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Check mpicoll's collective operators against numpy goldens, or run the "
                           "documented examples. Run under mpirun; works at any rank count >= 1.",
               epilog=epilog(USAGE_EPILOG + settings_help()))
    p.add_argument("--version", action="version", version=version_text(),
                   help="print mpicoll's version and the numeric kernels in use, and exit")
    p.add_argument("--info", action="store_true",
                   help="print what this installation is (versions, MPI, kernels, torch, ranks per node, "
                        "settings in effect), and exit; status 2 if a setting is refused")
    p.add_argument("command", nargs="?", default="check", choices=["check", "demo", "list", "bench", "trace"],
                   help="check (default): golden check; demo: documented examples; list: operators and dtypes; "
                        "bench: the nccl-tests-style benchmark (see: bench --help); trace DIR: what a trace or the "
                        "flight recorders say (see: trace --help)")
    p.add_argument("--demo", action="store_true", help="same as the demo command")
    p.add_argument("--op", help="comma-separated operator names (default: all)")
    p.add_argument("-d", "--dtype", help="comma-separated dtypes (default: all)")
    p.add_argument("--seed", type=int, default=None, help="data seed (default: fixed)")
    p.add_argument("--no-validate", action="store_true", help="run the operators with validation off")
    p.add_argument("--log-dir", help="write one log per rank to DIR/rank.N")
    p.add_argument("--rank-table", metavar="FILE",
                   help="first check that every rank runs on the host this rank table gives it (host by host)")
    return p


def _split(v: str | None) -> list[str] | None:
    return [s.strip() for s in v.split(",") if s.strip()] if v else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from . import check, demo
    if argv[:1] == ["trace"]:
        from ._trace_read import main as run_trace
        return run_trace(argv[1:])
    if argv[:1] == ["bench"]:
        from .bench import run_bench
        if not {"-h", "--help"} & set(argv):
            launcher_note("python -m mpicoll.run bench")
            if refused_settings("python -m mpicoll.run bench"):
                return 2
        try:
            return run_bench(argv[1:])
        except check.UsageError as exc:   # the same on every rank
            if MPI.COMM_WORLD.Get_rank() == 0:
                sys.stderr.write(f"python -m mpicoll.run bench: error: {exc}\n")
            return 2
    args = build_parser().parse_args(argv)
    if args.info:
        return run_info()
    if args.command != "list":
        launcher_note("python -m mpicoll.run" + (" --demo" if args.demo or args.command == "demo" else ""))
        if refused_settings("python -m mpicoll.run"):
            return 2
    from ._dtypes import ALL_DTYPES
    from .checks import CHECKS
    from .checks._golden import SEED

    world = MPI.COMM_WORLD
    me = world.Get_rank()
    log, why = None, None
    if args.log_dir:
        try:
            os.makedirs(args.log_dir, exist_ok=True)
            log = open(os.path.join(args.log_dir, f"rank.{me}"), "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            why = f"world rank {me} cannot write {os.path.join(args.log_dir, f'rank.{me}')}: {exc.strerror}"
        why = next((w for w in world.allgather(why) if w), None)   # (a usage error on every rank alike)
        if why:
            if log is not None:
                log.close()
            if me == 0:
                sys.stderr.write(f"python -m mpicoll.run: error: --log-dir {args.log_dir}: {why}\n")
            return 2
    try:
        placed = True
        if args.rank_table:
            placed, report = check.check_placement(args.rank_table)
            if me == 0:
                print(report, flush=True)
        if args.command == "list":
            if me == 0:
                print("operators: " + ", ".join(CHECKS))
                print("dtypes:    " + ", ".join(ALL_DTYPES))
            return 0 if placed else 1
        if args.demo or args.command == "demo":
            return max(demo.run_demo(log), 0 if placed else 1)
        try:
            rows = check.run_checks(_split(args.op), _split(args.dtype),
                                    seed=SEED if args.seed is None else args.seed, validate=not args.no_validate, log=log)
        except check.UsageError as exc:   # a bad --op/--dtype: the same on every rank
            if me == 0:
                sys.stderr.write(f"python -m mpicoll.run: error: {exc}\n")
            return 2
        kernels = kernels_summary(world)
        if me == 0:
            print(check.format_rows(rows, world.Get_size(), kernels=kernels), flush=True)
        return 1 if any(r.wrong for r in rows) or not placed else 0
    finally:
        if log is not None:
            log.close()


def entry(argv: list[str] | None = None) -> None:
    """Run :func:`main`; on an unhandled error print it with the rank and abort the whole job; on
    Ctrl-C end the job with one line (:func:`ctrl_c_ends_the_job`)."""
    try:
        with ctrl_c_ends_the_job():
            code = main(argv)
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - anything else must not strand the other ranks
        from ._watchdog import abort
        rank = MPI.COMM_WORLD.Get_rank()
        abort(f"mpicoll.run: unhandled error on rank {rank} of {MPI.COMM_WORLD.Get_size()}; aborting the job\n"
              f"{traceback.format_exc()}")
        raise
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    entry()
