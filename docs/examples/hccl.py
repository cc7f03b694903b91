"""The Hccl handle API (docs/hccl.md): the multi-round AllGather of the Ascend C documentation's
example, a ReduceScatter committed round by round, and a task committed again.

    mpirun -np 4 python docs/examples/hccl.py
"""
import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

import mpicoll
from mpicoll import Hccl, HcclDataType, HcclReduceOp

rank, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()

# 1. Ascend's example: 300 float16 per rank, gathered as 2 tiles of 128 (repeat=2) and a tail of 44, stride 300
x = np.arange(300, dtype=np.float16) + rank
y = np.zeros(300 * n, dtype=np.float16)
with Hccl().init() as hccl:                        # the world; or init("tp"), init(comm)
    stride = 2 * 128 + 44
    h1 = hccl.all_gather(x, y, 128, HcclDataType.FP16, stride, repeat=2, commit=True)
    h2 = hccl.all_gather(x[256:], y[256:], 44, HcclDataType.FP16, stride, commit=True)   # the tail: 44
    hccl.wait(h1)
    hccl.wait(h2)
assert np.array_equal(y.reshape(n, 300), mpicoll.AllGatherOperation().execute(x))

# 2. ReduceScatter in 3 rounds of 2 elements; rank i's blocks for rank r start at r*6 (stride 6)
send = np.arange(6 * n, dtype=np.float32) * (rank + 1)
recv = np.zeros(6, dtype=np.float32)
with Hccl().init() as hccl:
    h = hccl.reduce_scatter(send, recv, 2, HcclDataType.FP32, HcclReduceOp.SUM, stride_count=6, repeat=3)
    for k in range(3):
        hccl.commit(h)                             # releases round k; it progresses while we compute
        with threadpool_limits(limits=1, user_api="blas"):      # one BLAS thread per rank (docs/plans.md)
            _ = np.ones((64, 64)) @ np.ones((64, 64))
        finished = hccl.query(h)
        if rank == 0:
            print(f"rank 0: {finished} of 3 rounds finished after commit {k + 1}")
    hccl.wait(h)
total = sum(r + 1 for r in range(n))
assert np.array_equal(recv, np.arange(6 * rank, 6 * rank + 6, dtype=np.float32) * total)

# 3. a prepared task is committed again after a wait: it re-reads its buffers
a = np.full(4, rank, dtype=np.int32)
b = np.zeros(4, dtype=np.int32)
with Hccl().init() as hccl:
    h = hccl.all_reduce(a, b, 4, HcclDataType.INT32, HcclReduceOp.MAX)
    for step in range(3):
        a += 10
        hccl.commit(h)
        hccl.wait(h)
        assert b.tolist() == [n - 1 + 10 * (step + 1)] * 4
# every rank's line, printed by rank 0 (lines printed by several ranks at once can run together)
lines = MPI.COMM_WORLD.gather(f"rank {rank}: hccl example ok", root=0)
if rank == 0:
    print("\n".join(lines), flush=True)
