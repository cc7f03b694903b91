"""The cores of a node: the CPU sets of a communicator's members on this rank's node (the one place
they are read), from which mpicoll decides whether a node is crowded (more ranks than cores:
:func:`mpicoll._watchdog.crowded`, when a library communicator is made) and how many BLAS threads a
fused operator's rank may use (``ops/_moe.blas_threads``)."""
from __future__ import annotations

import os

from mpi4py import MPI


def node_affinities(mpi: MPI.Comm) -> tuple[list[set[int]], set[int]]:
    """The CPU sets (affinities: taskset, cpusets and ``mpirun -bind-to`` count) of the members of
    ``mpi`` on this rank's node, in their rank order there, and this rank's (read by :func:`cpu_sets`,
    the one place that reads them; collective over ``mpi``, on a node communicator made and freed here)."""
    local = mpi.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return cpu_sets(local)
    finally:
        local.Free()


def cpu_sets(node: MPI.Comm) -> tuple[list[set[int]], set[int]]:
    """:func:`node_affinities` on ``node``, a communicator of one node's members (collective)."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return [set(s) for s in node.allgather(mine)], set(mine)
