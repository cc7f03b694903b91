"""Comm domains formed by their members only, declared tables, meshes, user comms, rank tables."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveArgumentError, CollectiveTimeout

from _mpi import RANK, SIZE, WORLD

mpi1 = pytest.mark.mpi(min_size=1)
mpi2 = pytest.mark.mpi(min_size=2)
mpi4 = pytest.mark.mpi(min_size=4)


def _gather(domain, n, value):
    op = mpicoll.AllGatherOperation(mpicoll.AllGatherParam(comm_domain=domain, rank_size=n))
    return op.execute(np.array([value], dtype=np.int64)).reshape(-1).tolist()


@mpi2
def test_disjoint_domains_form_concurrently():
    """Ranks in the first half form one domain while the others form another, at the same time."""
    half = SIZE // 2
    lo = RANK < half
    name, members = ("t1.lo", list(range(half))) if lo else ("t1.hi", list(range(half, SIZE)))
    assert _gather(name, len(members), RANK) == members
    assert mpicoll.domain_members(name) == tuple(members)


@mpi2
def test_subset_forms_a_domain_while_the_others_do_nothing():
    if RANK < 2:
        assert _gather("t2.pair", 2, 10 * RANK) == [0, 10]
        # cached: a second use needs no rendezvous and the same communicator comes back
        assert mpicoll.domain("t2.pair") is mpicoll.domain("t2.pair", 2)
    WORLD.Barrier()


@mpi2
def test_overlapping_domains_in_different_orders():
    """Each rank forms {r, r+1} and {r-1, r} (a ring of pairs), in an order that would deadlock a
    world-collective Comm.Split."""
    right = f"t3.{RANK}-{(RANK + 1) % SIZE}"
    left = f"t3.{(RANK - 1) % SIZE}-{RANK}"
    if SIZE == 2:
        right = left = "t3.pair"
    first, second = (right, left) if RANK % 2 == 0 else (left, right)
    n = 1 if SIZE == 1 else 2
    for name in (first, second):
        got = _gather(name, n, RANK)
        assert sorted(got) == got and RANK in got


@mpi2
def test_reusing_a_name_for_another_membership():
    if RANK < 2:
        _gather("t4.x", 2, RANK)
    WORLD.Barrier()
    if RANK == SIZE - 1 and SIZE > 2:
        with pytest.raises(CollectiveArgumentError, match="not a member"):
            mpicoll.domain("t4.x", 3)
    WORLD.Barrier()


@mpi2
def test_members_disagree_on_rank_size():
    if RANK < 2:
        pair = mpicoll.domain("t5.pair-comm", 2)
        with pytest.raises(CollectiveArgumentError) as info:
            mpicoll.domain("t5.bad", 2 + RANK)   # rank 0 says 2, rank 1 says 3
        assert "rank_size disagrees" in str(info.value)
        pair.Barrier()
    WORLD.Barrier()


@mpi2
def test_missing_members_time_out(monkeypatch):
    monkeypatch.setenv("MPICOLL_DOMAIN_TIMEOUT", "1")
    if RANK < 2:
        with pytest.raises(CollectiveTimeout, match="timed out"):
            mpicoll.domain("t6.three", 3 if SIZE < 3 else SIZE + 1)
    WORLD.Barrier()


@mpi1
def test_undeclared_domain_needs_rank_size():
    with pytest.raises(CollectiveArgumentError, match="rank_size is required"):
        mpicoll.domain(f"t7.{RANK}")


@mpi1
def test_param_rank_size_must_match_domain():
    name = f"t8.self{RANK}"
    mpicoll.domain(name, 1)
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain=name, rank_size=1, rank=0))
    assert op.execute(np.ones(2)).tolist() == [1, 1]
    with pytest.raises(CollectiveArgumentError, match="rank_size=2"):
        mpicoll.domain(name, 2) and mpicoll.AllReduceOperation(
            mpicoll.AllReduceParam(comm_domain=name, rank_size=2)).execute(np.ones(2))


@mpi1
def test_declared_domains():
    table = {"t9.evens": [r for r in range(SIZE) if r % 2 == 0], "t9.odds": [r for r in range(SIZE) if r % 2]}
    mpicoll.declare_domains({k: v for k, v in table.items() if v})
    mine = "t9.odds" if RANK % 2 else "t9.evens"
    got = mpicoll.AllGatherOperation(mpicoll.AllGatherParam(comm_domain=mine)).execute(np.array([RANK]))
    assert got.reshape(-1).tolist() == table[mine]
    if SIZE >= 2:
        with pytest.raises(CollectiveArgumentError, match="already declared"):
            mpicoll.declare_domains({"t9.evens": [1]})
    with pytest.raises(CollectiveArgumentError, match="distinct world ranks"):
        mpicoll.declare_domains({"t9.bad": [SIZE]})


def test_mesh_layouts():
    if SIZE != 1:
        pytest.skip("pure function: check it once")
    # mesh() checks ep * tp against the world size; describe other ranks of a 1-rank world via the table
    m = mpicoll.mesh(1, 1, declare=False)
    assert (m.ep_rank, m.tp_rank) == (0, 0)


@mpi4
@pytest.mark.parametrize("layout", ["tp_contiguous", "ep_contiguous"])
def test_mesh_domains_run(layout):
    if SIZE != 4:
        pytest.skip("2 x 2 mesh")
    m = mpicoll.mesh(2, 2, layout)
    s, t = m.ep_rank, m.tp_rank
    assert RANK == (s * 2 + t if layout == "tp_contiguous" else t * 2 + s)
    tp_members = _gather(m.tp_domain, 2, RANK)
    ep_members = _gather(m.ep_domain, 2, RANK)
    if layout == "tp_contiguous":
        assert tp_members == [2 * s, 2 * s + 1] and ep_members == [t, t + 2]
    else:
        assert tp_members == [s, s + 2] and ep_members == [2 * t, 2 * t + 1]
    assert set(m.table) == {m.tp_domain, m.ep_domain} | set(m.table)


@mpi1
def test_mesh_errors():
    with pytest.raises(CollectiveArgumentError, match="must equal the world size"):
        mpicoll.mesh(SIZE + 1, 2)
    with pytest.raises(CollectiveArgumentError, match="layout"):
        mpicoll.mesh(SIZE, 1, "diagonal")


# ----------------------------------------------------------------------------- rank tables

def _table(n_servers=2, per=2):
    return {"version": "1.0", "server_count": str(n_servers), "status": "completed",
            "server_list": [{"server_id": f"node{s}", "device": [
                {"device_id": str(d), "device_ip": f"192.168.{s}.{d + 1}", "rank_id": str(s * per + d)}
                for d in range(per)]} for s in range(n_servers)]}


def test_rank_table_valid_and_hosts():
    t = mpicoll.load_rank_table(_table())
    assert t.size == 4 and t.hosts() == "node0:2,node1:2" and t.host_of(3) == "node1"
    assert mpicoll.load_rank_table(json.dumps(_table(1, 3))).hosts() == "node0:3"


@pytest.mark.parametrize("mutate,path", [
    (lambda t: t.__setitem__("status", "pending"), "$.status"),
    (lambda t: t.__setitem__("server_count", "3"), "$.server_count"),
    (lambda t: t["server_list"][1]["device"][0].__setitem__("rank_id", "0"), "$.server_list[1].device[0].rank_id"),
    (lambda t: t["server_list"][0]["device"][1].__setitem__("device_ip", "not-an-ip"),
     "$.server_list[0].device[1].device_ip"),
    (lambda t: t["server_list"][0]["device"][0].__setitem__("device_id", 0), "$.server_list[0].device[0].device_id"),
    (lambda t: t["server_list"][1].__setitem__("server_id", ""), "$.server_list[1].server_id"),
    (lambda t: t["server_list"][1]["device"][1].__setitem__("rank_id", "7"), "rank_id"),
])
def test_rank_table_errors_name_the_json_path(mutate, path):
    t = _table()
    mutate(t)
    with pytest.raises(CollectiveArgumentError) as info:
        mpicoll.load_rank_table(t)
    assert path in str(info.value)


@mpi1
def test_rank_table_file_param_is_checked_against_the_world(tmp_path_factory):
    good = tmp_path_factory.mktemp(f"rt{RANK}") / "good.json"
    good.write_text(json.dumps(_table(1, SIZE)))
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(rank_table_file=str(good)))
    assert op.execute(np.ones(1)).tolist() == [SIZE]
    bad = good.parent / "bad.json"
    bad.write_text(json.dumps(_table(1, SIZE + 1)))
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(rank_table_file=str(bad)))
    from _mpi import raises_everywhere
    raises_everywhere(lambda: op.execute(np.ones(1)), CollectiveArgumentError, "must equal the MPI world size")


# ----------------------------------------------------------------------------- first use

FIRST_USE = textwrap.dedent("""
    import numpy as np, mpicoll
    from mpi4py import MPI
    r = MPI.COMM_WORLD.Get_rank()
    name = "lo" if r < 2 else "hi"
    # the very first mpicoll call on every rank forms a domain of half the ranks
    out = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain=name, rank_size=2)).execute(np.array([r]))
    lines = MPI.COMM_WORLD.gather(f"rank {r} {name} {int(out[0])}")
    if r == 0:
        print(" | ".join(lines), flush=True)
""")


@pytest.mark.mpi(min_size=1)
def test_first_mpicoll_call_forms_domains(tmp_path_factory):
    if SIZE != 1:
        pytest.skip("runs its own 4-rank job once")
    script = tmp_path_factory.mktemp("first") / "first.py"
    script.write_text(FIRST_USE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYD", "MPI_LOCAL"))}
    res = subprocess.run(["mpirun", "-np", "4", sys.executable, "-m", "mpi4py", str(script)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().split(" | ")
    assert lines == ["rank 0 lo 1", "rank 1 lo 1", "rank 2 hi 5", "rank 3 hi 5"]
