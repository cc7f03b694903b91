"""The golden-check harness: every registered operator x dtype x case family, on the world and on
named comm domains, against the numpy golden (the registry: :data:`mpicoll.checks.CHECKS`). It never
names an operator. An operator it cannot check at this rank count (or in the dtypes asked for) is
reported as skipped, with the reason."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

import numpy as np
from mpi4py import MPI

from ._domains import world as lib_world
from ._dtypes import DTYPES
from .checks import CHECKS
from .checks._golden import SEED, count_wrong


@dataclass
class CheckRow:
    """One operator's results, summed over every rank."""

    op: str
    dtypes: int
    cases: int
    checks: int = 0
    wrong: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    #: why nothing of it was checked (None: something was)
    skipped: str | None = None


def layouts(world: int) -> list[tuple[str, Callable[[int], str]]]:
    """(label, world rank -> domain name) pairs: the world, and two domains by rank parity."""
    out = [("world", lambda r: "")]
    if world >= 2:
        out.append(("split", lambda r: f"mpicoll.check.{'odd' if r % 2 else 'even'}"))
    return out


class UsageError(ValueError):
    """A bad command-line choice (raised alike on every rank, since every rank parses the same line)."""


def select(names: list[str] | None, known: list[str], what: str) -> list[str]:
    """Case-insensitive filter of ``known`` by ``names`` (None = all)."""
    if not names:
        return list(known)
    lower = {k.lower(): k for k in known}
    missing = [n for n in names if n.lower() not in lower]
    if missing:
        raise UsageError(f"unknown {what}: {', '.join(missing)}; known: {', '.join(known)}")
    return [lower[n.lower()] for n in names]


def run_checks(ops: list[str] | None = None, dtypes: list[str] | None = None, *, seed: int = SEED,
               validate: bool = True, log: TextIO | None = None) -> list[CheckRow]:
    """Check the selected operators and dtypes; collective over the world.

    Returns:
        One :class:`CheckRow` per operator, identical on every rank (counts summed over ranks,
        time = slowest rank); ``skipped`` says why an operator had no case to run.
    """
    world = lib_world().mpi
    me, nworld = world.Get_rank(), world.Get_size()
    rows = []
    wanted = select(dtypes, list(DTYPES), "dtype")
    for name in select(ops, list(CHECKS), "operator"):
        spec = CHECKS[name]
        dts = [d for d in wanted if d in spec.dtypes]
        if not dts:
            rows.append(CheckRow(name, 0, 0, skipped=f"it takes {', '.join(spec.dtypes)} only (add it with --dtype)"))
            continue
        local = np.zeros(2, dtype=np.int64)          # checks, wrong
        failures = []
        t0 = time.perf_counter()
        ncases = 0
        for label, name_of in layouts(nworld):
            dom = name_of(me)
            members = [r for r in range(nworld) if name_of(r) == dom]
            n, rank = len(members), members.index(me)
            ncases += len(spec.cases(n))
            for dtype in dts:
                for case in spec.cases_for(n, dtype):
                    c0 = time.perf_counter()
                    c = spec.make(case, dtype, dom, rank, n, seed, validate=validate)
                    wrong = count_wrong(c.execute(), c.expected, exact=c.exact, n=n)
                    local += (1, wrong)
                    if wrong:
                        failures.append(f"{name} {dtype} {label}:{case} rank {me}: {wrong} wrong")
                    if log is not None:
                        log.write(f"{name}\t{dtype}\t{label}\t{case}\tn={n}\trank={rank}\twrong={wrong}\t"
                                  f"{(time.perf_counter() - c0) * 1e3:.3f} ms\n")
        elapsed = np.array([time.perf_counter() - t0])
        total = np.zeros(2, dtype=np.int64)
        world.Allreduce(local, total, MPI.SUM)
        world.Allreduce(MPI.IN_PLACE, elapsed, MPI.MAX)
        all_failures = [f for fs in world.allgather(failures) for f in fs]
        skipped = None
        if not total[0]:                             # (the same on every rank: summed)
            skipped = spec.skip_at(nworld) or f"no case at {nworld} rank(s) in {', '.join(dts)}"
        rows.append(CheckRow(name, len(dts), ncases, int(total[0]), int(total[1]), float(elapsed[0]), all_failures,
                             skipped))
    return rows


def format_rows(rows: list[CheckRow], nranks: int, kernels: str | None = None) -> str:
    """The check's table; ``kernels``: the numeric kernels the ranks use, for the header."""
    lines = [f"# mpicoll check: {nranks} rank(s); wrong elements summed over ranks"]
    if kernels:
        lines.append(f"# numeric kernels: {kernels}")
    w = max([len("operator"), *(len(r.op) for r in rows)]) + 2         # (the name column fits the longest name)
    lines.append(f"{'operator':<{w}}{'dtypes':>7}{'cases':>7}{'checks':>8}{'wrong':>8}{'time(s)':>9}  result")
    for r in rows:
        result = "WRONG" if r.wrong else f"skipped: {r.skipped}" if r.skipped else "ok"
        lines.append(f"{r.op:<{w}}{r.dtypes:>7}{r.cases:>7}{r.checks:>8}{r.wrong:>8}{r.seconds:>9.2f}  {result}")
        lines.extend(f"    {f}" for f in r.failures[:10])
    bad, checks = sum(r.wrong for r in rows), sum(r.checks for r in rows)
    skipped = sum(r.skipped is not None for r in rows)
    verdict = f"{bad} wrong element(s)" if bad else "all checks passed" if checks else "nothing checked"
    lines.append(f"# {verdict}: {checks} checks, {sum(r.wrong != 0 for r in rows)} operator(s) wrong"
                 + (f", {skipped} skipped at {nranks} rank(s)" if skipped else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- rank-table placement

def local_addresses() -> list[str]:
    """This host's IPv4 addresses (every interface that has one)."""
    import fcntl
    import socket
    import struct
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))   # SIOCGIFADDR
            except OSError:
                continue
            found.append(socket.inet_ntoa(packed[20:24]))
    return found


def check_placement(path: str) -> tuple[bool, str]:
    """Whether every rank runs on the host a rank table gives it (a server_id matches a rank's host
    name or one of its addresses); collective over the world. Returns (ok, report), the report
    host by host, identical on every rank.

    Raises:
        CollectiveArgumentError: the table is malformed or its size is not the world's (every rank).
    """
    from ._ranktable import rank_table
    table = rank_table(path)
    world = lib_world().mpi
    where = world.allgather((MPI.Get_processor_name(), local_addresses()))
    lines, ok = [f"# rank table {path}: {len(table.servers)} server(s), {table.size} rank(s)"], True
    for server in table.servers:
        ranks = sorted(d.rank_id for d in server.devices)
        wrong = [r for r in ranks if server.server_id != where[r][0] and server.server_id not in where[r][1]]
        ok &= not wrong
        runs_on = sorted({where[r][0] for r in ranks})
        verdict = "ok" if not wrong else "WRONG: " + "; ".join(
            f"rank {r} runs on {where[r][0]} ({', '.join(a for a in where[r][1] if a != '127.0.0.1') or 'no address'})"
            for r in wrong)
        lines.append(f"server {server.server_id}: ranks {ranks} run on {', '.join(runs_on)}: {verdict}")
    return ok, "\n".join(lines)
