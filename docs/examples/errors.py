"""Bad input raises the same CollectiveError on every rank, before any data moves.

    mpirun -np 4 python docs/examples/errors.py      (any rank count >= 2 works)
"""
import numpy as np
from mpi4py import MPI

from mpicoll import (AllGatherOperation, AllGatherParam, AllReduceOperation, AllReduceParam, AllToAllVV2Operation,
                     AllToAllVV2Param, CollectiveArgumentError, CollectiveMismatchError)

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()
if n < 2:                                     # (the errors below are one rank's against the others)
    raise SystemExit("1 rank: launch with mpirun -np 4 python docs/examples/errors.py (any count >= 2)")
last = n - 1


def same_everywhere(exc):
    """Every rank caught an error with the same message; rank 0 prints it."""
    messages = world.allgather(str(exc))
    assert len(set(messages)) == 1, messages
    if rank == 0:
        print(f"{type(exc).__name__} (op={exc.op!r}, param={exc.param!r}, rank={exc.rank}):\n  {exc}")


# 1. Shapes disagree: only the last rank passes 3 elements.
x = np.ones(3 if rank == last else 2, dtype=np.float32)
try:
    AllReduceOperation(AllReduceParam()).execute(x)
except CollectiveMismatchError as exc:
    assert exc.param == "x.shape" and exc.rank == last
    same_everywhere(exc)

# 2. A rule only one rank can see: a negative count on the last rank.
send_counts = [-1 if rank == last else 1] + [1] * (n - 1)
try:
    AllToAllVV2Operation(AllToAllVV2Param()).execute(np.zeros(n, np.int32), send_counts, list(range(n)),
                                                     [1] * n, list(range(n)))
except CollectiveArgumentError as exc:          # also a ValueError
    assert isinstance(exc, ValueError) and exc.rank == last
    same_everywhere(exc)

# 3. Counts disagree across ranks: rank 0 expects 2 elements from rank 1, which sends 1.
recv_counts = [1] * n
if rank == 0:
    recv_counts[1] = 2
rdispls = [sum(recv_counts[:i]) for i in range(n)]
try:
    AllToAllVV2Operation(AllToAllVV2Param()).execute(np.zeros(n, np.int32), [1] * n, list(range(n)),
                                                     recv_counts, rdispls)
except CollectiveMismatchError as exc:
    assert exc.rank == 0
    same_everywhere(exc)

# 4. Different operators on different ranks: every rank names both, and the ranks that called each.
try:
    x = np.ones(2 * n, np.float32)
    (AllGatherOperation(AllGatherParam()) if rank == n - 1 else AllReduceOperation(AllReduceParam())).execute(x)
except CollectiveMismatchError as exc:
    assert n == 1 or "AllReduce vs AllGather: operation differs" in str(exc)
    same_everywhere(exc)

# Every rank raised the same errors, so the ranks are still in step: the next collective is fine.
op = AllReduceOperation(AllReduceParam())
assert op.execute(np.array([1]))[0] == n

# Validation off for this Operation: local checks only, no agreement (bad input may hang).
op.validate = False
assert op.execute(np.array([2]))[0] == 2 * n
if rank == 0:
    print("after the errors: AllReduce still works, with and without validation")
