"""The fused MoE layer: AllToAll (ep) + AllGather (tp) + BatchMatMul, and its reverse.

    mpirun -np 4 python docs/examples/fused.py      (4 ranks: a 2 x 2 ep x tp mesh)
"""
import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import (AlltoAllAllGatherBatchMatMulOperation, AlltoAllAllGatherBatchMatMulParam,
                     BatchMatMulReduceScatterAlltoAllOperation, BatchMatMulReduceScatterAlltoAllParam)

world = MPI.COMM_WORLD
rank = world.Get_rank()
if world.Get_size() != 4:                     # (every rank alike: the same size everywhere)
    raise SystemExit(f"{world.Get_size()} rank(s): launch with mpirun -np 4 python docs/examples/fused.py")
m = mpicoll.mesh(2, 2)                         # tp contiguous: world rank = 2 * ep_rank + tp_rank
E, C, H, M = 4, 2, 4, 6                        # experts, tokens per expert, hidden size, output size

# x: this rank's tokens for every expert, H split over tp (shard 0): (E, C, H/tp)
x = np.full((E, C, H // 2), rank, dtype=np.float16)
w = np.ones((E // 2, H, M // 2), dtype=np.float16)          # this rank's experts' weights: (E/ep, H, M/tp)
fwd = AlltoAllAllGatherBatchMatMulOperation(AlltoAllAllGatherBatchMatMulParam(
    group_ep=m.ep_domain, group_tp=m.tp_domain, ep_world_size=2, tp_world_size=2,
    act_type="relu", output_y2=True))
y1, y2, y3 = fwd.execute(x, w)
# y2[e, s*C + c, t*(H/tp) + h] = x of rank (s, t): rows of ep rank s, columns of tp rank t
assert y2.shape == (E // 2, 2 * C, H) and y3 is None
want = np.array([[2 * s + t for t in range(2) for _ in range(H // 2)] for s in range(2) for _ in range(C)])
assert (y2 == want).all()
assert (y1 == (want @ np.ones((H, M // 2)))).all()          # ReLU of non-negative sums: the sums
if rank == 0:
    print("y2[0] (rows: ep rank s, columns: tp rank t):\n", y2[0])
    print("y1[0] = relu(y2[0] @ w[0]):\n", y1[0])

# the reverse sends every token back: with weights that copy, the layer round-trips
t = m.tp_rank
keep = np.zeros((E // 2, H, H // 2), np.float16)             # forward keeps tp rank t's H columns ...
back = np.zeros((E // 2, H // 2, H), np.float16)             # ... reverse puts them back in place
for e in range(E // 2):
    keep[e, t * 2:t * 2 + 2, :] = np.eye(2)
    back[e, :, t * 2:t * 2 + 2] = np.eye(2)
copy = AlltoAllAllGatherBatchMatMulOperation(AlltoAllAllGatherBatchMatMulParam(
    group_ep=m.ep_domain, group_tp=m.tp_domain))
rev = BatchMatMulReduceScatterAlltoAllOperation(BatchMatMulReduceScatterAlltoAllParam(
    group_ep=m.ep_domain, group_tp=m.tp_domain))
x2 = (np.arange(E * C * (H // 2)).reshape(E, C, H // 2) + 100 * rank).astype(np.float16)
y, _, _ = copy.execute(x2, keep)
assert (rev.execute(y, back) == x2).all()
if rank == 0:
    print("forward then reverse: x back on every rank")
