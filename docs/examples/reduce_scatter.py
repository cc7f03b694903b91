"""ReduceScatter and ReduceScatterV: reduce over all ranks, rank r keeps block r.

    mpirun -np 4 python docs/examples/reduce_scatter.py      (any rank count works)
"""
import ml_dtypes
import numpy as np
from mpi4py import MPI

from mpicoll import ReduceScatterOperation, ReduceScatterParam, ReduceScatterVOperation, ReduceScatterVParam

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()


def show(label, value):
    """Print every rank's value on rank 0, in rank order."""
    values = world.gather(value, root=0)
    if rank == 0:
        for r, v in enumerate(values):
            print(f"{label:<28} rank {r}: {v}")


# ReduceScatter: x has 2 n rows on every rank; rank r gets rows 2r, 2r + 1 of the sum.
x = (np.arange(2 * n * 2).reshape(2 * n, 2) + rank).astype(np.float32)
out = ReduceScatterOperation(ReduceScatterParam(reduce_type="sum")).execute(x)
full = sum(np.arange(2 * n * 2).reshape(2 * n, 2) + r for r in range(n))   # numpy golden
assert out.shape == (2, 2) and np.array_equal(out, full[2 * rank:2 * rank + 2])
show("ReduceScatter sum", out.tolist())

# bfloat16, max: reduced in float32, rounded once.
xb = np.array([rank, -rank] * n, dtype=ml_dtypes.bfloat16).reshape(n, 2)
outb = ReduceScatterOperation(ReduceScatterParam(reduce_type="max")).execute(xb)
assert outb.dtype == ml_dtypes.bfloat16 and outb.astype(np.float32).tolist() == [[n - 1, 0]]
show("ReduceScatter max bf16", outb.astype(np.float32).tolist())

# ReduceScatterV: block j (for rank j) has j + 1 elements, packed in rank order;
# every rank passes the same send_counts and its own recv_count = send_counts[rank].
send_counts = [j + 1 for j in range(n)]
sdispls = [sum(send_counts[:j]) for j in range(n)]
xv = np.arange(sum(send_counts), dtype=np.int64) * (rank + 1)
outv = ReduceScatterVOperation(ReduceScatterVParam()).execute(xv, send_counts, sdispls, send_counts[rank])
scale = sum(r + 1 for r in range(n))
mine = np.arange(sdispls[rank], sdispls[rank] + send_counts[rank]) * scale
assert outv.shape == (rank + 1,) and outv.tolist() == mine.tolist()
show("ReduceScatterV", outv.tolist())

# Displacements are each rank's own: here rank r stores its blocks in reverse order.
rev = [sum(send_counts[j + 1:]) for j in range(n)]
xr = np.empty(sum(send_counts), dtype=np.int64)
for j in range(n):
    xr[rev[j]:rev[j] + send_counts[j]] = xv[sdispls[j]:sdispls[j] + send_counts[j]]
outr = ReduceScatterVOperation(ReduceScatterVParam()).execute(
    xr if rank % 2 else xv, send_counts, rev if rank % 2 else sdispls, send_counts[rank])
assert outr.tolist() == mine.tolist()
show("ReduceScatterV mixed layout", outr.tolist())

# x may be longer than its blocks: the elements after the last block are not read.
longer = np.concatenate([xv, np.full(3, -1, dtype=np.int64)])
outl = ReduceScatterVOperation(ReduceScatterVParam()).execute(longer, send_counts, sdispls, send_counts[rank])
assert outl.tolist() == mine.tolist()
show("ReduceScatterV longer x", outl.tolist())
