"""AllGather and AllGatherV: every rank gets every rank's data, in rank order; Gather: the root only;
Scatter: the root's blocks, one to each rank.

    mpirun -np 4 python docs/examples/allgather.py      (any rank count works)
"""
import numpy as np
from mpi4py import MPI

from mpicoll import (AllGatherOperation, AllGatherParam, AllGatherVOperation, AllGatherVParam, GatherOperation,
                     GatherParam, ScatterOperation, ScatterParam)

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()


def show(label, value):
    """Print every rank's value on rank 0, in rank order."""
    values = world.gather(value, root=0)
    if rank == 0:
        for r, v in enumerate(values):
            print(f"{label:<26} rank {r}: {v}")


# AllGather stacks the inputs on a new leading axis: (1, 2) per rank -> (n, 1, 2).
x = np.array([[rank, 10 * rank]], dtype=np.float32)
out = AllGatherOperation(AllGatherParam()).execute(x)
assert out.shape == (n, 1, 2)
assert out.tolist() == [[[r, 10 * r]] for r in range(n)]
show("AllGather", out.tolist())

# A preallocated output buffer, reused by one Operation.
op = AllGatherOperation(AllGatherParam())
buf = np.empty((n, 3), dtype=np.int64)
for step in range(2):
    res = op.execute(np.full(3, rank + step, dtype=np.int64), out=buf)
    assert res is buf and buf[:, 0].tolist() == [r + step for r in range(n)]

# AllGatherV: rank r sends r + 1 elements; recv_counts and rdispls are the same on every rank.
v = np.full(rank + 1, rank, dtype=np.int32)
recv_counts = [r + 1 for r in range(n)]
rdispls = [sum(recv_counts[:r]) for r in range(n)]
outv = AllGatherVOperation(AllGatherVParam()).execute(v, rank + 1, recv_counts, rdispls)
assert outv.shape == (sum(recv_counts),)
assert outv.tolist() == [r for r in range(n) for _ in range(r + 1)]
show("AllGatherV", outv.tolist())

# rdispls decide where each rank's block lands: here in reverse rank order,
# and a shape reference turns the 1-D result into (n, 2).
two = np.array([rank, rank], dtype=np.int32)
rev = [2 * (n - 1 - r) for r in range(n)]
outr = AllGatherVOperation(AllGatherVParam()).execute(two, 2, [2] * n, rev, (n, 2))
assert outr.tolist() == [[r, r] for r in reversed(range(n))]
show("AllGatherV reversed", outr.tolist())

# Gather: AllGather's stacking, on the root only (here rank 0); the other ranks get None.
g = GatherOperation(GatherParam(rank_root=0)).execute(np.array([rank, rank * rank], dtype=np.int64))
assert (g.shape == (n, 2) and g.tolist() == [[r, r * r] for r in range(n)]) if rank == 0 else g is None
show("Gather (root 0)", None if g is None else g.tolist())

# Scatter: Gather's inverse. The root splits x along dim 0 into n blocks; rank r gets block r.
# Off the root x is not read (None) and out gives the block's shape and dtype.
scatter = ScatterOperation(ScatterParam(rank_root=0))
if rank == 0:
    block = scatter.execute(np.arange(2 * n, dtype=np.int64).reshape(n, 2))
else:
    block = scatter.execute(None, out=np.empty((1, 2), dtype=np.int64))
assert block.tolist() == [[2 * rank, 2 * rank + 1]]
show("Scatter (root 0)", block.tolist())
