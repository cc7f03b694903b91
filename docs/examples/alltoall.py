"""AllToAll, AllToAllV and AllToAllVV2: every rank sends a block to every rank; AllToAllAllGather on a mesh.

    mpirun -np 4 python docs/examples/alltoall.py      (2 or 4 ranks; any count works,
                                                        the ATB pair example needs an even one)
"""
import numpy as np
from mpi4py import MPI

from mpicoll import (AllToAllAllGatherOperation, AllToAllAllGatherParam, AllToAllOperation, AllToAllParam,
                     AllToAllVOperation, AllToAllVParam, AllToAllVV2Operation, AllToAllVV2Param, mesh)

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()


def show(label, value):
    """Print every rank's value on rank 0, in rank order."""
    values = world.gather(value, root=0)
    if rank == 0:
        for r, v in enumerate(values):
            print(f"{label:<20} rank {r}: {v}")


# AllToAll: block j (2 elements of dim 0) goes to rank j; received blocks in source order.
def a2a_input(r):
    return (100 * r + np.arange(2 * n)).astype(np.int32)


out = AllToAllOperation(AllToAllParam()).execute(a2a_input(rank))
expected = np.concatenate([a2a_input(i)[2 * rank:2 * rank + 2] for i in range(n)])
assert out.shape == (2 * n,) and np.array_equal(out, expected)
show("AllToAll", out.tolist())


# AllToAllV: rank i sends (i + j) % 3 elements to rank j (some are 0), packed in rank order.
def plan(r):
    """(send_counts, sdispls, recv_counts, rdispls) of rank r."""
    sc = [(r + j) % 3 for j in range(n)]
    rc = [(i + r) % 3 for i in range(n)]          # what rank i sends to rank r
    return sc, [sum(sc[:j]) for j in range(n)], rc, [sum(rc[:i]) for i in range(n)]


def v_input(r):
    return (100 * r + np.arange(sum(plan(r)[0]))).astype(np.float32)


def golden(me):
    """For every source i: x_i.flat[sdispls_i[me] : + send_counts_i[me]] lands at out.flat[rdispls_me[i] : ...]."""
    _, _, rc, rd = plan(me)
    g = np.empty((1, sum(rc)), dtype=np.float32)
    for i in range(n):
        sc_i, sd_i, _, _ = plan(i)
        g.flat[rd[i]:rd[i] + rc[i]] = v_input(i).flat[sd_i[me]:sd_i[me] + sc_i[me]]
    return g


sc, sd, rc, rd = plan(rank)
op = AllToAllVOperation(AllToAllVParam(send_counts=sc, sdispls=sd, recv_counts=rc, rdispls=rd))
outv = op.execute(v_input(rank))
assert outv.shape == (1, sum(rc)) and np.array_equal(outv, golden(rank))
show("AllToAllV", outv.tolist())

# AllToAllVV2: the same plan, given at execute time.
outv2 = AllToAllVV2Operation(AllToAllVV2Param()).execute(v_input(rank), sc, sd, rc, rd)
assert np.array_equal(outv2, golden(rank))

# The two-rank example of the ATB documentation, run by each pair of ranks in a comm domain.
if rank < n - n % 2:
    atb = [
        (np.array([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=np.int64), [2, 4], [0, 2], [2, 2], [0, 2]),
        (np.array([[0, 1, 2], [3, 4, 6]], dtype=np.int64), [2, 1], [0, 2], [4, 1], [0, 4]),
    ]
    x, sc, sd, rc, rd = atb[rank % 2]
    infer_shape = np.zeros(sum(rc), dtype=np.int8)       # tensorForInferShape: sum(recv_counts) elements
    pair = AllToAllVV2Operation(AllToAllVV2Param(comm_domain=f"atb.pair{rank // 2}", rank_size=2))
    got = pair.execute(x, sc, sd, rc, rd, infer_shape)
    assert got.tolist() == [[[0, 1, 0, 1]], [[2, 3, 4, 5, 2]]][rank % 2]
else:
    got = None
show("AllToAllVV2", None if got is None else got.tolist())

# AllToAllAllGather on an ep x tp mesh of the world (tp 2 for an even rank count, else 1; tp contiguous:
# world rank = s * tp + t): an AllToAll over the ep domain, then an AllGather of its result over tp.
tp = 2 if n % 2 == 0 else 1
ep = n // tp
m = mesh(ep, tp)
x = 10 * rank + np.arange(ep)                     # rank r: [10 r, 10 r + 1, ...], ep elements
z, y = AllToAllAllGatherOperation(AllToAllAllGatherParam(group_ep=m.ep_domain, group_tp=m.tp_domain)).execute(x)


def z_of(s, t):
    """z of mesh rank (s, t): element s of every rank (s2, t) of its ep domain, in ep order."""
    return [10 * (s2 * tp + t) + s for s2 in range(ep)]


assert z.tolist() == z_of(m.ep_rank, m.tp_rank)
assert y.shape == (tp, ep) and y.tolist() == [z_of(m.ep_rank, t2) for t2 in range(tp)]
show("AllToAllAllGather z", z.tolist())
show("AllToAllAllGather y", y.tolist())
