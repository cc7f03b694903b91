"""Broadcast: the root's array overwrites every rank's array, in place.

    mpirun -np 4 python docs/examples/broadcast.py      (any rank count works)
"""
import numpy as np
from mpi4py import MPI

from mpicoll import BroadcastOperation, BroadcastParam

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()


def show(label, value):
    """Print every rank's value on rank 0, in rank order."""
    values = world.gather(value, root=0)
    if rank == 0:
        for r, v in enumerate(values):
            print(f"{label:<22} rank {r}: {v}")


# Root = the last rank. Every rank passes an array of the same shape and dtype;
# it is filled with the root's data and returned.
root = n - 1
x = np.full((2, 3), rank, dtype=np.int64)
res = BroadcastOperation(BroadcastParam(rank_root=root)).execute(x)
assert res is x and (x == root).all()
show(f"int64 from root {root}", x.tolist())

# float16 from root 0; only the root's contents matter.
h = np.array([1.5, -2.25], dtype=np.float16) if rank == 0 else np.zeros(2, dtype=np.float16)
BroadcastOperation(BroadcastParam(rank_root=0)).execute(h)
assert h.tolist() == [1.5, -2.25]
show("float16 from root 0", h.tolist())
