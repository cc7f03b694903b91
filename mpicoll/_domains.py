"""THE comm-domain registry: names -> cached library communicators, meshes, rank tables.

Library traffic never runs on a user's communicator: the world is duplicated once (:func:`world`)
and a user ``comm`` is duplicated once, the duplicate cached on it as an MPI attribute (freed with
it). Each is a :class:`~mpicoll._comm.LibComm`.

Domains are formed by their members only, as HCCL's are, and nothing runs on any other rank, not
even a set-up: ranks 0 and 1 can form domain "x" and run on it while ranks 2 and 3 never touch
mpicoll. The members meet on the domain's name in the process manager's name service
(``MPI_Publish_name`` / ``MPI_Lookup_name``, which hydra, the launcher of the MPICH wheel, keeps
for the job; see :func:`_rendezvous`), then call ``Comm.Create_group``, which involves nobody
else. No message goes to a rank that might never read it (MPICH refuses to finalize a
communicator holding an unread message).

A name-keyed cache in front of a world-collective ``Comm.Split`` would deadlock here as soon as some
ranks form a new domain while others reuse a cached one.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ._comm import LOCK, LibComm
from ._errors import CollectiveArgumentError, CollectiveError, CollectiveTimeout
from ._watchdog import timeout_default

_WORLD: LibComm | None = None
_DOMAINS: dict[str, LibComm] = {}
_DECLARED: dict[str, tuple[int, ...]] = {}
_KEYVAL: int | None = None


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        raise CollectiveArgumentError(f"environment {name}={os.environ[name]!r}: must be a number",
                                      param=name) from None


def init() -> None:
    """Set up mpicoll's duplicate of the world (collective over ``MPI.COMM_WORLD``).

    Optional: the first operation on the world does it, and comm domains never need it.
    """
    world()


def world() -> LibComm:
    """mpicoll's duplicate of ``MPI.COMM_WORLD`` (made by the first operation on the world)."""
    global _WORLD
    if _WORLD is None:
        comm = _dup(MPI.COMM_WORLD, "the world")
        comm.Set_name("mpicoll.world")
        _WORLD = LibComm.make(comm, "the world (mpicoll.world)")
    return _WORLD


def _dup(comm: MPI.Comm, what: str) -> MPI.Comm:
    new, req = comm.Idup()
    timeout = timeout_default()
    if timeout is None:
        req.Wait()
    else:
        from ._watchdog import wait
        wait([req], timeout, lambda: CollectiveTimeout(f"duplicating {what}: timed out after {timeout:g} s",
                                                      param="timeout"))
    return new


def user_comm(comm: MPI.Comm) -> LibComm:
    """mpicoll's private duplicate of a user communicator (collective over it on first use only)."""
    global _KEYVAL
    if comm == MPI.COMM_WORLD:
        return world()
    with LOCK:
        if _KEYVAL is None:
            _KEYVAL = MPI.Comm.Create_keyval(delete_fn=lambda _c, _k, lib: lib.free())
    lib = comm.Get_attr(_KEYVAL)
    if lib is None:
        name = comm.Get_name() or "comm"
        dup = _dup(comm, f"user comm {name!r}")
        dup.Set_name(f"mpicoll.user.{name}")
        lib = LibComm.make(dup, f"user comm {name!r}")
        comm.Set_attr(_KEYVAL, lib)
    return lib


def lookup(name: str) -> LibComm | None:
    """The library communicator of a domain this rank has formed (or the world for ""), else None."""
    if not name:
        return world()
    return _DOMAINS.get(name)


def lib_domain(name: str, rank_size: int | None = None) -> LibComm:
    """The :class:`LibComm` of comm domain ``name``, formed on first use (see :func:`domain`)."""
    comm = lookup(name)
    me = MPI.COMM_WORLD.Get_rank()
    if comm is not None:
        return comm
    declared = _DECLARED.get(name)
    if declared is not None:
        if me not in declared:
            raise CollectiveArgumentError(f"comm domain {name!r}: world rank {me} is not a member (declared members "
                                          f"{list(declared)})", param="comm_domain", rank=me)
        if rank_size is not None and rank_size != len(declared):
            raise CollectiveArgumentError(f"comm domain {name!r}: rank_size={rank_size!r} on world rank {me}: the "
                                          f"domain is declared with {len(declared)} members", param="rank_size", rank=me)
        members = _rendezvous(name, len(declared), declared)
    else:
        if rank_size is None:
            raise CollectiveArgumentError(
                f"comm domain {name!r}: rank_size is required on world rank {me} to form an undeclared domain "
                "(members rendezvous by count)", param="rank_size", rank=me)
        if isinstance(rank_size, bool) or not isinstance(rank_size, (int, np.integer)) or rank_size < 1:
            raise CollectiveArgumentError(f"comm domain {name!r}: rank_size={rank_size!r} on world rank {me}: must "
                                          "be an int >= 1", param="rank_size", rank=me)
        members = _rendezvous(name, int(rank_size), None)
    group = MPI.COMM_WORLD.Get_group()
    sub = group.Incl(list(members))
    comm = MPI.COMM_WORLD.Create_group(sub, tag=_key(name) % _tag())
    sub.Free()
    group.Free()
    comm.Set_name(f"mpicoll.domain.{name}")
    lib = LibComm.make(comm, f"domain {name!r}")
    with LOCK:
        _DOMAINS[name] = lib
    return lib


def domain(name: str, rank_size: int | None = None) -> MPI.Comm:
    """The communicator of comm domain ``name`` (formed on first use by its members only).

    Args:
        name: domain name; "" is the world.
        rank_size: number of members; required to form an undeclared domain, checked otherwise.

    Returns:
        A library-owned communicator; group-local rank order = world rank order.

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
    return (comm or lib_domain(name, rank_size)).mpi


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
    world_size = MPI.COMM_WORLD.Get_size()
    for name, ranks in table.items():
        if not isinstance(name, str) or not name:
            raise CollectiveArgumentError(f"declare_domains: domain name {name!r}: must be a non-empty str",
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
            _DECLARED_BY_FP[_fingerprint(members)] = list(members)


# ----------------------------------------------------------------------------- the rendezvous

def _key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 2


def _tag() -> int:
    """The ``Create_group`` tag range on ``MPI.COMM_WORLD``."""
    return MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)


def _fingerprint(members) -> int:
    return _key(",".join(map(str, members)))


def _job() -> str:
    """A token naming this job, for a name server shared by several jobs (hydra_nameserver)."""
    for var in ("PMIX_NAMESPACE", "SLURM_JOB_ID", "PMI_KVSNAME", "OMPI_MCA_ess_base_jobid"):
        if os.environ.get(var):
            return os.environ[var] + os.environ.get("SLURM_STEP_ID", "")
    return "job"


def _publish(service: str, value: str) -> bool:
    """Publish ``service`` (False when another rank already has). ``value`` is unique to this rank:
    Open MPI's name service (PRRTE) accepts a second publish of a name and keeps answering lookups
    with the first, so the lookup after publishing says who has it; MPICH's refuses the second."""
    try:
        MPI.Publish_name(service, value)
    except MPI.Exception as exc:
        if _lookup(service) is not None:      # (MPICH gives "taken" and "no name service" one error class)
            return False
        raise CollectiveError(f"comm domains need the process manager's name service (MPI_Publish_name), which "
                              f"failed here: {exc}. Use a user communicator instead (Param comm=...)",
                              param="comm_domain") from None
    return _lookup(service) == value


def _lookup(service: str) -> str | None:
    try:
        return MPI.Lookup_name(service)
    except MPI.Exception:
        return None


def _rendezvous(name: str, size: int, declared: tuple[int, ...] | None) -> tuple[int, ...]:
    """Meet the other members of domain ``name`` through the process manager's name service
    (``MPI_Publish_name`` / ``MPI_Lookup_name``: local calls that never involve another rank);
    returns the sorted world ranks of its members.

    The first member to publish the name's leader entry leads; every other member publishes a
    member entry (world rank, rank_size, member-list fingerprint) in one of ``2 * rank_size``
    slots. The leader reads the slots until ``rank_size - 1`` members are there, reads every
    slot once more, and only then publishes its verdict: the member list, or the error every
    member raises (a rank_size or member list that disagrees, a name in use by other ranks, a
    timeout). The entries stay published, so a later use of the name by other ranks is an error.
    """
    me = MPI.COMM_WORLD.Get_rank()
    if size == 1 and (declared is None or declared == (me,)):
        return (me,)
    fp = _fingerprint(declared) if declared else 0
    base = f"mpicoll-{_job()}-{_key(name):x}"
    where = f"comm domain {name!r}"
    timeout = _env_float("MPICOLL_DOMAIN_TIMEOUT", 300)
    deadline = time.monotonic() + timeout
    mine = f"{me}:{size}:{fp}"
    if _publish(f"{base}-L", mine):
        return _lead(base, where, me, size, fp, declared, deadline, timeout)
    leader = _lookup(f"{base}-L")
    lsize = int(leader.split(":")[1]) if leader else size
    start = me % (2 * lsize)
    for k in range(2 * lsize):          # a free member slot (linear probing from this rank's own)
        if _publish(f"{base}-m{(start + k) % (2 * lsize)}", mine):
            break
    else:
        raise CollectiveArgumentError(f"{where}: more ranks name it than its rank_size {lsize} allows: a name names "
                                      "one membership", param="comm_domain")
    pause = 1e-4
    while (verdict := _lookup(f"{base}-V")) is None:
        if time.monotonic() > deadline:
            raise CollectiveTimeout(f"{where}: timed out after {timeout:g} s (MPICOLL_DOMAIN_TIMEOUT) waiting for "
                                    f"the leader, world rank {leader.split(':')[0] if leader else '?'}",
                                    param="comm_domain")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    kind, text = _verdict(base, verdict)
    if kind == "ok":
        members = tuple(int(r) for r in text.split(","))
        if me in members:
            return members
        raise CollectiveArgumentError(f"{where}: already formed by world ranks {list(members)}; world rank {me} is "
                                      "not a member: a name names one membership", param="comm_domain")
    raise (CollectiveTimeout if kind == "timeout" else CollectiveArgumentError)(text, param="comm_domain")


def _lead(base: str, where: str, me: int, size: int, fp: int, declared, deadline: float, timeout: float
          ) -> tuple[int, ...]:
    """The leader's side of :func:`_rendezvous`: read the member slots, then publish the verdict."""
    slots = 2 * size
    seen: dict[int, tuple[int, int]] = {}          # slot -> (world rank, its rank_size, fingerprint)
    pause = 1e-4

    def scan() -> None:
        for k in range(slots):
            if k not in seen and (v := _lookup(f"{base}-m{k}")) is not None:
                r, s, f = (int(t) for t in v.split(":"))
                seen[k] = (r, s, f)

    def says(s: int, f: int) -> str:
        return f"declares members {_DECLARED_BY_FP.get(f, '(another list)')}" if f else f"says rank_size {s}"

    error: tuple[str, str] | None = None
    while True:
        scan()
        bad = [(r, s, f) for r, s, f in seen.values() if (s, f) != (size, fp)]
        if bad:
            r, s, f = bad[0]
            what = "member list" if f or fp else "rank_size"
            error = ("fail", f"{where}: {what} disagrees between members: world rank {r} {says(s, f)}, world rank "
                             f"{me} {says(size, fp)}")
            break
        if len(seen) >= size - 1:
            scan()                       # read every slot once more before deciding
            break
        if time.monotonic() > deadline:
            got = sorted([me] + [r for r, _, _ in seen.values()])
            error = ("timeout", f"{where}: timed out after {timeout:g} s (MPICOLL_DOMAIN_TIMEOUT) waiting for "
                                f"members: {len(got)} of {size} arrived (world ranks {got})")
            break
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    members = tuple(sorted([me] + [r for r, _, _ in seen.values()]))
    if error is None and len(members) > size:
        error = ("fail", f"{where}: world ranks {list(members)} all name it, more than rank_size {size}: a name names "
                         "one membership")
    if error is None and declared is not None and members != declared:
        error = ("fail", f"{where}: world ranks {list(members)} name it, but the declared members are "
                         f"{list(declared)}")
    _publish_verdict(base, *(error if error else ("ok", ",".join(map(str, members)))))
    if error:
        raise (CollectiveTimeout if error[0] == "timeout" else CollectiveArgumentError)(error[1], param="comm_domain")
    return members


_CHUNK = 900      # characters per published value (MPICH's name service keeps at most 1023)


def _publish_verdict(base: str, kind: str, text: str) -> None:
    """Publish the verdict: its chunks first, then ``<base>-V`` = ``kind:chunks`` (so that a member
    seeing the verdict finds every chunk). An error's text goes hex-encoded (the name service
    splits values at spaces)."""
    payload = text if kind == "ok" else text.encode().hex()
    chunks = [payload[i:i + _CHUNK] for i in range(0, len(payload), _CHUNK)] or [""]
    for i, chunk in enumerate(chunks):
        _publish(f"{base}-V{i}", chunk)
    _publish(f"{base}-V", f"{kind}:{len(chunks)}")


def _verdict(base: str, head: str) -> tuple[str, str]:
    """``(kind, text)`` of a published verdict whose head entry is ``head``."""
    kind, _, count = head.partition(":")
    payload = "".join(_lookup(f"{base}-V{i}") or "" for i in range(int(count)))
    return kind, payload if kind == "ok" else bytes.fromhex(payload).decode()


#: fingerprint -> the member list it stands for (this rank's declarations), for messages
_DECLARED_BY_FP: dict[int, list[int]] = {}


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
