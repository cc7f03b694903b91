"""What the command-line tools share (``python -m mpicoll.run`` and its ``bench``): the rank-0-only
argument parser, the version and kernels lines, the settings in ``--help`` and a refused one as a
usage error, and how Ctrl-C ends the job."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import textwrap
import threading
import time
from typing import Callable, Iterator

from mpi4py import MPI

from . import __version__
from ._domains import world as lib_world
from ._env import ALIKE, SETTINGS, launched
from ._errors import CollectiveArgumentError
from ._numeric import kernels_in_use


def by_rank(seen: list[str]) -> str:
    """Every rank's text (``seen[r]``: rank r's): the one text when all are alike, else each text
    with its ranks, ``numpy on ranks [0]; C on ranks [1]``."""
    if len(set(seen)) == 1:
        return seen[0]
    ranks: dict[str, list[int]] = {}
    for r, text in enumerate(seen):
        ranks.setdefault(text, []).append(r)
    return "; ".join(f"{text} on ranks {rs}" for text, rs in ranks.items())


def kernels_summary(comm: MPI.Comm) -> str:
    """The numeric kernels the ranks of ``comm`` use (collective): :func:`by_rank`."""
    return by_rank(comm.allgather(kernels_in_use()))


def settings_help() -> str:
    """The ``--help`` lines of the settings, from the table (``mpicoll._env.SETTINGS``)."""
    lines = ["environment (each read once by the library on every rank; `--info` shows them in effect):"]
    width = max(len(name) for name in SETTINGS)            # (the names' column: the longest's)
    for s in SETTINGS.values():
        alike = "; set it alike on every rank" if s.agreed == ALIKE else ""
        text = f"{s.summary}; default: {s.shown_default}{alike}; {s.doc}"
        lines += textwrap.wrap(text, 104, initial_indent=f"  {s.name:<{width}} ", subsequent_indent=" " * (width + 3),
                               break_on_hyphens=False)
    return "\n".join(lines) + "\n"


def refused_settings(prog: str) -> bool:
    """Make mpicoll's world (collective), whose members check and agree their settings first: True,
    on every rank, when one is refused or differs (its error printed once, by rank 0: the command
    then exits 2, as for a usage error, instead of aborting with a traceback)."""
    try:
        lib_world()
    except CollectiveArgumentError as exc:
        if MPI.COMM_WORLD.Get_rank() == 0:
            sys.stderr.write(f"{prog}: error: {exc}\n")
            sys.stderr.flush()
        return True
    return False


def version_text() -> str:
    """The ``--version`` line: mpicoll's version, mpi4py's and the MPI library's, the kernels here."""
    import mpi4py
    vendor, numbers = MPI.get_vendor()
    return (f"mpicoll {__version__} (mpi4py {mpi4py.__version__}, {vendor} {'.'.join(map(str, numbers))}); "
            f"numeric kernels: {kernels_in_use()}")


def epilog(text: str) -> str:
    """A ``--help`` epilog: ``text``, then the kernels in use and where the docs are."""
    return f"{text}numeric kernels: {kernels_in_use()}\nmore: docs/cli.md\n"


def launcher_note(command: str) -> None:
    """On a job of one rank that no launcher started (``python -m mpicoll.run`` typed alone), say
    once, on stderr, how to run more ranks; silent under any launcher (``mpirun -np 1`` included)."""
    if MPI.COMM_WORLD.Get_size() == 1 and not launched():
        print(f"{command}: 1 rank (not started by mpirun): launch with `mpirun -np N {command}` for N ranks",
              file=sys.stderr, flush=True)


class Parser(argparse.ArgumentParser):
    """An argument parser for a command every rank runs with the same arguments: usage, errors,
    ``--help`` and ``--version`` print on world rank 0 only (once per job); every rank exits alike."""

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.Get_rank() == 0:
            super()._print_message(message, file)


#: seconds a rank that got Ctrl-C waits for the speaking rank to end the job, before it ends it itself
CTRL_C_GRACE = 3.0


class _CtrlC:
    """Who speaks when Ctrl-C ends the job, and what it says (:func:`on_ctrl_c`)."""

    def __init__(self) -> None:
        self.speaker = False
        self.words: Callable[[], str] = lambda: "python -m mpicoll.run: interrupted (Ctrl-C)"


_CTRL_C = _CtrlC()


def on_ctrl_c(speaker: bool, words: Callable[[], str]) -> None:
    """Set what Ctrl-C does from now on (every rank calls it): on the rank where ``speaker`` is
    true, ``words()`` runs (it may save what was done so far, and must not call MPI collectives:
    the peers may be gone) and its line is printed; the other ranks stay silent."""
    _CTRL_C.speaker, _CTRL_C.words = speaker, words


@contextlib.contextmanager
def ctrl_c_ends_the_job() -> Iterator[None]:
    """Within the block, Ctrl-C ends the job with one line printed by one rank, exit status 130
    and no traceback, whatever MPI call each rank is in.

    A terminal's Ctrl-C sends SIGINT to every rank, but a rank inside a blocking MPI call sees its
    KeyboardInterrupt only when the call returns, and the call never returns once a peer has left
    the collective. So a thread woken by the signal itself (``signal.set_wakeup_fd``) ends the job.
    On the speaking rank (world rank 0 until :func:`on_ctrl_c` names another) it prints the last
    words and aborts the job (``MPI_Abort(130)``). Every other rank waits ``CTRL_C_GRACE`` seconds
    for that abort, and ends the job itself, with a line of its own, only if the speaking rank
    never got the signal. A KeyboardInterrupt in the main thread hands over to that thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    on_ctrl_c(MPI.COMM_WORLD.Get_rank() == 0, _CtrlC().words)
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    previous = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    thread = threading.Thread(target=_watch_ctrl_c, args=(rfd,), name="mpicoll-ctrl-c", daemon=True)
    thread.start()
    try:
        yield
    except KeyboardInterrupt:
        os.write(wfd, bytes([signal.SIGINT]))      # (in case it was raised without the signal)
        while thread.is_alive():                   # the thread ends the process
            try:
                thread.join()
            except KeyboardInterrupt:              # (Ctrl-C again)
                continue
        raise SystemExit(130) from None
    finally:
        signal.set_wakeup_fd(previous)
        if thread.is_alive():
            os.write(wfd, b"\0")                   # stop the thread
            thread.join()
        os.close(rfd)
        os.close(wfd)


def _watch_ctrl_c(rfd: int) -> None:
    """The thread of :func:`ctrl_c_ends_the_job`: returns when told to stop (a zero byte), ends
    the process on SIGINT."""
    while True:
        data = os.read(rfd, 64)
        if signal.SIGINT in data:
            break
        if not data or 0 in data:
            return
    from ._watchdog import end_process
    try:
        if _CTRL_C.speaker:
            try:
                line = _CTRL_C.words()
            except Exception as exc:  # noqa: BLE001 - the job ends either way
                line = f"python -m mpicoll.run: interrupted (Ctrl-C) ({type(exc).__name__}: {exc})"
            end_process(line, 130)
        time.sleep(CTRL_C_GRACE)
        end_process(f"python -m mpicoll.run: interrupted (Ctrl-C) on world rank {MPI.COMM_WORLD.Get_rank()}, "
                    "and the rank that prints did not end the job: ending it from here", 130)
    finally:
        os._exit(130)
