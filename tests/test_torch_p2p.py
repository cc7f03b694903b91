"""Point-to-point on the mpicoll backend: send/recv (src=None: any source), isend/irecv,
batch_isend_irecv, tags, every dtype, on the world and on subgroups; the errors of a message.
Skipped, with the reason, where torch is not installed."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install '.[torch]' (torch 2.13 or later, CPU)")
import torch.distributed as dist  # noqa: E402

import mpicoll  # noqa: E402
import mpicoll.torch  # noqa: E402, F401 - registers the backend and mpi://
from mpicoll._dtypes import ALL_DTYPES  # noqa: E402

from _mpi import RANK, SIZE  # noqa: E402
from _torch import world_group  # noqa: E402, F401 - the module's process group (autouse)

pytestmark = pytest.mark.mpi(min_size=2)
#: every dtype of the table, as torch names it
DTYPES = [getattr(torch, name) for name in ALL_DTYPES]



def _value(src: int, tag: int, dtype) -> torch.Tensor:
    return (torch.arange(5) * (src + 1) + tag).to(dtype) if dtype != torch.bool else torch.arange(5) % (src + 2) == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_p2p_ring_with_tags_out_of_order(dtype):
    """Each rank sends two tagged messages to the next; the next receives tag 2 before tag 1."""
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    works = [dist.isend(_value(RANK, tag, dtype), dst=nxt, tag=tag) for tag in (1, 2)]
    for tag in (2, 1):
        t = torch.empty(5, dtype=dtype)
        assert dist.recv(t, src=prv, tag=tag) == prv
        assert torch.equal(t, _value(prv, tag, dtype))
    for w in works:
        w.wait()




def test_torch_p2p_recv_from_any_source():
    if RANK == 0:
        seen = set()
        for _ in range(SIZE - 1):
            t = torch.empty(1, dtype=torch.int64)
            src = dist.recv(t, tag=7)                      # src=None: whoever sends first
            assert t.item() == src * 10
            seen.add(src)
        assert seen == set(range(1, SIZE))
    else:
        dist.send(torch.tensor([RANK * 10]), dst=0, tag=7)
    dist.barrier()


def test_torch_p2p_isend_irecv_and_batch():
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    got = torch.empty(3)
    recv = dist.irecv(got, src=prv)
    send = dist.isend(torch.full((3,), float(RANK)), dst=nxt)
    send.wait()
    recv.wait()
    assert got.tolist() == [float(prv)] * 3
    ins = [torch.empty(2) for _ in range(2)]
    ops = [dist.P2POp(dist.irecv, ins[0], prv, tag=3), dist.P2POp(dist.isend, torch.full((2,), RANK + 0.5), nxt, tag=3),
           dist.P2POp(dist.isend, torch.full((2,), -RANK - 0.5), prv, tag=4), dist.P2POp(dist.irecv, ins[1], nxt, tag=4)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert ins[0].tolist() == [prv + 0.5] * 2 and ins[1].tolist() == [-nxt - 0.5] * 2


@pytest.mark.mpi(min_size=2)
def test_torch_p2p_wait_with_a_timeout():
    """``wait(timeout)`` of a message that has not come raises after that long; the receive stays
    posted, and a later ``wait()`` completes it."""
    from datetime import timedelta
    if RANK == 0:
        got = torch.zeros(2)
        work = dist.irecv(got, src=1, tag=9)
        with pytest.raises(mpicoll.CollectiveTimeout, match=r"recv: wait\(timeout=0.2 s\) timed out with the call "
                                                            r"still in flight"):
            work.wait(timeout=timedelta(seconds=0.2))
        dist.barrier()
        assert work.wait() and got.tolist() == [1.0, 1.0]
    else:
        dist.barrier()
        if RANK == 1:
            dist.send(torch.ones(2), dst=0, tag=9)


def test_torch_p2p_on_a_subgroup():
    """On a group of the world's odd ranks or of ranks [1, ...]: src/dst are world ranks (group_src,
    group_dst group ranks); any-source gives a world rank."""
    members = list(range(1, SIZE)) if SIZE > 2 else [0, 1]
    g = dist.new_group(members)
    if RANK in members:
        me = members.index(RANK)
        nxt, prv = members[(me + 1) % len(members)], members[(me - 1) % len(members)]
        w = dist.isend(torch.tensor([float(RANK)]), dst=nxt, group=g, tag=5)
        t = torch.empty(1)
        assert dist.recv(t, src=prv, group=g, tag=5) == prv and t.item() == prv
        w.wait()
        w = dist.isend(torch.tensor([float(RANK)]), group=g, group_dst=(me + 1) % len(members))
        t = torch.empty(1)
        assert dist.recv(t, group=g) == prv and t.item() == prv            # any source, in the group
        w.wait()
    dist.barrier()


def test_torch_p2p_errors_name_the_parameter():
    nxt = (RANK + 1) % SIZE
    with pytest.raises(mpicoll.CollectiveArgumentError, match=r"send: tag=-1 on rank \d+: must be in \[0, "):
        dist.send(torch.ones(1), dst=nxt, tag=-1)
    with pytest.raises(mpicoll.CollectiveArgumentError, match="must be contiguous: pass t.contiguous"):
        dist.send(torch.ones(3, 2).t(), dst=nxt)
    # a receiver whose tensor is not the sender's size: its wait() names the sender and its size (a larger
    # message's size where the MPI tells it: Open MPI does, MPICH does not)
    prv = (RANK - 1) % SIZE
    w = dist.isend(torch.ones(4), dst=nxt, tag=9)
    t = torch.empty(2)
    with pytest.raises(mpicoll.CollectiveArgumentError, match=rf"irecv: tensor.nbytes=8 on rank {RANK}: the message "
                       rf"from rank {prv} \(tag 9\) (is larger|has 16 bytes): give a tensor"):
        dist.recv(t, src=prv, tag=9)
    w.wait()
    w = dist.isend(torch.ones(1), dst=nxt, tag=10)
    r = dist.irecv(t, src=(RANK - 1) % SIZE, tag=10)
    for _ in range(2):                                     # (a second wait() says the same)
        with pytest.raises(mpicoll.CollectiveArgumentError, match=r"irecv: tensor.nbytes=8 on rank \d+: the message "
                                                                  r"from rank \d+ \(tag 10\) has 4 bytes"):
            r.wait()
    assert r.is_completed() and not r.is_success()
    w.wait()
    dist.barrier()


def test_torch_pipeline_example(tmp_path):
    """docs/examples/torch_pipeline.py at this rank count (it asserts its own result)."""
    if SIZE % 2:
        pytest.skip("the pipeline example runs at even rank counts")
    import runpy
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "docs" / "examples" / "torch_pipeline.py"
    dist.destroy_process_group()                           # (the example makes its own)
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        dist.init_process_group("mpicoll", init_method="mpi://")


def test_torch_wait_takes_what_timeout_takes_and_refuses_the_rest_by_name():
    """The torch Work's ``wait(timeout=)`` (a message's, an async collective's) takes what an
    Operation's ``timeout=`` takes (a timedelta, seconds; 0 or less: none) and refuses anything
    else with a CollectiveArgumentError naming the call and ``timeout``, in flight (a receive whose
    send is not posted yet) or done."""
    from datetime import timedelta
    import math
    bad_waits = ["abc", math.inf, math.nan, True, [1.0]]
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    got = torch.zeros(3)
    works = {"recv": dist.irecv(got, src=prv, tag=4), "all_reduce": dist.all_reduce(torch.ones(2), async_op=True)}
    for name, work in works.items():
        for bad in bad_waits:
            with pytest.raises(mpicoll.CollectiveArgumentError) as info:
                work.wait(bad)
            assert info.value.param == "timeout" and str(info.value).startswith(
                f"{name}: wait(timeout={bad!r}) on rank {RANK}: must be a finite number of seconds"), str(info.value)
    works["send"] = dist.isend(torch.full((3,), float(RANK)), dst=nxt, tag=4)
    for name, work in works.items():
        assert work.wait(timedelta(seconds=30)) and work.wait(30) and work.wait(0) and work.wait(), name
        with pytest.raises(mpicoll.CollectiveArgumentError, match=r"wait\(timeout=nan\)"):
            work.wait(math.nan)
    assert got.tolist() == [float(prv)] * 3


def test_torch_profiler_and_mpicolls_trace_show_the_backends_calls(tmp_path):
    """torch.profiler holds each collective and message of the backend under a name like gloo's
    (``mpicoll:all_reduce``, also for an async call); mpicoll's trace holds them under torch's names."""
    from torch.profiler import profile
    from mpicoll._trace_read import load_trace
    from _mpi import WORLD
    where = WORLD.bcast(str(tmp_path) if RANK == 0 else None)
    t = torch.ones(8)
    with profile() as prof, mpicoll.trace(where) as path:
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        dist.broadcast(t, 0)
        if RANK == 0:
            dist.send(t, 1)
        elif RANK == 1:
            dist.recv(t, 0)
    names = {e.name for e in prof.events()}
    assert {"mpicoll:all_reduce", "mpicoll:broadcast"} <= names, names
    assert {0: "mpicoll:send", 1: "mpicoll:recv"}.get(RANK, "mpicoll:broadcast") in names, names
    traced = {e["name"] for e in load_trace(path) if e.get("ph") == "X"}
    assert {"all_reduce", "broadcast"} <= traced, traced
