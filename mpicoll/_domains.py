"""THE comm-domain registry: names -> cached library communicators, meshes, rank tables.

Library traffic never runs on a user's communicator: the world is duplicated once (:func:`world`)
and a user ``comm`` is duplicated once, the duplicate cached on it as an MPI attribute (freed with
it). Each is a :class:`~mpicoll._comm.LibComm`.

Domains are formed by their members only, as HCCL's are, and nothing runs on any other rank, not
even a set-up: ranks 0 and 1 can form domain "x" and run on it while ranks 2 and 3 never touch
mpicoll. The members meet on the domain's name in the process manager's name service
(:mod:`mpicoll._rendezvous`), then call ``Comm.Create_group``, which involves nobody else.
Meshes live in :mod:`mpicoll._mesh`, rank tables in :mod:`mpicoll._ranktable`.

A name-keyed cache in front of a world-collective ``Comm.Split`` would deadlock here as soon as some
ranks form a new domain while others reuse a cached one.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _rendezvous, _trace, _watchdog
from ._comm import LOCK, LibComm, alive
from ._making import make
from ._errors import CollectiveArgumentError, CollectiveError, arg_error

_WORLD: LibComm | None = None
_DOMAINS: dict[str, LibComm] = {}
_DECLARED: dict[str, tuple[int, ...]] = {}
_KEYVAL: int | None = None
_USER: dict[str, MPI.Comm] = {}       # name -> the user's duplicate handed out by domain()
_UNLINKED = False      # (this process has unlinked MPICH's shared-memory files: _own)


def init() -> None:
    """Set up mpicoll's duplicate of the world (collective over ``MPI.COMM_WORLD``).

    Optional: the first operation on the world does it, and comm domains never need it.
    """
    world()


def world(set_up: float | None = None) -> LibComm:
    """mpicoll's duplicate of ``MPI.COMM_WORLD`` (made by the first operation on the world).
    ``set_up``: seconds its making may wait for every rank (a torch ``init_process_group``'s
    ``timeout=``; default ``MPICOLL_TIMEOUT``'s), if this call makes it."""
    global _WORLD
    if _WORLD is None:
        _WORLD = _own(_dup(MPI.COMM_WORLD, "the world", set_up=set_up), "mpicoll.world", "the world (mpicoll.world)",
                      set_up=set_up)
    return _WORLD


def _own(comm: MPI.Comm, name: str, label: str, timeout: float | None = None,
         set_up: float | None = None) -> LibComm:
    """Name and wrap a communicator mpicoll has just made: the world's or a user comm's ``Idup``, a
    domain's ``Create_group``. Every entry path (operations, plans, graphs, node buffers, the Hccl
    client) gets its first library communicator here, so this is where, once per process, the
    names of MPICH's shared-memory files are unlinked (:func:`~mpicoll._watchdog.unlink_own_segments`):
    a job that ends without ``MPI_Finalize`` (killed, or aborted by ``python -m mpi4py`` after an
    uncaught error) then leaves nothing in /dev/shm, whichever communicator it used.

    Safe here: the collective that made ``comm`` has completed, so every member has started and
    mapped the file. Ranks outside a domain have too: MPICH's ``MPI_Init`` returns on no rank
    before every rank of the job has mapped it (measured: a rank that unlinked as soon as its
    ``MPI_Init`` returned, with a peer starting 2 s later, left that peer working).
    """
    global _UNLINKED
    first = not _UNLINKED
    if first:
        _UNLINKED = True
        _watchdog.unlink_own_segments()
    comm.Set_name(name)
    lib = make(comm, label, timeout, set_up)
    _trace.from_settings(first, lib.mpi if name == "mpicoll.world" else None)   # (MPICOLL_TRACE)
    return lib


def _dup(comm: MPI.Comm, what: str, timeout: float | None = None, set_up: float | None = None) -> MPI.Comm:
    """The ``Idup`` that makes a library communicator, under the watchdog when timed (``set_up``,
    else ``timeout``: the communicator's own, else ``MPICOLL_TIMEOUT``'s): made on the world or on
    the user's communicator, before any LibComm exists (so not a LibComm call)."""
    alive(f"duplicating {what}")
    new, req = comm.Idup()
    seconds, own = _watchdog.set_up_limit(timeout, set_up)
    _watchdog.wait([req], seconds, lambda: f"duplicating {what}: timed out after {seconds:g} s: some rank has not "
                   "reached it", own=own)
    return new


def user_comm(comm: MPI.Comm, timeout: float | None = None, set_up: float | None = None) -> LibComm:
    """mpicoll's private duplicate of a user communicator (collective over it on first use only).
    ``timeout``: the duplicate's own watchdog timeout (:class:`LibComm`), given alike by every
    member at that first use (mpicoll.torch's groups); ``set_up``: how long its making may wait
    for every member (default: that timeout)."""
    global _KEYVAL
    if comm == MPI.COMM_WORLD:
        return world()
    with LOCK:
        if _KEYVAL is None:
            _KEYVAL = MPI.Comm.Create_keyval(delete_fn=lambda _c, _k, lib: lib.free())
    lib = comm.Get_attr(_KEYVAL)
    if lib is None:
        name = comm.Get_name() or "comm"
        lib = _own(_dup(comm, f"user comm {name!r}", timeout, set_up), f"mpicoll.user.{name}", f"user comm {name!r}",
                   timeout, set_up)
        comm.Set_attr(_KEYVAL, lib)
    return lib


def check_name(name: object, op: str = "comm domain", param: str = "comm_domain") -> None:
    """The rule for a comm-domain name (the one place it is written), checked before anything is
    made: a str ("" names the world) with no NUL character. MPI keeps names as C strings:
    ``Comm.Set_name`` refuses a NUL, but only after the members met and formed the domain.

    Raises:
        CollectiveArgumentError: naming ``op``, ``param``, the name and this world rank.
    """
    if not isinstance(name, str) or "\0" in name:
        raise arg_error(op, param, name, MPI.COMM_WORLD.Get_rank(),
                        "a domain name must be a str with no NUL character (MPI keeps names as C strings)")


def lookup(name: str) -> LibComm | None:
    """The library communicator of a domain this rank has formed (or the world for ""), else None."""
    if not name:
        return world()
    return _DOMAINS.get(name)


def lib_domain(name: str, rank_size: int | None = None) -> LibComm:
    """The :class:`LibComm` of comm domain ``name``, formed on first use (see :func:`domain`).

    A member that gives no ``rank_size`` for an undeclared domain still meets the others, so that
    every member raises the same error instead of its peers waiting for it. A bad name raises on
    this rank alone, at once: a member naming another domain cannot be told (its peers wait for
    it until ``MPICOLL_DOMAIN_TIMEOUT``, as for any name that differs between members).
    """
    comm = lookup(name)
    if comm is not None:
        return comm
    alive(f"comm domain {name!r}")
    check_name(name)
    me = MPI.COMM_WORLD.Get_rank()
    declared = _DECLARED.get(name)
    if declared is not None:
        if me not in declared:
            raise CollectiveArgumentError(f"comm domain {name!r}: world rank {me} is not a member (declared members "
                                          f"{list(declared)})", param="comm_domain", rank=me)
        if rank_size is not None and rank_size != len(declared):
            raise CollectiveArgumentError(f"comm domain {name!r}: rank_size={rank_size!r} on world rank {me}: the "
                                          f"domain is declared with {len(declared)} members", param="rank_size", rank=me)
        members = _rendezvous.rendezvous(name, len(declared), declared)
    else:
        if rank_size is not None and (isinstance(rank_size, bool) or not isinstance(rank_size, (int, np.integer))
                                      or rank_size < 1):
            raise CollectiveArgumentError(f"comm domain {name!r}: rank_size={rank_size!r} on world rank {me}: must "
                                          "be an int >= 1", param="rank_size", rank=me)
        members = _rendezvous.rendezvous(name, None if rank_size is None else int(rank_size), None)
    lib = _own(_rendezvous.create(name, members), f"mpicoll.domain.{name}", f"domain {name!r}")
    # (the user's own duplicate, for domain(name), made now, while every member is here: made
    # later, at a domain() call only some members make, it would wait for the others)
    user = _dup(lib.mpi, f"domain {name!r} for its user")
    user.Set_name(f"user.{name}")
    with LOCK:
        _DOMAINS[name], _USER[name] = lib, user
    return lib


def domain(name: str, rank_size: int | None = None) -> MPI.Comm:
    """The communicator of comm domain ``name`` (formed on first use by its members only).

    Args:
        name: domain name; "" is the world.
        rank_size: number of members; required to form an undeclared domain, checked otherwise.

    Returns:
        The user's own duplicate of the domain's communicator (group-local rank order = world rank
        order), made when the domain was formed, the same one at every call: use it freely (mpicoll
        never calls MPI on it); freeing it is yours, after which ``domain(name)`` raises. For ""
        the world: ``MPI.COMM_WORLD``.

    Raises:
        CollectiveArgumentError: no rank_size for a new domain, this rank not a member of a declared
            domain, a name reused for another membership, members disagreeing on rank_size or on
            the member list.
        CollectiveTimeout: members did not all arrive within ``MPICOLL_DOMAIN_TIMEOUT`` seconds.
    """
    comm = lookup(name)
    if comm is not None and rank_size is not None and rank_size != comm.size:
        me = MPI.COMM_WORLD.Get_rank()
        raise CollectiveArgumentError(f"comm domain {name!r}: rank_size={rank_size!r} on world rank {me}: the domain "
                                      f"has {comm.size} members", param="rank_size", rank=me)
    if comm is None:
        lib_domain(name, rank_size)
    if not name:
        return MPI.COMM_WORLD
    mine = _USER[name]
    if mine == MPI.COMM_NULL:
        raise CollectiveError(f"comm domain {name!r}: the communicator mpicoll.domain() gave for it was freed "
                              "(Comm.Free): keep it while you use the domain's communicator", param="name",
                              rank=MPI.COMM_WORLD.Get_rank())
    return mine


def domain_members(name: str) -> tuple[int, ...]:
    """World ranks of a domain this rank has formed or declared."""
    if name in _DECLARED:
        return _DECLARED[name]
    comm = lookup(name)
    if comm is None:
        raise CollectiveArgumentError(f"comm domain {name!r} is neither formed on this rank nor declared",
                                      param="comm_domain")
    return comm.world_ranks


def declare_domains(table: dict[str, list[int]] | str) -> None:
    """Declare domains up front: ``{name: [world ranks]}`` or a JSON file of that object.

    Declared domains need no ``rank_size``; their members compare their member lists when they
    form the domain. Declaring a name again with another membership is an error. Local: no
    communication.
    """
    if isinstance(table, (str, os.PathLike)):
        with open(table, encoding="utf-8") as fh:
            table = json.load(fh)
    if not isinstance(table, dict):
        raise CollectiveArgumentError(f"declare_domains: expected a dict name -> world ranks, got "
                                      f"{type(table).__name__}", param="table")
    alive("declare_domains")
    world_size = MPI.COMM_WORLD.Get_size()
    for name, ranks in table.items():
        check_name(name, "declare_domains", "table")
        if not name:
            raise CollectiveArgumentError("declare_domains: domain name '': must be non-empty (\"\" names the world)",
                                          param="table")
        try:
            members = tuple(sorted(int(r) for r in ranks))
        except (TypeError, ValueError):
            raise CollectiveArgumentError(f"declare_domains: {name!r}={ranks!r}: must be a list of world ranks",
                                          param=name) from None
        if not members or len(set(members)) != len(members) or members[0] < 0 or members[-1] >= world_size:
            raise CollectiveArgumentError(
                f"declare_domains: {name!r}={list(ranks)!r}: members must be distinct world ranks in "
                f"[0, {world_size})", param=name)
        old = _DECLARED.get(name)
        formed = _DOMAINS.get(name)
        if (old is not None and old != members) or (formed is not None and formed.world_ranks != members):
            raise CollectiveArgumentError(
                f"declare_domains: {name!r} is already declared as {list(old or formed.world_ranks)}; reusing a "
                f"domain name for a different membership ({list(members)}) is an error", param=name)
        with LOCK:
            _DECLARED[name] = members


def resolve(op: str, comm: Any, name: Any, rank_size: Any, what: str) -> LibComm:
    """The library communicator for a user comm, else a domain name, else the world (the one
    place that maps an operation's, or the Hccl client's, arguments to a communicator)."""
    if comm is not None:
        if not isinstance(comm, MPI.Comm):
            raise CollectiveArgumentError(f"{op}: comm={comm!r}: must be an mpi4py MPI.Comm", op=op, param="comm")
        if comm == MPI.COMM_NULL:
            raise CollectiveArgumentError(f"{op}: comm is MPI.COMM_NULL (a freed or null communicator): give a live "
                                          "one", op=op, param="comm")
        return user_comm(comm)
    if name:
        check_name(name, op, what)
        return lookup(name) or lib_domain(name, rank_size)
    return world()


#: the domain name of each list of world ranks given as a group (declared once, as torch's new_group)
_GROUPS: dict[tuple[int, ...], str] = {}


def group_fields(group: Any, op: str, what: str = "group") -> dict | None:
    """The Param fields that name a group (the one mapping of the group forms every API takes):
    None or "" the world, a domain name, a list of world ranks (a domain of those ranks, declared
    at its first use, as torch's ``new_group``), or an mpi4py communicator (a user comm). None: a
    list this rank is not in (it takes no part in the call).

    Raises:
        CollectiveArgumentError: anything else, or a list that is not of world ranks, naming ``op``
            and ``what``.
    """
    if group is None or group == "":
        return {}
    if isinstance(group, str):
        return {"comm_domain": group}
    if isinstance(group, MPI.Comm):
        return {"comm": group}
    alive(op)
    me = MPI.COMM_WORLD.Get_rank()
    if isinstance(group, (list, tuple, range)):
        size = MPI.COMM_WORLD.Get_size()
        try:
            ranks = tuple(sorted({int(r) for r in group}))
            ok = not any(isinstance(r, bool) for r in group) and (not ranks or 0 <= ranks[0] and ranks[-1] < size)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise arg_error(op, what, group, me, f"must be a list of world ranks, in [0, {size})")
        name = _GROUPS.get(ranks)
        if name is None:
            name = _GROUPS[ranks] = "mpicoll.group:" + ",".join(map(str, ranks))
            if me in ranks:
                declare_domains({name: list(ranks)})
        return {"comm_domain": name} if me in ranks else None
    raise arg_error(op, what, group, me, "must be None, a domain name, a list of world ranks or an mpi4py communicator")


def resolve_group(op: str, group: Any, rank_size: int | None = None, what: str = "group") -> LibComm:
    """:func:`resolve` of a group given in one of :func:`group_fields`' forms (a list must hold this
    rank)."""
    f = group_fields(group, op, what)
    if f is None:
        raise arg_error(op, what, list(group), MPI.COMM_WORLD.Get_rank(), "must hold this world rank")
    return resolve(op, f.get("comm"), f.get("comm_domain", ""), rank_size, what)
