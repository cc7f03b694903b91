"""torch's own distributed test suite against the mpicoll backend, as torch once ran its MPI backend:
one MPI rank per torch rank, one process group for the whole run, ``DistributedTest._DistTestBase``
from the installed torch, with the tests that torch runs for gloo (``BACKEND=gloo`` opens their
gates; a test about the backend's own name, ``NAMED``, sees the real one) minus the ones listed in
``NOT_APPLICABLE`` with the reason (none today: all 90 of gloo's pass).

    mpirun -np 3 python -m mpi4py tests/torch_suite.py                  # every applicable test
    mpirun -np 3 python -m mpi4py tests/torch_suite.py --backend gloo   # the same harness on gloo
    mpirun -np 3 python -m mpi4py tests/torch_suite.py -k all_reduce    # the tests whose name has it

Rank 0 prints one line per test (``PASS``/``FAIL``/``SKIP`` and why) and a summary; the exit status
is 1 if any test failed on any rank. The ranks agree every test's outcome over MPI before the next,
and a test that fails on one rank is reported as failed for the run. A collective that a failing
rank skipped would hang the others: the watchdog (``MPICOLL_TIMEOUT``, default 120 s here, raising)
ends it, and that test and the rest of the run are then reported as failed (the group is broken).
tests/test_torch_suite.py runs the whole in CI (about 20 s at 3 ranks on 2 cores). It needs
``expecttest`` (torch's testing helpers import it): ``pip install expecttest``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
import unittest
from datetime import timedelta

from mpi4py import MPI

W = MPI.COMM_WORLD
RANK, SIZE = W.Get_rank(), W.Get_size()

#: tests whose assertion is about the backend's own name (``BACKEND``, which is "gloo" at import, to
#: open gloo's gates): they run with the name of the backend under test, as they do on gloo
NAMED = {"test_get_backend"}
#: tests gloo passes on CPU (90 in this harness, torch 2.13 and 2.14) that do not apply to this
#: backend, and why: none (all 90 pass, on torch 2.13 and 2.14)
NOT_APPLICABLE: dict[str, str] = {}


def _setup_env(backend: str) -> str:
    """The environment distributed_test.py reads at import, like torch's run_test.py set it."""
    temp = tempfile.mkdtemp(prefix="mpicoll-torch-suite-") if RANK == 0 else None
    temp = W.bcast(temp, root=0)
    if RANK == 0:
        for sub in ("barrier", "test_dir", "init_dir"):
            os.mkdir(os.path.join(temp, sub))
    W.Barrier()
    os.environ.update(BACKEND="gloo", WORLD_SIZE=str(SIZE), INIT_METHOD="mpi://", TEMP_DIR=temp)
    os.environ.setdefault("MPICOLL_TIMEOUT", "120")
    os.environ.setdefault("MPICOLL_TIMEOUT_ACTION", "raise")
    return temp


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="mpicoll", choices=["mpicoll", "gloo"])
    parser.add_argument("-k", default="", help="only the tests whose name contains this")
    parser.add_argument("--start", default="", help="only the tests from this name on (in sorted order)")
    parser.add_argument("--list", action="store_true", help="list the tests and exit")
    args = parser.parse_args()
    temp = _setup_env(args.backend)

    import torch.distributed as dist
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.common_utils import TestCase
    from torch.testing._internal.distributed import distributed_test
    from torch.testing._internal.distributed.distributed_test import Barrier, DistributedTest

    import mpicoll.torch  # registers the backend and mpi://

    class Suite(DistributedTest._DistTestBase, TestCase):   # (torch's TestCase: its assertEqual)
        @property
        def rank(self):
            return dist.get_rank()

        @property
        def world_size(self):                  # (a string, as TestDistBackend's)
            return os.environ["WORLD_SIZE"]

    names = sorted(n for n in dir(Suite) if n.startswith("test_") and args.k in n and n >= args.start)
    if args.list:
        if RANK == 0:
            print("\n".join(names))
        return 0
    dist.init_process_group(args.backend, init_method="mpi://", timeout=timedelta(seconds=120))
    skip_codes = {s.exit_code: s.message for s in TEST_SKIPS.values()}
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    failed = []
    t_start = time.monotonic()
    for name in names:
        if name in NOT_APPLICABLE:
            outcome, why = "SKIP", "not applicable: " + NOT_APPLICABLE[name]
        else:
            W.Barrier()                        # (every rank done with the last test's barrier files)
            if RANK == 0:
                Barrier.init()                 # (empties the barrier folder)
            Barrier.barrier_id = 0             # (each test starts its file barriers from 0, as in torch's
            W.Barrier()                        # harness, where each test is a fresh process)
            distributed_test.BACKEND = args.backend if name in NAMED else "gloo"
            outcome, why = _run(Suite, name, skip_codes)
        seen = W.allgather((outcome, why))
        if any(o == "FAIL" for o, _ in seen):
            outcome = "FAIL"
            why = "; ".join(f"rank {r}: {w}" for r, (o, w) in enumerate(seen) if o == "FAIL")
            failed.append(name)
        elif any(o == "SKIP" for o, _ in seen):
            outcome, why = "SKIP", next(w for o, w in seen if o == "SKIP")
        counts[outcome] += 1
        if RANK == 0:
            print(f"{outcome} {name}" + (f": {why}" if why else ""), flush=True)
    if RANK == 0:
        print(f"{args.backend}, {SIZE} ranks: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} "
              f"skipped in {time.monotonic() - t_start:.0f} s" + (f"; failed: {failed}" if failed else ""), flush=True)
    dist.destroy_process_group()
    if RANK == 0:
        shutil.rmtree(temp, ignore_errors=True)
    return 1 if failed else 0


def _run(cls, name: str, skip_codes: dict) -> tuple[str, str]:
    """Run one test on this rank: ``(PASS|FAIL|SKIP, why)``."""
    result = unittest.TestResult()
    try:
        cls(name).run(result)
    except SystemExit as exc:                  # (torch's skip decorators exit with a code)
        code = exc.code if isinstance(exc.code, int) else 1
        return ("SKIP", skip_codes[code]) if code in skip_codes else ("FAIL", f"exited with {exc.code}")
    if result.errors or result.failures:
        text = (result.errors + result.failures)[0][1]
        if os.environ.get("MPICOLL_TEST_SUITE_VERBOSE"):
            print(f"--- rank {RANK}: {name}\n{text}", file=sys.stderr, flush=True)
        lines = [ln for ln in text.strip().splitlines() if ln.strip() and "PYTORCH_PRINT_REPRO" not in ln
                 and not ln.startswith(("To execute this test", "    python "))]
        last = lines[-1] if lines else text[-300:]
        if last.startswith("SystemExit: "):      # (torch's skip decorators exit with a code)
            code = int(last.split()[-1]) if last.split()[-1].isdigit() else None
            if code in skip_codes:
                return "SKIP", skip_codes[code]
        return "FAIL", last[:300]
    if result.skipped:
        return "SKIP", result.skipped[0][1][:200]
    return "PASS", ""


if __name__ == "__main__":
    status = 1
    try:
        status = main()
    except BaseException:                      # noqa: BLE001 - end the whole job, never strand a rank
        traceback.print_exc()
        sys.stderr.flush()
        W.Abort(1)
    sys.exit(status)
