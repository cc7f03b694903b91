"""AllToAllAllGather: an operator on two domains (ep, tp) with two outputs. (Every dtype x case
family runs against the golden in test_ops.py, on meshes the check spec forms.)"""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveArgumentError
from mpicoll.checks.alltoall_allgather import golden

from _mpi import RANK, SIZE, raises_everywhere

mpi1 = pytest.mark.mpi(min_size=1)


def _op(ep, tp, layout="tp_contiguous", **kw):
    m = mpicoll.mesh(ep, tp, layout, prefix="a2aag-test.")
    return m, mpicoll.AllToAllAllGatherOperation(mpicoll.AllToAllAllGatherParam(group_ep=m.ep_domain,
                                                                                group_tp=m.tp_domain, **kw))


@pytest.mark.mpi(min_size=4)
def test_documented_example():
    if SIZE != 4:
        pytest.skip("a 2 x 2 mesh")
    _, op = _op(2, 2)
    z, y = op.execute(np.array([10 * RANK, 10 * RANK + 1]))
    if RANK == 0:
        assert z.tolist() == [0, 20] and y.tolist() == [[0, 20], [10, 30]]


@mpi1
@pytest.mark.parametrize("layout", ["tp_contiguous", "ep_contiguous"])
def test_both_mesh_layouts_against_the_golden(layout):
    tp = 2 if SIZE % 2 == 0 else 1
    m, op = _op(SIZE // tp, tp, layout)
    xs = [np.arange(4 * m.ep * 3, dtype=np.float32).reshape(4 * m.ep, 3) + 1000 * r for r in range(SIZE)]
    # the golden is written for tp-contiguous ranks: renumber the world ranks by (s, t)
    order = [s * tp + t for s in range(m.ep) for t in range(tp)] if layout == "tp_contiguous" else \
        [t * m.ep + s for s in range(m.ep) for t in range(tp)]
    want = golden([xs[w] for w in order], order.index(RANK), SIZE)
    z, y = op.execute(xs[RANK])
    assert np.array_equal(z, want[0]) and np.array_equal(y, want[1])
    with op.prepare(xs[RANK]) as plan:      # two collectives: the plan runs on private copies
        got = plan.start().wait()
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@mpi1
def test_outputs_given():
    tp = 2 if SIZE % 2 == 0 else 1
    _, op = _op(SIZE // tp, tp)
    x = np.ones((SIZE // tp, 2), np.int16)
    z, y = np.empty_like(x), np.empty((tp, *x.shape), x.dtype)
    assert all(a is b for a, b in zip(op.execute(x, out=(z, y)), (z, y)))
    raises_everywhere(lambda: op.execute(x, out=(y, z)), CollectiveArgumentError, "AllToAllAllGather: out[0]=")
    raises_everywhere(lambda: op.execute(x, out=z), CollectiveArgumentError, "must be a pair (z, y)")


@mpi1
def test_same_domain_twice_is_refused():
    p = mpicoll.AllToAllAllGatherParam(group_ep="a2aag.same", group_tp="a2aag.same", ep_world_size=1)
    raises_everywhere(lambda: mpicoll.AllToAllAllGatherOperation(p).execute(np.ones(2)), CollectiveArgumentError,
                      "two different domains")


@mpi1
def test_dim0_must_divide_by_ep_on_the_last_rank():
    if SIZE < 2:
        pytest.skip("ep 1 divides everything")
    _, op = _op(SIZE, 1)
    x = np.ones(SIZE + (RANK == SIZE - 1))
    raises_everywhere(lambda: op.execute(x), CollectiveArgumentError, f"x.shape[0]={SIZE + 1} on rank {SIZE - 1}",
                      f"divisible by the ep size={SIZE}")


@pytest.mark.mpi(min_size=2)
def test_domains_must_lie_inside_the_mesh_communicator():
    """The operation agrees over its comm_domain (here each half of the world): an ep domain
    reaching outside it is a param error, raised on every rank of the half."""
    m = mpicoll.mesh(SIZE, 1, prefix="a2aag-outside.")
    half = [r for r in range(SIZE) if (r < SIZE // 2) == (RANK < SIZE // 2)]
    p = mpicoll.AllToAllAllGatherParam(comm_domain=f"a2aag-half.{half[0]}", rank_size=len(half),
                                       group_ep=m.ep_domain, group_tp=m.tp_domain)
    from _mpi import raises_on
    raises_on(mpicoll.domain(p.comm_domain, len(half)), lambda: mpicoll.AllToAllAllGatherOperation(p).execute(
        np.ones(SIZE)), CollectiveArgumentError, "ep domain", "must lie inside domain 'a2aag-half.")
