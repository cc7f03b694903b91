"""A model of mpicoll's AllReduce and ReduceScatter paths and of MPI's own algorithms: the time of one
call and the bytes each host sends on its link, from a few measured constants (:class:`Machine`).

    python benchmarks/model.py            the key points of docs/scaling.md (benchmarks/scaling.py: the
                                          full grid, the plot, the check against measurement)

A job is ``n = h * p`` ranks, ``p`` on each of ``h`` hosts, placed in blocks (host ``r // p``) or
round-robin (host ``r % h``); ``S`` is the bytes of each rank's input. Each function returns a
:class:`Cost`: seconds, and the bytes the busiest host sends on its link. Steps are costed as
``latency + bytes x seconds per byte``: an exchange across hosts shares the host's one link among the
host's ranks that make it at once; one within a host costs a shared-memory message and one core's
copy; a local reduction of k rows costs k passes over one row. Nothing overlaps unless said so (MPI's
pipelined ring and mpicoll's host-after-host chain). MPI's algorithms are MPICH 5.0's (its
``coll_selection.json`` and ch4 compositions, checked against the bytes on the test bed); mpicoll's paths
are those of ``mpicoll/ops/allreduce.py`` (``reduce_pieces``), ``ops/_base.py`` (``reduce_scatter``,
``alltoall_reduce``), and ``_shm.py`` (the node window) at HEAD, with their thresholds.

``tree_*`` model the proposed tree order (docs/scaling.md, "The design"): the same bits on every path,
which lets node-first tiers and recursive halving serve float reductions. They are designs, not code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Machine:
    """The constants (seconds; seconds per byte). ``BED`` says where each was measured."""
    name: str
    net_lat: float      # one message across hosts, inside an MPI collective
    net_byte: float     # a host's link (full duplex: each direction)
    net_gap: float      # each further message a rank has in flight at once (a scattered AllToAll)
    net_hdr: float      # bytes a message adds on the link (TCP/IP and MPI headers, acknowledgements)
    shm_lat: float      # one message between ranks of a host, inside an MPI collective
    shm_byte: float     # an MPI transfer between ranks of a host
    copy: float         # one core's memcpy (numpy copyto), per byte copied
    row32: float        # mpicoll's rank-order reduction (reduce_rows), per byte of each float32 row
    row16: float        # the same, bfloat16 rows accumulated in float32 (C kernel), per 16-bit byte
    cache: float        # bytes a rank's message and step may hold and stay in its cache (then row16_c)
    row16_c: float      # a bfloat16 row, in cache
    cast: float         # bfloat16 <-> float32 (C kernels), per 16-bit byte
    add: float          # MPI's own reduction of two operands, per byte
    call: float         # one MPI call from Python (mpi4py; a plan's MPI step)
    coll: float         # a collective's own set-up inside MPI (its algorithm's choice, buffers)
    step: float         # one local step of an mpicoll plan (a reduction, a cast)
    win_step: float     # one step of the node window (Python and Win.Sync around its copy or reduction)
    cores: float        # cores per host (0: one per rank; the bed's hosts share this machine's 2)
    over_lat: float     # each message's extra wait while a host's ranks outnumber its cores
    node_byte: float    # the host's memory, per byte moved by all its ranks together


#: This machine (2 cores, MPICH 5.0.2 wheel, mpi4py 4.1.2, at thread level MULTIPLE) and the test bed's
#: links (scripts/cluster, tbf 1gbit, MPICH ofi/tcp), measured with benchmarks/model_check.py calibrate
#: on a quiet machine (medians; docs/scaling.md "Constants").
BED = Machine(
    name="bed",
    net_lat=5e-6,           # bed 2 x 1: Sendrecv of 8 B (7.7 us) less one call
    net_byte=8.36e-9,       # bed 2 x 1: Sendrecv of 4 MiB (35.1 ms): 957 Mbit/s, as docs/multihost.md
    net_gap=1e-6,           # (assumed; the bed's hosts share 2 cores: not measurable there)
    net_hdr=100,            # bed 2 x 1: tx bytes of a 16-byte Sendrecv, 115
    shm_lat=0.3e-6,         # np=2: PERF.md's Allreduce of 8 B from C (0.27 us)
    shm_byte=0.2e-9,        # fitted* (np=2 Sendrecv of 4 MiB: 0.135)
    copy=0.03e-9,           # fitted* (np=1 copyto of 256 KiB: 0.030, of 16 MiB: 0.078)
    row32=0.06e-9,          # fitted* (np=1 reduce_rows of 2, 4 rows of 256 KiB: 0.08, 0.14 ns a byte out)
    row16=0.12e-9,          # np=1: reduce_rows of 4, 8 bfloat16 rows of 16 MiB: 0.42, 0.95 ns a byte out
    cache=2 * MiB,          # lscpu: 2 MiB of L2 a core
    row16_c=0.05e-9,        # np=1: reduce_rows of 2, 4 bfloat16 rows of 128 Ki elements: 0.12, 0.19 ns
    cast=0.28e-9,           # np=1: to_f32, from_f32 of 8 Mi elements: 0.24, 0.32 ns a 16-bit byte
    add=0.1e-9,             # fitted* (np=1 MPI.SUM.Reduce_local of 16 MiB float32: 0.17)
    call=1.5e-6,            # np=2, bound: a raw Allreduce of 8 B (2.1 us) less coll and one message
    coll=0.3e-6,            # (the rest of the 2.1 us)
    step=1.2e-6,            # np=2: a bfloat16 AllReduce of 8 B, cast-Allreduce-cast: 4.6 us, two steps and a call
    win_step=3e-6,          # fitted* (a plan's MPI step: 0.2 us over raw; a window step is Python + Win.Sync)
    cores=2,
    over_lat=11e-6,         # bed 2 x 2 (4 ranks on 2 cores): Sendrecv of 8 B, 18.4 us, less 2 x 1's 7.7
    node_byte=0.02e-9,      # fitted* (PERF.md: two copies at once, 13.8 GB/s, each byte read and written: 0.036)
)
#: * fitted: the value that brings the model closest to the 30 measured one-host paths at 2 ranks from
#: 64 KiB (benchmarks/scaling.py --check); the microbenchmark's value in brackets. The node's copies and
#: reductions run partly in cache: the microbenchmarks bound them.

#: Hosts like this machine's cores but one core per rank and a node's memory of 100 GB/s (assumed),
#: on the bed's links: the profile of docs/scaling.md's table.
CLUSTER = replace(BED, name="1 Gbit/s", cores=0, node_byte=0.005e-9)
#: The same hosts on a 100 Gbit/s network with 2 us latency (assumed, not measured: a sensitivity check).
FAST = replace(CLUSTER, name="100 Gbit/s", net_lat=2e-6, net_byte=0.08e-9, net_gap=0.2e-6)


@dataclass(frozen=True)
class Cost:
    """Seconds, and bytes the busiest host sends on its link."""
    t: float = 0.0
    link: float = 0.0

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(self.t + o.t, self.link + o.link)

    def __mul__(self, k: float) -> "Cost":
        return Cost(self.t * k, self.link * k)


@dataclass(frozen=True)
class Group:
    """``n`` ranks, ``p`` a host, in ``layout`` "block" or "rr"; ``share`` groups of this shape run at
    once on every host (the members with each index on their host: their bytes share the link)."""
    n: int
    p: int = 1
    layout: str = "block"
    share: int = 1

    @property
    def h(self) -> int:
        return max(self.n // self.p, 1)

    def host(self, r: int) -> int:
        return r // self.p if self.layout == "block" else r % self.h

    def mine(self) -> list[int]:
        """Host 0's ranks (every host alike where h and p are powers of two)."""
        return [r for r in range(self.p)] if self.layout == "block" else [k * self.h for k in range(self.p)]

    def crossing(self, partner) -> int:
        """How many of host 0's ranks talk to a rank on another host (``partner(r)``)."""
        return sum(1 for r in self.mine() if self.host(partner(r) % self.n) != 0)


def _log2(n: int) -> int:
    return max(n - 1, 0).bit_length()


def _pof2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _par(m: Machine, k: int) -> float:
    """How much slower k ranks of a host work at once than one (cores shared)."""
    return max(1.0, k / m.cores) if m.cores else 1.0


#: the bytes of each rank's message in the call being costed (set by :func:`predict`): a step streams
#: from memory when the message does not fit in a rank's cache, however small the step
_MESSAGE = [0.0]


def local(m: Machine, g: Group, seconds: float, nbytes: float) -> float:
    """Every rank of a host busy ``seconds`` on its core, moving ``nbytes`` of memory: the slower of its
    core (shared when the ranks outnumber the cores) and the host's memory (unless the step and the
    message stay in cache)."""
    mem = g.p * g.share * nbytes * m.node_byte if max(nbytes, _MESSAGE[0]) > m.cache else 0.0
    return max(seconds * _par(m, g.p * g.share), mem)


def _copy(m: Machine, g: Group, nbytes: float) -> float:
    """Each of a host's ranks copying ``nbytes``."""
    return local(m, g, nbytes * m.copy, 2 * nbytes)


def exchange(m: Machine, g: Group, partner, nbytes: float, reduce: float = 0.0) -> Cost:
    """One step in which every rank sends ``nbytes`` to ``partner(r)`` (and receives as much), then
    reduces ``reduce`` bytes with MPI's own loop."""
    return _step(m, g, g.crossing(partner) if g.h > 1 else 0, nbytes, reduce)


def _step(m: Machine, g: Group, c: int, nbytes: float, reduce: float = 0.0) -> Cost:
    """:func:`exchange` where ``c`` of a host's ranks talk across hosts."""
    link = c * (nbytes + m.net_hdr) * g.share
    wait = m.over_lat if m.cores and g.p * g.share > m.cores else 0.0
    net = wait + m.net_lat + link * m.net_byte if c else 0.0
    shm = wait + m.shm_lat + local(m, g, nbytes * m.shm_byte, 2 * nbytes) if c < g.p else 0.0
    return Cost(max(net, shm) + local(m, g, reduce * m.add, 3 * reduce), link)


# ---------------------------------------------------------------------------------- MPI's algorithms

def mpi_recursive_doubling(m: Machine, g: Group, S: float) -> Cost:
    """Allreduce: log2 n exchanges of the whole message (non-powers of two: two more)."""
    pof2, cost = _pof2(g.n), Cost()
    if g.n > pof2:
        cost += exchange(m, g, lambda r: r ^ 1, S, S) + exchange(m, g, lambda r: r ^ 1, S)
    for k in range(pof2.bit_length() - 1):
        cost += exchange(m, g, lambda r, d=1 << k: r ^ d, S, S)
    return cost


def mpi_rabenseifner(m: Machine, g: Group, S: float) -> Cost:
    """Allreduce as MPICH's reduce_scatter_allgather: recursive halving of the message with partners at
    distance 1, 2, 4, ... (ranks near each other first), then recursive doubling back."""
    pof2, cost = _pof2(g.n), Cost()
    if g.n > pof2:
        cost += exchange(m, g, lambda r: r ^ 1, S, S) + exchange(m, g, lambda r: r ^ 1, S)
    for k in range(pof2.bit_length() - 1):
        part = S / (2 << k)
        cost += exchange(m, g, lambda r, d=1 << k: r ^ d, part, part) + exchange(m, g, lambda r, d=1 << k: r ^ d,
                                                                                 part)
    return cost


def mpi_ring(m: Machine, g: Group, S: float) -> Cost:
    """Allreduce: 2 (n - 1) pipelined steps of S / n to the next rank."""
    if g.n == 1:
        return Cost()
    return (exchange(m, g, lambda r: r + 1, S / g.n, S / g.n) + exchange(m, g, lambda r: r + 1, S / g.n)) * (g.n - 1)


def mpi_node_aware(m: Machine, g: Group, S: float) -> Cost:
    """Allreduce as MPICH's node-aware composition (ch4 'alpha', MPIR_Allreduce_intra_smp): a reduce to
    each host's first rank, an Allreduce among those, a broadcast on each host."""
    node, roots = Group(g.p, g.p), Group(g.h, 1)
    return mpi_node_reduce(m, node, S) + mpi_allreduce(m, roots, S) + mpi_node_bcast(m, node, S)


def mpi_node_reduce(m: Machine, g: Group, S: float) -> Cost:
    if g.n == 1:
        return Cost()
    if S <= 2 * KiB:                                  # binomial
        return exchange(m, g, lambda r: r, S, S) * _log2(g.n)
    return mpi_reduce_scatter(m, g, S) + exchange(m, g, lambda r: r, S * (g.n - 1) / g.n) + \
        Cost(m.shm_lat * (_log2(g.n) - 1))            # (recursive halving, then a gather to the root)


def mpi_node_bcast(m: Machine, g: Group, S: float) -> Cost:
    if g.n == 1:
        return Cost()
    if S < 12 * KiB:
        return exchange(m, g, lambda r: r, S) * _log2(g.n)
    return exchange(m, g, lambda r: r, S / g.n) * _log2(g.n) + mpi_allgather(m, g, S)


def mpi_node_gather(m: Machine, g: Group, T: float) -> Cost:
    """Gather of T bytes in all to one rank of a host (binomial: log2 p steps, the root receiving
    (p - 1) / p of T)."""
    return Cost(_log2(g.n) * m.shm_lat + local(m, g, T * (g.n - 1) / g.n * m.shm_byte, 2 * T))


def mpi_allreduce(m: Machine, g: Group, S: float) -> Cost:
    """MPI's own Allreduce as MPICH 5.0.2 picks it (float32 SUM): on several hosts with several ranks
    each, node-aware at every size (measured on the bed: one message's worth per host in block and
    round-robin placement; forced flat, MPIR_CVAR_DEVICE_COLLECTIVES=none, twice that round-robin);
    flat: recursive doubling up to 8 B (and when the count is below the power of two), else Rabenseifner."""
    if g.n == 1:
        return Cost()
    if g.h > 1 and g.p > 1:
        return mpi_node_aware(m, g, S)
    if S <= 8 or S / 4 < _pof2(g.n):
        return mpi_recursive_doubling(m, g, S)
    return mpi_rabenseifner(m, g, S)


def mpi_reduce_scatter(m: Machine, g: Group, S: float) -> Cost:
    """MPI's Reduce_scatter_block of S (all blocks): recursive halving (partners at distance n/2 first)
    below 512 KiB, else pairwise (n - 1 steps of one block)."""
    n, cost = g.n, Cost()
    if n == 1:
        return cost
    if S < 512 * KiB:
        pof2 = _pof2(n)
        if n > pof2:
            cost += exchange(m, g, lambda r: r ^ 1, S, S) + exchange(m, g, lambda r: r ^ 1, S / n)
        for k in range(1, pof2.bit_length()):
            cost += exchange(m, g, lambda r, d=pof2 >> k: r ^ d, S / (1 << k), S / (1 << k))
        return cost
    return _pairwise(m, g, S / n, S / n)


def _pairwise(m: Machine, g: Group, blk: float, reduce: float = 0.0) -> Cost:
    """n - 1 steps, rank r sending one block to r + i: the steps differ only in how many of a host's
    ranks cross hosts. Block placement: i of them at steps i and n - i (i < p), all p at the n - 2p + 1
    others; round-robin: none at the p - 1 steps where h divides i, all p at the others."""
    n, p = g.n, g.p
    if g.h == 1:
        counts = {0: n - 1}
    elif g.layout == "block":
        counts = {p: n - 2 * p + 1, **{c: 2 for c in range(1, p)}}
    else:
        counts = {0: p - 1, p: n - p}
    return sum((_step(m, g, c, blk, reduce) * k for c, k in counts.items() if k), Cost())


def mpi_allgather(m: Machine, g: Group, T: float) -> Cost:
    """MPI's Allgather of T bytes in all (T / n from each rank), as MPICH picks it: recursive doubling
    (powers of two, T < 512 KiB), Bruck (others, T < 80 KiB), else a ring."""
    n, blk, cost = g.n, T / g.n, Cost()
    if n == 1:
        return cost
    pof2 = n == _pof2(n)
    if (pof2 and T < 512 * KiB) or (not pof2 and T < 80 * KiB):
        for k in range(_log2(n)):
            d = 1 << k
            cost += exchange(m, g, (lambda r, d=d: r ^ d) if pof2 else (lambda r, d=d: r + d), min(d, n - d) * blk)
        return cost
    return exchange(m, g, lambda r: r + 1, blk) * (n - 1)


def mpi_alltoall(m: Machine, g: Group, S: float) -> Cost:
    """MPI's Alltoall of S from each rank (S / n to each), as MPICH picks it: Bruck (n >= 8, blocks up
    to 256 B), scattered (every message at once, blocks up to 32 KiB), else pairwise."""
    n, blk = g.n, S / g.n
    if n == 1:
        return Cost(_copy(m, g, S))
    if n >= 8 and blk <= 256:
        return sum((exchange(m, g, lambda r, d=1 << k: r + d, S / 2) for k in range(_log2(n))), Cost())
    if blk <= 32 * KiB:
        remote = g.p * (n - g.p) if g.h > 1 else 0       # (messages a host's ranks send to other hosts)
        link = remote * (blk + m.net_hdr) * g.share
        net = m.net_lat + max(link * m.net_byte, (n - 1) * m.net_gap) if remote else 0.0
        shm = m.shm_lat * min(n - 1, 8) + local(m, g, (g.p - 1) * blk * m.shm_byte, 2 * g.p * blk)
        return Cost(max(net, shm), link)
    return _pairwise(m, g, blk)


# ---------------------------------------------------------------------------------- mpicoll's pieces

def _rows(m: Machine, g: Group, k: int, nbytes: float, bf16: bool) -> float:
    """One rank reducing k rows of ``nbytes`` each (reduce_rows: k passes)."""
    row = m.row32 if not bf16 else m.row16_c if (k + 1) * nbytes <= m.cache else m.row16
    return local(m, g, nbytes * k * row, (k + 1) * nbytes)


def _call(m: Machine, cost: Cost, calls: int = 1, steps: int = 0) -> Cost:
    """``cost`` made of ``calls`` MPI collectives from Python and ``steps`` local steps of a plan."""
    return cost + Cost(calls * (m.call + m.coll) + steps * m.step)


def _barrier(m: Machine, p: int) -> Cost:
    return Cost(m.call + m.coll + 2 * _log2(p) * m.shm_lat)


def window_allreduce(m: Machine, p: int, S: float, bf16: bool = False, cores_of: Group | None = None) -> Cost:
    """ops/_window.allreduce: one shot up to 2 MiB / (p (p - 1)) (copy in, Barrier, reduce all p rows), else
    rounds of 2 MiB (copy the others' parts in, Barrier, reduce this rank's block, Barrier, copy out)."""
    g = cores_of or Group(p, p)
    if S * p * (p - 1) <= 2 * MiB and S <= 2 * MiB:
        work = _copy(m, g, S) + _rows(m, g, p, S, bf16)
        return Cost(work + 4 * m.win_step) + _barrier(m, p)
    cost = Cost()
    for r in range(math.ceil(S / (2 * MiB))):
        s = min(2 * MiB, S - r * 2 * MiB)
        work = _copy(m, g, s * (p - 1) / p) * 2 + _copy(m, g, s / p) + _rows(m, g, p, s / p, bf16)
        cost += Cost(work + 4 * m.win_step) + _barrier(m, p) * 2
    return cost + Cost(m.win_step)


def window_reduce_scatter(m: Machine, p: int, S: float, bf16: bool = False, cores_of: Group | None = None) -> Cost:
    """ops/_window.reduce_scatter: rounds of 2 MiB (copy the others' blocks in, Barrier, reduce this rank's)."""
    g = cores_of or Group(p, p)
    cost = Cost(m.win_step)
    for r in range(max(math.ceil(S / (2 * MiB)), 1)):
        s = min(2 * MiB, S - r * 2 * MiB)
        work = _copy(m, g, s * (p - 1) / p) + _rows(m, g, p, s / p, bf16)
        cost += Cost(work + 3 * m.win_step) + _barrier(m, p)
    return cost


def gathered(m: Machine, g: Group, S: float, bf16: bool = False) -> Cost:
    """An Allgather of every input and a local reduction of the n rows (rank or tree order alike)."""
    return _call(m, mpi_allgather(m, g, g.n * S) + Cost(_rows(m, g, g.n, S, bf16)), 1, 1)


def alltoall_reduce(m: Machine, g: Group, S: float, bf16: bool = False) -> Cost:
    """_base.alltoall_reduce: an Alltoall of the blocks, a local reduction of n rows of S / n."""
    return _call(m, mpi_alltoall(m, g, S) + Cost(_rows(m, g, g.n, S / g.n, bf16)), 1, 1)


def flat(m: Machine, g: Group, S: float, bf16: bool = False) -> Cost:
    """reduce_pieces' AllToAll path: alltoall_reduce and an Allgather, in 2 MiB pieces from 8 MiB."""
    piece = 2 * MiB if S >= 8 * MiB else S
    one = alltoall_reduce(m, g, piece, bf16) + _call(m, mpi_allgather(m, g, piece))
    return one * (S / piece)


def chained(m: Machine, g: Group, S: float) -> Cost:
    """_chained (float32, 2 hosts of consecutive ranks): block k of the message to each host's k-th
    rank, the first host folds its rows and passes running results over, piece by piece (256 KiB),
    the results coming back the other way; an Allgather on each host."""
    node, p = Group(g.p, g.p), g.p
    pieces = max(math.ceil(S / p / (256 * KiB)), 1)
    q = S / p / pieces                                  # (each rank's piece)
    hop = _rows(m, g, p + 1, q, False) + m.net_lat + p * q * m.net_byte + m.call + m.coll + m.step
    return _call(m, mpi_alltoall(m, node, S)) + Cost((pieces + 1) * hop, S) + _call(m, mpi_allgather(m, node, S))


def native(m: Machine, g: Group, S: float) -> Cost:
    """MPI's own Allreduce from mpicoll (a float32 SUM in MPI's order), in 2 MiB pieces from 8 MiB."""
    piece = 2 * MiB if S >= 8 * MiB else S
    return _call(m, mpi_allreduce(m, g, piece)) * (S / piece)


def tiered(m: Machine, g: Group, S: float, bf16: bool = True) -> Cost:
    """_tiered (MPICOLL_EXACT=0, 16-bit floats from 256 KiB): a ReduceScatter on each host (the window),
    the AllReduce of each block among the ranks with its index on every host (rounded to 16 bits
    between the tiers), an Allgatherv on each host."""
    node, across = Group(g.p, g.p), Group(g.h, 1, share=g.p)
    part = S / g.p
    if bf16 and part <= 64 * KiB:                    # (cast to float32, MPI's float32 Allreduce, cast back)
        mid = _call(m, mpi_allreduce(m, across, 2 * part) + Cost(local(m, g, 2 * part * m.cast, 3 * part)), 1, 2)
    else:
        mid = flat(m, across, part, bf16) if bf16 else native(m, across, part)
    rs = window_reduce_scatter(m, g.p, S, bf16, g) if S >= 64 * KiB else alltoall_reduce(m, node, S, bf16)
    return rs + mid + _call(m, mpi_allgather(m, node, S))


# ---------------------------------------------------------------------------------- today's choices

def mpicoll_allreduce(m: Machine, g: Group, S: float, bf16: bool, exact: bool) -> Cost:
    """reduce_pieces in the release before the tree order (SUM): ``exact`` is MPICOLL_EXACT (rank order over
    more than 2 ranks; what the tree order runs now: ``tree_allreduce``)."""
    n = g.n
    order = exact and n > 2
    if g.h == 1:
        window = 4 * KiB if order else 8 * KiB if bf16 else 16 * KiB
        if n > 1 and S >= window:
            return window_allreduce(m, n, S, bf16)
    mpi_reduces = not bf16 and not order
    if g.h > 1 and g.p > 1 and not mpi_reduces:
        if order and g.layout == "block" and g.h == 2 and not bf16 and S >= KiB:
            return chained(m, g, S)
        if not order and S >= 256 * KiB:
            return tiered(m, g, S, bf16)
    if mpi_reduces:
        return native(m, g, S)
    piece = 2 * MiB if S >= 8 * MiB else S
    if order and n * piece <= 64 * KiB:
        one = gathered(m, g, piece, bf16)
    elif not order and bf16 and (piece <= 64 * KiB or n == 1):
        one = _call(m, mpi_allreduce(m, g, 2 * piece) + Cost(local(m, g, 2 * piece * m.cast, 3 * piece)), 1, 2)
    else:
        one = flat(m, g, piece, bf16)
    return one * (S / piece)


def mpicoll_reduce_scatter(m: Machine, g: Group, S: float, bf16: bool, exact: bool) -> Cost:
    """_base.reduce_scatter in the release before the tree order (S: all blocks of a rank)."""
    if g.h == 1 and g.n > 1 and S >= 64 * KiB:
        return window_reduce_scatter(m, g.n, S, bf16)
    if not bf16 and not (exact and g.n > 2):
        return _call(m, mpi_reduce_scatter(m, g, S))
    return alltoall_reduce(m, g, S, bf16)


# ---------------------------------------------------------------------------------- a tree order

def aligned(g: Group) -> bool:
    """Each host holds an aligned block of 2^k consecutive ranks: a subtree of the tree order."""
    return g.h == 1 or g.p == 1 or (g.layout == "block" and g.p == _pof2(g.p))


def tree_across(m: Machine, across: Group, S: float, bf16: bool, scatter: bool = False, raw: bool = False) -> Cost:
    """An exact AllReduce (ReduceScatter: ``scatter``) of S among one rank per host, in the tree order of
    the hosts: the best of an Allgather of every host's partial, an AllToAll + local reduction
    (+ Allgather), recursive halving (+ doubling) and (AllReduce) recursive doubling by mpicoll's own
    Sendrecv steps, partners at host distance 1, 2, 4, ... (the lower hosts' partial on the left). 16-bit floats:
    partials travel in float32 (``raw``: a host's partial is one rank's input, 16 bits), the result in
    16 bits."""
    h = across.n
    if h == 1:
        return Cost()
    w = 1 if raw or not bf16 else 2                     # (bytes of what a host sends, per byte of the dtype)
    red = Cost(_rows(m, across, h, w * S / h, bf16 and raw))
    back = Cost() if scatter else _call(m, mpi_allgather(m, across, S))
    a2a = _call(m, mpi_alltoall(m, across, w * S), 1, 1) + red + back
    halving = Cost()
    for k in range(_log2(h)):
        part = (w if k == 0 else 2 if bf16 else 1) * S / (2 << k)
        halving += _call(m, exchange(m, across, lambda r, d=1 << k: r ^ d, part), 1, 1) + Cost(
            _rows(m, across, 2, part, False))
        if not scatter:
            halving += _call(m, exchange(m, across, lambda r, d=1 << k: r ^ d, S / (2 << k)))
    options = [a2a, halving]
    if not scatter:                                     # (an Allgather of every partial; recursive doubling)
        options.append(_call(m, mpi_allgather(m, across, h * w * S), 1, 1) + Cost(_rows(m, across, h, w * S, False)))
        doubling = Cost()
        for k in range(_log2(h)):
            wk = w if k == 0 else 2 if bf16 else 1
            doubling += _call(m, exchange(m, across, lambda r, d=1 << k: r ^ d, wk * S), 1, 1) + Cost(
                _rows(m, across, 2, wk * S, False))
        options.append(doubling)
    return min(options, key=lambda c: c.t)


def tree_allreduce(m: Machine, g: Group, S: float, bf16: bool, raw16: bool = True) -> Cost:
    """An AllReduce in the tree order (docs/scaling.md): one host: the window from 4 KiB, else the
    Allgather path (both reduce in the tree's order instead of rank order: the same cost). Several
    hosts holding aligned blocks: node-first tiers, the best of (a) a ReduceScatter on each host, the
    exact AllReduce of each block across hosts (:func:`tree_across`), an Allgather on each host, and
    (b) for small messages, the window's one-shot reduction on each host, the exact AllReduce of the
    whole message among the hosts' first ranks and a broadcast on each host; or the flat paths.
    Other placements: the owners gather raw inputs (an AllToAll), reduce, and gather back host-aware.
    ``raw16`` False: one rank a host sends float32 too (benchmarks/model_check.py's prototype)."""
    n, p, h = g.n, g.p, g.h
    flat_opts = [gathered(m, g, S, bf16)] if n * S <= 64 * KiB else []
    if h == 1:
        return window_allreduce(m, n, S, bf16) if n > 1 and S >= 4 * KiB else min(
            flat_opts + [flat(m, g, S, bf16)], key=lambda c: c.t)
    node = Group(p, p)
    if aligned(g):                                      # (16-bit floats: float32 partials until the end)
        last = Cost(local(m, g, S / p * m.cast, 3 * S / p)) if bf16 else Cost()
        q = 2 * MiB if S >= 8 * MiB else S              # (in pieces from 8 MiB, as MPI's own from mpicoll)
        tiers = ((window_reduce_scatter(m, p, q, bf16, g) if p > 1 else Cost()) + tree_across(
            m, Group(h, 1, share=p), q / p, bf16, raw=raw16 and p == 1) + last * (q / S) + (
            _call(m, mpi_allgather(m, node, q)) if p > 1 else Cost())) * (S / q)
        small = (window_allreduce(m, p, S, bf16, g) if p > 1 else Cost()) + tree_across(
            m, Group(h, 1), S, bf16, raw=raw16 and p == 1) + (_call(m, mpi_node_bcast(m, node, S)) if p > 1 else Cost())
        leader = (_call(m, mpi_node_gather(m, node, p * S), 1, 1) + Cost(_rows(m, node, p, S, bf16))
                  if p > 1 else Cost()) + tree_across(m, Group(h, 1), S, bf16, raw=raw16 and p == 1) + (
            _call(m, mpi_node_bcast(m, node, S)) if p > 1 else Cost())
        return min(flat_opts + [tiers, small, leader], key=lambda c: c.t)
    across = Group(h, 1, share=p)                       # (other placements: raw inputs to their owners)
    a2a = alltoall_reduce(m, g, S, bf16) + _call(m, mpi_allgather(m, across, S / p)) + _call(
        m, mpi_allgather(m, node, S))
    return min(flat_opts + [a2a], key=lambda c: c.t)


def tree_reduce_scatter(m: Machine, g: Group, S: float, bf16: bool, raw16: bool = True) -> Cost:
    """A ReduceScatter in the tree order: one host, or placements that are not aligned, as today (the
    window, or alltoall_reduce, reducing in the tree's order); aligned hosts: a ReduceScatter on each
    host (member k gets the blocks bound for member k of every host) and the exact ReduceScatter of
    those among the members with index k (:func:`tree_across`)."""
    if g.h == 1 or not aligned(g):
        return mpicoll_reduce_scatter(m, g, S, bf16, True)
    last = Cost(local(m, g, S / g.n * m.cast, 3 * S / g.n)) if bf16 else Cost()
    rs = window_reduce_scatter(m, g.p, S, bf16, g) if g.p > 1 else Cost()
    return rs + tree_across(m, Group(g.h, 1, share=g.p), S / g.p, bf16, scatter=True, raw=raw16 and g.p == 1) + last


# ---------------------------------------------------------------------------------- rank order's best

def chain_hosts(m: Machine, g: Group, S: float) -> Cost:
    """The best a rank order can do on hosts of consecutive ranks without sending raw inputs: the
    running sum passes host after host (each host's ranks fold their rows of a piece), pipelined in
    pieces of the best size, and the result returns along the same chain: each host sends the message
    twice (once for 2 hosts), and a piece waits 2 (h - 1) hops."""
    if g.h == 1:
        return Cost()
    sent = S if g.h == 2 else 2 * S
    best = None
    for q in (2 ** k for k in range(12, 31)):
        if q > S and best is not None:
            break
        q = min(q, S)
        hop = m.net_lat + q * m.net_byte + _rows(m, g, g.p, q / g.p, False) + m.call + m.step
        t = (S / q) * max(hop, q * m.net_byte * sent / S) + 2 * (g.h - 1) * hop
        best = min(best or t, t)
    return Cost(best, sent)


def rank_order_best(m: Machine, g: Group, S: float, bf16: bool) -> Cost:
    """A lower bound for any rank-order AllReduce: the best of today's paths, the host chain, and the
    raw inputs to their owners with a host-aware gather back."""
    across, node = Group(g.h, 1, share=g.p), Group(g.p, g.p)
    raw = alltoall_reduce(m, g, S, bf16) + _call(m, mpi_allgather(m, across, S / g.p)) + _call(
        m, mpi_allgather(m, node, S))
    options = [mpicoll_allreduce(m, g, S, bf16, True), raw]
    if g.layout == "block" and not bf16 and g.h > 1:
        options.append(chain_hosts(m, g, S) + _call(m, mpi_alltoall(m, Group(g.p, g.p), S)) + _call(
            m, mpi_allgather(m, Group(g.p, g.p), S)))
    return min(options, key=lambda c: c.t)


# ---------------------------------------------------------------------------------- issue 45's slot

def header_bytes(n: int, counts: bool = True) -> int:
    """The header row one rank sends to agree a call (``_validate.header``: H_LEN + 2n int64; without
    the 2n per-rank counts, which only the V operators need: H_LEN)."""
    return 8 * (20 + (2 * n if counts else 0))


def slot_call(m: Machine, g: Group, S: float, slot: int, counts: bool = True) -> Cost:
    """A validated AllReduce of S <= slot bytes: ONE Allgather of fixed slots (the header and the
    payload, padded to ``slot``), checked, then reduced locally (rank or tree order)."""
    return _call(m, mpi_allgather(m, g, g.n * (header_bytes(g.n, counts) + slot)) + Cost(
        _rows(m, g, g.n, S, False)), 1, 1)


def separate_call(m: Machine, g: Group, S: float, counts: bool = True) -> Cost:
    """A validated AllReduce today: the header's Allgather, then the data call (rank order)."""
    return _call(m, mpi_allgather(m, g, g.n * header_bytes(g.n, counts))) + mpicoll_allreduce(m, g, S, False, True)


# ---------------------------------------------------------------------------------- the paths, by name

#: name -> (AllReduce, ReduceScatter) model of a column of docs/scaling.md
PATHS = {
    "exact": (lambda m, g, S, b: mpicoll_allreduce(m, g, S, b, True),
              lambda m, g, S, b: mpicoll_reduce_scatter(m, g, S, b, True)),
    "tree": (tree_allreduce, tree_reduce_scatter),
    "fast": (lambda m, g, S, b: mpicoll_allreduce(m, g, S, b, False),
             lambda m, g, S, b: mpicoll_reduce_scatter(m, g, S, b, False)),
    "mpi": (lambda m, g, S, b: native(m, g, S),
            lambda m, g, S, b: _call(m, mpi_reduce_scatter(m, g, S))),
    "mpi-best": (lambda m, g, S, b: _call(m, min((f(m, g, S) for f in (mpi_allreduce, mpi_ring, mpi_rabenseifner,
                                                                        mpi_recursive_doubling, mpi_node_aware)),
                                                 key=lambda c: c.t)),
                 lambda m, g, S, b: _call(m, mpi_reduce_scatter(m, g, S))),
}


def predict(path: str, op: str, m: Machine, g: Group, S: float, dtype: str) -> Cost:
    """The model of one column: ``path`` in PATHS, ``op`` "AllReduce" or "ReduceScatter"."""
    _MESSAGE[0] = S
    try:
        return PATHS[path][op == "ReduceScatter"](m, g, S, dtype == "bfloat16")
    finally:
        _MESSAGE[0] = 0.0


def _size(b: float) -> str:
    for unit, v in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if b >= v:
            return f"{b / v:g} {unit}"
    return f"{b:g} B"


if __name__ == "__main__":
    for mach in (CLUSTER, FAST):
        print(f"# {mach.name}: AllReduce float32, block placement, time (us) and link bytes / S")
        for h, p in ((2, 8), (64, 8), (1024, 8)):
            g = Group(h * p, p)
            for S in (8, 64 * KiB, 16 * MiB, 1 << 30):
                row = {k: predict(k, "AllReduce", mach, g, S, "float32") for k in ("exact", "tree", "fast", "mpi")}
                print(f"{h:>5} x {p} {_size(S):>8} " + " ".join(
                    f"{k} {c.t * 1e6:10.1f} ({c.link / S:5.2f})" for k, c in row.items()))
