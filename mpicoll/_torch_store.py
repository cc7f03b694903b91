"""The torch backend's start-up (mpicoll/torch.py): ``init_method="mpi://"`` (:func:`mpi_rendezvous`)
and its store, a TCPStore served by world rank 0, whose address MPI hands to the other ranks, so that
store-based groups (gloo's) can join an mpicoll job (else, when some rank cannot reach it, a store of
this process's alone that says why); and the start-up exchanges, each bounded by the group's
``timeout=`` (:func:`exchange`, :func:`agree_problem`), on mpicoll's own communicators, never on
the user's.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import urllib.parse
from datetime import timedelta
from typing import Any

import numpy as np
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.constants import default_pg_timeout

from . import _env
from ._comm import LibComm, timed_call
from ._domains import world as lib_world
from ._agreement import AGREEMENT, SetUp, agree
from ._errors import CollectiveArgumentError, CollectiveError, CollectiveTimeout

__all__ = ["LocalStore", "agree_problem", "exchange", "mpi_rendezvous", "refuse_other_world", "shared_store", "world"]


def exchange(comm: MPI.Comm, name: str, args: tuple, seconds: float, what: str) -> None:
    """One start-up collective ``name`` on ``comm``, waiting at most ``seconds`` for every member
    (then :class:`~mpicoll.CollectiveTimeout` on the ranks that came, naming ``what``: the start-up
    step a rank never reached)."""
    timed_call(comm, name, args, seconds, lambda: f"{what}: timed out after {seconds:g} s waiting for every rank "
               "(some rank has not reached it)", own=True)


def agree_problem(lib: LibComm, problem: BaseException | None, seconds: float, what: str) -> None:
    """Every rank of ``lib`` raises the lowest failing rank's ``problem`` (a start-up check one rank
    can see), or none does: so that no rank waits in the next step for one that raised."""
    error = problem if problem is None or isinstance(problem, CollectiveError) else \
        CollectiveArgumentError(str(problem), op=what, rank=lib.rank)
    agree(SetUp(lib.mpi, True, lambda step: f"{what}: timed out after {seconds:g} s waiting for every rank (some "
                "rank has not reached it)"), np.zeros(1, np.int64), error, seconds, (what, 0, AGREEMENT))


def _bcast(lib: LibComm, obj: Any, seconds: float, what: str) -> Any:
    """World rank 0's ``obj`` (JSON) on every rank of ``lib`` (the world's)."""
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8) if lib.rank == 0 else np.empty(0, np.uint8)
    size = np.array([data.size], np.int64)
    exchange(lib.mpi, "Bcast", ([size, MPI.INT64_T], 0), seconds, what)
    buf = data.copy() if lib.rank == 0 else np.empty(int(size[0]), np.uint8)
    exchange(lib.mpi, "Bcast", ([buf, MPI.BYTE], 0), seconds, what)
    return json.loads(buf.tobytes())


class LocalStore(dist.Store):
    """The store of ``mpi://`` when some rank cannot reach world rank 0's TCPStore: this process's
    alone (the mpicoll backend needs none). A key another rank would have set is an error at once,
    not a wait, saying ``why`` there is no shared store."""

    def __init__(self, why: str) -> None:
        super().__init__()
        self._d: dict[str, bytes] = {}
        self._why = why

    def _missing(self, key: str):
        raise RuntimeError(f"init_method='mpi://' has no store shared between the ranks (key {key!r} is not "
                           f"here): {self._why}. The mpicoll backend needs none, but a store-based group (gloo) "
                           "does: set MPICOLL_STORE_HOST to an address of world rank 0 the others reach, or start "
                           "with init_method='env://' or 'tcp://...'")

    def set(self, key, value):
        self._d[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key):
        return self._d[key] if key in self._d else self._missing(key)

    def add(self, key, value):
        v = int(self._d.get(key, b"0")) + value
        self._d[key] = str(v).encode()
        return v

    def compare_set(self, key, expected, desired):
        as_bytes = lambda v: v if isinstance(v, bytes) else str(v).encode()  # noqa: E731
        if self._d.get(key, b"") == as_bytes(expected):
            self._d[key] = as_bytes(desired)
        return self._d.get(key, as_bytes(expected))

    def check(self, keys):
        return all(k in self._d for k in keys)

    def wait(self, keys, timeout=None):
        for k in keys:
            if k not in self._d:
                self._missing(k)

    def delete_key(self, key):
        return self._d.pop(key, None) is not None

    def num_keys(self):
        return len(self._d)


def _ipv4_addresses() -> list[str]:
    """This host's IPv4 addresses but loopback (Linux: SIOCGIFADDR per interface)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127."):
                found.append(address)
    return found


def shared_store(world: LibComm, timeout: timedelta) -> tuple[Any, str]:
    """``(a TCPStore served by world rank 0, "")``, or ``(None, why)`` on every rank when some rank
    cannot reach it. Rank 0 serves on every interface and sends its addresses over MPI
    (``MPICOLL_STORE_HOST``, else its IPv4 addresses); a rank on rank 0's host takes the loopback,
    another the first address it can connect to; the ranks agree whether all could (start-up steps
    on mpicoll's world, each bounded by ``timeout``)."""
    rank, seconds, what = world.rank, timeout.total_seconds(), "init_process_group: the store's set-up"
    server, offer = None, None
    if rank == 0:
        try:
            server = dist.TCPStore("127.0.0.1", 0, world.size, is_master=True, timeout=timeout,
                                   wait_for_workers=False)
            given = _env.value("MPICOLL_STORE_HOST")
            offer = ([given] if given else _ipv4_addresses(), server.port, MPI.Get_processor_name())
        except (RuntimeError, OSError) as exc:
            offer = str(exc)
    offer = _bcast(world, offer, seconds, what)
    if isinstance(offer, str):
        return None, f"world rank 0 could not serve a TCPStore ({offer})"
    addresses, port, host0 = offer
    address = "127.0.0.1" if rank == 0 or MPI.Get_processor_name() == host0 else None
    for candidate in addresses if address is None else ():
        try:
            socket.create_connection((candidate, port), timeout=2).close()
            address = candidate
            break
        except OSError:
            continue
    reached = np.empty(world.size, dtype=np.int64)
    exchange(world.mpi, "Allgather", ([np.array([address is not None], np.int64), MPI.INT64_T],
                                      [reached, MPI.INT64_T]), seconds, what)
    lost = [r for r, ok in enumerate(reached.tolist()) if not ok]
    if lost:
        return None, f"world ranks {lost} could not reach world rank 0's TCPStore at {addresses} port {port}"
    if server is not None:
        return server, ""
    return dist.TCPStore(address, port, world.size, is_master=False, timeout=timeout), ""


def _launcher_size() -> tuple[str, int] | None:
    """``(variable, value)`` of a launcher's world size in the environment (torchrun's and
    torch's ``env://`` ``WORLD_SIZE``), or None."""
    value = os.environ.get("WORLD_SIZE")
    return None if value in (None, "") else ("WORLD_SIZE", int(value))


def refuse_other_world(torch_size: int, where: str) -> None:
    """Raise at once, on every process, when torch's world is not MPI's: a job launched by
    torchrun (or any launcher but mpirun) runs each process as an MPI world of its own, and would
    otherwise train N separate worlds of 1."""
    mpi_size = MPI.COMM_WORLD.Get_size()
    launcher = _launcher_size()
    if torch_size != mpi_size or (launcher is not None and launcher[1] != mpi_size):
        given = f"{launcher[0]}={launcher[1]}" if launcher is not None and launcher[1] != mpi_size else \
            f"a world of {torch_size}"
        raise RuntimeError(f"the mpicoll backend ({where}): torch was given {given}, but this process's MPI world "
                           f"has {mpi_size} process(es): the processes were not started by one MPI launcher (torchrun "
                           f"starts MPI singletons, which MPI cannot join). Launch with "
                           f"`mpirun -np {max(torch_size, launcher[1] if launcher else 0)} python ...` instead")


def world(limit: float) -> LibComm:
    """mpicoll's world, made (if this is its first use) within ``init_process_group``'s timeout."""
    try:
        return lib_world(set_up=limit)
    except CollectiveTimeout as exc:
        raise CollectiveTimeout(f"init_process_group(timeout={limit:g} s): {exc}", param="timeout") from None


def mpi_rendezvous(url: str, timeout: timedelta = default_pg_timeout, **kwargs):
    """``init_method="mpi://"``: MPI's rank and world size, and a TCPStore served by world rank 0
    whose address MPI gives the others (so that a store-based group, gloo's, can be made). torch
    passes a ``rank=``/``world_size=`` given to ``init_process_group`` in the URL's query (-1: not
    given); one that is not MPI's is refused, as is a launcher's WORLD_SIZE that is not MPI's."""
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))
    problem = None
    try:
        refuse_other_world(size, "init_method='mpi://'")
        for key, mine in (("rank", rank), ("world_size", size)):
            given = query.get(key, kwargs.get(key, -1))
            if given not in (-1, "-1", None) and int(given) != mine:
                raise ValueError(f"init_process_group(init_method='mpi://', {key}={given}): MPI says {mine} on "
                                 f"world rank {rank}; leave {key} out (mpi:// takes it from MPI)")
    except (RuntimeError, ValueError) as exc:
        problem = exc
    # mpicoll's world, made within the timeout; every rank raises the first rank's problem, so that
    # none waits in the store's set-up
    limit = timeout.total_seconds()
    lib = world(limit)
    agree_problem(lib, problem, limit, "init_process_group")
    store, why = shared_store(lib, timeout)
    yield (store if store is not None else LocalStore(why)), rank, size
