"""THE comm-domain registry: names -> cached sub-communicators, meshes, rank tables.

Library traffic never runs on a user's communicator: the world is duplicated once
(:func:`runtime`) and a user ``comm`` is duplicated once, the duplicate cached on it as an MPI
attribute (freed with it).

Domains are formed by their members only, as HCCL's are: a member looks the name up in a small
table held in an RMA window on world rank 0 (created once, in :func:`init`), under an exclusive
lock. The first member to arrive becomes the domain's leader; the others send it their world rank;
the leader answers each with the sorted member list, and the members call ``Comm.Create_group``,
which involves nobody else. So ranks 0 and 1 can form domain "x" while ranks 2 and 3 form "y", or
do nothing at all. A name-keyed cache in front of a world-collective ``Comm.Split`` would deadlock
here as soon as some ranks form a new domain while others reuse a cached one.
"""
from __future__ import annotations

import atexit
import hashlib
import ipaddress
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ._errors import CollectiveArgumentError, CollectiveError, CollectiveTimeout

_SLOT = 4                      # int64 words per table slot: key, size, leader + 1, state
_FORMING, _FORMED, _FAILED, _DECLARED, _TIMED_OUT = 0, 1, 2, 3, 4
_TAG_BASE = 7000               # rendezvous p2p tags on the library world: _TAG_BASE + 2 * slot (+1 for replies)


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        raise CollectiveArgumentError(f"environment {name}={os.environ[name]!r}: must be a number",
                                      param=name) from None


@dataclass
class _Runtime:
    world: MPI.Comm
    group: MPI.Group
    win: MPI.Win
    slots: int
    arrivals_win: MPI.Win   # the watchdog's arrival mark: 2 int64 on every rank, read remotely on a timeout
    domains: dict[str, MPI.Comm] = field(default_factory=dict)
    declared: dict[str, tuple[int, ...]] = field(default_factory=dict)


_RT: _Runtime | None = None
_KEYVAL: int | None = None


def init() -> None:
    """Set mpicoll up: a collective over ``MPI.COMM_WORLD``, done once.

    The first mpicoll call on every rank (any operation, domain or this) does it implicitly, so
    call it explicitly only when some ranks may form comm domains before the others touch mpicoll.
    Domain table size: ``MPICOLL_MAX_DOMAINS`` (default 1024).
    """
    runtime()


def runtime() -> _Runtime:
    """The library's world duplicate and rendezvous window (created on first use)."""
    global _RT
    if _RT is None:
        world = MPI.COMM_WORLD.Dup()
        world.Set_name("mpicoll.world")
        slots = int(_env_float("MPICOLL_MAX_DOMAINS", 1024))
        size = slots * _SLOT * 8 if world.Get_rank() == 0 else 0
        win = MPI.Win.Allocate(size, 8, comm=world)
        marks = MPI.Win.Allocate(2 * 8, 8, comm=world)
        np.frombuffer(marks.tomemory(), dtype=np.int64)[:] = 0
        if world.Get_rank() == 0:
            np.frombuffer(win.tomemory(), dtype=np.int64)[:] = 0
        world.Barrier()
        marks.Lock_all()
        _RT = _Runtime(world, world.Get_group(), win, slots, marks)
        # Runs before mpi4py's own finalizer (atexit is LIFO): free the window (a collective, as
        # MPI_Finalize itself is) so that MPI does not finalize with it still exposed.
        atexit.register(_shutdown)
        _watch_mpi4py_exit()
    return _RT


#: the exit status ``python -m mpi4py`` decided on (it aborts the job at exit when non-zero)
_EXIT: list = []


def _watch_mpi4py_exit() -> None:
    """Record the status mpi4py's ``-m`` runner passes to ``set_abort_status`` (if it is running)."""
    runner = sys.modules.get("mpi4py.run")
    original = getattr(runner, "set_abort_status", None)
    if original is None or getattr(original, "_mpicoll", False):
        return

    def set_abort_status(status):
        _EXIT.append(status)
        return original(status)
    set_abort_status._mpicoll = True
    runner.set_abort_status = set_abort_status


def _failing_exit() -> bool:
    if getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None:
        return True                          # an unhandled exception was printed
    for status in _EXIT:
        code = status.code if isinstance(status, SystemExit) else status
        if isinstance(status, BaseException) and not isinstance(status, SystemExit):
            return True
        if code not in (0, None):
            return True
    return False


def _shutdown() -> None:
    """Free the window at a clean exit. After an unhandled exception or a non-zero exit (``python -m
    mpi4py`` then aborts the job) skip it: freeing is collective and would wait for ranks that are
    still inside some collective, turning a prompt abort into a hang."""
    global _RT
    rt, _RT = _RT, None
    if rt is None or MPI.Is_finalized() or _failing_exit():
        return
    rt.arrivals_win.Unlock_all()
    rt.arrivals_win.Free()
    rt.win.Free()


def library_comm(comm: MPI.Comm) -> MPI.Comm:
    """mpicoll's private duplicate of a user communicator (collective over it on first use only)."""
    global _KEYVAL
    if comm == MPI.COMM_WORLD:
        return runtime().world
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=lambda _c, _k, dup: dup.Free())
    dup = comm.Get_attr(_KEYVAL)
    if dup is None:
        runtime()
        dup = comm.Dup()
        dup.Set_name(f"mpicoll.user.{comm.Get_name() or 'comm'}")
        comm.Set_attr(_KEYVAL, dup)
    return dup


def _key(name: str) -> int:
    key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little", signed=True)
    return key or 1


def _claim(rt: _Runtime, name: str, size: int, leader: int, state: int) -> tuple[int, np.ndarray]:
    """Find the slot of ``name`` in the shared table, or take a free one; returns (slot, entry)."""
    key = _key(name)
    table = np.empty((rt.slots, _SLOT), dtype=np.int64)
    rt.win.Lock(0, MPI.LOCK_EXCLUSIVE)
    try:
        rt.win.Get([table, MPI.INT64_T], 0)
        rt.win.Flush(0)
        hit = np.flatnonzero(table[:, 0] == key)
        if hit.size:
            slot = int(hit[0])
            entry = table[slot].copy()
        else:
            free = np.flatnonzero(table[:, 0] == 0)
            if not free.size:
                raise CollectiveError(f"comm domain {name!r}: the domain table is full ({rt.slots} names); "
                                      "raise MPICOLL_MAX_DOMAINS", param="comm_domain")
            slot = int(free[0])
            entry = np.array([key, size, leader + 1, state], dtype=np.int64)
            rt.win.Put([entry, MPI.INT64_T], 0, target=(slot * _SLOT, _SLOT, MPI.INT64_T))
    finally:
        rt.win.Unlock(0)
    return slot, entry


def _set_state(rt: _Runtime, slot: int, state: int) -> None:
    value = np.array([state], dtype=np.int64)
    rt.win.Lock(0, MPI.LOCK_EXCLUSIVE)
    rt.win.Put([value, MPI.INT64_T], 0, target=(slot * _SLOT + 3, 1, MPI.INT64_T))
    rt.win.Unlock(0)


def _recv(rt: _Runtime, source: int, tag: int, deadline: float, what: str) -> tuple[np.ndarray, int]:
    """Receive a small int64 message, polling with back-off so a missing peer becomes a timeout."""
    status = MPI.Status()
    pause = 1e-5
    while not rt.world.Iprobe(source, tag, status):
        if time.monotonic() > deadline:
            raise CollectiveTimeout(f"{what}: timed out (MPICOLL_DOMAIN_TIMEOUT)", param="comm_domain")
        time.sleep(pause)
        pause = min(pause * 2, 1e-2)
    buf = np.empty(status.Get_count(MPI.INT64_T), dtype=np.int64)
    rt.world.Recv([buf, MPI.INT64_T], status.Get_source(), tag)
    return buf, status.Get_source()


def _rendezvous(rt: _Runtime, name: str, size: int) -> tuple[int, tuple[int, ...]]:
    """Meet the other members of an undeclared domain; returns (slot, sorted world ranks)."""
    me = rt.world.Get_rank()
    deadline = time.monotonic() + _env_float("MPICOLL_DOMAIN_TIMEOUT", 300)
    slot, entry = _claim(rt, name, size, me, _FORMING)
    tsize, leader, state = int(entry[1]), int(entry[2]) - 1, int(entry[3])
    where = f"comm domain {name!r} (world rank {me})"
    if state == _FORMED:
        raise CollectiveArgumentError(
            f"{where}: the name is already formed with rank_size {tsize} and world rank {me} is not a "
            "member: reusing a domain name for a different membership is an error", param="comm_domain")
    if state == _FAILED:
        raise CollectiveArgumentError(f"{where}: forming this domain already failed (rank_size disagreement)",
                                      param="rank_size")
    if state == _TIMED_OUT:
        raise CollectiveTimeout(f"{where}: forming this domain already timed out (its leader gave up waiting "
                                "for members; MPICOLL_DOMAIN_TIMEOUT)", param="comm_domain")
    tag = _TAG_BASE + 2 * slot
    if leader != me:
        rt.world.Send([np.array([me, size], dtype=np.int64), MPI.INT64_T], leader, tag)
        reply, _ = _recv(rt, leader, tag + 1, deadline, f"{where}: waiting for leader world rank {leader}")
        if reply[0] == -2:
            raise CollectiveTimeout(f"{where}: timed out (MPICOLL_DOMAIN_TIMEOUT): only {int(reply[1])} of "
                                    f"rank_size {int(reply[2])} members arrived", param="comm_domain")
        if reply[0] < 0:
            raise CollectiveArgumentError(
                f"{where}: rank_size disagrees between members: world rank {int(reply[1])} says "
                f"{int(reply[2])}, world rank {leader} says {tsize}", param="rank_size")
        return slot, tuple(int(r) for r in reply[1:])
    members, bad = [me], None
    while len(members) < size:
        try:
            msg, src = _recv(rt, MPI.ANY_SOURCE, tag, deadline, f"{where}: leader waiting for members")
        except CollectiveTimeout as exc:
            # tell the members that did arrive, so that they fail now rather than at their own deadline
            _set_state(rt, slot, _TIMED_OUT)
            notice = np.array([-2, len(members), size], dtype=np.int64)
            for r in members[1:]:
                rt.world.Send([notice, MPI.INT64_T], r, tag + 1)
            raise CollectiveTimeout(f"{exc}: {len(members)} of rank_size {size} arrived (world ranks "
                                    f"{sorted(members)})", param="comm_domain") from None
        members.append(src)
        if int(msg[1]) != size:
            bad = (src, int(msg[1]))
            break
    if bad is not None:
        _set_state(rt, slot, _FAILED)
        notice = np.array([-1, bad[0], bad[1]], dtype=np.int64)
        for r in members[1:]:
            rt.world.Send([notice, MPI.INT64_T], r, tag + 1)
        raise CollectiveArgumentError(
            f"{where}: rank_size disagrees between members: world rank {bad[0]} says {bad[1]}, "
            f"world rank {me} says {size}", param="rank_size")
    _set_state(rt, slot, _FORMED)
    members.sort()
    reply = np.array([0, *members], dtype=np.int64)
    for r in members:
        if r != me:
            rt.world.Send([reply, MPI.INT64_T], r, tag + 1)
    return slot, tuple(members)


def domain(name: str, rank_size: int | None = None) -> MPI.Comm:
    """The communicator of comm domain ``name`` (formed on first use by its members only).

    Args:
        name: domain name; "" is the world.
        rank_size: number of members; required to form an undeclared domain, checked otherwise.

    Returns:
        A library-owned communicator; group-local rank order = world rank order.

    Raises:
        CollectiveArgumentError: no rank_size for a new domain, this rank not a member of a declared
            domain, a name reused for another membership, or members disagreeing on rank_size.
        CollectiveTimeout: members did not all arrive within ``MPICOLL_DOMAIN_TIMEOUT`` seconds.
    """
    rt = runtime()
    if not name:
        comm = rt.world
    else:
        comm = rt.domains.get(name)
    me = rt.world.Get_rank()
    if comm is not None and rank_size is not None and rank_size != comm.Get_size():
        raise CollectiveArgumentError(f"comm domain {name!r}: rank_size={rank_size!r} on world rank {me}: the domain "
                                      f"has {comm.Get_size()} members", param="rank_size", rank=me)
    if comm is None:
        declared = rt.declared.get(name)
        if declared is not None:
            if me not in declared:
                raise CollectiveArgumentError(
                    f"comm domain {name!r}: world rank {me} is not a member (declared members "
                    f"{list(declared)})", param="comm_domain", rank=me)
            slot, entry = _claim(rt, name, len(declared), -1, _DECLARED)
            if int(entry[1]) != len(declared):
                raise CollectiveArgumentError(
                    f"comm domain {name!r}: declared with {len(declared)} members but already formed with "
                    f"rank_size {int(entry[1])}", param="comm_domain", rank=me)
            members = declared
        else:
            if rank_size is None:
                raise CollectiveArgumentError(
                    f"comm domain {name!r}: rank_size is required on world rank {me} to form an undeclared "
                    "domain (members rendezvous by count)", param="rank_size", rank=me)
            if isinstance(rank_size, bool) or not isinstance(rank_size, (int, np.integer)) or rank_size < 1:
                raise CollectiveArgumentError(
                    f"comm domain {name!r}: rank_size={rank_size!r} on world rank {me}: must be an int >= 1",
                    param="rank_size", rank=me)
            slot, members = _rendezvous(rt, name, int(rank_size))
        comm = rt.world.Create_group(rt.group.Incl(list(members)), tag=_TAG_BASE + 2 * slot)
        comm.Set_name(f"mpicoll.domain.{name}")
        rt.domains[name] = comm
    return comm


def domain_members(name: str) -> tuple[int, ...]:
    """World ranks of a domain this rank has formed or declared."""
    rt = runtime()
    if name in rt.declared:
        return rt.declared[name]
    comm = rt.domains.get(name) if name else rt.world
    if comm is None:
        raise CollectiveArgumentError(f"comm domain {name!r} is neither formed on this rank nor declared",
                                      param="comm_domain")
    return tuple(MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())), rt.group))


def declare_domains(table: dict[str, list[int]] | str) -> None:
    """Declare domains up front: ``{name: [world ranks]}`` or a JSON file of that object.

    Declared domains need no rendezvous and no ``rank_size``. Declaring a name again with another
    membership is an error. Not collective, except that it sets mpicoll up (:func:`init`) if this is
    the rank's first mpicoll call.
    """
    if isinstance(table, (str, os.PathLike)):
        with open(table, encoding="utf-8") as fh:
            table = json.load(fh)
    if not isinstance(table, dict):
        raise CollectiveArgumentError(f"declare_domains: expected a dict name -> world ranks, got "
                                      f"{type(table).__name__}", param="table")
    rt = runtime()
    world = rt.world.Get_size()
    for name, ranks in table.items():
        if not isinstance(name, str) or not name:
            raise CollectiveArgumentError(f"declare_domains: domain name {name!r}: must be a non-empty str",
                                          param="table")
        try:
            members = tuple(sorted(int(r) for r in ranks))
        except (TypeError, ValueError):
            raise CollectiveArgumentError(f"declare_domains: {name!r}={ranks!r}: must be a list of world ranks",
                                          param=name) from None
        if not members or len(set(members)) != len(members) or members[0] < 0 or members[-1] >= world:
            raise CollectiveArgumentError(
                f"declare_domains: {name!r}={list(ranks)!r}: members must be distinct world ranks in "
                f"[0, {world})", param=name)
        old = rt.declared.get(name)
        if old is not None and old != members:
            raise CollectiveArgumentError(
                f"declare_domains: {name!r} is already declared as {list(old)}; reusing a domain name "
                f"for a different membership ({list(members)}) is an error", param=name)
        rt.declared[name] = members


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
        declare: also declare the mesh's domains (so they need no rendezvous).
        prefix: prepended to the generated domain names.

    Returns:
        A :class:`Mesh` with this rank's ``ep_domain``/``tp_domain`` names and local ranks.
    """
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


# ----------------------------------------------------------------------------- rank tables

@dataclass(frozen=True)
class Device:
    device_id: int
    device_ip: str
    rank_id: int


@dataclass(frozen=True)
class Server:
    server_id: str
    devices: tuple[Device, ...]


@dataclass(frozen=True)
class RankTable:
    """A validated HCCL rank table."""

    version: str
    servers: tuple[Server, ...]
    source: str = "<dict>"

    @property
    def size(self) -> int:
        return sum(len(s.devices) for s in self.servers)

    def host_of(self, rank: int) -> str:
        for s in self.servers:
            if any(d.rank_id == rank for d in s.devices):
                return s.server_id
        raise CollectiveArgumentError(f"rank table {self.source}: no device has rank_id {rank}", param="rank_id")

    def hosts(self) -> str:
        """Host list for ``mpirun -hosts`` (hydra): ``"host1:2,host2:2"``, servers in rank order.

        Raises:
            CollectiveArgumentError: a server whose rank ids are not consecutive (hydra places
                ranks on hosts in blocks, so such a table has no host list).
        """
        order = sorted(self.servers, key=lambda s: min(d.rank_id for d in s.devices))
        for s in order:
            ids = sorted(d.rank_id for d in s.devices)
            if ids != list(range(ids[0], ids[0] + len(ids))):
                raise CollectiveArgumentError(f"rank table {self.source}: server {s.server_id!r} has rank ids {ids}: "
                                              "hosts() needs consecutive rank ids per server", param="rank_id")
        return ",".join(f"{s.server_id}:{len(s.devices)}" for s in order)

    def check_world(self, world_size: int) -> None:
        """Raise unless the table describes exactly ``world_size`` ranks."""
        if self.size != world_size:
            raise CollectiveArgumentError(
                f"rank table {self.source}: $.server_list has {self.size} devices: must equal the MPI world "
                f"size {world_size}", param="rank_table_file")


def _bad(src: str, path: str, value: object, rule: str) -> CollectiveArgumentError:
    return CollectiveArgumentError(f"rank table {src}: {path}={value!r}: {rule}", param=path)


def _int_str(src: str, path: str, value: object) -> int:
    if not isinstance(value, str) or not value.strip().isdigit():
        raise _bad(src, path, value, "must be a string holding a non-negative integer")
    return int(value)


def load_rank_table(source: str | dict) -> RankTable:
    """Load and validate an HCCL rank table (a path, a JSON text or a dict).

    Raises:
        CollectiveArgumentError: naming the JSON path of the first bad field
            (``$.server_list[1].device[0].rank_id``).
    """
    src = "<dict>"
    if isinstance(source, (str, os.PathLike)) and not str(source).lstrip().startswith("{"):
        src = str(source)
        try:
            with open(source, encoding="utf-8") as fh:
                source = json.load(fh)
        except OSError as exc:
            raise CollectiveArgumentError(f"rank table {src}: cannot read: {exc}", param="rank_table_file") from exc
        except json.JSONDecodeError as exc:
            raise CollectiveArgumentError(f"rank table {src}: not JSON: {exc}", param="rank_table_file") from exc
    elif isinstance(source, str):
        src = "<json>"
        try:
            source = json.loads(source)
        except json.JSONDecodeError as exc:
            raise CollectiveArgumentError(f"rank table {src}: not JSON: {exc}", param="rank_table_file") from exc
    if not isinstance(source, dict):
        raise _bad(src, "$", type(source).__name__, "must be a JSON object")
    if source.get("status") != "completed":
        raise _bad(src, "$.status", source.get("status"), 'must be "completed"')
    version = source.get("version")
    if not isinstance(version, str):
        raise _bad(src, "$.version", version, "must be a string")
    servers_json = source.get("server_list")
    if not isinstance(servers_json, list) or not servers_json:
        raise _bad(src, "$.server_list", servers_json, "must be a non-empty list")
    count = _int_str(src, "$.server_count", source.get("server_count"))
    if count != len(servers_json):
        raise _bad(src, "$.server_count", source.get("server_count"),
                   f"must equal the length of server_list ({len(servers_json)})")
    servers, seen = [], {}
    for i, sj in enumerate(servers_json):
        p = f"$.server_list[{i}]"
        if not isinstance(sj, dict):
            raise _bad(src, p, sj, "must be an object")
        sid = sj.get("server_id")
        if not isinstance(sid, str) or not sid:
            raise _bad(src, p + ".server_id", sid, "must be a non-empty string")
        devs_json = sj.get("device")
        if not isinstance(devs_json, list) or not devs_json:
            raise _bad(src, p + ".device", devs_json, "must be a non-empty list")
        devices = []
        for j, dj in enumerate(devs_json):
            q = f"{p}.device[{j}]"
            if not isinstance(dj, dict):
                raise _bad(src, q, dj, "must be an object")
            dev = _int_str(src, q + ".device_id", dj.get("device_id"))
            ip = dj.get("device_ip")
            try:
                ipaddress.ip_address(ip)
            except (TypeError, ValueError):
                raise _bad(src, q + ".device_ip", ip, "must be an IP address string") from None
            rid = _int_str(src, q + ".rank_id", dj.get("rank_id"))
            if rid in seen:
                raise _bad(src, q + ".rank_id", dj.get("rank_id"), f"duplicate of {seen[rid]}")
            seen[rid] = q + ".rank_id"
            devices.append(Device(dev, ip, rid))
        servers.append(Server(sid, tuple(devices)))
    ids = sorted(seen)
    if ids != list(range(len(ids))):
        missing = sorted(set(range(len(ids))) - set(ids))
        raise _bad(src, "$.server_list[*].device[*].rank_id", ids,
                   f"rank ids must be 0..{len(ids) - 1} exactly; missing {missing}")
    return RankTable(version, tuple(servers), src)


_TABLES: dict[str, RankTable] = {}


def rank_table(path: str) -> RankTable:
    """:func:`load_rank_table` cached by path, checked against the MPI world size."""
    table = _TABLES.get(path)
    if table is None:
        table = load_rank_table(path)
        table.check_world(MPI.COMM_WORLD.Get_size())
        _TABLES[path] = table
    return table
