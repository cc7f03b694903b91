"""THE table of algorithm thresholds: every size at which mpicoll changes how it moves data, with
what it chooses and the measurement it came from (``python -m mpicoll.run --info`` prints it;
``benchmarks/crossover.py`` measures the crossovers on your machine).

The choices themselves are made in one place per operator family, from these values and facts
every rank holds alike (:mod:`mpicoll.ops._paths`); the paths they name are what a trace shows
for each call (docs/trace.md). The values are constants, the same on every rank: they pick the MPI
calls, which every rank must make alike.
"""
from __future__ import annotations

from dataclasses import dataclass

KiB, MiB = 1024, 1024 * 1024


@dataclass(frozen=True)
class Threshold:
    """One row: ``name``, ``value`` (bytes, or a pair of bytes), what it ``chooses``, and the
    measurement it came from (``measured``)."""

    name: str
    value: int | tuple[int, int]
    chooses: str
    measured: str


#: THE table
TABLE: dict[str, Threshold] = {t.name: t for t in (
    Threshold("ride", 1 * KiB, "a validated call whose every rank's payload fits rides its agreement: one exchange",
              "2 ranks: an Allgather of the 1.2 KB row 3.4 us, the header alone 3.1 us, an 8 B Allreduce 3.1 us"),
    Threshold("compiled", 2 * MiB, "calls whose arrays hold at most this many bytes together are compiled (their "
              "steps kept, their arrays slots; the last call's arrays and the temporaries its steps use stay "
              "referenced until the next call of its layout); larger ones are described every call",
              "benchmarks/overhead.py, 2 ranks, float32, execute with validation off / raw, described every call -> "
              "compiled (2026-12-07): AllReduce 64 KiB 2.23 -> 0.91, 1 MiB 1.26 -> 1.00; ReduceScatter 64 KiB "
              "3.32 -> 0.93, 1 MiB 1.48 -> 1.10; AllToAll 64 KiB 1.76 -> 1.27; at 16 MiB the describe is under 1% "
              "of a call, and 8 layouts of an operation would keep hundreds of MiB"),
    Threshold("window.allreduce", 16 * KiB, "one node: an AllReduce or Reduce from here goes through the shared "
              "window (below: MPI's own reduction)",
              "benchmarks/shm.py --no-threshold, float32, window / raw MPICH: 2 ranks 1.7-2.0x at 8-12 KiB, "
              "0.53-0.85x at 16 KiB, 0.43-0.75x at 24-32 KiB; 4 ranks 1.3-1.7x, 0.77-0.85x, 0.57-0.83x; Open MPI "
              "0.82-1.20x at 8 KiB, 0.61-0.87x at 16 KiB; 2026-12-07, 2 ranks: 1.65x at 4 KiB, 1.04x at 16 KiB, "
              "0.70x at 64 KiB"),
    Threshold("window.allreduce.16bit", 8 * KiB, "one node: a float16/bfloat16 AllReduce from here goes through the "
              "window (below: cast to float32, MPI's float32 reduction, cast back)",
              "the window 0.30-0.38x that path's time at 8 KiB (2 ranks), 0.50-0.55x (4 ranks); 0.6-1.2x at 1-4 KiB"),
    Threshold("window.ordered", 8 * KiB, "one node, a float reduction over 3+ ranks (the tree order): the window from "
              "here (below: an Allgather of every input, reduced in the tree order on every rank)",
              "benchmarks/crossover.py, float32, window / Allgather (2026-12-07, 3 and 4 ranks on 2 cores): 3 ranks 1.26x "
              "at 4 KiB, 0.73x at 8 KiB, 0.54x at 32 KiB; 4 ranks 1.10x at 4 KiB, 0.87x at 8 KiB; bfloat16 alike "
              "(earlier runs: 3 ranks 1.02x at 4 KiB, 0.62x at 8 KiB)"),
    Threshold("window.reduce_scatter", 64 * KiB, "one node: a ReduceScatter(V) of at least this many bytes a rank "
              "goes through the window (below: MPI's own)",
              "2026-12-07, 2 ranks, float32, window / raw: 2.45x at 4 KiB, 1.32x at 16 KiB, 1.04x at 64 KiB, 0.67x "
              "at 256 KiB; benchmarks/crossover.py, window / MPI's path, three runs: 1.02-1.14x at 16 KiB, "
              "0.91-1.12x at 32 KiB, 0.75-1.01x at 64 KiB, 0.57-0.58x at 128 KiB"),
    Threshold("window.one_shot", 2 * MiB, "a window AllReduce goes in one shot (every rank reduces the whole message) "
              "while n (n - 1) times its bytes are at most this; above: two shots",
              "benchmarks/shm.py --one-shot, over two shots: 2 ranks 0.76-0.88x at 0.5-1 MiB; 3 ranks 0.76-0.94x at "
              "256-320 KiB; 4 ranks 0.88-0.98x at 128-160 KiB, 1.06-1.25x at 256-512 KiB"),
    Threshold("window.slot", 2 * MiB, "the window's bytes per rank per round (and per half): larger calls go in "
              "rounds", "rounds of 2 MiB keep a round's copies in cache"),
    Threshold("window.stream_out", 8 * MiB, "a window AllReduce copies its result out with streamed stores from "
              "this many bytes of output (below: plain copies)",
              "streamed / plain: 4 ranks 0.74-0.83x at 16-64 MiB; 2 ranks 0.88-0.95x at 8-64 MiB, 1.04-1.39x at 1 MiB"),
    Threshold("window.probe", 64 * KiB, "copies into the window of at least this many bytes are timed, to pick "
              "streamed or plain copies on each rank", "timing smaller copies cost a 16-32 KiB AllReduce a quarter "
              "of its time"),
    Threshold("nodebuf.gather", (64 * KiB, 32 * MiB), "AllGather(V) whose inputs are node buffers copies straight "
              "from the peers' between these output sizes", "over raw MPICH, 2 ranks: 0.42x at 64 KiB, 0.14x at 1-4 "
              "MiB, 0.63x at 32 MiB, 1.20x at 64 MiB"),
    Threshold("nodebuf.broadcast", 256 * KiB, "a Broadcast of a node buffer copies straight from the root's from "
              "here", "benchmarks/crossover.py, 2 ranks, float32, copy / MPI's Bcast (2026-12-07, three runs): 1.19-1.23x "
              "at 64 KiB, 1.02-1.05x at 128 KiB, 0.85-0.86x at 256 KiB, 0.77-0.78x at 512 KiB; over raw MPICH: "
              "0.40-0.72x at 1-32 MiB, 1.06x at 64 MiB"),
    Threshold("allreduce.f32", 64 * KiB, "a float16/bfloat16 AllReduce (off the window) up to here: one float32 "
              "reduction (above: AllToAll, reduction, AllGather in 16 bits)", "one collective beats two below it"),
    Threshold("allreduce.bytes_alltoall", 1 * MiB, "an 8-bit integer AllReduce from here: AllToAll, a numpy "
              "reduction, AllGather (MPICH's 8-bit reduction loop is slow)",
              "2 ranks: 1.8x faster at 1-2 MiB, 1.6x at 4 MiB; no gain below 1 MiB"),
    Threshold("allreduce.pieces", (8 * MiB, 2 * MiB), "an AllReduce off the window of at least the first size runs "
              "in pieces of the second (MPICH maps a temporary buffer as large as the message on every call)",
              "float32 at 64 MiB: 44 -> 22 ms at 2 ranks, 116 -> 64 ms at 4"),
    Threshold("allreduce.tiers", 256 * KiB, "several nodes, several ranks each, a reduction MPI does not make itself "
              "(16-bit floats, large 8-bit integers): in tiers from here", "bfloat16 on the test bed, 2 x 2 ranks: "
              "1.27x the flat path at 128 KiB, 0.87x and 0.51x at 256 KiB"),
    Threshold("tiers.aligned", 8 * KiB, "several nodes aligned with the tree order: a float reduction in tiers from "
              "this many bytes a rank (AllReduce, ReduceScatter(V))", "test bed, 2 x 2 ranks, 1 Gbit/s, tiers / flat: "
              "1.62 at 1 KiB, 1.33 at 4 KiB, 0.41 at 16 KiB, 0.50 at 64 KiB"),
    Threshold("gathered", 64 * KiB, "a tree-order reduction off the window and the tiers, of at most this many bytes "
              "over all ranks' inputs: an Allgather (Gather) of every input and a reduction (above: AllToAll, "
              "reduction, AllGather)", "without the window, 3-4 ranks: 0.55-0.77x up to 4 KiB a rank, 0.95-1.2x "
              "at 8-16 KiB, 0.6-0.8x at 32-64 KiB"),
)}


#: the values the paths read (tests and ``benchmarks/crossover.py`` set them here, alike on every rank)
VALUES: dict[str, int | tuple[int, int]] = {name: t.value for name, t in TABLE.items()}


def value(name: str) -> int | tuple[int, int]:
    """Threshold ``name``'s value."""
    return VALUES[name]


def shown(t: Threshold) -> str:
    """A value as ``--info`` shows it: ``64 KiB``, ``64 KiB, 32 MiB``."""
    def size(b: int) -> str:
        return f"{b // MiB} MiB" if b >= MiB and b % MiB == 0 else f"{b // KiB} KiB" if b % KiB == 0 else f"{b} B"
    v = t.value
    return ", ".join(size(b) for b in v) if isinstance(v, tuple) else size(v)
