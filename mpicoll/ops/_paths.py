"""THE choice of how a reduction moves its data: the one place each operator family's algorithm is
picked, from the thresholds of :mod:`mpicoll._thresholds` and from facts every rank holds alike
(the dtype, the size, the communicator's agreed layout). Each choice names its path; the
implementations (:mod:`._window`, ``ops/allreduce.py``, ``ops/_reduce.py``) follow it, and a
trace shows it for each call (docs/trace.md).

Paths: ``window`` (one node: the shared window), ``tiers`` (several nodes: node first, then across),
``mpi`` (MPI's own reduction, one call), ``pieces`` (MPI's or mpicoll's reduction of pieces, one after
the other), and for a piece ``gather`` (every input gathered, reduced in the tree order), ``f32``
(16-bit floats widened, MPI's float32 reduction, rounded back), ``alltoall`` (AllToAll of the
blocks, a reduction in the tree order, AllGather).
"""
from __future__ import annotations

from .. import _shm
from .._comm import LibComm
from .._dtypes import DType, ReduceOp
from .._thresholds import value


def ordered(comm: LibComm, dt: DType, rop: ReduceOp) -> bool:
    """THE reproducibility rule (docs/reproducibility.md): whether a reduction on ``comm`` must
    run on mpicoll's paths in the tree order (the shared window, an AllToAll or a gather and
    :func:`~mpicoll._numeric.reduce_rows`; tiers on :func:`aligned` nodes), never in MPI's own
    reduction, whose order changes with the message size, the MPI library, even the rank: every
    float reduction over more than 1 member, with ``MPICOLL_EXACT`` on (``comm.exact``, agreed),
    but a SUM or PROD over 2 (one commutative operation per element: the same bits on any path).
    Integers are exact anyway; a float MAX or MIN is not (MPI's ``a > b ? a : b`` drops a NaN or
    picks a signed zero by its operands' order, which MPI varies; numpy's maximum in the tree order
    propagates NaN)."""
    return comm.exact and dt.floating and (comm.size > 2 or (comm.size == 2 and not rop.rounds))


def aligned(comm: LibComm) -> bool:
    """Whether ``comm``'s nodes are aligned with the tree order: several nodes (``per_node``), each
    holding consecutive ranks (``blocks``), the same power of two of them. Then every node's ranks
    form a subtree of the order (``[k 2^a, (k + 1) 2^a)``) and the tree over the nodes' partials is
    the rest of it: a tiered reduction computes the order's bits (both facts agreed at set-up)."""
    p = comm.per_node
    return comm.blocks and p > 1 and p & (p - 1) == 0


def invariant(comm: LibComm, dt: DType, rop: ReduceOp) -> bool:
    """Whether a reduction's bits cannot depend on its path (the message size, fusion into a larger
    message): integers, one member (a copy), the :func:`ordered` reductions, a float SUM or PROD
    over 2 members."""
    return not dt.floating or comm.size == 1 or ordered(comm, dt, rop) or (comm.size == 2 and rop.rounds)


def mpi_reduces(dt: DType, nbytes: int, n: int, order: bool) -> bool:
    """Whether MPI's own reduction serves a (piece of an) AllReduce or Reduce: the dtypes MPI
    reduces natively, but not 8-bit integers from ``allreduce.bytes_alltoall`` on (MPICH's byte
    loop), and never a reduction that must run in the tree order (``order``: :func:`ordered`)."""
    return dt.reduce != "float32" and not order and (dt.itemsize > 1 or nbytes < value("allreduce.bytes_alltoall")
                                                     or n == 1)


def allreduce(comm: LibComm, nbytes: int, dt: DType, rop: ReduceOp, rooted: bool) -> str:
    """The path of an AllReduce (``rooted``: a Reduce) of ``nbytes`` a rank: ``window`` on one node
    from ``window.allreduce`` (16-bit floats: ``window.allreduce.16bit``; the tree order:
    ``window.ordered``); ``tiers`` over several nodes with more than one member each for a reduction
    MPI does not make itself, from ``allreduce.tiers`` (the tree order: over :func:`aligned` nodes,
    from ``tiers.aligned``); ``mpi`` for MPI's own reduction in one call; else ``pieces`` (from
    ``allreduce.pieces``, in pieces; below it, one piece of the whole: :func:`piece` picks each)."""
    n, order = comm.size, ordered(comm, dt, rop)
    window = value("window.ordered") if order else value("window.allreduce") if dt.reduce != "float32" else \
        value("window.allreduce.16bit")
    if _shm.serves(comm, nbytes, window):
        return "window"
    native = mpi_reduces(dt, nbytes, n, order)
    if not rooted and comm.per_node and not native:       # (the flat path would be mpicoll's own: blind to nodes)
        if (nbytes >= value("tiers.aligned") and aligned(comm)) if order else nbytes >= value("allreduce.tiers"):
            return "tiers"
    if native and not (nbytes >= value("allreduce.pieces")[0] and n > 1):
        return "mpi"
    return "pieces"


def piece(comm: LibComm, nbytes: int, dt: DType, rop: ReduceOp) -> str:
    """The path of one piece of an AllReduce or Reduce (:func:`allreduce`'s ``pieces``): ``mpi``;
    for the tree order, ``gather`` while every input together holds at most ``gathered``; ``f32``
    for 16-bit floats up to ``allreduce.f32`` (or one member); else ``alltoall``."""
    n, order = comm.size, ordered(comm, dt, rop)
    if mpi_reduces(dt, nbytes, n, order):
        return "mpi"
    if order and n * nbytes <= value("gathered"):
        return "gather"
    if not order and dt.reduce == "float32" and (nbytes <= value("allreduce.f32") or n == 1):
        return "f32"
    return "alltoall"


def reduce_scatter(comm: LibComm, nbytes: int, dt: DType, rop: ReduceOp, packed: bool, window: bool) -> str:
    """The path of a ReduceScatter(V) of ``nbytes`` of a rank's blocks: ``window`` on one node from
    ``window.reduce_scatter`` (``packed``: every rank's blocks packed, agreed; ``window``: the call
    needs the window, not reading node buffers); ``tiers`` for the tree order over :func:`aligned`
    nodes from ``tiers.aligned``; ``mpi`` (MPI's ``Reduce_scatter(_block)``) for the dtypes it
    reduces natively when the order cannot change the bits; ``gather`` for the tree order while every
    input together holds at most ``gathered``; else ``alltoall``."""
    if packed and _shm.serves(comm, nbytes, value("window.reduce_scatter"), window):
        return "window"
    order = ordered(comm, dt, rop)
    if order and packed and nbytes >= value("tiers.aligned") and aligned(comm):
        return "tiers"
    if dt.reduce != "float32" and packed and not order:
        return "mpi"
    if order and packed and comm.size * nbytes <= value("gathered"):
        return "gather"
    return "alltoall"
