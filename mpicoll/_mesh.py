"""``ep x tp`` meshes: each rank's expert-parallel and tensor-parallel domain names of the world, for
the two common layouts, declared as comm domains (:func:`mesh`); and the rule of the ep and tp
domains an operator on a mesh is given (:func:`mesh_domains`, :func:`check_domains`: the
AllToAllAllGather and fused MoE operators)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from ._comm import LibComm, alive
from ._domains import declare_domains, resolve
from ._errors import CollectiveArgumentError, arg_error


@dataclass(frozen=True)
class Mesh:
    """One rank's place in an ``ep x tp`` mesh (see :func:`mesh`)."""

    ep: int
    tp: int
    layout: str
    ep_domain: str
    tp_domain: str
    ep_rank: int
    tp_rank: int
    table: dict[str, tuple[int, ...]]


_LAYOUTS = ("tp_contiguous", "ep_contiguous")


def mesh(ep: int, tp: int, layout: str = "tp_contiguous", *, rank: int | None = None,
         declare: bool = True, prefix: str = "") -> Mesh:
    """Domain names for an ``ep x tp`` mesh of the world.

    Layouts: ``"tp_contiguous"``: world rank = s * tp + t (a tp group is a run of consecutive ranks);
    ``"ep_contiguous"``: world rank = t * ep + s. s is the ep-local rank, t the tp-local rank.

    Args:
        ep, tp: mesh sizes; ``ep * tp`` must equal the world size.
        layout: one of the two layouts above.
        rank: world rank to describe (default: this rank).
        declare: also declare the mesh's domains (so they need no rank_size; their members compare
            member lists when they meet).
        prefix: prepended to the generated domain names.

    Returns:
        A :class:`Mesh` with this rank's ``ep_domain``/``tp_domain`` names and local ranks.
    """
    alive("mesh")
    world = MPI.COMM_WORLD.Get_size()
    for pname, v in (("ep", ep), ("tp", tp)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise CollectiveArgumentError(f"mesh: {pname}={v!r}: must be an int >= 1", param=pname)
    if layout not in _LAYOUTS:
        raise CollectiveArgumentError(f"mesh: layout={layout!r}: must be one of {_LAYOUTS}", param="layout")
    if ep * tp != world:
        raise CollectiveArgumentError(f"mesh: ep={ep} x tp={tp} = {ep * tp}: must equal the world size {world}",
                                      param="ep")
    rank = MPI.COMM_WORLD.Get_rank() if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world:
        raise CollectiveArgumentError(f"mesh: rank={rank!r}: must be a world rank in [0, {world})", param="rank")
    if layout == "tp_contiguous":
        where = lambda s, t: s * tp + t  # noqa: E731
    else:
        where = lambda s, t: t * ep + s  # noqa: E731
    s, t = next((s, t) for s in range(ep) for t in range(tp) if where(s, t) == rank)
    tag = f"{prefix}{layout}:{ep}x{tp}"
    table = {f"{tag}:ep{tt}": tuple(where(ss, tt) for ss in range(ep)) for tt in range(tp)}
    table.update({f"{tag}:tp{ss}": tuple(where(ss, tt) for tt in range(tp)) for ss in range(ep)})
    if declare:
        declare_domains({k: list(v) for k, v in table.items()})
    return Mesh(ep, tp, layout, f"{tag}:ep{t}", f"{tag}:tp{s}", s, t, table)


def mesh_domains(op: str, rank: int, group_ep: Any, group_tp: Any, ep_size: Any, tp_size: Any
                 ) -> tuple[LibComm, LibComm]:
    """The ep and tp domains an operator on a mesh is given (with :func:`check_domains`, the one
    rule of them): two domain names of 1 to 127 characters that differ, each domain formed by its
    members (collective: ``ep_size``/``tp_size`` are needed to form a domain that is not declared).

    Raises:
        CollectiveArgumentError: a name that breaks the rule, naming ``op`` and ``rank``.
    """
    for name, v in (("group_ep", group_ep), ("group_tp", group_tp)):
        if not isinstance(v, str) or not 0 < len(v) < 128:
            raise arg_error(op, name, v, rank, "must be a domain name of 1 to 127 characters")
    if group_ep == group_tp:
        raise arg_error(op, "group_tp", group_tp, rank, f"must differ from group_ep ({group_ep!r}): the two name "
                        "two different domains")
    return resolve(op, None, group_ep, ep_size, "group_ep"), resolve(op, None, group_tp, tp_size, "group_tp")


def check_domains(op: str, rank: int, mesh: LibComm, ep: LibComm, tp: LibComm, ep_size: Any, tp_size: Any,
                  sizes: tuple[int, ...] | None = None) -> None:
    """The rest of the rule, once every member is past the collective set-up (a rank that breaks it
    keeps the error, agreed at the operation's first call): each domain of the size given (and, with
    ``sizes``, of one of those), inside ``mesh``, the operator's own communicator.

    Raises:
        CollectiveArgumentError: naming ``op``, the size or the domain, and ``rank``.
    """
    for name, comm, size in (("ep_world_size", ep, ep_size), ("tp_world_size", tp, tp_size)):
        if sizes is not None and comm.size not in sizes:
            raise arg_error(op, name, comm.size, rank, f"the domain has {comm.size} members: must be one of "
                            f"{list(sizes)}")
        if size is not None and size != comm.size:
            raise arg_error(op, name, size, rank, f"the domain has {comm.size} members")
        if not set(comm.world_ranks) <= set(mesh.world_ranks):
            raise arg_error(op, name[:2] + " domain", list(comm.world_ranks), rank,
                            f"must lie inside {mesh.label} ({list(mesh.world_ranks)})")
