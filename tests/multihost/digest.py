"""The bits of float reductions, for comparing runs (docs/reproducibility.md): MPICH vs Open MPI,
1 host x 4 ranks vs 2 hosts x 2 (tests/test_reproducible.py, tests/test_multihost.py).

    mpirun -np 4 python tests/multihost/digest.py

Every rank builds every rank's inputs from fixed seeds (normal values over 8 decades, where another
order of a sum rounds differently), runs AllReduce, Reduce (root: the last rank), ReduceScatter and
ReduceScatterV (uneven blocks) of float16, bfloat16, float32 and float64, SUM and PROD, at sizes that
take every path (the Allgather, the node window in one and two shots, the AllToAll path, pieces), and
compares each result with the tree-order golden (``_golden.golden_reduce``). Rank 0 prints one JSON line: the library, the rank
count, a SHA-256 of every rank's results' bytes (in rank order) and how many results differ from the
golden.
"""
import hashlib
import json

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll._dtypes import DTYPES, reduce_op
from mpicoll.checks._golden import golden_reduce

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()
digest, wrong = hashlib.sha256(), 0
for dtype in [d for d, row in DTYPES.items() if row.floating]:     # (every float: their sums round)
    dt = DTYPES[dtype]
    inputs = {}                                                    # (the same inputs for SUM and PROD)
    for rname in ("sum", "prod"):
        for count in (1, 7, 1000, 4099, 20_000, 300_000, 1_100_000):
            count -= count % n
            if count not in inputs:
                inputs[count] = []
                for r in range(n):
                    g = np.random.default_rng([r, count, dt.code])
                    inputs[count].append((g.standard_normal(count) * 10.0 ** g.integers(-4, 4, count)).astype(dt.np))
            xs = inputs[count]
            with np.errstate(over="ignore"):                       # (products overflow to inf)
                want = golden_reduce(xs, dt, reduce_op(rname))
            per = count // n
            counts = [per + (1 if r % 2 else -1) * min(per, 3) for r in range(n)]
            counts[-1] += count - sum(counts)
            starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int).tolist()
            got = [mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type=rname)).execute(xs[rank]),
                   mpicoll.ReduceOperation(mpicoll.ReduceParam(reduce_type=rname, rank_root=n - 1)).execute(xs[rank]),
                   mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(reduce_type=rname)).execute(xs[rank]),
                   mpicoll.ReduceScatterVOperation(mpicoll.ReduceScatterVParam(reduce_type=rname)).execute(
                       xs[rank], counts, starts, counts[rank])]
            expected = [want, want if rank == n - 1 else None, want[rank * per:(rank + 1) * per],
                        want[starts[rank]:starts[rank] + counts[rank]]]
            for k, (a, b) in enumerate(zip(got, expected)):
                mine = b"-" if a is None else a.view(np.uint8).tobytes()
                wrong += int(mine != (b"-" if b is None else b.view(np.uint8).tobytes()))
                digest.update(mine)
wrong, every = world.reduce(wrong), world.gather(digest.hexdigest())
if rank == 0:
    print(json.dumps({"mpi": MPI.Get_library_version().splitlines()[0].strip(" \x00"), "ranks": n,
                      "sha256": hashlib.sha256(" ".join(every).encode()).hexdigest(), "wrong": wrong}))
