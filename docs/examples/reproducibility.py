"""Reproducible reductions: the same values give the same bits alone, inside a large message, merged
in a graph, through ReduceScatter, and equal numpy's sum in the tree order (docs/reproducibility.md).

    mpirun -np 4 python docs/examples/reproducibility.py      (any rank count works)
"""
import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import functional as F, graph

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()

# every rank's 1000 values, over 8 decades (where the order of a sum shows in its last bits)
g = [np.random.default_rng(r) for r in range(n)]
every = [(x.standard_normal(1000) * 10.0 ** x.integers(-4, 4, 1000)).astype(np.float32) for x in g]
mine = every[rank]


def tree(lo, hi):
    """The tree order: T(lo, hi) = T(lo, mid) + T(mid, hi), mid = lo + the largest power of two below
    hi - lo (4 ranks: (x0 + x1) + (x2 + x3))."""
    if hi - lo == 1:
        return every[lo]
    mid = lo + (1 << ((hi - lo - 1).bit_length() - 1))
    return tree(lo, mid) + tree(mid, hi)


golden = tree(0, n)

allreduce = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type="sum"))
alone = allreduce.execute(mine)

big = np.random.default_rng(100 + rank).standard_normal(3_000_000).astype(np.float32)
big[12345:13345] = mine                            # the same values inside a 12 MB message
inside = allreduce.execute(big)[12345:13345]

parts = [mine[:10].copy(), mine[10:600].copy(), mine[600:].copy()]
with graph.capture() as gr:                        # three calls merged into one message
    for p in parts:
        F.all_reduce(p)
for p, src in zip(parts, (mine[:10], mine[10:600], mine[600:])):
    p[...] = src
gr.replay()
merged = np.concatenate(parts)

block = -(-1000 // n)
padded = np.zeros(block * n, np.float32)
padded[:1000] = mine
scattered = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam()).execute(padded)
scattered = np.concatenate(world.allgather(scattered))[:1000]

for name, got in (("alone", alone), ("inside 12 MB", inside), ("merged in a graph", merged),
                  ("ReduceScatter", scattered)):
    assert got.tobytes() == golden.tobytes(), name
if rank == 0:
    print(f"{n} ranks: 1000 float32 sums, alone, inside 12 MB, merged in a graph, through ReduceScatter: "
          "the same bits, numpy's sum in the tree order")
