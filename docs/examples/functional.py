"""torch.distributed names on numpy arrays, and a captured graph replayed.

    mpirun -np 4 python docs/examples/functional.py      (any rank count works)
"""
import numpy as np
from mpi4py import MPI

from mpicoll import functional as dist
from mpicoll import graph

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()


def show(label, value):
    """Print every rank's value on rank 0, in rank order."""
    values = world.gather(value, root=0)
    if rank == 0:
        for r, v in enumerate(values):
            print(f"{label:<30} rank {r}: {v}")


# all_reduce: in place, as in torch
t = np.array([rank + 1.0, 10.0 * rank], dtype=np.float32)
dist.all_reduce(t)
assert t.tolist() == [n * (n + 1) / 2, 10.0 * n * (n - 1) / 2]
show("all_reduce", t.tolist())

# all_to_all_single with uneven splits along dim 0: rank r sends r + 1 rows to every rank
inp = np.full((n * (rank + 1), 2), rank, dtype=np.int64)
out = np.empty((sum(r + 1 for r in range(n)), 2), dtype=np.int64)
dist.all_to_all_single(out, inp, output_split_sizes=[r + 1 for r in range(n)],
                       input_split_sizes=[rank + 1] * n)
assert out[:, 0].tolist() == [r for r in range(n) for _ in range(r + 1)]
show("all_to_all_single (uneven)", out[:, 0].tolist())

# async_op=True: a Work to wait for, while local work goes on
gathered = np.empty((n, 3), dtype=np.float64)
work = dist.all_gather_into_tensor(gathered, np.full(3, float(rank)), async_op=True)
local = np.arange(1000.0).sum()                       # overlap
work.wait()
assert gathered[:, 0].tolist() == list(range(n))

# a graph: captured once (nothing runs), agreed once at the end of the block, replayed many times
grads = [np.zeros(k + 2, dtype=np.int32) for k in range(4)]
weights = np.zeros(3, dtype=np.float32)
with graph.capture() as g:
    for grad in grads:
        dist.all_reduce(grad)                         # merged into one MPI call (independent arrays)
    dist.broadcast(weights, src=0)
show("graph summary", g.summary())
for step in range(3):
    for grad in grads:
        grad[:] = rank + step                         # new contents, same arrays
    weights[:] = 100 * step if rank == 0 else -1
    g.replay()
    assert all((grad == n * step + n * (n - 1) // 2).all() for grad in grads)
    assert (weights == 100 * step).all()
show("after 3 replays, grads[0]", grads[0].tolist())
g.free()
