"""Shared helpers for tests run under mpirun."""
from __future__ import annotations

import pytest
from mpi4py import MPI

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


def raises_everywhere(fn, cls, *fragments):
    """Run ``fn`` on every rank; every rank must raise ``cls`` with the same message containing
    every fragment. Returns the message."""
    return raises_on(WORLD, fn, cls, *fragments)


def raises_on(comm, fn, cls, *fragments):
    """Like :func:`raises_everywhere` over ``comm`` (a sub-communicator). Every rank must raise
    the same class with the same message and the same ``op``, ``param`` and ``rank`` attributes."""
    with pytest.raises(cls) as info:
        fn()
    exc = info.value
    message = str(exc)
    seen = comm.allgather((type(exc).__name__, message, getattr(exc, "op", None), getattr(exc, "param", None),
                           getattr(exc, "rank", None)))
    assert len(set(seen)) == 1, f"ranks raised different errors: {seen}"
    for f in fragments:
        assert f in message, f"{f!r} not in {message!r}"
    return message
