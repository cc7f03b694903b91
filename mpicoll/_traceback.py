"""What a user sees of mpicoll's own frames: an uncaught mpicoll error prints the user's call and
the message, not a page of mpicoll's internal frames (``MPICOLL_TRACEBACK_FILTERING``, on by default),
and a warning points at the user's line.

As JAX does (``JAX_TRACEBACK_FILTERING``), the frames of mpicoll's own modules are taken out of the
traceback of an uncaught :class:`~mpicoll.CollectiveError`, with a note saying so and how to see them
all; so are the frames of the runner ``python -m mpi4py`` puts above the script (``runpy``, mpi4py's
``run``), which ``python script.py`` does not show either. The filtering happens where the traceback
is printed (``mpicoll._comm``'s exception hook): a caught error keeps its whole traceback. A traceback
is written with one ``write``, so that another rank's output, forwarded by the launcher, lands before
or after it, not inside.

Standard library only: the modules below everything else (``mpicoll._env``) use it too.
"""
from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

#: mpicoll's package folder: a frame whose code lies under it is internal
PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: the code of the runner ``python -m mpi4py`` (and ``python -m``, ``runpy``) above the user's script
_RUNNERS = ("<frozen runpy>", os.sep + "runpy.py")
_MPI4PY_RUN = (os.sep + os.path.join("mpi4py", "run.py"), os.sep + os.path.join("mpi4py", "__main__.py"))


def internal(filename: str) -> bool:
    """Whether code in ``filename`` is mpicoll's own (a module of the package)."""
    return filename.startswith(PACKAGE)


def _runner(filename: str) -> bool:
    return filename.startswith(_RUNNERS[0]) or filename.endswith(_RUNNERS[1:] + _MPI4PY_RUN)


def user_stacklevel() -> int:
    """The ``stacklevel`` of ``warnings.warn`` called right here by the caller that names the first
    frame outside mpicoll (the user's line, the ``import mpicoll`` included)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_back is not None and (internal(frame.f_code.co_filename) or
                                                              _importlib(frame.f_code.co_filename)):
        frame = frame.f_back
        level += not _importlib(frame.f_code.co_filename)   # (warnings skips importlib's frames itself)
    return level


def _importlib(filename: str) -> bool:
    return "importlib" in filename and "_bootstrap" in filename


def filtered(tb: TracebackType | None) -> tuple[TracebackType | None, int, int]:
    """``tb`` without mpicoll's frames and the runner's (a new chain: the frames stay as they are),
    and how many of each were taken out; ``tb`` itself where nothing of the user's would be left."""
    kept: list[TracebackType] = []
    ours = runner = 0
    node = tb
    while node is not None:
        name = node.tb_frame.f_code.co_filename
        if internal(name):
            ours += 1
        elif _runner(name):
            runner += 1
        else:
            kept.append(node)
        node = node.tb_next
    if not kept or not ours + runner:
        return tb, 0, 0
    chain = None
    for node in reversed(kept):
        chain = TracebackType(chain, node.tb_frame, node.tb_lasti, node.tb_lineno)
    return chain, ours, runner


def note(ours: int, runner: int, setting: str) -> str:
    """The line that says frames were hidden, and how to see them."""
    parts = [f"{ours} frame{'s' if ours != 1 else ''} of mpicoll's own"] if ours else []
    parts += [f"{runner} of the runner (python -m mpi4py)"] if runner else []
    return f"(hidden from this traceback: {' and '.join(parts)}; {setting}=0 shows every frame)"


def render(kind: type, exc: BaseException, tb: TracebackType | None, setting: str, filtering: bool = True) -> str:
    """The text of an uncaught error's traceback; ``filtering``: with mpicoll's frames and the
    runner's taken out (of each error in its chain), and the note when any were."""
    ours = runner = 0
    seen: set[int] = set()
    node: BaseException | None = exc if filtering else None
    exc.__traceback__ = tb
    while node is not None and id(node) not in seen:       # (the chain: __cause__, or __context__)
        seen.add(id(node))
        node.__traceback__, n, m = filtered(node.__traceback__)
        ours, runner = ours + n, runner + m
        node = node.__cause__ or (None if node.__suppress_context__ else node.__context__)
    text = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
    return text + (note(ours, runner, setting) + "\n" if ours + runner else "")


def write(text: str) -> None:
    """Write ``text`` to stderr in one piece (a launcher forwards each rank's output as it reads it:
    one write is not split by another rank's line, as a traceback printed line by line is)."""
    try:
        sys.stderr.flush()
        data = text.encode(sys.stderr.encoding or "utf-8", "backslashreplace")
        fd = sys.stderr.fileno()
        while data:
            data = data[os.write(fd, data):]
    except (AttributeError, OSError, ValueError):   # (no real file: a test's capture, a closed stderr)
        sys.stderr.write(text)
        sys.stderr.flush()
