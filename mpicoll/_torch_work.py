"""The ``Work`` the torch backend hands back (mpicoll.torch): what torch, DDP's reducer, FSDP,
pipelining and functional collectives wait on, poll and chain.

A call torch asked to run synchronously (``opts.asyncOp`` False: torch's Python API without
``async_op=True``) has run when the backend returns: its Work is complete. Any other call runs on its
communicator's worker (:mod:`mpicoll._async`) and a message is in flight
(:mod:`mpicoll._messages`): the Work holds that handle and tells the truth about it.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from ._errors import CollectiveTimeout
from ._watchdog import wait_seconds

__all__ = ["Work"]


class Work(dist.Work):
    """A call of the backend: ``handles`` (the calls it stands for, in their order on one worker, or
    a message; none: it has run), its ``result`` (the tensors torch gets back), named ``call``.

    ``wait(timeout)`` blocks until it has finished and raises its error (the same
    ``CollectiveError`` on every rank); with a timeout (what an Operation's ``timeout=`` takes: a
    timedelta or seconds, 0 or less: none, torch's default; inf, nan or anything else: a
    ``CollectiveArgumentError`` naming it) a ``CollectiveTimeout`` once that long has passed, the
    call going on. ``is_completed()``
    and ``is_success()`` never block; ``get_future()`` is one future, completed (or failed) as the
    call finishes, on the thread that finishes it; ``source_rank()`` is a receive's sender.
    """

    def __init__(self, handles: tuple, result: Any, call: str) -> None:
        super().__init__()
        self._handles, self._result, self._call = handles, result, call
        self._future: torch.futures.Future | None = None

    def wait(self, timeout: Any = None) -> bool:
        seconds = wait_seconds(timeout, self._call, self._rank())
        end = None if seconds is None else time.monotonic() + seconds
        for h in self._handles:             # (one limit for all of them)
            if not h.wait(None if end is None else max(end - time.monotonic(), 0.0)):
                raise CollectiveTimeout(f"{self._call}: wait(timeout={seconds:g} s) timed out with the call still in "
                                        "flight (it goes on: wait() again to complete it)", op=self._call,
                                        param="timeout", seconds=seconds)
        return True

    def _rank(self) -> int:
        """This rank in the call's group (its first handle's communicator; a call that has run: the world's)."""
        rank = next((h.rank for h in self._handles if getattr(h, "rank", None) is not None), None)
        return dist.get_rank() if rank is None else rank

    def is_completed(self) -> bool:
        return all(h.is_completed() for h in self._handles)

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        """The call's error, once it has finished (None: it went well, or is still running)."""
        return next((h.exception() for h in self._handles if h.exception() is not None), None)

    def result(self) -> Any:
        return self._result

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            fut = self._future = torch.futures.Future()
            if not self._handles:
                fut.set_result(self._result)
            else:                           # (the last handle finishes last: one worker, in order)
                self._handles[-1].then(lambda _: self._finish(fut))
        return self._future

    def _finish(self, fut: torch.futures.Future) -> None:
        error = self.exception()
        if error is None:
            fut.set_result(self._result)
        else:
            fut.set_exception(error)

    def source_rank(self) -> int:
        """A receive's sender, its group rank (torch's ``recv`` with ``src=None`` reads it)."""
        self.wait()
        return self._handles[-1].source

    _source_rank = source_rank

    def __repr__(self) -> str:
        return f"<mpicoll Work {self._call} {'completed' if self.is_completed() else 'in flight'}>"
