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
    """Like :func:`raises_everywhere` over ``comm`` (a sub-communicator)."""
    with pytest.raises(cls) as info:
        fn()
    message = str(info.value)
    messages = comm.allgather(message)
    assert len(set(messages)) == 1, f"ranks raised different messages: {messages}"
    for f in fragments:
        assert f in message, f"{f!r} not in {message!r}"
    return message
