"""Set-up rules that one rank breaks alone, each in a fresh ``mpirun`` job (state left by earlier
tests hides set-up bugs): every rank raises the same ``CollectiveError`` and the job goes on, or,
where no agreement is possible, the job ends within its limit. Before the core for many calls,
each of the first four hung its peers for more than 40 s."""
from __future__ import annotations

import re

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import _validate as V
from mpicoll._call import Call

from _mpi import remove, run_job, within

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]

#: every rank runs BODY (with ``rank``, ``np``, ``mpicoll`` and ``MPI`` defined), prints what it
#: raised, then proves it is still in step with a world AllReduce
JOB = """
    import sys
    import numpy as np
    import mpicoll
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    try:
{body}
        print(f"@@{{rank}}|no error@@", flush=True)
    except mpicoll.CollectiveError as exc:
        print(f"@@{{rank}}|{{type(exc).__name__}}: {{exc}}@@", flush=True)     # (@@: lines of two ranks may run together)
    total = mpicoll.AllReduceOperation().execute(np.ones(1))
    print(f"@@in step {{int(total[0])}}@@", flush=True)
"""


def _agreed(tmp_path, body: str, np_: int = 2, env: dict | None = None) -> str:
    """Run the job; every rank must report the same error and still be in step. Returns it."""
    script = JOB.format(body="\n".join("        " + line for line in body.strip().splitlines()))
    res, seconds, left = run_job(tmp_path, script, np_=np_, env={"MPICOLL_DOMAIN_TIMEOUT": "20", **(env or {})})
    remove(left)
    out = res.stdout
    assert res.returncode == 0 and seconds < within(30), (seconds, out, res.stderr[-3000:])
    errors = {int(m[1]): m[2] for m in re.finditer(r"@@(\d)\|(.*?)@@", out)}
    assert sorted(errors) == list(range(np_)), out
    assert len(set(errors.values())) == 1, errors
    assert out.count(f"@@in step {np_}@@") == np_, out
    return errors[0]


def test_validate_differs_across_ranks(tmp_path):
    err = _agreed(tmp_path, """
op = mpicoll.AllReduceOperation(validate=(rank == 0))
for _ in range(3):
    op.execute(np.ones(2))
""")
    assert err.startswith("CollectiveMismatchError: AllReduce: validate differs across ranks: validate=True on "
                          "rank 0; validate=False on rank 1"), err
    assert "set it alike on every rank" in err


def test_a_mismatch_reads_alike_whatever_each_rank_imported(tmp_path):
    """Rank 0 calls torch's name for an AllReduce (``mpicoll.functional``, which rank 1 never
    imports), rank 1 the operator: both name both calls, in the words of the rank that made each."""
    err = _agreed(tmp_path, """
if rank == 0:
    import mpicoll.functional as F
    F.all_reduce(np.ones(2))
else:
    mpicoll.AllReduceOperation().execute(np.ones(2))
""")
    assert err.startswith("CollectiveMismatchError: all_reduce vs AllReduce: operation differs across ranks: "
                          "all_reduce on rank 0; AllReduce on rank 1"), err


@pytest.mark.parametrize("forgets", ["rank 0", "rank 1", "both"])
def test_a_member_without_rank_size_forming_a_domain(tmp_path, forgets):
    """Whoever arrives first leads the rendezvous: the missing rank_size is agreed either way."""
    missing = {"rank 0": "rank == 0", "rank 1": "rank == 1", "both": "True"}[forgets]
    err = _agreed(tmp_path, f"""
param = mpicoll.AllReduceParam(comm_domain="d", rank_size=None if {missing} else 2)
mpicoll.AllReduceOperation(param).execute(np.ones(2))
""")
    assert err.startswith("CollectiveArgumentError: comm domain 'd': rank_size is required to form an undeclared "
                          "domain"), err
    assert "gives no rank_size" in err


def test_an_integer_parameter_past_int64_on_one_rank(tmp_path):
    err = _agreed(tmp_path, """
param = mpicoll.QuantAllReduceParam(block_size=2 ** 63 if rank == 1 else 0)
mpicoll.QuantAllReduceOperation(param).execute(np.ones(8, np.int8), 0.5)
""")
    assert err == ("CollectiveArgumentError: QuantAllReduce: block_size=9223372036854775808 on rank 1: must be an "
                   "int >= 0 (0 = one scale) and < 2**62"), err


def test_a_header_value_past_int64_is_a_local_error_to_agree():
    """Any value that cannot travel in the int64 header is this rank's error (agreed like any
    other), not a bare OverflowError raised on that rank alone."""
    from mpicoll.ops._agree import header_row
    call = Call(None, np.zeros(1), None, (1,))
    call.params = 2 ** 64
    op = mpicoll.AllReduceOperation()
    op._bind()
    row, err = header_row(op._lib, op, call, None)
    assert row[V.H_FLAG] == 1 and row[V.H_OP] == op.CODE
    assert str(err) == (f"AllReduce: operator parameters=18446744073709551616 on rank {op.rank}: must fit in a "
                        "signed 64-bit integer")


def test_hccl_init_checks_rank_size_when_the_domain_exists(tmp_path):
    err = _agreed(tmp_path, """
hccl = mpicoll.Hccl().init("", rank_size=3 if rank == 1 else 2)
hccl.all_reduce(np.ones(4, np.float32), np.empty(4, np.float32), 4, "float32", "sum", commit=True)
""")
    assert "Hccl.AllReduce: rank_size=3 on rank 1: must equal the communicator size (2)" in err, err


BAD_COMM = """
    import sys, time
    import numpy as np
    import mpicoll
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    comm = MPI.COMM_WORLD.Dup()
    param = mpicoll.AllReduceParam(comm="not a communicator" if rank == 1 else comm)
    try:
        mpicoll.AllReduceOperation(param).execute(np.ones(2))
    except mpicoll.CollectiveError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        if CAUGHT:
            time.sleep(30)                      # caught, and the peers are left in the Idup
            sys.exit(0)
        raise
"""


def test_a_comm_that_is_not_a_communicator_on_one_rank_ends_the_job(tmp_path):
    """It cannot be agreed (the rank has no communicator to agree on): uncaught, python -m mpi4py
    aborts the job at once; caught, the peers' watchdog ends it (docs/errors.md)."""
    res, seconds, left = run_job(tmp_path, BAD_COMM.replace("CAUGHT", "False"), np_=2)
    remove(left)
    assert res.returncode != 0 and seconds < within(20), (seconds, res.stdout, res.stderr[-2000:])
    assert "rank 1: CollectiveArgumentError: AllReduce: comm='not a communicator': must be an mpi4py MPI.Comm" \
        in res.stdout, res.stdout
    res, seconds, left = run_job(tmp_path, BAD_COMM.replace("CAUGHT", "True"), np_=2, env={"MPICOLL_TIMEOUT": "2"})
    remove(left)
    assert res.returncode != 0 and seconds < within(20), (seconds, res.stdout, res.stderr[-2000:])
    assert "mpicoll watchdog: duplicating user comm" in res.stderr and "timed out after 2 s" in res.stderr, res.stderr
