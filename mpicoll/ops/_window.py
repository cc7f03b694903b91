"""The reductions through the node's shared window (:mod:`mpicoll._shm`: the window, its rounds and
halves, node buffers): AllReduce (and Reduce) in one shot or in two, ReduceScatter(V) in rounds, each
block reduced once in the tree order. :mod:`._paths` picks them."""
from __future__ import annotations

import numpy as np

from .._comm import LibComm
from .._dtypes import DType, ReduceOp
from .._numeric import prefix, reduce_rows, split_even
from .._shm import NodeBuffer, keyed, node_window, publish
from .._thresholds import value


def allreduce(go, comm: LibComm, x: np.ndarray, out: np.ndarray | None, dt: DType, rop: ReduceOp,
              in_place: bool, inputs: tuple[NodeBuffer, list] | None = None) -> None:
    """AllReduce (or Reduce) of ``x`` into ``out`` (``in_place``: ``out`` is ``x``; None: a Reduce's other ranks)
    through the node window. Up to ``window.one_shot / (n (n - 1))``, in one shot (each rank with an ``out``
    reduces the whole message from every slot, in the tree order); else in rounds of at most
    ``window.slot``: each rank reduces one block of the round (``split_even``: the first ranks get one
    element more), in the tree order, and places it in its slot; then every rank with an ``out`` copies
    the blocks out. ``inputs`` (:func:`~mpicoll._shm.resident`): every rank's input is in a node buffer, read
    there instead of copied in (in one shot, a last Barrier keeps the inputs until every peer has
    read them; an in-place result waits for it in a private array)."""
    node, n, me = node_window(comm), comm.size, comm.rank
    flat, oflat = x.reshape(-1), None if out is None else out.reshape(-1)
    per = node.slot_bytes // dt.itemsize
    slots = [node.slots(r, dt.np) for r in range(n)]
    buf, peers = inputs or (None, None)
    go.hold(True)
    go.local(node.check)
    if flat.nbytes * n * (n - 1) <= value("window.one_shot") and flat.nbytes <= node.slot_bytes:
        if buf is not None:            # (agreed: the same steps on every rank, in place or not)
            rows = ([flat if r == me else p for r, p in enumerate(peers)],) * 2
            into = np.empty_like(flat) if in_place else oflat      # (in place: x is read by the peers
            publish(go, comm, buf)                                # until the last Barrier)
            if into is not None:
                go.local(node.reduce, rows, dt, rop, into, None)
            go.mpi(comm, "Barrier")                    # (every peer has read this rank's input)
            if in_place:
                go.local(np.copyto, oflat, into)
        else:
            own = tuple(m[:flat.size] for m in slots[me])     # (in place on a rank > 0: its row from its slot)
            rows = tuple([flat if r == me and (me == 0 or not in_place) else slots[r][h][:flat.size]
                          for r in range(n)] for h in (0, 1))
            go.local(node.put, keyed(tuple([(o, flat)] for o in own)))
            go.mpi(comm, "Barrier")
            if oflat is not None:
                go.local(node.reduce, rows, dt, rop, oflat, None)
        go.local(node.flip)
        go.hold(False)
        return
    direct = oflat is not None and not in_place     # (reduce straight into the output; else privately first)
    mine = None if direct else np.empty(-(-min(per, flat.size) // n), dtype=dt.np)
    for s in range(0, flat.size, per):
        xs = flat[s:s + per]
        counts = split_even(xs.size, n)
        bounds = [(int(a), int(a + c)) for a, c in zip(prefix(counts), counts)]
        lo, hi = bounds[me]
        if buf is None:
            put = tuple([(m[:lo], xs[:lo]), (m[hi:xs.size], xs[hi:])] for m in slots[me])
            rows = tuple([xs[lo:hi] if r == me else slots[r][h][lo:hi] for r in range(n)] for h in (0, 1))
            go.local(node.put, keyed(put))
            go.mpi(comm, "Barrier")
        else:                                          # (peers read this round's inputs before the next Barrier)
            rows = ([xs[lo:hi] if r == me else p[s + lo:s + hi] for r, p in enumerate(peers)],) * 2
            publish(go, comm, buf)
        block = oflat[s + lo:s + hi] if direct else mine[:hi - lo]
        go.local(node.reduce, rows, dt, rop, block, keyed(tuple([(m[lo:hi], block)] for m in slots[me])))
        go.mpi(comm, "Barrier")
        if oflat is not None:
            os_ = oflat[s:s + per]
            get = tuple([(os_[a:b], slots[r][h][a:b]) for r, (a, b) in enumerate(bounds) if r != me]
                        + ([] if direct else [(os_[lo:hi], mine[:hi - lo])]) for h in (0, 1))
            go.local(node.get, get, oflat.nbytes >= value("window.stream_out"))
        go.local(node.flip)
    go.hold(False)


def reduce_scatter(go, comm: LibComm, blocks: np.ndarray, counts: list[int], dt: DType, rop: ReduceOp,
                   out: np.ndarray, inputs: tuple[NodeBuffer, list] | None = None) -> None:
    """ReduceScatter(V) of the packed ``blocks`` (block j: ``counts[j]`` elements, rank j's) into
    ``out`` through the node window, in rounds: round k takes the k-th ``take[j]`` elements of every
    block j (``take`` in proportion to the counts, together at most a slot, so that skewed counts
    need no more rounds than even ones); each rank copies the others' parts into its slot and, after
    a Barrier, reduces its own part from every slot (its own straight from ``blocks``) into ``out``.
    ``inputs`` (:func:`~mpicoll._shm.resident`): every rank's blocks are in a node buffer: after one Barrier each
    rank reduces its whole block straight from them, and a second keeps them until all have read."""
    n, me = comm.size, comm.rank
    flat, oflat = blocks.reshape(-1), out.reshape(-1)
    if inputs is not None:                             # (no window: read straight from the buffers)
        buf, peers = inputs
        a = int(sum(counts[:me]))
        rows = [p[a:a + counts[me]] for p in peers]
        rows[me] = flat[a:a + counts[me]]
        publish(go, comm, buf)
        go.local(reduce_rows, rows, dt, rop, oflat)
        go.mpi(comm, "Barrier")                        # (every peer has read this rank's blocks)
        return
    node = node_window(comm)
    per = node.slot_bytes // dt.itemsize
    rounds = max(-(-sum(counts) // per), 1)
    while sum(-(-c // rounds) for c in counts) > per:          # (each block's ceil may add an element)
        rounds += 1
    take = [-(-c // rounds) for c in counts]
    at = prefix(take)                                          # block j's place in a slot
    starts = prefix(counts)
    slots = [node.slots(r, dt.np) for r in range(n)]
    go.hold(True)
    go.local(node.check)
    for k in range(rounds):
        part = [(k * t, min((k + 1) * t, c)) for t, c in zip(take, counts)]     # block j's range this round
        put = tuple([(m[at[j]:at[j] + e - a], flat[starts[j] + a:starts[j] + e])
                     for j, (a, e) in enumerate(part) if j != me and e > a] for m in slots[me])
        go.local(node.put, keyed(put))
        go.mpi(comm, "Barrier")
        a, e = part[me]
        if e > a:
            mine = flat[starts[me] + a:starts[me] + e]
            rows = tuple([mine if r == me else slots[r][h][at[me]:at[me] + e - a] for r in range(n)] for h in (0, 1))
            go.local(node.reduce, rows, dt, rop, oflat[a:e], None)
        go.local(node.flip)
    go.hold(False)
