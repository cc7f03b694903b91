"""The store of the torch backend's ``init_method="mpi://"`` (mpicoll/torch.py): a TCPStore served by
world rank 0, whose address MPI hands to the other ranks, so that store-based groups (gloo's) can join
an mpicoll job; else, when some rank cannot reach it, a store of this process's alone that says why.
"""
from __future__ import annotations

import fcntl
import socket
import struct
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from mpi4py import MPI

from . import _env

__all__ = ["LocalStore", "shared_store"]


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


def shared_store(world: MPI.Comm, timeout: timedelta) -> tuple[Any, str]:
    """``(a TCPStore served by world rank 0, "")``, or ``(None, why)`` on every rank when some rank
    cannot reach it. Rank 0 serves on every interface and sends its addresses over MPI
    (``MPICOLL_STORE_HOST``, else its IPv4 addresses); a rank on rank 0's host takes the loopback,
    another the first address it can connect to; the ranks agree whether all could (set-up steps on
    MPI_COMM_WORLD, before any group exists)."""
    rank = world.Get_rank()
    server, offer = None, None
    if rank == 0:
        try:
            server = dist.TCPStore("127.0.0.1", 0, world.Get_size(), is_master=True, timeout=timeout,
                                   wait_for_workers=False)
            given = _env.value("MPICOLL_STORE_HOST")
            offer = ([given] if given else _ipv4_addresses(), server.port, MPI.Get_processor_name())
        except (RuntimeError, OSError) as exc:
            offer = str(exc)
    offer = world.bcast(offer, root=0)
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
    lost = [r for r, ok in enumerate(world.allgather(address is not None)) if not ok]
    if lost:
        return None, f"world ranks {lost} could not reach world rank 0's TCPStore at {addresses} port {port}"
    if server is not None:
        return server, ""
    return dist.TCPStore(address, port, world.Get_size(), is_master=False, timeout=timeout), ""
