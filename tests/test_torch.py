"""mpicoll as a torch.distributed backend (mpicoll.torch): start-up with mpi://, every collective
and dtype against numpy goldens, async Works and futures, new_group on comm domains, agreed errors
through torch, unsupported calls, torch's documented examples, and DDP against a single-process
run. Skipped, with the reason, where torch is not installed (the core never needs it)."""
from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install '.[torch]' (torch 2.13 or later, CPU)")
import ml_dtypes  # noqa: E402
import torch.distributed as dist  # noqa: E402

import mpicoll  # noqa: E402
import mpicoll.torch  # noqa: E402, F401 - registers the backend and mpi://
from mpicoll._dtypes import ALL_DTYPES, DTYPES, REDUCE_OPS  # noqa: E402
from mpicoll.checks._golden import SEED, golden_reduce, rank_data  # noqa: E402

from _mpi import FLOATS, RANK, SIZE, WORLD, raises_everywhere  # noqa: E402
from _torch import world_group  # noqa: E402, F401 - the module's process group (autouse)

pytestmark = pytest.mark.mpi(min_size=1)

ALL = list(ALL_DTYPES)
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}



def _np(key: str, shape, dtype: str, rank: int = RANK) -> np.ndarray:
    """Rank ``rank``'s input as numpy (small integers: every reduction is exact); bool from uint8."""
    if dtype == "bool":
        return rank_data(SEED, f"torch/{key}", rank, shape, DTYPES["uint8"]) % 3 == 0
    return rank_data(SEED, f"torch/{key}", rank, shape, DTYPES[dtype])


def _t(a: np.ndarray) -> torch.Tensor:
    """A tensor holding a copy of ``a`` (bfloat16 through its bits)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _a(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _same(t: torch.Tensor, want: np.ndarray) -> None:
    got = _a(t)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert got.tobytes() == want.tobytes(), (got, want)


def _golden(xs: list[np.ndarray], dtype: str, op: str) -> np.ndarray:
    if dtype == "bool":       # torch's bool reductions: sum/max = any, prod/min = all
        stack = np.stack(xs)
        return stack.any(0) if op in ("sum", "max") else stack.all(0)
    return golden_reduce(xs, DTYPES[dtype], REDUCE_OPS[op])


# ----------------------------------------------------------------------------- start-up

def test_rank_and_size_are_mpis():
    assert dist.get_rank() == WORLD.Get_rank() and dist.get_world_size() == WORLD.Get_size()
    assert dist.get_backend() == "mpicoll"
    pg = dist.group.WORLD
    backend = pg if isinstance(pg, mpicoll.torch.ProcessGroupMpicoll) else pg._get_backend(torch.device("cpu"))
    assert isinstance(backend, mpicoll.torch.ProcessGroupMpicoll), backend


# ----------------------------------------------------------------------------- reductions

@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", ALL)
def test_all_reduce(dtype, op):
    xs = [_np("ar", (3, 5), dtype, r) for r in range(SIZE)]
    t = _t(xs[RANK])
    assert dist.all_reduce(t, op=OPS[op]) is None
    _same(t, _golden(xs, dtype, op))


@pytest.mark.parametrize("dtype", FLOATS)
def test_all_reduce_avg(dtype):
    xs = [_np("avg", (7,), dtype, r) for r in range(SIZE)]
    t = _t(xs[RANK])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    want = _t(golden_reduce(xs, DTYPES[dtype], REDUCE_OPS["sum"])) / SIZE
    assert torch.equal(t, want)


@pytest.mark.parametrize("dtype", ALL)
def test_reduce_and_reduce_scatter(dtype):
    xs = [_np("red", (2 * SIZE, 3), dtype, r) for r in range(SIZE)]
    total = _golden(xs, dtype, "max")
    root = SIZE - 1
    t = _t(xs[RANK])
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    _same(t, total if RANK == root else xs[RANK])           # (torch leaves the other ranks' tensors as they were)
    out = _t(xs[RANK][:2])
    dist.reduce_scatter_tensor(out, _t(xs[RANK]), op=dist.ReduceOp.MAX)
    _same(out, total[2 * RANK:2 * RANK + 2])
    out = _t(xs[RANK][:2])
    dist.reduce_scatter(out, [_t(xs[RANK][2 * r:2 * r + 2]) for r in range(SIZE)], op=dist.ReduceOp.MAX)
    _same(out, total[2 * RANK:2 * RANK + 2])


# ----------------------------------------------------------------------------- data movement

@pytest.mark.parametrize("dtype", ALL)
def test_broadcast_gather_scatter(dtype):
    xs = [_np("mv", (4, 2), dtype, r) for r in range(SIZE)]
    root = SIZE // 2
    t = _t(xs[RANK])
    dist.broadcast(t, src=root)
    _same(t, xs[root])
    outs = [_t(np.zeros_like(xs[0])) for _ in range(SIZE)] if RANK == root else None
    dist.gather(_t(xs[RANK]), outs, dst=root)
    if RANK == root:
        for r in range(SIZE):
            _same(outs[r], xs[r])
    t = _t(np.zeros_like(xs[0]))
    dist.scatter(t, [_t(x) for x in xs] if RANK == root else None, src=root)
    _same(t, xs[RANK])


@pytest.mark.parametrize("dtype", ALL)
def test_all_gather(dtype):
    xs = [_np("ag", (3, 2), dtype, r) for r in range(SIZE)]
    outs = [_t(np.zeros_like(xs[0])) for _ in range(SIZE)]
    dist.all_gather(outs, _t(xs[RANK]))
    for r in range(SIZE):
        _same(outs[r], xs[r])
    out = _t(np.zeros((3 * SIZE, 2), xs[0].dtype))
    dist.all_gather_into_tensor(out, _t(xs[RANK]))
    _same(out, np.concatenate(xs))


@pytest.mark.parametrize("dtype", ALL)
def test_all_to_all(dtype):
    # rank r sends block j (r + j + 1 rows: uneven, and a zero block where it lands) to rank j
    rows = [[(r + j) % 3 for j in range(SIZE)] for r in range(SIZE)]
    xs = [_np("a2a", (sum(rows[r]), 2), dtype, r) for r in range(SIZE)]

    def block(r, j):
        start = sum(rows[r][:j])
        return xs[r][start:start + rows[r][j]]
    want = np.concatenate([block(r, RANK) for r in range(SIZE)])
    out = _t(np.zeros_like(want))
    dist.all_to_all_single(out, _t(xs[RANK]), output_split_sizes=[rows[r][RANK] for r in range(SIZE)],
                           input_split_sizes=rows[RANK])
    _same(out, want)
    even = [_np("even", (2 * SIZE,), dtype, r) for r in range(SIZE)]
    out = _t(np.zeros_like(even[0]))
    dist.all_to_all_single(out, _t(even[RANK]))
    _same(out, np.concatenate([even[r][2 * RANK:2 * RANK + 2] for r in range(SIZE)]))
    outs = [_t(np.zeros_like(block(r, RANK))) for r in range(SIZE)]
    dist.all_to_all(outs, [_t(block(RANK, j)) for j in range(SIZE)])
    for r in range(SIZE):
        _same(outs[r], block(r, RANK))


def test_barrier_and_objects():
    dist.barrier()
    objs = [None] * SIZE
    dist.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": r} for r in range(SIZE)]
    box = [{"from": 0}] if RANK == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    assert box == [{"from": 0}]


# ----------------------------------------------------------------------------- async Work, future

def test_async_work_and_future():
    t = torch.full((4,), float(RANK + 1))
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() is True
    assert work.is_completed() and work.is_success()
    fut = work.get_future()
    assert fut.done() and torch.equal(fut.value()[0], torch.full((4,), SIZE * (SIZE + 1) / 2))
    chained = fut.then(lambda f: f.value()[0] * 2)
    assert torch.equal(chained.wait(), torch.full((4,), SIZE * (SIZE + 1.0)))
    out = torch.empty(SIZE)
    work = dist.all_gather_into_tensor(out, torch.tensor([float(RANK)]), async_op=True)
    work.wait()
    assert out.tolist() == list(range(SIZE))


@pytest.mark.mpi(min_size=2)
def test_an_async_call_returns_before_it_completes_and_says_so():
    """``async_op=True`` returns while the call waits for a peer that has not come (rank 1 calls
    0.5 s later): its Work is not completed, its future not done; a synchronous call after it runs
    after it (the program's order); the future then holds the result."""
    t = torch.full((4,), float(RANK + 1))
    if RANK == 1:
        time.sleep(0.5)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    if RANK == 0:
        assert not work.is_completed() and not fut.done() and not work.is_success()
    later = torch.full((2,), float(RANK))
    dist.all_reduce(later)
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert fut.wait()[0] is t and t.tolist() == [SIZE * (SIZE + 1) / 2] * 4
    assert later.tolist() == [float(sum(range(SIZE)))] * 2


@pytest.mark.mpi(min_size=2)
def test_wait_with_a_timeout_gives_up_and_the_call_goes_on():
    """``wait(timeout)``: a CollectiveTimeout once that long has passed (rank 1 comes 1 s later),
    the call still in flight; ``wait()`` then completes it."""
    t = torch.ones(3)
    if RANK == 1:
        time.sleep(1.0)
    work = dist.all_reduce(t, async_op=True)
    if RANK == 0:
        with pytest.raises(mpicoll.CollectiveTimeout, match=r"all_reduce: wait\(timeout=0.05 s\) timed out"):
            work.wait(timedelta(milliseconds=50))
        assert not work.is_completed()
    assert work.wait() and t.tolist() == [float(SIZE)] * 3


@pytest.mark.mpi(min_size=2)
def test_an_async_mismatch_is_raised_by_wait_on_every_rank():
    def call():
        dist.all_reduce(torch.ones(RANK + 1), async_op=True).wait()
    raises_everywhere(call, mpicoll.CollectiveMismatchError, "all_reduce: tensor.shape differs across ranks")


@pytest.mark.mpi(min_size=2)
def test_a_message_future_completes_when_the_message_does():
    """``get_future()`` of a receive returns at once (not done); the message thread completes it
    when the message comes, with no one waiting on the Work."""
    t = torch.zeros(2)
    if RANK == 0:
        work = dist.irecv(t, src=1)
        fut = work.get_future()
        assert not fut.done() and not work.is_completed()
    dist.barrier()
    if RANK == 1:
        dist.send(torch.tensor([1.0, 2.0]), dst=0)
    if RANK == 0:
        assert fut.wait()[0].tolist() == [1.0, 2.0] and work.is_completed()


@pytest.mark.mpi(min_size=2)
def test_a_message_can_be_the_first_call_on_a_new_group():
    """The group's communicator is made with the group: a message needs no collective first."""
    g = dist.new_group(list(range(SIZE)))
    t = torch.full((3,), float(RANK))
    if RANK == 0:
        dist.send(t, dst=1, group=g)
    elif RANK == 1:
        dist.recv(t, src=0, group=g)
        assert t.tolist() == [0.0] * 3
    dist.barrier(group=g)


def test_complex_tensors_move_and_sum_as_gloo_takes_them():
    """A complex tensor handed to the backend (as DDP's and FSDP's C++ callers do; torch's Python API
    takes its real view itself): moved as it is, summed part by part; PRODUCT/MIN/MAX refused by
    name on every rank."""
    pg = dist.group.WORLD
    c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (RANK + 1)
    b = c.clone()
    opts = dist.BroadcastOptions()
    opts.asyncOp = False
    pg.broadcast([b], opts).wait()
    assert b.tolist() == [1 + 2j, 3 - 1j]
    out, x = torch.empty(2, dtype=torch.complex64), torch.cat([c] * SIZE)
    red = dist.ReduceScatterOptions()
    red.reduceOp = dist.ReduceOp.SUM
    pg._reduce_scatter_base(out, x, red).wait()                      # (asyncOp: torch's default, True)
    total = SIZE * (SIZE + 1) // 2
    assert out.tolist() == [(1 + 2j) * total, (3 - 1j) * total]
    red.reduceOp = dist.ReduceOp.MAX
    raises_everywhere(lambda: pg._reduce_scatter_base(out, x, red).wait(), mpicoll.CollectiveArgumentError,
                      "reduce_scatter_tensor: op='MAX'", "a complex tensor (torch.complex64) is reduced with SUM or "
                      "AVG only")


def test_views_not_copies():
    """The arrays mpicoll gets share the tensors' memory (bfloat16 and bool too)."""
    for dtype in (torch.float32, torch.bfloat16, torch.bool, torch.int8):
        t = torch.zeros(4, dtype=dtype)
        assert mpicoll._torch_views.array(t, "test", RANK).__array_interface__["data"][0] == t.data_ptr()
        assert mpicoll._torch_views.array(t[1:], "test", RANK).__array_interface__["data"][0] == t[1:].data_ptr()
    assert mpicoll._torch_views.array(torch.zeros(0, 3), "test", RANK).shape == (0, 3)


# ----------------------------------------------------------------------------- groups

@pytest.mark.mpi(min_size=2)
def test_new_group_is_a_comm_domain():
    members = list(range(1, SIZE)) if SIZE > 2 else [0, 1]
    g = dist.new_group(members)
    odd = dist.new_group([r for r in range(SIZE) if r % 2])
    if RANK in members:
        assert dist.get_rank(g) == members.index(RANK) and dist.get_world_size(g) == len(members)
        t = torch.tensor([float(RANK)])
        dist.all_reduce(t, group=g)
        assert t.item() == sum(members)
        t = torch.tensor([RANK])
        dist.broadcast(t, src=members[-1], group=g)         # src: a world rank, as torch's
        assert t.item() == members[-1]
    else:
        assert g == dist.GroupMember.NON_GROUP_MEMBER
    if RANK % 2:
        out = torch.empty(len(range(1, SIZE, 2)), dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.tensor([RANK]), group=odd)
        assert out.tolist() == list(range(1, SIZE, 2))
    dist.barrier()


# ----------------------------------------------------------------------------- errors

@pytest.mark.mpi(min_size=2)
def test_a_mismatch_raises_the_agreed_error_on_every_rank():
    t = torch.ones(RANK + 1)
    with pytest.raises(mpicoll.CollectiveMismatchError, match=r"all_reduce: tensor.shape differs across ranks"):
        dist.all_reduce(t)
    t = torch.ones(2, dtype=torch.float32 if RANK else torch.float64)
    with pytest.raises(mpicoll.CollectiveMismatchError, match="dtype differs across ranks"):
        dist.all_reduce(t)
    dist.all_reduce(torch.ones(2))                         # the ranks are still in step


@pytest.mark.mpi(min_size=2)
def test_torch_level_choices_are_agreed():
    """AVG on one rank against SUM on the others, and a bool tensor against uint8 (with SUM, which a
    bool reduces as a logical or): an agreed mismatch naming the reduce op, the dtype (they used to
    pass: one rank got the mean, the bool tensor held the bytes 5/200/3)."""
    last, bad = SIZE - 1, RANK == SIZE - 1
    with pytest.raises(mpicoll.CollectiveMismatchError, match=rf"reduce_type differs across ranks: .*'avg' on rank "
                                                              rf"{last}"):
        dist.all_reduce(torch.ones(2), dist.ReduceOp.AVG if bad else dist.ReduceOp.SUM)
    with pytest.raises(mpicoll.CollectiveMismatchError, match=rf"dtype differs across ranks: .*bool on rank {last}"):
        dist.all_reduce(torch.ones(3, dtype=torch.bool) if bad else torch.tensor([5, 200, 3], dtype=torch.uint8))
    t = torch.tensor([RANK == 0, False, True])
    dist.all_reduce(t)
    assert t.tolist() == [True, False, True]


def test_unsupported_calls_say_which():
    with pytest.raises(mpicoll.CollectiveArgumentError, match=r"all_reduce: op='BAND' on ranks? .*must be one of "
                                                              "'sum', 'prod', 'max', 'min', 'avg'"):
        dist.all_reduce(torch.ones(1, dtype=torch.int32), op=dist.ReduceOp.BAND)
    with pytest.raises(mpicoll.CollectiveArgumentError, match="reduce_type='avg'.*averages floating-point dtypes "
                                                              "only, not int32"):
        dist.all_reduce(torch.ones(1, dtype=torch.int32), op=dist.ReduceOp.AVG)
    with pytest.raises(mpicoll.CollectiveArgumentError, match=r"tensor='meta' on ranks? .*the mpicoll backend takes "
                                                              "CPU tensors"):
        dist.all_reduce(torch.ones(2, device="meta"))
    with pytest.raises(mpicoll.CollectiveArgumentError, match=r"tensor='strided \(2,\) .*on ranks? .*contiguous"):
        dist.all_reduce(torch.ones(4)[::2])
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_a_failure_on_one_rank_before_the_call_is_agreed():
    """A reduce op or a tensor the backend cannot take on one rank only: every rank raises the same
    error (the peers do not wait in the collective), and the group stays usable."""
    bad = RANK == SIZE - 1
    with pytest.raises(mpicoll.CollectiveArgumentError, match=rf"op='BAND' on rank {SIZE - 1}"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND if bad else dist.ReduceOp.SUM)
    with pytest.raises(mpicoll.CollectiveArgumentError, match=rf"tensor='strided .* on rank {SIZE - 1}"):
        dist.broadcast(torch.ones(4)[::2] if bad else torch.ones(2), src=0)
    outs = [torch.empty(2) for _ in range(SIZE)]
    with pytest.raises(mpicoll.CollectiveArgumentError, match=rf"on rank {SIZE - 1}"):
        dist.all_gather(outs, torch.ones(4)[::2] if bad else torch.ones(2))
    kept = torch.ones(2)
    dist.all_reduce(kept)                                      # (its view kept: the neg view shares its key)
    with pytest.raises(mpicoll.CollectiveArgumentError, match=rf"a neg-bit view' on rank {SIZE - 1}"):
        dist.all_reduce(torch._neg_view(kept) if bad else kept)
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [SIZE, SIZE]


def test_non_contiguous_tensors():
    """A strided output in a list is filled (through a copy); a strided single tensor is refused
    on every rank with an error that says what to do (gloo silently returned a wrong result)."""
    outs = [torch.zeros(2, 3).t() for _ in range(SIZE)]                     # (3, 2), strided
    dist.all_to_all(outs, [torch.full((3, 2), float(RANK * 10 + j)) for j in range(SIZE)])
    for r in range(SIZE):
        assert torch.equal(outs[r], torch.full((3, 2), float(r * 10 + RANK)))
    with pytest.raises(mpicoll.CollectiveArgumentError, match=r"all_reduce: tensor='strided \(2, 4\).* on ranks? "
                                                              r".*must be contiguous: pass t.contiguous\(\)"):
        dist.all_reduce(torch.ones(4, 2).t())


def test_coalesced_calls_run_one_after_the_other():
    from torch.distributed.distributed_c10d import _coalescing_manager
    ts = [torch.full((3,), float(RANK + k)) for k in range(3)]
    with _coalescing_manager(async_ops=False):
        for t in ts:
            dist.all_reduce(t)
    for k, t in enumerate(ts):
        assert t.tolist() == [float(sum(r + k for r in range(SIZE)))] * 3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_avg_of_the_other_reductions(dtype):
    xs = [_np("avgrs", (2 * SIZE,), dtype, r) for r in range(SIZE)]
    total = _t(golden_reduce(xs, DTYPES[dtype], REDUCE_OPS["sum"])) / SIZE
    out = _t(xs[RANK][:2])
    dist.reduce_scatter_tensor(out, _t(xs[RANK]), op=dist.ReduceOp.AVG)
    assert torch.equal(out, total[2 * RANK:2 * RANK + 2])
    t = _t(xs[RANK])
    dist.reduce(t, dst=0, op=dist.ReduceOp.AVG)
    assert torch.equal(t, total if RANK == 0 else _t(xs[RANK]))


@pytest.mark.mpi(min_size=3)
def test_rooted_calls_on_a_group_whose_ranks_are_not_the_worlds():
    members = list(range(1, SIZE))
    g = dist.new_group(members)
    if RANK not in members:
        return
    root = members[-1]                                       # a world rank (torch's dst/src)
    gathered = [torch.empty(1) for _ in members] if RANK == root else None
    dist.gather(torch.tensor([float(RANK)]), gathered, dst=root, group=g)
    if RANK == root:
        assert [t.item() for t in gathered] == [float(m) for m in members]
    t = torch.empty(1)
    dist.scatter(t, [torch.tensor([float(m * 10)]) for m in members] if RANK == root else None, src=root, group=g)
    assert t.item() == RANK * 10
    t = torch.tensor([float(RANK)])
    dist.reduce(t, dst=root, group=g)
    assert t.item() == (sum(members) if RANK == root else RANK)


@pytest.mark.mpi(min_size=2)
def test_a_group_in_torch_order_is_refused():
    if RANK > 1:                                           # (torch makes a group on its members only)
        dist.new_group([1, 0], sort_ranks=False)
        return
    with pytest.raises(ValueError, match="sort_ranks=False"):
        dist.new_group([1, 0], sort_ranks=False)


def test_init_with_another_rank_is_refused():
    from torch.distributed.rendezvous import rendezvous     # (how init_process_group calls it)
    with pytest.raises(ValueError, match="mpi:// takes it from MPI"):
        next(rendezvous("mpi://", rank=RANK + 1, world_size=SIZE))


# ----------------------------------------------------------------------------- torch's own examples

@pytest.mark.skipif(SIZE != 2, reason="torch documents these results for 2 ranks")
def test_torch_documented_examples_at_two_ranks():
    """The examples of torch.distributed's docstrings, with their documented results (2 ranks)."""
    rank = dist.get_rank()
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank          # all_reduce
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    assert tensor.tolist() == [4, 6]
    tensor_list = [torch.zeros(2, dtype=torch.int64) for _ in range(2)]  # all_gather
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
    dist.all_gather(tensor_list, tensor)
    assert [t.tolist() for t in tensor_list] == [[1, 2], [3, 4]]
    tensor_out = torch.zeros(4, dtype=torch.int64)                       # all_gather_into_tensor
    dist.all_gather_into_tensor(tensor_out, torch.arange(2, dtype=torch.int64) + 1 + 2 * rank)
    assert tensor_out.tolist() == [1, 2, 3, 4]
    tensor_out2 = torch.zeros(2, 2, dtype=torch.int64)
    dist.all_gather_into_tensor(tensor_out2, torch.arange(2, dtype=torch.int64) + 1 + 2 * rank)
    assert tensor_out2.tolist() == [[1, 2], [3, 4]]
    tensor_out = torch.zeros(2, dtype=torch.int64)                       # reduce_scatter_tensor
    dist.reduce_scatter_tensor(tensor_out, torch.arange(4, dtype=torch.int64) + 1 + 2 * rank)
    assert tensor_out.tolist() == ([4, 6] if rank == 0 else [8, 10])
    objects = ["foo", 12, {1: 2}]                                        # broadcast_object_list
    objs = objects if rank == 0 else [None, None, None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == ["foo", 12, {1: 2}]


@pytest.mark.skipif(SIZE != 4, reason="torch documents these results for 4 ranks")
def test_torch_documented_all_to_all_examples_at_four_ranks():
    """all_to_all_single's docstring examples, even and uneven splits, with their results (4 ranks)."""
    rank = dist.get_rank()
    input = torch.arange(4) + rank * 4  # noqa: A001 - the docstring's names
    output = torch.empty([4], dtype=torch.int64)
    dist.all_to_all_single(output, input)
    assert output.tolist() == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]][rank]
    input = [torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([10, 11, 12, 13, 14, 15, 16, 17, 18]),  # noqa: A001
             torch.tensor([20, 21, 22, 23, 24]), torch.tensor([30, 31, 32, 33, 34, 35, 36])][rank]
    input_splits = [[2, 2, 1, 1], [3, 2, 2, 2], [2, 1, 1, 1], [2, 2, 2, 1]][rank]
    output_splits = [[2, 3, 2, 2], [2, 2, 1, 2], [1, 2, 1, 2], [1, 2, 1, 1]][rank]
    output = torch.empty(sum(output_splits), dtype=torch.int64)
    dist.all_to_all_single(output, input, output_splits, input_splits)
    assert output.tolist() == [[0, 1, 10, 11, 12, 20, 21, 30, 31], [2, 3, 13, 14, 22, 32, 33],
                               [4, 15, 16, 23, 34, 35], [5, 17, 18, 24, 36]][rank]


# ----------------------------------------------------------------------------- DDP

def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


#: rows of each batch a rank trains on in the data-parallel tests
PER_RANK = 4


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of ``PER_RANK`` rows per rank, alike on every rank."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(PER_RANK * SIZE, 8, generator=g), torch.randn(PER_RANK * SIZE, 4, generator=g))
            for _ in range(steps)]


def _train(model: torch.nn.Module, batches: list, shard: bool) -> torch.optim.Optimizer:
    """SGD steps of ``model`` on each batch: on this rank's rows (``shard``) or the whole batch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mine = slice(RANK * PER_RANK, (RANK + 1) * PER_RANK) if shard else slice(None)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
    return opt


def test_ddp_trains_like_one_process_on_the_whole_batch():
    """DDP on the mpicoll backend, each rank its shard of every batch, 5 SGD steps: the parameters
    equal those of one process trained on the whole batches (float32 tolerance)."""
    batches = _batches(5)
    ddp = torch.nn.parallel.DistributedDataParallel(_model(seed=RANK))   # DDP broadcasts rank 0's parameters
    _train(ddp, batches, shard=True)
    single = _model(seed=0)
    _train(single, batches, shard=False)
    for a, b in zip(ddp.module.parameters(), single.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _complex_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 6, dtype=torch.complex64), torch.nn.Linear(6, 4, dtype=torch.complex64))


def _train_complex(m: torch.nn.Module, shard: bool) -> None:
    """3 SGD steps of a complex model (|error|^2 loss), on this rank's rows or the whole batches."""
    g = torch.Generator().manual_seed(2)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    mine = slice(RANK * PER_RANK, (RANK + 1) * PER_RANK) if shard else slice(None)
    for _ in range(3):
        x = torch.randn(PER_RANK * SIZE, 8, dtype=torch.complex64, generator=g)
        y = torch.randn(PER_RANK * SIZE, 4, dtype=torch.complex64, generator=g)
        opt.zero_grad()
        (m(x[mine]) - y[mine]).abs().pow(2).mean().backward()
        opt.step()


@pytest.mark.parametrize("wrap", ["DistributedDataParallel", "fully_shard"])
def test_complex_parameters_train_like_one_process(wrap):
    """DDP (its C++ weight sync and gradient buckets hand the backend complex64 tensors) and FSDP2
    of a model with complex parameters: the parameters equal one process's on the whole batches.
    (FSDP1 refuses complex parameters itself, on any backend: "Cannot flatten integer dtype tensors".)"""
    if wrap == "fully_shard":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (SIZE,))
        model = _complex_model(seed=0)
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        _train_complex(model, shard=True)
        got = [p.full_tensor() for p in model.parameters()]
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(_complex_model(seed=RANK))
        _train_complex(ddp, shard=True)
        got = list(ddp.module.parameters())
    single = _complex_model(seed=0)
    _train_complex(single, shard=False)
    for a, b in zip(got, single.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fsdp", ["FullyShardedDataParallel", "fully_shard"])
def test_fsdp_trains_like_one_process_on_the_whole_batch(fsdp):
    """FSDP (its wrapper, FSDP1, and ``fully_shard``, FSDP2) on the mpicoll backend, 3 SGD steps: the
    parameters equal those of one process on the whole batches. FSDP1 frees each gathered
    parameter by resizing its storage to 0, which a view made by ``Tensor.numpy()`` forbade."""
    from torch.distributed import fsdp as F
    batches = _batches(3)
    model = _model(seed=0)
    if fsdp == "fully_shard":
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (SIZE,))
        for m in model:
            if isinstance(m, torch.nn.Linear):
                F.fully_shard(m, mesh=mesh)
        sharded = F.fully_shard(model, mesh=mesh)
    else:
        sharded = F.FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
    sharded_opt = _train(sharded, batches, shard=True)
    single = _model(seed=0)
    _train(single, batches, shard=False)
    if fsdp == "fully_shard":
        got = [p.full_tensor() for p in sharded.parameters()]
    else:
        assert "state" in F.FullyShardedDataParallel.optim_state_dict(sharded, sharded_opt)  # (asks for the device)
        with F.FullyShardedDataParallel.summon_full_params(sharded):
            got = [p.detach().clone() for p in sharded.parameters()]
    for a, b in zip(got, single.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_group_says_its_device_is_the_cpu(tmp_path):
    """torch asks a group for its devices (FSDP's state dicts, DCP's async_save, broadcast_from_rank0):
    the CPU, for the world and a subgroup; DCP's async_save and load then round-trip a state dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.distributed_c10d import _get_pg_default_device
    sub = dist.new_group([SIZE - 1])
    for g in (dist.group.WORLD,) + ((sub,) if RANK == SIZE - 1 else ()):
        assert g._device_types == [torch.device("cpu")] and _get_pg_default_device(g) == torch.device("cpu")
    where = WORLD.bcast(str(tmp_path / "checkpoint"))
    state = {"w": torch.arange(6.0), "step": torch.tensor([7])}        # (replicated: alike on every rank)
    dcp.async_save(state, checkpoint_id=where).result()
    dist.barrier()
    back = {"w": torch.zeros(6), "step": torch.tensor([-1])}
    dcp.load(back, checkpoint_id=where)
    assert back["w"].tolist() == list(range(6)) and back["step"].item() == 7


def test_a_functional_collectives_result_as_a_tensor():
    """What torch's functional collectives return (an ``AsyncCollectiveTensor``, also a redistributed
    DTensor's ``to_local()``) passed to ``dist.*``: it waits and is used as its result (torch hands
    the group the wrapper itself). A DTensor has no memory of its own: an agreed error."""
    import torch.distributed._functional_collectives as fc
    a = fc.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
    dist.all_reduce(a)
    assert a.tolist() == [SIZE * SIZE] * 4
    outs = [torch.empty(4) for _ in range(SIZE)]
    dist.all_gather(outs, fc.all_reduce(torch.full((4,), float(RANK)), "max", dist.group.WORLD))
    assert all(o.tolist() == [SIZE - 1.0] * 4 for o in outs)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    d = distribute_tensor(torch.ones(2 * SIZE, 2), init_device_mesh("cpu", (SIZE,)), [Shard(0)])
    raises_everywhere(lambda: dist.all_reduce(d), mpicoll.CollectiveArgumentError,
                      "all_reduce: tensor='DTensor' on rank", "pass a plain tensor (a DTensor's to_local())")


def test_tensors_it_cannot_view_are_argument_errors():
    """Each one a ``CollectiveArgumentError`` (which the call agrees), never torch's or numpy's own error
    on one rank: a sparse list element, a negative-bit view (also of a tensor whose view is kept), a
    view whose storage was freed."""
    def refused(t, *fragments, strided=False):
        with pytest.raises(mpicoll.CollectiveArgumentError) as info:
            mpicoll._torch_views.array(t, "test", RANK, strided=strided)
        assert all(f in str(info.value) for f in fragments), str(info.value)
    refused(torch.ones(4).to_sparse(), "torch.sparse_coo", "must be dense", strided=True)
    refused(torch._neg_view(torch.ones(4)), "neg-bit view", "pass t.resolve_neg()")
    kept = torch.ones(4)
    mpicoll._torch_views.array(kept, "test", RANK)             # (its view kept, under the neg view's key too)
    refused(torch._neg_view(kept), "neg-bit view", "pass t.resolve_neg()")
    t = torch.ones(8)
    tail = t[2:]
    t.untyped_storage().resize_(0)
    refused(tail, "a storage of 0 bytes", "must hold the tensor's 32 bytes")


def test_storage_stays_resizable():
    """After a call, a tensor's storage can still be resized (as gloo leaves it), and a call on the
    re-grown tensor uses its new memory: small tensors (whose views are kept) and large ones."""
    for numel, dtype in ((4, torch.float32), (4, torch.bfloat16), (4, torch.bool), (1 << 17, torch.float32)):
        t = torch.ones(numel, dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        storage.resize_(0)
        with pytest.raises(mpicoll.CollectiveArgumentError, match="must hold the tensor's"):   # (freed: refused)
            dist.all_reduce(t)
        storage.resize_(nbytes)
        before = t.data_ptr()
        storage.resize_(2 * nbytes)                    # (new memory, taken while the old is still held: it moves)
        assert t.data_ptr() != before
        assert mpicoll._torch_views.array(t, "test", RANK).__array_interface__["data"][0] == t.data_ptr()
        t.fill_(RANK + 1 if dtype != torch.bool else RANK == SIZE - 1)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert t.tolist() == [SIZE if dtype != torch.bool else True] * numel, (numel, dtype)


def test_a_gloo_group_under_mpi_init():
    """mpi://'s store is a TCPStore on world rank 0 that every rank reaches: a gloo group can join
    the job, beside the mpicoll groups."""
    g = dist.new_group(backend="gloo")
    t = torch.tensor([float(RANK + 1)])
    dist.all_reduce(t, group=g)
    assert t.item() == SIZE * (SIZE + 1) / 2
    pair = dist.new_group(sorted({0, SIZE - 1}), backend="gloo")
    if RANK in (0, SIZE - 1):
        t = torch.tensor([RANK])
        dist.broadcast(t, src=SIZE - 1, group=pair)
        assert t.item() == SIZE - 1
    dist.barrier()


def test_views_are_reused_only_for_the_same_memory():
    """A small tensor's numpy view is kept (so that mpicoll can replay a repeated call), and given
    back only for a tensor of the same address, dtype, shape and strides that still owns it."""
    t = torch.zeros(2, 2)
    assert mpicoll._torch_views.array(t, "test", RANK) is mpicoll._torch_views.array(t, "test", RANK)
    strided = mpicoll._torch_views.array(t.t(), "test", RANK, strided=True)      # (same address and shape)
    assert strided.strides != mpicoll._torch_views.array(t, "test", RANK).strides
    before = mpicoll._torch_views.array(t, "test", RANK)
    t.set_(torch.ones(2, 2).untyped_storage(), 0, (2, 2), (2, 1))          # (other memory)
    after = mpicoll._torch_views.array(t, "test", RANK)
    assert after is not before and after.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    x = torch.full((3,), float(RANK))
    for _ in range(3):                                                     # (a repeated call, same tensor)
        x.fill_(float(RANK))
        dist.all_reduce(x)
        assert x.tolist() == [float(sum(range(SIZE)))] * 3
