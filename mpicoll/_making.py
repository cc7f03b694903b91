"""How mpicoll makes a library communicator (:class:`~mpicoll._comm.LibComm`) from an MPI
communicator it has just created (a duplicate of the world or of a user comm, a comm domain, a
tier): collective over its members, who agree their settings, their layout over the nodes and
whether any of them runs a watchdog, before the communicator carries any call.

Every member says whether it could read its settings (a value one of them cannot read,
:mod:`mpicoll._env`, is every member's error) and gives those that change which MPI calls a rank
makes (``ALIKE_SETTINGS``: ``MPICOLL_VALIDATE``, ``MPICOLL_DEBUG``, ``MPICOLL_SHM``,
``MPICOLL_EXACT``), which must be alike. Then whether every member runs on one node (``local``: large
reductions may go through a shared window, :mod:`mpicoll._shm`), or else how many members each
node holds (``per_node``: a large AllReduce may go in tiers, :func:`tiers`), whether this rank's node
is crowded (more ranks than cores, :func:`mpicoll._watchdog.crowded`), and whether any member runs
a watchdog (``MPICOLL_TIMEOUT``): then every member keeps arrival marks.
"""
from __future__ import annotations

import hashlib
import os
import socket

import numpy as np
from mpi4py import MPI

from . import _comm, _env, _exit, _trace, _watchdog
from ._agreement import SetUp, agree
from ._comm import LOCK, LibComm
from ._cpus import cpu_sets
from ._errors import CollectiveError, CollectiveMismatchError, CollectiveTimeout

#: this host, as a number (the set-up's row says where each member runs: :data:`mpicoll._trace.PEERS`)
_HOST = int.from_bytes(hashlib.blake2b(socket.gethostname().encode(), digest_size=7).digest(), "little")
#: the settings every member of a library communicator must have alike (flags: they decide which MPI
#: calls a rank makes), in the order of the columns of :func:`make`'s table
ALIKE_SETTINGS = tuple(name for name, s in _env.SETTINGS.items() if s.agreed == _env.ALIKE)


def make(mpi: MPI.Comm, label: str, timeout: float | None = None, set_up: float | None = None) -> LibComm:
    """The library communicator of ``mpi``, a communicator mpicoll has just created (collective over
    its members; see the module docstring). ``timeout``: its own watchdog timeout (a torch group's:
    :class:`~mpicoll._comm.LibComm`); ``set_up``: how long these steps may wait for a member
    (default: that timeout).

    Raises:
        CollectiveArgumentError: a setting some member cannot read (``mpicoll._env.error``), the
            lowest such member's error, on every member.
        CollectiveMismatchError: a setting that decides which MPI calls a rank makes set differently
            on the members, on every member.
    """
    with LOCK:
        _exit.register(_comm.finalizing)     # (its excepthook prints an error every member raises once)
    error = _env.error(MPI.COMM_WORLD.Get_rank())
    # columns: this member's error flag, whether it runs a watchdog, then the settings alike everywhere
    # (and, where it dumps on SIGUSR1, its process id and host: _trace.PEERS)
    mine = np.array([error is not None, timeout is not None or _watchdog.timeout_default() is not None,
                     *(_env.value(name) for name in ALIKE_SETTINGS), os.getpid() if _trace.LISTENING else 0, _HOST],
                    dtype=np.int64)
    set_up, own = _watchdog.set_up_limit(timeout, set_up)
    making = SetUp(mpi, own, lambda step: f"setting up {label}: timed out in {step}")
    try:
        table = agree(making, mine, error, set_up, ("", None, "its settings' agreement (internal MPI Allgather)"))
    except CollectiveTimeout:
        raise                                # (a collective of it may be in flight: not freed)
    except CollectiveError:
        mpi.Free()                           # (every member raises here: every member frees it)
        raise
    agreed = dict(zip(ALIKE_SETTINGS, table[0, 2:].tolist()))
    _trace.PEERS.update(pid for pid, host in table[:, -2:].tolist() if host == _HOST and pid not in (0, os.getpid()))
    for col, name in enumerate(ALIKE_SETTINGS, 2):
        values = table[:, col].tolist()
        if len(set(values)) > 1:
            on = [r for r, v in enumerate(values) if v]
            off = [r for r, v in enumerate(values) if not v]
            mpi.Free()                       # (every member raises here: every member frees it)
            raise CollectiveMismatchError(
                f"{label}: {name} differs across ranks: on for ranks {on}, off for ranks {off}: set it alike "
                "on every rank (it decides which MPI calls a rank makes)", param=name, rank=off[0])
    split = mpi.Split_type(MPI.COMM_TYPE_SHARED)      # (every member is here: its settings agreed)
    crowded = _watchdog.crowded(cpu_sets(split)[0])
    one_node = False
    if not agreed["MPICOLL_SHM"]:            # (no node window, no tiers: agreed, every member alike)
        split.Free()
        split = None
    else:
        here = split.Get_size()
        one_node = here == mpi.Get_size()    # (all on one node: the whole comm everywhere, else smaller
        if not one_node:                     # everywhere: the same verdict on every member)
            ours, theirs = split.Get_group(), mpi.Get_group()
            node_ranks = list(MPI.Group.Translate_ranks(ours, list(range(here)), theirs))
            ours.Free()
            theirs.Free()
            first = node_ranks[0]            # (in blocks: this node holds ranks first.. first + here - 1)
            block = node_ranks == list(range(first, first + here)) and first % here == 0
            # max of (size, -size, -block): every node alike if max == -(-min); every node in blocks
            span = np.array([here, -here, -int(block)], dtype=np.int64)
            making.call("Allreduce", (MPI.IN_PLACE, [span, MPI.INT64_T], MPI.MAX), set_up,
                        ("", None, "its layout's agreement (internal MPI Allreduce)"))
        if one_node or here == 1 or span[0] != -span[1]:
            split.Free()
            split = None
    return LibComm(mpi, label, bool(agreed["MPICOLL_VALIDATE"]), bool(agreed["MPICOLL_DEBUG"]), bool(table[:, 1].any()),
                   one_node, split, bool(agreed["MPICOLL_EXACT"]), split is not None and span[2] == -1, timeout,
                   crowded)


def tiers(comm: LibComm) -> tuple[LibComm, LibComm]:
    """The two communicators of a tiered AllReduce on ``comm`` (``per_node`` > 0), made on first use
    like :func:`mpicoll._shm.node_window`: this rank's node's members (``local``: they share a node
    window), and the members with this rank's index on its node, one per node (rank order kept in
    both). Freed with ``comm``."""
    if comm.tiered is None:
        comm.meet("make its node and cross-node communicators (a rank never made its first large "
                  "AllReduce there)")
        k = comm.node_comm.Get_rank()
        across = comm.mpi.Split(k, comm.rank)
        comm.tiered = (make(comm.node_comm, f"{comm.label}: the members on this node", comm.timeout),
                       make(across, f"{comm.label}: the members with node index {k}", comm.timeout))
    return comm.tiered
