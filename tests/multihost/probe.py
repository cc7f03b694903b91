"""Run inside the test bed (scripts/cluster run N NP -- python tests/multihost/probe.py): which host
each rank runs on, and the bytes each host's link sent during one 16 MiB AllReduce (mpicoll; the least
of three runs) of
int32 (MPI's own, node-aware reduction), int8 (in tiers where each host runs several ranks), and
float32 and bfloat16 SUM (in the tree order, docs/reproducibility.md: in tiers where the hosts hold
aligned blocks of consecutive ranks, bfloat16 with float32 partials; else the flat AllToAll + AllGather).
Rank 0 prints one JSON line: {"hosts": [...per rank...], "tx": {dtype: {host: bytes}}, "nbytes": S,
"tiers": whether the int8 AllReduce went in tiers}."""
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
op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type="sum"))
for dtype in (np.int32, np.int8, np.float32, ml_dtypes.bfloat16):
    x = np.ones((16 << 20) // np.dtype(dtype).itemsize, dtype)      # 16 MiB
    op.execute(x[:16])                                              # forms the communicators first
    least = None
    for _ in range(3):          # (the least of three: a TCP retransmission on a busy machine adds bytes)
        world.Barrier()
        before = tx()
        world.Barrier()
        y = op.execute(x)
        world.Barrier()
        after = tx()
        assert float(y[0]) == float(y[-1]) == world.Get_size()
        least = after - before if least is None else min(least, after - before)
    sent[np.dtype(dtype).name] = dict(world.gather((host, least)) or [])
hosts = world.gather(host)
if world.Get_rank() == 0:
    print(json.dumps({"hosts": hosts, "tx": sent, "nbytes": 16 << 20, "tiers": lib_world().tiered is not None}))
