"""How the members of a comm domain find each other: a rendezvous on the domain's name in the
process manager's name service (``MPI_Publish_name`` / ``MPI_Lookup_name``: local calls that never
involve another rank), then :func:`create` (``Comm.Create_group``, which involves the members only).

The first member to publish the name's leader entry leads; every other member publishes a member
entry (world rank, rank_size, member-list fingerprint) in one of ``2 * rank_size`` slots. The
leader reads the slots until ``rank_size - 1`` members are there, reads every slot once more, and
only then publishes its verdict: the member list, or the error every member raises (a rank_size or
member list that disagrees, a rank_size missing on some member, a name in use by other ranks, a
timeout). Every member waits for the verdict and raises the same error, or forms the domain. The
entries stay published, so a later use of the name by other ranks (or after a failed formation) is
an error. No message goes to a rank that might never read it (MPICH refuses to finalize a
communicator holding an unread message).

When more ranks name a domain than its ``rank_size``, the first ``rank_size`` to arrive form it and
the later ones raise ("already formed by ..."): which ones form it depends on arrival order. A name
names one membership; declare domains (``declare_domains``, ``mesh``) to fix who the members are.
"""
from __future__ import annotations

import hashlib
import os
import time

from mpi4py import MPI

from . import _env
from ._env import JOB_VARS
from ._errors import CollectiveArgumentError, CollectiveError, CollectiveTimeout, gloo_timeout

_CHUNK = 900      # characters per published value (MPICH's name service keeps at most 1023)


def key(name: str) -> int:
    """A stable 62-bit number for a name (the same on every rank)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 2


def fingerprint(members) -> int:
    """A number for a declared member list (0: none declared)."""
    return key(",".join(map(str, members)))


def create(name: str, members: tuple[int, ...]) -> MPI.Comm:
    """``Comm.Create_group`` of the world over ``members`` (collective over them only)."""
    group = MPI.COMM_WORLD.Get_group()
    sub = group.Incl(list(members))
    comm = MPI.COMM_WORLD.Create_group(sub, tag=key(name) % MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))
    sub.Free()
    group.Free()
    return comm


def _job() -> str:
    """A token naming this job, for a name server shared by several jobs (hydra_nameserver)."""
    for var in JOB_VARS:
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


def _timeout() -> float:
    """``MPICOLL_DOMAIN_TIMEOUT`` (default 300 s; 0: wait for ever)."""
    return _env.value("MPICOLL_DOMAIN_TIMEOUT") or float("inf")


def rendezvous(name: str, size: int | None, declared: tuple[int, ...] | None,
               limit: tuple[float, str] | None = None) -> tuple[int, ...]:
    """Meet the other members of domain ``name``; returns the sorted world ranks of its members.

    Args:
        size: its rank_size (the declared list's length for a declared domain), or None when this
            member gave none: the members still meet, and every one of them raises the error.
        declared: the members this rank declared, or None.
        limit: ``(seconds, what sets them)`` (a torch group's ``timeout=``); default
            ``MPICOLL_DOMAIN_TIMEOUT``'s.

    Raises:
        CollectiveArgumentError: the verdict's error (the same on every member).
        CollectiveTimeout: members did not all arrive within the limit.
    """
    me = MPI.COMM_WORLD.Get_rank()
    size = size or 0
    if size == 1 and (declared is None or declared == (me,)):
        return (me,)
    fp = fingerprint(declared) if declared else 0
    base = f"mpicoll-{_job()}-{key(name):x}"
    where = f"comm domain {name!r}"
    timeout, why = limit or (_timeout(), "MPICOLL_DOMAIN_TIMEOUT")
    deadline = time.monotonic() + timeout
    if declared:
        _publish(f"{base}-D{fp:x}", ",".join(map(str, declared))[:_CHUNK])   # (for the leader's messages)
    mine = f"{me}:{size}:{fp}"
    if _publish(f"{base}-L", mine):
        return _lead(base, where, me, size, fp, declared, deadline, timeout, why)
    leader = _lookup(f"{base}-L")
    lsize = int(leader.split(":")[1]) if leader else size
    slots = 2 * (lsize or size)
    if slots:
        start = me % slots
        for k in range(slots):          # a free member slot (linear probing from this rank's own)
            if _publish(f"{base}-m{(start + k) % slots}", mine):
                break
        else:
            raise CollectiveArgumentError(f"{where}: more ranks name it than its rank_size {lsize} allows: a name "
                                          "names one membership", param="comm_domain")
    pause = 1e-4
    while (verdict := _lookup(f"{base}-V")) is None:
        if time.monotonic() > deadline:
            raise CollectiveTimeout(f"{where}: timed out after {timeout:g} s ({why}) waiting for "
                                    f"the leader, world rank {leader.split(':')[0] if leader else '?'}; in gloo's "
                                    f"words: {gloo_timeout(timeout, where)}", param="comm_domain")
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


def _lead(base: str, where: str, me: int, size: int, fp: int, declared, deadline: float, timeout: float,
          why: str) -> tuple[int, ...]:
    """The leader's side of :func:`rendezvous`: read the member slots, then publish the verdict."""
    slots = 2 * size
    seen: dict[int, tuple[int, int, int]] = {}          # slot -> (world rank, its rank_size, fingerprint)
    pause = 1e-4

    def scan() -> None:
        for k in range(slots):
            if k not in seen and (v := _lookup(f"{base}-m{k}")) is not None:
                seen[k] = tuple(int(t) for t in v.split(":"))

    def says(r: int, s: int, f: int) -> str:
        if f:
            listed = _lookup(f"{base}-D{f:x}")
            return f"world rank {r} declares members [{listed.replace(',', ', ')}]" if listed else \
                f"world rank {r} declares another member list"
        return f"world rank {r} says rank_size {s}" if s else f"world rank {r} gives no rank_size"

    error: tuple[str, str] | None = None
    if not size:
        error = ("fail", f"{where}: rank_size is required to form an undeclared domain (members rendezvous by "
                         f"count): world rank {me} gives no rank_size")
    while error is None:
        scan()
        bad = [(r, s, f) for r, s, f in seen.values() if (s, f) != (size, fp)]
        if bad:
            r, s, f = bad[0]
            if not s and not f:
                error = ("fail", f"{where}: rank_size is required to form an undeclared domain (members rendezvous "
                                 f"by count): {says(r, s, f)} ({says(me, size, fp)})")
            else:
                what = "member list" if f or fp else "rank_size"
                error = ("fail", f"{where}: {what} disagrees between members: {says(r, s, f)}, {says(me, size, fp)}")
            break
        if len(seen) >= size - 1:
            scan()                       # read every slot once more before deciding
            break
        if time.monotonic() > deadline:
            got = sorted([me] + [r for r, _, _ in seen.values()])
            error = ("timeout", f"{where}: timed out after {timeout:g} s ({why}) waiting for "
                                f"members: {len(got)} of {size} arrived (world ranks {got}); in gloo's words: "
                                f"{gloo_timeout(timeout, where)}")     # (the verdict's text: every member's)
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
