"""AllReduce in tiers over several nodes (``_making.tiers``, ``ops/allreduce._tiered``): a
ReduceScatter on each node through its shared window, an AllReduce across nodes, an AllGather on
each node.

One machine is one node, so each test launches its own job (from the 1-rank run) with MPICH's
``MPIR_CVAR_NUM_CLIQUES=K``: MPICH then places its ranks on K nodes, round robin (its own setting
for testing node-aware code: ``Split_type`` and shared memory follow it). The job checks, bit for
bit, large 8-bit integers against a numpy golden of the tiers (each node's members reduced in
rank order, then the nodes' partial results the same way), every float reduction against the
tree-order golden (docs/reproducibility.md: float32/float64 in tiers where the nodes are aligned
with the tree, consecutive ranks and a power of two on each; else flat); that the integer dtypes
MPI reduces itself, and smaller messages, stay flat (MPICH's own AllReduce is node-aware); sizes at the threshold and across the window's
rounds; in place; plans, started plans with collectives in between, the functional API; uneven
layouts (no tiers); ``MPICOLL_SHM=0``; freeing a communicator that has tiers; a rank that never
arrives. The bytes each host sends, against the model, are measured on the test bed
(tests/test_multihost.py).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from mpi4py import MPI

from _mpi import launch_env, mpirun, within

pytestmark = [pytest.mark.mpi(min_size=1), pytest.mark.skipif(
    MPI.COMM_WORLD.Get_size() != 1 or not MPI.Get_library_version().startswith("MPICH"),
    reason="launches its own jobs once (from the 1-rank run) with MPICH's MPIR_CVAR_NUM_CLIQUES (nodes on one "
           "machine); this run has several ranks or another MPI")]

JOB = r'''
import os, sys, time
import numpy as np
from mpi4py import MPI
import mpicoll
import mpicoll.functional
from mpicoll import _shm
from mpicoll._thresholds import VALUES
from mpicoll._domains import user_comm
from mpicoll._dtypes import DTYPES, REDUCE_OPS
from mpicoll.checks._golden import golden_reduce, rank_data

VALUES["window.slot"] = 4096                       # (small rounds: the node tier's ReduceScatter takes many)
VALUES["allreduce.tiers"] = 2048
VALUES["allreduce.bytes_alltoall"] = 8192
W = MPI.COMM_WORLD
n, me = W.size, W.rank

# the nodes, found independently of mpicoll: world ranks on each, in rank order
here = W.Split_type(MPI.COMM_TYPE_SHARED)
first = W.allgather(here.allreduce(me, op=MPI.MIN))          # each rank's node: its lowest world rank
here.Free()
nodes = [[r for r in range(n) if first[r] == f] for f in sorted(set(first))]
regular = len({len(m) for m in nodes}) == 1 and len(nodes[0]) > 1 and len(nodes) > 1
window = os.environ.get("MPICOLL_SHM", "1") != "0"          # MPICOLL_SHM=0: no window, so no tiers
tiered = regular and window
# nodes aligned with the tree order (consecutive ranks, a power of two on each): a float32/float64
# reduction in the tree order goes in tiers (ops._paths.aligned)
L = len(nodes[0])
aligned = tiered and L & (L - 1) == 0 and all(m == list(range(m[0], m[0] + len(m))) for m in nodes)


def tiered_golden(inputs, dt, rop):
    """Integers: each node's members reduced in rank order, then the nodes' results the same way,
    node index k's member of each node in order. Floats: the tree order, on every path."""
    def reduce(rows):
        acc = rows[0].copy()
        for r in rows[1:]:
            acc = rop.ufunc(acc, r).astype(dt.np)
        return acc
    if dt.floating:
        return golden_reduce(inputs, dt, rop)
    if not tiered:
        return reduce(inputs)
    L = len(nodes[0])
    counts = [len(inputs[0].reshape(-1)) // L + (k < len(inputs[0].reshape(-1)) % L) for k in range(L)]
    bounds = np.concatenate(([0], np.cumsum(counts)))
    out = np.empty(inputs[0].size, dt.np)
    for k in range(L):
        part = [reduce([inputs[r].reshape(-1)[bounds[k]:bounds[k + 1]] for r in node]) for node in nodes]
        out[bounds[k]:bounds[k + 1]] = reduce(part)
    return out.reshape(inputs[0].shape)


def check(what, got, want):
    if got.tobytes() != want.tobytes():
        bad = np.flatnonzero(got.reshape(-1).view(np.uint8) != want.reshape(-1).view(np.uint8))
        print(f"rank {me}: WRONG {what}: first bytes differ at {bad[:5]}", flush=True)
        sys.exit(3)


def fresh():
    c = W.Dup()
    return c, user_comm(c)


# a rank that never arrives (alone: the checks below run in the other jobs): the others time out
# naming the operator; the absent rank stays away a while longer (ABSENT seconds), then leaves
if os.environ.get("TIMEOUT_CASE") and tiered:
    from mpicoll import CollectiveTimeout
    c2 = W.Dup()
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=c2, reduce_type="sum"), timeout=2,
                                    validate=False)
    x = np.ones(16384, np.int8)                  # (in tiers)
    op.execute(x)
    if me == n - 1:
        time.sleep(float(os.environ["ABSENT"]))
        sys.exit(0)
    try:
        op.execute(x)
    except CollectiveTimeout as exc:
        print(f"rank {me}: timeout: {exc}", flush=True)
        sys.exit(0)
    print(f"rank {me}: no timeout", flush=True)
    sys.exit(4)

comm, lib = fresh()
assert lib.per_node == (len(nodes[0]) if tiered else 0), (lib.per_node, nodes)
assert not lib.local

# below the threshold, and the dtypes MPI reduces itself: flat (no tiers made)
for name, count in [("bfloat16", 1023), ("float32", 50_000), ("int32", 50_000), ("int8", 8191)]:
    dt = DTYPES[name]
    xs = [rank_data(5, name, r, (count,), dt, "int") for r in range(n)]
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
    got = op.execute(xs[me])
    want = xs[0].astype(np.float64) if dt.np.kind == "f" else xs[0].copy()
    for x in xs[1:]:
        want = want + x if dt.np.kind == "f" else (want + x).astype(dt.np)
    check(f"flat {name} {count}", got, want.astype(dt.np))
assert (lib.tiered is not None) == aligned, "a flat call made tiers"

# float32/float64 (the floats MPI reduces) in the tree order (in tiers where aligned), above the threshold, in place too
for name in [d for d, row in DTYPES.items() if row.floating and row.reduce == "native"]:
    dt = DTYPES[name]
    for rname in ("sum", "prod", "max"):
        op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type=rname))
        for count in (2048 // dt.itemsize, 5 * 4096 + 3):
            xs = [rank_data(8, f"{name}/{rname}/{count}", r, (count,), dt, "random") for r in range(n)]
            want = tiered_golden(xs, dt, REDUCE_OPS[rname])
            check(f"{name} {rname} {count}", op.execute(xs[me]), want)
            y = xs[me].copy()
            op.execute(y, out=y)
            check(f"{name} {rname} {count} in place", y, want)

for name in ["float16", "bfloat16", "int8"]:
    dt = DTYPES[name]
    per = 2048 // dt.itemsize
    counts = [per, per + 1, per + 7, 5 * 4096 // dt.itemsize + 3] if name != "int8" else [8192, 8192 * 3 + 5]
    for rname in (["sum", "prod", "max", "min"] if name != "int8" else ["sum", "max"]):
        rop = REDUCE_OPS[rname]
        op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type=rname))
        for count in counts:
            kind = "int" if name == "int8" or rname == "prod" else "random"
            xs = [rank_data(7, f"{name}/{rname}/{count}", r, (count,), dt, kind) for r in range(n)]
            want = tiered_golden(xs, dt, rop)
            check(f"{name} {rname} {count}", op.execute(xs[me]), want)
            y = xs[me].copy()
            op.execute(y, out=y)
            check(f"{name} {rname} {count} in place", y, want)
assert (lib.tiered is not None) == tiered

# ReduceScatter(V) in the tree order: node first where aligned (the tiers), else flat; every float
# against the tree golden, blocks of every size (a zero one too) and in place
for name in ["float32", "float64", "bfloat16"]:
    dt = DTYPES[name]
    for rname in ("sum", "max"):
        rop = REDUCE_OPS[rname]
        k = 6000 // dt.itemsize                                           # (above the tiers' threshold)
        xs = [rank_data(11, f"rs/{name}/{rname}", r, (n * k,), dt, "random") for r in range(n)]
        want = golden_reduce(xs, dt, rop)
        op = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(comm=comm, reduce_type=rname))
        check(f"ReduceScatter {name} {rname}", op.execute(xs[me]), want[me * k:(me + 1) * k])
        y = xs[me].copy()
        op.execute(y, out=y[me * k:(me + 1) * k])
        check(f"ReduceScatter {name} {rname} in place", y[me * k:(me + 1) * k], want[me * k:(me + 1) * k])
        counts = np.array([(3 * r + 1) * 700 if r != 1 else 0 for r in range(n)])     # (rank 1: nothing)
        total = int(counts.sum())
        vs = [rank_data(12, f"rsv/{name}/{rname}", r, (total,), dt, "random") for r in range(n)]
        wantv = golden_reduce(vs, dt, rop)
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        opv = mpicoll.ReduceScatterVOperation(mpicoll.ReduceScatterVParam(comm=comm, reduce_type=rname))
        got = opv.execute(vs[me], counts, displs, int(counts[me]))
        check(f"ReduceScatterV {name} {rname}", got, wantv[displs[me]:displs[me] + counts[me]])

# plans, a started plan with collectives in between, the functional API (int8: in tiers; float32:
# in tiers where aligned)
for name, count, kind in (("int8", 3 * 8192, "int"), ("float32", 3 * 1001, "random")):
    dt = DTYPES[name]
    xs = [rank_data(9, "plan", r, (3, count // 3), dt, kind) for r in range(n)]
    want = tiered_golden(xs, dt, REDUCE_OPS["sum"])
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
    out = np.empty_like(xs[me])
    plan = op.prepare(xs[me], out=out)
    for _ in range(3):
        out[:] = 0
        check("plan", plan.run(), want)
    bc = mpicoll.BroadcastOperation(mpicoll.BroadcastParam(comm=comm))
    for _ in range(3):
        out[:] = 0
        h = plan.start()
        b = np.arange(4096, dtype=np.float32) if me == 0 else np.zeros(4096, np.float32)
        bc.execute(b)
        other = op.execute(xs[me])
        check("started plan", h.wait(), want)
        check("between", other, want)
        assert b[-1] == 4095
    t = xs[me].copy()
    mpicoll.functional.all_reduce(t, group=comm)
    check("functional", t, want)
comm.Free()                                  # (frees its tiers and their windows)

print(f"rank {me}: tiers ok ({len(nodes)} nodes: {nodes}; {'in tiers' if tiered else 'flat'}"
      f"{', aligned' if aligned else ''})", flush=True)
'''


def _job(tmp_path, np_: int, cliques: int, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "tiers_job.py"
    script.write_text(textwrap.dedent(JOB))
    clean = launch_env(settings=False)
    clean.update({"MPIR_CVAR_NUM_CLIQUES": str(cliques), "MPICOLL_TIMEOUT": "60", **env})
    return subprocess.run(mpirun(np_, sys.executable, "-m", "mpi4py", str(script)), capture_output=True, text=True,
                          timeout=240, env=clean)


@pytest.mark.timeout_s(260)
@pytest.mark.parametrize("np_,cliques,blocks", [(4, 2, False), (6, 2, False), (6, 3, False), (3, 2, False),
                                                 (4, 2, True), (6, 2, True), (8, 4, True)],
                         ids=["2x2", "2x3", "3x2", "uneven-2+1", "2x2-blocks", "2x3-blocks", "4x2-blocks"])
def test_tiered_allreduce_bit_for_bit(tmp_path, np_, cliques, blocks):
    """Round-robin placement (MPICH's cliques), and in blocks (``MPIR_CVAR_CLIQUES_BY_BLOCK``: nodes
    holding consecutive ranks, where float32/float64 go in tiers when each holds a power of two:
    2 x 2 and 4 x 2, not 2 x 3)."""
    res = _job(tmp_path, np_, cliques, **({"MPIR_CVAR_CLIQUES_BY_BLOCK": "1"} if blocks else {}))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("tiers ok") == np_, res.stdout
    power_of_two = (np_ // cliques) & (np_ // cliques - 1) == 0
    verdict = ("; in tiers, aligned)" if blocks and power_of_two else "; in tiers)") if np_ % cliques == 0 else \
        "; flat)"
    assert res.stdout.count(verdict) == np_, res.stdout


@pytest.mark.timeout_s(120)
def test_no_tiers_without_the_window(tmp_path):
    """MPICOLL_SHM=0 on 2 nodes of 2: no tiers (per_node 0, none made by the large 16-bit and 8-bit
    AllReduces that take them with the window), and every result the flat numpy golden."""
    res = _job(tmp_path, 4, 2, MPICOLL_SHM="0")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("tiers ok (2 nodes: [[0, 2], [1, 3]]; flat)") == 4, res.stdout


@pytest.mark.timeout_s(120)
def test_a_rank_that_never_arrives_times_out_naming_the_operator(tmp_path):
    res = _job(tmp_path, 4, 2, TIMEOUT_CASE="1", MPICOLL_TIMEOUT_ACTION="raise", ABSENT=str(2 + within(1)))
    out = res.stdout
    assert out.count("timeout: AllReduce: timed out after 2 s") == 3, out + res.stderr[-2000:]
    assert "the members on this node" in out and "(world ranks [3])" in out, out
