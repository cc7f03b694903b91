"""Bad input on one rank, and cross-rank mismatches: the same CollectiveError on every rank, before
any data moves, naming the op, the parameter, the value, the rank and the rule; never a hang."""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveArgumentError, CollectiveError, CollectiveMismatchError

from _mpi import RANK, SIZE, WORLD, raises_everywhere

mpi1 = pytest.mark.mpi(min_size=1)
mpi2 = pytest.mark.mpi(min_size=2)


def _v2(plan_of_rank, x=None, **kw):
    """Run AllToAllVV2 with rank-specific plans (a function rank -> (sc, sd, rc, rd))."""
    sc, sd, rc, rd = plan_of_rank(RANK)
    x = np.arange(64, dtype=np.float32) if x is None else x
    return mpicoll.AllToAllVV2Operation(mpicoll.AllToAllVV2Param(), **kw).execute(x, sc, sd, rc, rd)


def _ones(rank):
    return [1] * SIZE, list(range(SIZE)), [1] * SIZE, list(range(SIZE))


def test_errors_are_value_errors_and_collective_errors():
    assert issubclass(CollectiveArgumentError, ValueError)
    assert issubclass(CollectiveMismatchError, CollectiveError)


@mpi2
def test_negative_count_on_one_rank():
    def plan(r):
        sc, sd, rc, rd = _ones(r)
        if r == 1:
            sc[0] = -1
        return sc, sd, rc, rd
    msg = raises_everywhere(lambda: _v2(plan), CollectiveArgumentError, "AllToAllVV2", "send_counts[0]=-1",
                            "rank 1", ">= 0")
    assert mpicoll.AllReduceOperation().execute(np.ones(3)).tolist() == [SIZE] * 3, msg  # still usable


@mpi2
@pytest.mark.parametrize("direction", ["expects_more", "expects_fewer"])
def test_alltoallv_cross_rank_count_mismatch(direction):
    def plan(r):
        sc, sd, rc, rd = _ones(r)
        if r == 0:  # rank 0 expects 2 (or 0) elements from rank 1, which sends 1
            rc[1] = 2 if direction == "expects_more" else 0
            rd = list(np.concatenate(([0], np.cumsum(rc)[:-1])))
        return sc, sd, rc, rd
    raises_everywhere(lambda: _v2(plan), CollectiveMismatchError, "AllToAllVV2", "recv_counts[1]=",
                      "on rank 0", "rank 1 has send_counts[0]=1")


@mpi2
def test_allgatherv_mismatch():
    x = np.arange(10, dtype=np.int16)
    send_count = 3 if RANK == 1 else 2
    recv = [2] * SIZE
    disp = [2 * i for i in range(SIZE)]
    raises_everywhere(lambda: mpicoll.AllGatherVOperation().execute(x, send_count, recv, disp),
                      CollectiveMismatchError, "AllGatherV", "recv_counts[1]=2", "rank 1 has send_count=3")


@mpi2
def test_reducescatterv_mismatch():
    x = np.ones(10, dtype=np.float32)
    sc = [2] * SIZE
    recv = 3 if RANK == 1 else 2
    raises_everywhere(lambda: mpicoll.ReduceScatterVOperation().execute(x, sc, [2 * i for i in range(SIZE)], recv),
                      CollectiveMismatchError, "ReduceScatterV", "recv_count=3 on rank 1", "send_counts[1]=2")


@mpi2
@pytest.mark.parametrize("opname", ["AllReduce", "AllGather", "ReduceScatter", "AllToAll", "Broadcast"])
def test_dtype_differs_on_one_rank(opname):
    op = mpicoll.OPERATIONS[opname]()
    x = np.ones(2 * SIZE, dtype=np.float64 if RANK == 1 else np.float32)
    raises_everywhere(lambda: op.execute(x), CollectiveMismatchError, opname, "dtype", "float32 on rank 0",
                      "float64 on rank 1")


@mpi2
@pytest.mark.parametrize("opname", ["AllReduce", "AllGather", "ReduceScatter", "AllToAll", "Broadcast"])
def test_shape_differs_on_one_rank(opname):
    x = np.ones(2 * SIZE * (2 if RANK == SIZE - 1 else 1), dtype=np.int32)
    raises_everywhere(lambda: mpicoll.OPERATIONS[opname]().execute(x), CollectiveMismatchError, opname,
                      "x.shape", f"on rank {SIZE - 1}")


@mpi2
def test_reduce_type_differs():
    p = mpicoll.AllReduceParam(reduce_type="max" if RANK == 1 else "sum")
    raises_everywhere(lambda: mpicoll.AllReduceOperation(p).execute(np.ones(4)), CollectiveMismatchError,
                      "reduce_type", "'sum' on rank 0", "'max' on rank 1")


@mpi2
def test_root_differs():
    p = mpicoll.BroadcastParam(rank_root=1 if RANK == 1 else 0)
    x = np.full(4, RANK, dtype=np.int64)
    raises_everywhere(lambda: mpicoll.BroadcastOperation(p).execute(x), CollectiveMismatchError, "rank_root",
                      "0 on rank 0", "1 on rank 1")
    assert x.tolist() == [RANK] * 4  # nothing moved


@mpi2
def test_different_operators_on_different_ranks():
    x = np.ones(2 * SIZE, dtype=np.float32)
    op = mpicoll.AllGatherOperation() if RANK == 1 else mpicoll.AllReduceOperation()
    raises_everywhere(lambda: op.execute(x), CollectiveMismatchError, "rank 0 called AllReduce",
                      "rank 1 called AllGather")


@mpi1
@pytest.mark.parametrize("field,value,fragment", [
    ("rank", 99, "rank=99"), ("rank_size", 0, "cannot be 0"), ("rank_size", 99, "rank_size=99"),
    ("rank_root", -1, "rank_root=-1"), ("backend", "gloo", "backend='gloo'"), ("reduce_type", "avg", "'avg'")])
def test_bad_param_on_last_rank(field, value, fragment):
    kwargs = {field: value} if RANK == SIZE - 1 else {}
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(**kwargs))
    raises_everywhere(lambda: op.execute(np.ones(3)), CollectiveArgumentError, "AllReduce", fragment,
                      f"rank {SIZE - 1}")


@mpi1
def test_multi_thread_mode_needs_a_user_comm():
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_mode=mpicoll.CommMode.MULTI_THREAD))
    raises_everywhere(lambda: op.execute(np.ones(3)), CollectiveArgumentError, "comm_mode", "user comm")


@mpi1
@pytest.mark.parametrize("case,fragment", [
    ("not_divisible", "must be divisible by rank_size"), ("unsupported_dtype", "unsupported"),
    ("not_array", "x.dtype='object'"), ("out_alias", "must not overlap")])
def test_local_bad_input_on_last_rank(case, fragment):
    if case == "not_divisible" and SIZE == 1:
        pytest.skip("every length divides by 1")
    x = np.ones(2 * SIZE, dtype=np.float32)
    out = None
    if RANK == SIZE - 1:
        if case == "not_divisible":
            x = np.ones(2 * SIZE + 1, dtype=np.float32)
        elif case == "unsupported_dtype":
            x = np.ones(2 * SIZE, dtype=np.complex64)
        elif case == "not_array":
            x = object()
        else:
            out = x
    op = mpicoll.AllToAllOperation()
    raises_everywhere(lambda: op.execute(x, out=out), CollectiveArgumentError, "AllToAll", fragment,
                      f"rank {SIZE - 1}")


@mpi1
@pytest.mark.parametrize("change,fragment", [
    (lambda p: p[0].__setitem__(0, p[0][0] + 100), "must be <= x.size"),
    (lambda p: p[3].__setitem__(0, 10_000), "must be <= sum(recv_counts)"),
    (lambda p: p.__setitem__(0, p[0][:-1]), "exactly rank_size"),
    (lambda p: p.__setitem__(1, [0.5] * SIZE), "integers"),
])
def test_alltoallv_plan_out_of_range_on_last_rank(change, fragment):
    def plan(r):
        p = [list(v) for v in _ones(r)]
        if r == SIZE - 1:
            change(p)
        return p
    raises_everywhere(lambda: _v2(plan, x=np.arange(SIZE, dtype=np.float32)), CollectiveArgumentError,
                      "AllToAllVV2", fragment, f"rank {SIZE - 1}")


@mpi2
def test_overlapping_receive_regions():
    def plan(r):
        sc, sd, rc, rd = _ones(r)
        if r == 0:
            rd = [0] * SIZE
        return sc, sd, rc, rd
    raises_everywhere(lambda: _v2(plan), CollectiveArgumentError, "overlaps", "rank 0")


@mpi1
def test_broadcast_non_contiguous_is_refused():
    x = np.zeros((4, 4))[:, 0]
    raises_everywhere(lambda: mpicoll.BroadcastOperation().execute(x), CollectiveArgumentError, "Broadcast",
                      "C-contiguous")


@mpi1
def test_validation_switch(monkeypatch):
    monkeypatch.setenv("MPICOLL_VALIDATE", "0")
    assert mpicoll.AllReduceOperation().validate is False
    monkeypatch.setenv("MPICOLL_VALIDATE", "1")
    assert mpicoll.AllReduceOperation().validate is True
    assert mpicoll.AllReduceOperation(validate=False).validate is False
    # with validation off the result is the same
    assert mpicoll.AllReduceOperation(validate=False).execute(np.ones(2)).tolist() == [SIZE, SIZE]


@mpi2
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_integer_sum_overflow_is_an_error_not_a_wrap(dtype):
    big = np.iinfo(dtype).max // 2 + 1
    x = np.full(4, big, dtype=dtype)
    raises_everywhere(lambda: mpicoll.AllReduceOperation().execute(x), CollectiveArgumentError, "AllReduce",
                      "overflows", np.dtype(dtype).name, "never wrap")
    # validation off: MPI's wrap-around, as documented
    wrapped = mpicoll.AllReduceOperation(validate=False).execute(x)
    assert wrapped.tolist() == [int(np.array(big * SIZE).astype(dtype))] * 4


@mpi2
def test_reduce_scatter_overflow_on_some_blocks_raises_everywhere():
    x = np.ones(2 * SIZE, dtype=np.int8)
    x[-2:] = 100                       # only the last rank's block overflows
    raises_everywhere(lambda: mpicoll.ReduceScatterOperation().execute(x), CollectiveArgumentError,
                      "ReduceScatter", "overflows int8", f"rank {SIZE - 1}'s block")
    raises_everywhere(lambda: mpicoll.ReduceScatterVOperation().execute(x, [2] * SIZE, [2 * i for i in range(SIZE)], 2),
                      CollectiveArgumentError, "ReduceScatterV", "overflows int8")


@mpi1
def test_int64_sums_wrap_and_prod_wraps():
    """No wider accumulator for 64-bit integers, nor for products: they wrap, as in MPI."""
    x = np.full(2, np.iinfo(np.int64).max, dtype=np.int64)
    with np.errstate(over="ignore"):
        expected = np.full(2, np.iinfo(np.int64).max, dtype=np.int64) * np.int64(SIZE)
    assert mpicoll.AllReduceOperation().execute(x).tolist() == expected.tolist()
    y = np.full(2, 100, dtype=np.int8)
    assert mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type="prod")).execute(y).tolist() == \
        [int(np.array(100 ** SIZE).astype(np.int64).astype(np.int8))] * 2


@mpi1
def test_reduce_scatter_v_with_a_longer_input():
    x = np.arange(3 * SIZE + 5, dtype=np.int32)
    got = mpicoll.ReduceScatterVOperation().execute(x, [3] * SIZE, [3 * i for i in range(SIZE)], 3)
    assert got.tolist() == [SIZE * v for v in range(3 * RANK, 3 * RANK + 3)]


@mpi1
def test_param_is_bound_at_first_execute():
    p = mpicoll.AllReduceParam(reduce_type="sum")
    op = mpicoll.AllReduceOperation(p)
    assert op.execute(np.ones(2)).tolist() == [SIZE, SIZE]
    p.reduce_type = "max"               # no effect on an op already bound; validation agrees with the run
    assert op.execute(np.ones(2)).tolist() == [SIZE, SIZE]
    assert mpicoll.AllReduceOperation(p).execute(np.ones(2)).tolist() == [1, 1]


@mpi1
def test_hccl_reduce_op_codes_and_conflicting_comm_and_domain():
    assert mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type=2)).execute(np.ones(1)).tolist() == [1]
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=WORLD, comm_domain="x"))
    raises_everywhere(lambda: op.execute(np.ones(1)), CollectiveArgumentError, "not both")


@mpi1
def test_broadcast_unexpected_keyword_is_agreed():
    kwargs = {"out": np.zeros(2)} if RANK == SIZE - 1 else {}
    raises_everywhere(lambda: mpicoll.BroadcastOperation().execute(np.zeros(2), **kwargs), CollectiveArgumentError,
                      "Broadcast", "TypeError", f"rank {SIZE - 1}")


@mpi2
def test_debug_fingerprint_names_the_disagreeing_ranks(monkeypatch):
    monkeypatch.setenv("MPICOLL_DEBUG", "1")
    op = mpicoll.AllReduceOperation(validate=False)       # debug mode turns validation back on
    assert op.validate
    op.execute(np.ones(2, np.float32))
    x = np.ones(2, np.float16 if RANK == 1 else np.float32)
    raises_everywhere(lambda: op.execute(x), CollectiveMismatchError, "fingerprint", "dtype: float32 on rank",
                      "float16 on rank [1]")


@mpi2
def test_debug_mode_accepts_valid_v_plans(monkeypatch):
    monkeypatch.setenv("MPICOLL_DEBUG", "1")
    counts = [RANK + 1] * SIZE                 # each rank sends a different count: legitimate
    recv = list(range(1, SIZE + 1))
    rd = [sum(recv[:i]) for i in range(SIZE)]
    got = mpicoll.AllToAllVV2Operation().execute(np.full(SIZE * (RANK + 1), RANK, np.int32), counts,
                                                  [i * (RANK + 1) for i in range(SIZE)], recv, rd)
    assert got.reshape(-1).tolist() == [r for r in range(SIZE) for _ in range(r + 1)]
    got = mpicoll.AllGatherVOperation().execute(np.full(RANK + 1, RANK), RANK + 1, recv, rd)
    assert got.tolist() == [r for r in range(SIZE) for _ in range(r + 1)]
