"""Comm domains: named sub-communicators formed by their members, declared tables, meshes, user comms.

    mpirun -np 4 python docs/examples/domains.py      (2 or 4 ranks: any even count works)
"""
import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import AllGatherOperation, AllGatherParam, AllReduceOperation, AllReduceParam

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()
if n % 2:                                     # (every rank alike: the same size everywhere)
    raise SystemExit(f"{n} rank(s): launch with an even number, e.g. mpirun -np 4 python docs/examples/domains.py")


def show(label, value):
    """Print every rank's value on rank 0, in rank order."""
    values = world.gather(value, root=0)
    if rank == 0:
        for r, v in enumerate(values):
            print(f"{label:<16} rank {r}: {v}")


# 1. Undeclared domains: ranks naming the same domain form it; rank_size says how many will come.
name = "parity.odd" if rank % 2 else "parity.even"
par = AllReduceOperation(AllReduceParam(comm_domain=name, rank_size=n // 2))
total = par.execute(np.array([rank]))
assert total[0] == sum(r for r in range(n) if r % 2 == rank % 2)
show("parity sum", f"{name}: {total.tolist()}")
assert mpicoll.domain_members(name) == tuple(r for r in range(n) if r % 2 == rank % 2)

# 2. Only the members take part: ranks 0 and 1 form "first-two"; the other ranks do nothing.
if rank < 2:
    got = AllGatherOperation(AllGatherParam(comm_domain="first-two", rank_size=2)).execute(np.array([rank]))
    assert got.tolist() == [[0], [1]]
world.Barrier()

# 3. Declared domains: no rank_size needed; the members compare their member lists.
mpicoll.declare_domains({"lo": list(range(n // 2)), "hi": list(range(n // 2, n))})
half = "lo" if rank < n // 2 else "hi"
members = AllGatherOperation(AllGatherParam(comm_domain=half)).execute(np.array([rank]))
assert members.ravel().tolist() == list(mpicoll.domain_members(half))
show("declared", f"{half}: {members.ravel().tolist()}")

# 4. An ep x tp mesh (tp contiguous: world rank = s * tp + t); its domains are declared.
ep, tp = 2, n // 2
m = mpicoll.mesh(ep, tp, "tp_contiguous")
assert rank == m.ep_rank * tp + m.tp_rank
tp_ranks = AllGatherOperation(AllGatherParam(comm_domain=m.tp_domain)).execute(np.array([rank])).ravel()
ep_ranks = AllGatherOperation(AllGatherParam(comm_domain=m.ep_domain)).execute(np.array([rank])).ravel()
assert tp_ranks.tolist() == [m.ep_rank * tp + t for t in range(tp)]
assert ep_ranks.tolist() == [s * tp + m.tp_rank for s in range(ep)]
show("mesh", f"s={m.ep_rank} t={m.tp_rank} {m.tp_domain}={tp_ranks.tolist()} {m.ep_domain}={ep_ranks.tolist()}")

# 5. A user communicator: mpicoll runs on a duplicate of it and never frees it.
sub = world.Split(color=rank % 2, key=rank)
outs = AllReduceOperation(AllReduceParam(comm=sub, reduce_type="max")).execute(np.array([rank]))
assert outs[0] == max(r for r in range(n) if r % 2 == rank % 2)
show("user comm max", outs.tolist())
sub.Free()
