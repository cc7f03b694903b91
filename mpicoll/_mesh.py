"""``ep x tp`` meshes of the world: each rank's expert-parallel and tensor-parallel domain names, for
the two common layouts, declared as comm domains."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ._comm import alive
from ._domains import declare_domains
from ._errors import CollectiveArgumentError


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
