"""AllReduce: every rank gets the element-wise reduction of every rank's array; Reduce: the root only.

    mpirun -np 4 python docs/examples/allreduce.py      (any rank count works)
"""
import ml_dtypes
import numpy as np
from mpi4py import MPI

from mpicoll import AllReduceOperation, AllReduceParam, ReduceOperation, ReduceParam

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()


def show(label, value):
    """Print every rank's value on rank 0, in rank order."""
    values = world.gather(value, root=0)
    if rank == 0:
        for r, v in enumerate(values):
            print(f"{label:<22} rank {r}: {v}")


# Sum of float32 arrays: rank r holds [r, 10 r].
x = np.array([rank, 10 * rank], dtype=np.float32)
out = AllReduceOperation(AllReduceParam(reduce_type="sum")).execute(x)
s = sum(range(n))
assert out.dtype == np.float32 and out.tolist() == [s, 10 * s]
show("sum float32", out.tolist())

# One Operation, reused; in place: out=x writes the result into x itself.
op = AllReduceOperation(AllReduceParam(reduce_type="max"))
for step in range(2):
    y = np.array([[rank + step, -rank]], dtype=np.int32)
    res = op.execute(y, out=y)
    assert res is y and y.tolist() == [[n - 1 + step, 0]]
show("max int32, in place", y.tolist())

# float16 / bfloat16: accumulated in float32, rounded once.
# Rank 0 holds 2048, the others 1: float32 sum 2048 + (n - 1), then one rounding to float16.
h = np.array([2048 if rank == 0 else 1], dtype=np.float16)
out16 = AllReduceOperation(AllReduceParam()).execute(h)
assert out16.dtype == np.float16 and out16[0] == np.float16(2048 + (n - 1))
show("sum float16", out16.tolist())
b = np.array([256 if rank == 0 else 1], dtype=ml_dtypes.bfloat16)
outb = AllReduceOperation(AllReduceParam()).execute(b)
assert outb.dtype == ml_dtypes.bfloat16 and outb[0] == ml_dtypes.bfloat16(256 + (n - 1))
show("sum bfloat16", outb.astype(np.float32).tolist())

# Integer sums wrap, as in numpy and MPI, validation on or off: n x 100 in int8.
i8 = np.array([100, 1], dtype=np.int8)
wrapped = AllReduceOperation(AllReduceParam()).execute(i8)
assert wrapped.tolist() == np.array([100 * n, n]).astype(np.int8).tolist()
show("sum int8 (wraps)", wrapped.tolist())

# Reduce: the reduction lands on the root only (here the last rank); the other ranks get None.
root = n - 1
red = ReduceOperation(ReduceParam(rank_root=root, reduce_type="sum")).execute(np.array([rank, 1], dtype=np.int32))
assert (red.tolist() == [s, n]) if rank == root else red is None
show(f"Reduce sum (root {root})", None if red is None else red.tolist())

# Reduce in place on the root (out=x), float16 accumulated in float32 and rounded once, as in AllReduce.
h = np.array([2048 if rank == 0 else 1], dtype=np.float16)
red16 = ReduceOperation(ReduceParam(rank_root=0)).execute(h, out=h)
assert (red16 is h and h[0] == np.float16(2048 + (n - 1))) if rank == 0 else (red16 is None and h[0] == 1)
show("Reduce f16 in place", h.tolist())
