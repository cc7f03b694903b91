"""Comm domains formed by their members only, declared tables, meshes, user comms, rank tables."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import CollectiveArgumentError, CollectiveTimeout

from _mpi import RANK, SIZE, WORLD, launch_env, mpirun, setting, within

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
@pytest.mark.parametrize("size", [2, 3])
def test_reusing_a_name_for_another_membership(size):
    """Ranks 0 and 1 form a name; later the last rank names it too, with the same rank_size or
    another: it raises, naming the members the name has."""
    if RANK < 2:
        _gather(f"t4.x{size}", 2, RANK)
    WORLD.Barrier()
    if RANK == SIZE - 1 and SIZE > 2:
        with pytest.raises(CollectiveArgumentError, match=r"already formed by world ranks \[0, 1\].*not a member"):
            mpicoll.domain(f"t4.x{size}", size)
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
    setting(monkeypatch, "MPICOLL_DOMAIN_TIMEOUT", "1")
    if RANK < 2:
        with pytest.raises(CollectiveTimeout, match="timed out"):
            mpicoll.domain("t6.three", 3 if SIZE < 3 else SIZE + 1)
    WORLD.Barrier()


@mpi1
def test_a_nul_in_a_domain_name_raises_before_anything_is_made(monkeypatch):
    """Every rank names "a\\x00b" (MPI names are C strings): every rank raises an argument error
    naming comm_domain and its rank, from the operation, domain() and declare_domains(), before
    any rendezvous or communicator (Comm.Set_name used to raise a bare ValueError after both)."""
    import mpicoll._rendezvous as R

    def made(*_):
        raise AssertionError("a rendezvous or a communicator was made for a bad name")
    monkeypatch.setattr(R, "rendezvous", made)
    monkeypatch.setattr(R, "create", made)
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain="a\x00b", rank_size=2))
    for fn in (lambda: op.execute(np.ones(2)), lambda: mpicoll.domain("a\x00b", 2)):
        with pytest.raises(CollectiveArgumentError) as info:
            fn()
        assert (info.value.param, info.value.rank) == ("comm_domain", RANK)
        assert f"comm_domain='a\\x00b' on rank {RANK}: a domain name must be a str with no NUL" in str(info.value)
    with pytest.raises(CollectiveArgumentError, match="table='a\\\\x00b' on rank .*no NUL") as info:
        mpicoll.declare_domains({"a\x00b": [0]})
    assert info.value.param == "table"


@mpi2
def test_a_nul_in_one_ranks_domain_name(monkeypatch):
    """Only rank 0's name has a NUL: it raises at once; rank 1, which named another domain (a name
    that differs between members), waits for it only until MPICOLL_DOMAIN_TIMEOUT, then raises."""
    import time
    setting(monkeypatch, "MPICOLL_DOMAIN_TIMEOUT", "2")
    if RANK < 2:
        op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain="tE\x00x" if RANK == 0 else "tE.x",
                                                               rank_size=2))
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeout if RANK else CollectiveArgumentError) as info:
            op.execute(np.ones(2))
        seconds = time.monotonic() - t0
        if RANK == 0:
            assert "comm_domain='tE\\x00x' on rank 0" in str(info.value) and seconds < within(1), (str(info.value), seconds)
        else:
            assert "1 of 2 arrived (world ranks [1])" in str(info.value) and seconds < within(10), (str(info.value), seconds)
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
    env = launch_env()
    res = subprocess.run(mpirun(4, sys.executable, "-m", "mpi4py", str(script)), capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().split(" | ")
    assert lines == ["rank 0 lo 1", "rank 1 lo 1", "rank 2 hi 5", "rank 3 hi 5"]


# ----------------------------------------------------------------------------- agreement fixes

NOTHING_ELSEWHERE = textwrap.dedent("""
    from mpi4py import MPI
    r = MPI.COMM_WORLD.Get_rank()
    if r < 2:          # ranks 2 and 3 never import mpicoll, let alone call it
        import numpy as np, mpicoll
        out = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain="x", rank_size=2)).execute(np.array([r + 1]))
        plan = mpicoll.AllGatherOperation(mpicoll.AllGatherParam(comm_domain="x")).prepare(np.array([r]))
        print(f"rank {r} {int(out[0])} {plan.run().reshape(-1).tolist()}", flush=True)
        plan.free()
""")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("timeout", ["", "5"], ids=["plain", "watchdog"])
def test_domain_formed_by_its_members_alone_in_a_fresh_job(tmp_path_factory, timeout):
    """Nothing runs on the other ranks, not even a set-up: no world collective, no message to them
    (MPICH refuses to finalize a world holding an unread message), with or without the watchdog."""
    if SIZE != 1:
        pytest.skip("runs its own 4-rank job once")
    script = tmp_path_factory.mktemp("alone") / "alone.py"
    script.write_text(NOTHING_ELSEWHERE)
    env = launch_env(settings=False)
    env["MPICOLL_TIMEOUT"] = timeout
    for _ in range(3):                 # (an unread message failed the finalize only now and then)
        res = subprocess.run(mpirun(4, sys.executable, str(script)), capture_output=True, text=True,
                             timeout=60, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "rank 0 3 [0, 1]" in res.stdout and "rank 1 3 [0, 1]" in res.stdout, res.stdout


@mpi2
def test_rank_size_contradicting_a_formed_domain_is_agreed():
    """One rank's Param says rank_size 3 for a formed 2-member domain: every member raises the same
    error at the call (the peer is not left waiting in the collective)."""
    if RANK < 2:
        pair = mpicoll.domain("tA.pair", 2)
        p = mpicoll.AllReduceParam(comm_domain="tA.pair", rank_size=3 if RANK == 1 else 2)
        from _mpi import raises_on
        raises_on(pair, lambda: mpicoll.AllReduceOperation(p).execute(np.ones(2)), CollectiveArgumentError,
                  "rank_size=3 on rank 1", "must equal the communicator size (2)")
        assert mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain="tA.pair")).execute(
            np.ones(1)).tolist() == [2]
    WORLD.Barrier()


@pytest.mark.mpi(min_size=3)
def test_declared_domains_compare_member_lists():
    """Rank 0 declares a name as [0, 1], rank 1 as [0, 1, 2] (rank 2 never forms it): both raise at
    once, naming both lists."""
    if RANK < 2:
        mpicoll.declare_domains({"tB.x": [0, 1] if RANK == 0 else [0, 1, 2]})
        with pytest.raises(CollectiveArgumentError, match=r"member list disagrees between members.*declares members"):
            mpicoll.domain("tB.x")
    WORLD.Barrier()


@mpi4
def test_declared_domains_same_count_other_members():
    """Ranks 0 and 1 declare and form "tC.x" as [0, 1]; then ranks 2 and 3 declare it as [2, 3]
    (the same count, other members): they raise, naming the members it has; 0 and 1 are fine."""
    mine = [0, 1] if RANK < 2 else [2, 3]
    mpicoll.declare_domains({"tC.x": mine})
    if RANK < 2:
        assert _gather("tC.x", 2, RANK) == [0, 1]
    WORLD.Barrier()
    if RANK >= 2:
        with pytest.raises(CollectiveArgumentError, match=r"already formed by world ranks \[0, 1\]"):
            mpicoll.domain("tC.x")
    WORLD.Barrier()


@pytest.mark.mpi(min_size=3)
def test_leader_reads_every_member_before_deciding(monkeypatch):
    """Three ranks name a domain, one with another rank_size: whoever leads sees the disagreement
    and every one of them raises at once (the timeout is 20 s; nobody waits it out)."""
    import time
    setting(monkeypatch, "MPICOLL_DOMAIN_TIMEOUT", "20")
    if RANK < 3:
        t0 = time.monotonic()
        with pytest.raises(CollectiveArgumentError, match="rank_size disagrees between members"):
            mpicoll.domain("tD.x", 2 if RANK == 2 else 3)
        assert time.monotonic() - t0 < 10
    WORLD.Barrier()


@mpi1
def test_multi_thread_mode_runs_one_communicator_per_thread():
    """CommMode.MULTI_THREAD (thread level MULTIPLE): each thread drives its own user communicator
    (duplicated in the same order on every rank); the library's shared state is guarded."""
    import threading
    from mpi4py import MPI
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        pytest.skip("needs MPI thread level MULTIPLE")
    comms = [WORLD.Dup() for _ in range(2)]
    results, errors = {}, []

    def work(k):
        try:
            p = mpicoll.AllReduceParam(comm=comms[k], comm_mode=mpicoll.CommMode.MULTI_THREAD)
            op = mpicoll.AllReduceOperation(p)
            got = [op.execute(np.full(3, RANK + k, np.int64)).tolist() for _ in range(50)]
            with op.prepare(np.full(2, k, np.int64)) as plan:
                got.append(plan.start().wait().tolist())
            results[k] = got
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(2):
        assert results[k][0] == [sum(range(SIZE)) + k * SIZE] * 3 and results[k][-1] == [k * SIZE] * 2
    for c in comms:
        c.Free()


@mpi2
def test_a_domain_communicator_is_the_users_own():
    """``mpicoll.domain(name)`` hands out a duplicate the user owns, made when the domain formed: not
    the library's own (calls on it never meet mpicoll's), usable beside mpicoll's operations, asked
    for by one rank alone without a collective; once the user frees it, asking again raises;
    "" gives MPI.COMM_WORLD."""
    from mpicoll._domains import lookup
    assert mpicoll.domain("") is MPI.COMM_WORLD
    if RANK < 2:
        mine = mpicoll.domain("tU.pair", 2)
        assert mine is mpicoll.domain("tU.pair") and mine != lookup("tU.pair").mpi
        op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain="tU.pair"))
        req = mine.Iallreduce(MPI.IN_PLACE, x := np.full(2, RANK + 1.0))   # in flight across a library call
        assert op.execute(np.ones(2)).tolist() == [2, 2]
        req.Wait()
        assert x.tolist() == [3, 3]
        if RANK == 0:
            assert mpicoll.domain("tU.pair") is mine          # (no collective: one rank alone may ask)
        mine.Free()
        with pytest.raises(mpicoll.CollectiveError, match="was freed"):
            mpicoll.domain("tU.pair")
    WORLD.Barrier()
