"""Run inside the test bed (scripts/cluster run N NP -- python tests/multihost/probe.py): which host
each rank runs on, and the bytes each host's link sent during one 16 MiB AllReduce (mpicoll) of
float32 MAX (MPI's own, node-aware reduction), bfloat16 MAX (in tiers where each host runs several
ranks), and float32 and bfloat16 SUM (in rank order, docs/reproducibility.md: never regrouped by
host, so over more than 2 ranks the flat AllToAll + AllGather, blind to hosts).
Rank 0 prints one JSON line: {"hosts": [...per rank...], "tx": {"dtype op": {host: bytes}},
"nbytes": S, "tiers": whether the bfloat16 MAX went in tiers}."""
import json

import ml_dtypes
import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll._domains import world as lib_world


def tx() -> int:
    with open("/sys/class/net/eth0/statistics/tx_bytes") as fh:
        return int(fh.read())


world = MPI.COMM_WORLD
host = MPI.Get_processor_name()
sent = {}
for dtype, rname in ((np.float32, "max"), (ml_dtypes.bfloat16, "max"), (np.float32, "sum"), (ml_dtypes.bfloat16, "sum")):
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type=rname))
    x = np.ones((16 << 20) // np.dtype(dtype).itemsize, dtype)      # 16 MiB
    op.execute(x[:16])                                              # forms the communicators first
    world.Barrier()
    before = tx()
    world.Barrier()
    y = op.execute(x)
    world.Barrier()
    after = tx()
    assert float(y[0]) == float(y[-1]) == (world.Get_size() if rname == "sum" else 1)
    sent[f"{np.dtype(dtype).name} {rname}"] = dict(world.gather((host, after - before)) or [])
hosts = world.gather(host)
if world.Get_rank() == 0:
    print(json.dumps({"hosts": hosts, "tx": sent, "nbytes": 16 << 20, "tiers": lib_world()._tiers is not None}))
