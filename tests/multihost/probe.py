"""Run inside the test bed (scripts/cluster run N NP -- python tests/multihost/probe.py): which host
each rank runs on, and the bytes each host's link sent during one 16 MiB float32 AllReduce (mpicoll).
Rank 0 prints one JSON line: {"hosts": [...per rank...], "tx": {host: bytes}, "nbytes": S}."""
import json

import numpy as np
from mpi4py import MPI

import mpicoll


def tx() -> int:
    with open("/sys/class/net/eth0/statistics/tx_bytes") as fh:
        return int(fh.read())


world = MPI.COMM_WORLD
host = MPI.Get_processor_name()
x = np.ones(4 << 20, np.float32)                       # 16 MiB
op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type="sum"))
op.execute(x[:16])                                     # forms the communicators first
world.Barrier()
before = tx()
world.Barrier()
y = op.execute(x)
world.Barrier()
after = tx()
assert float(y[0]) == world.Get_size() and float(y[-1]) == world.Get_size()
hosts = world.gather(host)
deltas = world.gather((host, after - before))
if world.Get_rank() == 0:
    print(json.dumps({"hosts": hosts, "tx": dict(deltas), "nbytes": x.nbytes}))
