"""The bench harness' report (mpicoll/bench.py): its rows (:class:`Row`), the table it prints as
nccl-tests does, the JSON of a run (every row, where and how it ran) and its plot (bus bandwidth
against size, log-log, per operator)."""
from __future__ import annotations

import json
import os
import platform
import statistics
import textwrap
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from . import __version__
from .check import UsageError
from .checks import BENCHES


@dataclass
class Row:
    op: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float | None = None
    algbw: float | None = None
    busbw: float | None = None
    wrong: int | None = None
    ip_time_us: float | None = None
    ip_algbw: float | None = None
    ip_busbw: float | None = None
    ip_wrong: int | None = None
    compare: dict = field(default_factory=dict)      # impl -> time_us (None = not available)
    ratio: dict = field(default_factory=dict)        # impl -> time mpicoll/impl, paired per repetition



def header(name, n, dtype, redop, compare, validate, args) -> str:
    extra = "".join(f" {c + '(us)':>11} {'mpicoll/' + c:>15}" for c in compare)
    lines = [f"# {name}: {n} rank(s), dtype {dtype}, redop {redop}, validation {'on' if validate else 'off'}, "
             f"{'plan.run()' if args.plan else 'execute()'}, "
             f"iters {args.iters}, warmup {args.warmup_iters}"
             + (f", compare {','.join(compare)} (mpicoll/<peer>: time ratio, < 1 = mpicoll faster)"
                if compare else ""),
             f"#{'':>62}out-of-place{'':>24}in-place",
             f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} "
             f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6} {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
             + extra,
             f"# {'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'':>5} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} "
             f"{'':>6} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"]
    return "\n".join(lines)


def _f(v, spec, width):
    return f"{'n/a':>{width}}" if v is None else f"{v:>{width}{spec}}"


def row_text(r: Row, compare) -> str:
    s = (f"  {r.size:>10} {r.count:>12} {r.type:>8} {r.redop:>6} {r.root:>5} "
         f"{_f(r.time_us, '.2f', 9)} {_f(r.algbw, '.3f', 7)} {_f(r.busbw, '.3f', 7)} {_f(r.wrong, 'd', 6)} "
         f"{_f(r.ip_time_us, '.2f', 9)} {_f(r.ip_algbw, '.3f', 7)} {_f(r.ip_busbw, '.3f', 7)} {_f(r.ip_wrong, 'd', 6)}")
    for c in compare:
        s += f" {_f(r.compare.get(c), '.2f', 11)} {_f(r.ratio.get(c), '.3f', 15)}"
    return s


def write_json(args, rows, n, compare, validate, placement, kernels, interrupted=False) -> None:
    import mpi4py
    doc = {"command": args.command_line, "ratio": "mpicoll/peer", "ranks": n, "validate": validate, "plan": args.plan, "compare": compare,
           "placement": placement, "interrupted": interrupted, "mpicoll": __version__, "kernels": kernels,
           "mpi": MPI.Get_library_version().splitlines()[0], "mpi4py": mpi4py.__version__, "numpy": np.__version__,
           "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
           "rows": [r.__dict__ for r in rows]}
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)


def hosts_text(hosts: list[str], most: int = 8) -> str:
    """``vm``, ``2 hosts: a, b``; past ``most`` hosts the first ones and how many more."""
    if len(hosts) == 1:
        return hosts[0]
    names = ", ".join(hosts[:most]) + (f", ... ({len(hosts) - most} more)" if len(hosts) > most else "")
    return f"{len(hosts)} hosts: {names}"


def mode_text(plan: bool, validate: bool) -> str:
    """What was timed: ``plan.run()`` or ``execute()``, and whether validation was on."""
    return f"{'plan.run()' if plan else 'execute()'}, validation {'on' if validate else 'off'}"


def size_label(nbytes: float) -> str:
    """A size for an axis: ``8 B``, ``1 KiB``, ``64 MiB``, ``1.5 GiB`` (powers of 1024)."""
    for unit, k in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= k:
            return f"{nbytes / k:g} {unit}"
    return f"{nbytes:g} B"


def pyplot():
    """matplotlib's pyplot, drawing to files (Agg). Raises ImportError when it is not installed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_usable(world: MPI.Comm, printer: bool) -> None:
    """Before the sweep (collective over ``world``): the rank that will draw ``--plot`` can import
    matplotlib, else a usage error on every rank."""
    why = None
    if printer:
        try:
            pyplot()
            why = ""
        except ImportError as exc:
            why = (f"which world rank {world.Get_rank()} (on {MPI.Get_processor_name()}, where the plot is drawn) "
                   f"cannot import ({exc})")
    verdict = next((w for w in world.allgather(why) if w is not None), "")
    if verdict:
        raise UsageError(f"--plot needs matplotlib, {verdict}: pip install '.[plot]' (or pip install matplotlib)")


def plot(path: str, rows: list[Row], n: int, compare: list[str], *, mode: str | None = None,
          hosts: list[str] | None = None) -> None:
    """Draw busbw vs size, one panel per operator, log-log, to the PNG ``path``; the title says
    ``mode`` (:func:`mode_text`), the rank count ``n`` and the ``hosts`` when given."""
    plt = pyplot()
    fig, title = figure(plt, rows, n, compare, mode, hosts)
    fig.savefig(path, dpi=110, metadata={"Title": title, "Software": f"mpicoll {__version__}"})
    plt.close(fig)


def figure(plt, rows: list[Row], n: int, compare: list[str], mode: str | None, hosts: list[str] | None):
    """The figure of :func:`plot` and its title."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator
    ops = list(dict.fromkeys(r.op for r in rows))
    dtypes = sorted({r.type for r in rows})
    cols = max(1, min(3, len(ops)))
    nrows = max(1, -(-len(ops) // cols))
    # (constrained layout leaves the figure's title its own room: tight_layout ignores it, and it
    # overlapped the first row's panel titles)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False, layout="constrained")
    colors = {"mpicoll": "tab:blue", "mpicoll in-place": "tab:cyan", "mpi4py": "tab:orange", "gloo": "tab:green",
              "deepspeed": "tab:red"}
    for ax, op in zip(axes.flat, ops):
        mine = [r for r in rows if r.op == op and r.size > 0]
        factor = BENCHES[op].bus_factor(n) if op in BENCHES else None
        series: dict[str, dict[int, list[float]]] = {}      # implementation -> size -> busbw per dtype
        for r in mine:
            values = {"mpicoll": r.busbw, "mpicoll in-place": r.ip_busbw}
            for c in compare:
                t = r.compare.get(c)
                values[c] = r.size / (t * 1e-6) / 1e9 * factor if t and factor is not None else None
            for label, bw in values.items():
                if bw is not None and bw > 0:                 # (log scale: a 0 has no place; n/a is not drawn)
                    series.setdefault(label, {}).setdefault(r.size, []).append(bw)
        for label, by_size in series.items():
            sizes = sorted(by_size)
            kw = dict(color=colors.get(label), ls="--" if "in-place" in label else "-", lw=1.2, marker="o", ms=3)
            ax.plot(sizes, [statistics.median(by_size[s]) for s in sizes], label=label, **kw)
            if len(dtypes) > 1:   # one line per implementation: the median over the dtypes, their range shaded
                ax.fill_between(sizes, [min(by_size[s]) for s in sizes], [max(by_size[s]) for s in sizes],
                                color=colors.get(label), alpha=0.15, lw=0)
        ax.set_title(op)
        ax.set_xlabel("size")
        ax.set_ylabel("bus bandwidth (GB/s)")
        if not series:
            ax.text(0.5, 0.5, "no bus traffic to draw" + (" (bus factor 0 at 1 rank)" if n == 1 else ""),
                    ha="center", va="center", transform=ax.transAxes, fontsize=8)
            continue
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({s for by_size in series.values() for s in by_size})
        ax.xaxis.set_major_locator(FixedLocator(size_ticks(sizes[0], sizes[-1])))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_label(v)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    what = dtypes[0] if len(dtypes) == 1 else f"median over {', '.join(dtypes)} (shaded: their range)"
    where = f"{n} ranks" + (f" on {hosts_text(hosts)}" if hosts else "")
    title = (f"mpicoll vs {', '.join(compare) or 'itself'}: bus bandwidth vs size, "
             f"{mode + ', ' if mode else ''}{where}, {what}")
    # (wrapped to the figure's width: one panel is narrower than the title; a 9 pt character is
    # about 5.4 pt wide)
    fig.suptitle(textwrap.fill(title, width=max(40, int(fig.get_figwidth() * 72 / 5.6)), break_on_hyphens=False),
                 fontsize=9)
    return fig, title


def size_ticks(low: int, high: int, most: int = 8) -> list[int]:
    """Powers of 2 spanning ``low`` .. ``high``, at most ``most``: every one, or every 2nd, 5th,
    10th, ... exponent, aligned so that 1 KiB, 1 MiB and 1 GiB are among them."""
    first, last = max(int(low), 1).bit_length() - 1, (max(int(high), 1) - 1).bit_length()
    for step in (1, 2, 5, 10, 20, 50):
        exponents = range(first + (-first % step), last + 1, step)
        if len(exponents) <= most:
            break
    return [2 ** e for e in exponents]
