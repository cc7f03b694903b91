"""What the collectives did (docs/trace.md): the trace of every call (``MPICOLL_TRACE``,
``mpicoll.trace``), the flight recorder's dumps, and ``python -m mpicoll.run trace`` reading them.
The jobs are launched once, from the 1-rank run; the region API runs in this job at every size."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import _trace
from mpicoll._trace_read import late_calls, load_trace, stragglers

from _mpi import RANK, SIZE, WORLD, launch_env, run_job

one_job = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")
#: how long the late rank sleeps before its 5th call
SLEEP = 0.3
#: the fields every event of the Chrome trace event format has (a complete event also its ``dur``)
CHROME = {"name", "ph", "pid"}


def report(where) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpicoll.run", "trace", str(where)], capture_output=True, text=True,
                          timeout=60, env=launch_env(settings=False))     # (a process of its own, as a user runs it)


def chrome_events(path) -> list[dict]:
    """The events of a closed trace file, read as JSON (the Chrome format's array), checked for the
    format's fields."""
    with open(path, encoding="utf-8") as f:
        events = [e for e in json.load(f) if e]
    for e in events:
        assert CHROME <= e.keys(), e
        if e["ph"] == "X":
            assert {"ts", "dur", "tid", "cat", "args"} <= e.keys(), e
    return events


@pytest.mark.mpi(min_size=1)
@one_job
def test_the_trace_names_the_rank_that_came_late_and_holds_every_kind_of_call(tmp_path):
    """3 ranks, ``MPICOLL_TRACE``: rank 1 sleeps before its 5th AllReduce. Every rank's file loads
    as a Chrome trace; call 5 names rank 1 the last to arrive, at least the sleep late; the report
    ranks it first among the stragglers. A plan's run, a graph's replay, a Hccl task, a message and
    an async call on the worker's lane are events too."""
    where = tmp_path / "trace"
    res, _, _ = run_job(tmp_path, f"""
        import time
        import numpy as np
        from mpi4py import MPI
        import mpicoll, mpicoll.functional as F
        from mpicoll import graph
        rank, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        op = mpicoll.AllReduceOperation()
        x = np.ones(16, np.float32)
        for call in range(1, 9):
            if rank == 1 and call == 5:
                time.sleep({SLEEP})
            op.execute(x)
        plan = mpicoll.AllGatherOperation().prepare(x)
        plan.run()
        y = np.ones(4, np.float32)
        with graph.capture() as g:
            F.all_reduce(y)
            F.all_reduce(y)
        g.replay()
        h = mpicoll.Hccl().init("")
        out = np.empty(4 * n, np.float32)
        h.wait(h.all_gather(y, out, 4, mpicoll.HcclDataType.FP32, commit=True))
        h.finalize()
        F.all_reduce(y, async_op=True).wait()
        if rank == 0:
            F.send(y, 1)
        elif rank == 1:
            F.recv(y, 0)
    """, np_=3, env={"MPICOLL_TRACE": str(where)}, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(os.listdir(where)) == ["trace.0.json", "trace.1.json", "trace.2.json"]
    events = [e for r in range(3) for e in chrome_events(where / f"trace.{r}.json")]
    calls = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in calls} >= {"collective", "plan", "graph", "hccl", "message"}, {e["cat"] for e in calls}
    assert {e["args"]["outcome"] for e in calls} == {"ok"}
    workers = {e["tid"] for e in calls if e["name"] == "all_reduce" and e["tid"] != 0}
    assert workers, "the async call is on its worker's lane"
    fifth = [c for c in late_calls(events) if c["op"] == "AllReduce" and c["seq"] == 5]
    assert len(fifth) == 1 and fifth[0]["last_rank"] == 1, late_calls(events)
    assert fifth[0]["late_us"] >= 0.9 * SLEEP * 1e6, fifth
    assert stragglers(events)[0]["rank"] == 1
    said = report(where)
    assert said.returncode == 0, said.stderr
    assert "call 5 (AllReduce): world rank 1 came" in said.stdout, said.stdout
    for cat in ("collective", "plan", "graph", "hccl", "message"):
        assert f"\n{cat} " in said.stdout, said.stdout


@pytest.mark.mpi(min_size=1)
@one_job
def test_a_skipped_call_leaves_every_ranks_dump_and_the_report_names_it(tmp_path):
    """Rank 2 never comes to call 7, ``MPICOLL_TIMEOUT``: the job aborts, the error says where the
    dumps went, every rank's flight recorder is there, and the report names call 7 and rank 2."""
    where = tmp_path / "dumps"
    res, _, _ = run_job(tmp_path, """
        import time
        import numpy as np
        from mpi4py import MPI
        import mpicoll
        op = mpicoll.AllReduceOperation()
        for call in range(1, 11):
            if MPI.COMM_WORLD.Get_rank() == 2 and call == 7:
                time.sleep(60)
            op.execute(np.ones(16, np.float32))
    """, np_=3, env={"MPICOLL_TIMEOUT": "3", "MPICOLL_DUMP_DIR": str(where)}, timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert f"each rank's last calls: {where}/flight.<rank>.json" in out, out
    assert sorted(os.listdir(where)) == ["flight.0.json", "flight.1.json", "flight.2.json"], out
    said = report(where)
    assert said.returncode == 0, said.stderr
    assert "call 7 there (AllReduce) was never entered by world rank(s) [2]" in said.stdout, said.stdout


@pytest.mark.mpi(min_size=1)
@one_job
def test_nothing_is_written_when_nothing_asks(tmp_path):
    """No setting, no region, no error: no trace, no dump, in the working directory or elsewhere."""
    res, _, _ = run_job(tmp_path, """
        import os
        import numpy as np
        import mpicoll
        os.chdir(os.path.dirname(os.path.abspath(__file__)))
        for _ in range(3):
            mpicoll.AllReduceOperation().execute(np.ones(4, np.float32))
    """, np_=2)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(os.listdir(tmp_path)) == ["job.py"]


@pytest.mark.mpi(min_size=1)
def test_a_traced_region_writes_each_ranks_events_and_stops():
    """``mpicoll.trace(dir)`` around a few calls: one file per rank with their events, closed as a
    JSON array; an inner region adds nothing; after the block, tracing is off."""
    where = WORLD.bcast(str(__import__("tempfile").mkdtemp(prefix="mpicoll-trace-")) if RANK == 0 else None)
    op = mpicoll.AllReduceOperation()
    with mpicoll.trace(where) as path:
        with mpicoll.trace(os.path.join(where, "inner")) as inner:
            assert inner == path
        op.execute(np.ones(8, np.float32))
        off = mpicoll.AllReduceOperation(validate=False)
        off.execute(np.ones(8, np.float32))
        off.execute(np.ones(8, np.float32))                # (its compiled call: no agreement)
    assert not _trace.ON and path == os.path.join(where, f"trace.{MPI.COMM_WORLD.Get_rank()}.json")
    op.execute(np.ones(8, np.float32))                     # (after the block: not traced)
    calls = [e for e in chrome_events(path) if e["ph"] == "X"]
    assert len(calls) == 3 and calls[0]["args"]["agreed"] and not calls[2]["args"]["agreed"], calls
    if SIZE > 1:
        first = calls[0]["args"]
        assert first["last_rank"] in range(SIZE) and first["wait_us"] >= 0 and first["move_us"] >= 0, first
        assert first["wait_us"] + first["move_us"] <= calls[0]["dur"] + 1, calls[0]     # (rounding: us)
    assert calls[0]["args"]["bytes"] == 32 and calls[0]["args"]["dtype"] == "float32"
    assert load_trace(path) == [e for e in chrome_events(path)]
    WORLD.Barrier()
    if RANK == 0:
        assert f"trace of {SIZE} rank(s)" in mpicoll.trace_report(where)
