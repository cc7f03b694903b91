"""``python -m mpicoll.run --info``: what this installation is, for a bug report or to compare two
machines (as ``torch.utils.collect_env``, ``ompi_info`` or ``mpichversion`` do): the versions, the
MPI library and its thread level, the numeric kernels, torch and its backend's route, the ranks per
node and the shared window, every ``MPICOLL_*`` setting in effect. Collective over the world; rank 0
prints. A setting mpicoll refuses is said, and the status is 2."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import sys

import mpi4py
import numpy as np
from mpi4py import MPI

from . import __version__, _env
from ._cli import by_rank
from ._domains import world as lib_world
from ._errors import CollectiveArgumentError
from ._numeric import kernels_in_use
from ._thresholds import TABLE, shown
from ._watchdog import sleeps

_THREADS = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
            MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED", MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}


def _shown(r: _env.Reading) -> str:
    """A setting's value in effect and where it came from, as ``--info`` shows it."""
    if r.problem is not None:
        return f"{r.raw!r} REFUSED ({r.problem})"
    v, kind = r.value, r.setting.kind
    if kind == _env.FLAG:
        text = "on" if v else "off"
    elif kind == _env.SECONDS:
        text = "no limit" if v is None else f"{v:g} s"
    else:
        text = "unset" if v is None else str(v)
    return f"{text}, {r.source}"


def _waits() -> str:
    """How this rank waits for its point-to-point messages (``MPICOLL_WAIT``) and why: whether its
    node runs more ranks than cores (as mpicoll's world, made by :func:`_window`, found it)."""
    crowded = lib_world().crowded
    how = "sleep between polls" if sleeps(crowded) else "MPI's own wait (spins)"
    node = "more ranks on this node than cores" if crowded else "no more ranks on this node than cores"
    return f"{how} (MPICOLL_WAIT={_env.value('MPICOLL_WAIT')}; {node})"


def _version(package: str) -> str:
    """An installed package's version, from its metadata (not imported: importing ml_dtypes 0.7 takes
    0.5-1 s here, for every rank of every command of the CLI)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _packages() -> str:
    """The version of every package mpicoll requires or offers as an extra (its metadata)."""
    try:
        wanted = importlib.metadata.requires("mpicoll") or []
    except importlib.metadata.PackageNotFoundError:
        return "unknown (mpicoll is imported from a source tree that was never installed: `pip install .`)"
    names = list(dict.fromkeys(re.split(r"[\s<>=!~;\[(]", w, maxsplit=1)[0] for w in wanted))
    found, missing = [], []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return ", ".join(found) + (f"; not installed: {', '.join(missing)}" if missing else "")


def _torch() -> str:
    """torch's version and what mpicoll's backend is there, or why none."""
    if importlib.util.find_spec("torch") is None:
        return "not installed (pip install '.[torch]')"
    try:
        import mpicoll.torch as backend      # (optional: torch is imported only where it is installed)
    except Exception as exc:  # noqa: BLE001 - a broken torch is a fact to report, not a crash
        return f"installed, but `import mpicoll.torch` fails: {type(exc).__name__}: {exc}"
    return f"{backend.torch.__version__}; the backend 'mpicoll' is a ProcessGroup subclass"


def _nodes(world: MPI.Comm) -> str:
    """How many ranks each node holds (collective: ``Split_type(COMM_TYPE_SHARED)``)."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    mine = (MPI.Get_processor_name(), node.Get_size()) if node.Get_rank() == 0 else None
    leaders = [leader for leader in world.allgather(mine) if leader]
    node.Free()
    sizes = sorted({n for _, n in leaders})
    per = f"{sizes[0]} per node" if len(sizes) == 1 else f"per node: {', '.join(str(n) for _, n in leaders)}"
    hosts = ", ".join(name for name, _ in leaders[:8]) + (", ..." if len(leaders) > 8 else "")
    return f"{world.Get_size()} on {len(leaders)} node(s), {per} ({hosts})"


def _window() -> tuple[str, CollectiveArgumentError | None]:
    """Whether mpicoll's world takes the shared window (made here: its members check and agree the
    settings, collective), or the error of a setting they refuse."""
    try:
        lib = lib_world()
    except CollectiveArgumentError as exc:           # (a refused or disagreeing setting: every rank)
        return "unknown (a setting is refused: below)", exc
    if lib.local:
        return "used (every rank on one node, MPICOLL_SHM on): large reductions go through it (docs/shm.md)", None
    if not _env.value("MPICOLL_SHM"):
        return "not used (MPICOLL_SHM off): MPI's collectives", None
    tiers = f"; large AllReduce in tiers, {lib.per_node} per node" if lib.per_node else ""
    return f"not used (ranks on several nodes){tiers}", None


def run_info(world: MPI.Comm = MPI.COMM_WORLD) -> int:
    """Print what this installation is on world rank 0 (collective over ``world``); 2 on every rank
    when a setting is refused (printed last, the library's own message), else 0."""
    readings = _env.readings()
    seen = world.allgather([_shown(r) for r in readings])       # (seen[rank][setting])
    kernels = by_rank(world.allgather(kernels_in_use()))
    nodes = _nodes(world)
    window, error = _window()
    waits = by_rank(world.allgather("unknown (a setting is refused: below)" if error is not None else _waits()))
    if world.Get_rank() == 0:
        vendor, numbers = MPI.get_vendor()
        built = importlib.util.find_spec("mpicoll._kernels") is not None
        rows = [
            ("mpicoll", f"{__version__} ({os.path.dirname(os.path.abspath(__file__))})"),
            ("python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"),
            ("platform", platform.platform()),
            ("numpy", np.__version__), ("ml_dtypes", _version("ml_dtypes")), ("mpi4py", mpi4py.__version__),
            ("MPI", f"{vendor} {'.'.join(map(str, numbers))} (MPI {'.'.join(map(str, MPI.Get_version()))}); "
                    f"thread level {_THREADS.get(MPI.Query_thread(), MPI.Query_thread())}"),
            ("MPI library", " ".join(MPI.Get_library_version().splitlines()[0].split())),
            ("C kernels", f"{'built' if built else 'not built'}; in use: {kernels}"),
            ("torch", _torch()),
            ("ranks", nodes),
            ("shared window", window),
            ("message waits", waits),
            ("packages", _packages()),
        ]
        lines = [f"{name:<15}{text}" for name, text in rows]
        width = max(len(name) for name in _env.SETTINGS) + 2        # (the names' column, the longest's)
        lines.append(f"{'settings':<{width + 2}}{'(default)':<12}(in effect, from where)")
        for i, r in enumerate(readings):
            lines.append(f"  {r.setting.name:<{width}}{r.setting.shown_default:<12}{by_rank([mine[i] for mine in seen])}")
        others = _env.strangers()
        if others:
            lines.append(f"  not settings (ignored): {', '.join(others)}")
        tw = max(len(name) for name in TABLE) + 2
        lines.append(f"{'thresholds':<{tw + 2}}{'value':<16}(what it chooses; docs/benchmark.md, benchmarks/crossover.py)")
        lines += [f"  {t.name:<{tw}}{shown(t):<16}{t.chooses}" for t in TABLE.values()]
        print("\n".join(lines), flush=True)
        if error is not None:
            sys.stderr.write(f"python -m mpicoll.run --info: error: {error}\n")
            sys.stderr.flush()
    return 2 if error is not None else 0
