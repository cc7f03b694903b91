"""The documented examples (ATB's AllToAllVV2 example at 2 ranks, run in pairs of ranks at more;
its AllReduce / AllGather / ReduceScatter / Broadcast examples), run for real and printed per rank, in
rank order, on rank 0."""
from __future__ import annotations

from typing import TextIO

import numpy as np

from ._domains import world as lib_world
from .ops.allgather import AllGatherOperation, AllGatherParam
from .ops.allreduce import AllReduceOperation, AllReduceParam
from .ops.alltoall import AllToAllVV2Operation, AllToAllVV2Param
from .ops.broadcast import BroadcastOperation, BroadcastParam
from .ops.reduce_scatter import ReduceScatterOperation, ReduceScatterParam


def _examples(rank: int, n: int) -> list[tuple[str, str, object]]:
    """(title, code shown, output) for this rank."""
    out = []
    value = np.array([[rank]], dtype=np.float32)
    out.append(("AllReduce sum, x = [[rank]] float32", "AllReduceOperation(AllReduceParam(reduce_type='sum'))"
                ".execute(x)", AllReduceOperation(AllReduceParam(reduce_type="sum")).execute(value)))
    out.append(("AllGather, x = [[rank]] float32 (stacked: [rank_size, 1, 1])",
                "AllGatherOperation(AllGatherParam()).execute(x)",
                AllGatherOperation(AllGatherParam()).execute(value)))
    rs_in = np.arange(n, dtype=np.float32).reshape(n, 1)
    out.append((f"ReduceScatter sum, x = [[0], ..., [{n - 1}]] on every rank",
                "ReduceScatterOperation(ReduceScatterParam()).execute(x)",
                ReduceScatterOperation(ReduceScatterParam()).execute(rs_in)))
    b = np.array([[rank]], dtype=np.int32)
    out.append(("Broadcast from root 0, x = [[rank]] int32", "BroadcastOperation(BroadcastParam(rank_root=0))"
                ".execute(x)", BroadcastOperation(BroadcastParam(rank_root=0)).execute(b)))
    # the ATB documentation's example is for 2 ranks: run it in pairs (0-1, 2-3, ...), each pair a domain
    title = "AllToAllVV2, the two-rank example of the ATB documentation" + (", in pairs of ranks" if n > 2 else "")
    me = rank % 2
    if rank // 2 * 2 + 1 < n:
        xs = [np.array([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=np.int64), np.array([[0, 1, 2], [3, 4, 6]], dtype=np.int64)]
        plan = [([2, 4], [0, 2], [2, 2], [0, 2]), ([2, 1], [0, 2], [4, 1], [0, 4])][me]
        infer = np.zeros(sum(plan[2]), dtype=np.int8)
        param = AllToAllVV2Param(rank_size=2, comm_domain=f"mpicoll.demo.pair{rank // 2}" if n > 2 else "")
        got = AllToAllVV2Operation(param).execute(xs[me], *plan, infer)
        out.append((title, f"execute(x={xs[me].tolist()}, send_counts={plan[0]}, sdispls={plan[1]}, "
                           f"recv_counts={plan[2]}, rdispls={plan[3]})", got))
    else:
        out.append((title, "(no partner: an odd rank count leaves the last rank out)", "skipped"))
    return out


def run_demo(log: TextIO | None = None) -> int:
    """Run the examples on every rank; rank 0 prints each example's per-rank outputs in rank order."""
    world = lib_world().mpi
    rank, n = world.Get_rank(), world.Get_size()
    mine = [(t, code, o, "", "") if isinstance(o, str) else
            (t, code, " ".join(np.array2string(np.asarray(o), separator=", ").split()), f"  shape={np.shape(o)}",
             f" dtype={np.asarray(o).dtype}") for t, code, o in _examples(rank, n)]
    if log is not None:
        for t, code, s, shape, dt in mine:
            log.write(f"{t}\n  {code}\n  -> {s}{shape}{dt}\n")
    gathered = world.gather(mine, root=0)
    if rank == 0:
        for i, (title, code, *_rest) in enumerate(mine):
            print(f"== {title} ({n} ranks)\n   {code}")
            for r, per_rank in enumerate(gathered):
                _, rcode, s, shape, dt = per_rank[i]
                if rcode != code:
                    print(f"   rank {r}: {rcode}")
                print(f"   rank {r} -> {s}{shape}{dt}")
    world.Barrier()
    return 0
