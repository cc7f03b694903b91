"""torch's ``monitored_barrier`` on an mpicoll group, in gloo's words (docs/torch.md).

``ProcessGroupMpicoll.monitored_barrier`` is :func:`barrier`; :func:`on_a_cpu_backend` lets
``dist.monitored_barrier`` reach it on torch 2.13, whose own refuses every backend but gloo.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from ._comm import LibComm
from ._errors import milliseconds
from ._messages import post, tag_ub


def barrier(lib: LibComm, r: int, world_ranks: list[int], serial: int, seconds: float, wait_all_ranks: bool) -> None:
    """Call number ``serial`` of gloo's ``monitored_barrier`` on group rank ``r`` of ``lib``.
    Group rank 0 waits up to ``seconds`` for a message from every other rank, then answers each; a
    rank that did not come is named in the ``RuntimeError`` rank 0 raises (all of them with
    ``wait_all_ranks``); the ranks that came then time out too. Each message names the ranks in
    mpicoll's words, then says it in gloo's (``Rank 1 failed to pass monitoredBarrier in 2000 ms``,
    ``Rank 0 timed out in monitoredBarrier``, ``Rank 2 successfully reached monitoredBarrier, but
    received errors while waiting for send/recv from rank 0``): programs and log scrapers written
    for gloo look for those."""
    size = len(world_ranks)
    ms = milliseconds(seconds)
    deadline = time.monotonic() + seconds
    other: dict[int, int] = {}              # group rank -> the call number of the last token it dropped

    def receive(p: int, why: Callable[[], str]) -> None:
        """A token of this barrier from group rank ``p`` (one of an earlier, failed barrier that
        came late is dropped); a receive that times out is withdrawn (a late token must not land
        in a later barrier's buffer)."""
        token = np.zeros(1, np.int64)
        while int(token[0]) != serial:
            if token[0]:
                other[p] = int(token[0])
            # (its tag MPI's largest: a user's tags stay below it)
            message = post("monitored_barrier recv", token, None, p, lib, tag_ub(), "src")
            if not message.wait(max(deadline - time.monotonic(), 0.0)):
                message.cancel()
                raise RuntimeError(why())

    def send(p: int) -> None:
        post("monitored_barrier send", np.full(1, serial, np.int64), None, p, lib, tag_ub(),
             "dst").wait()

    def step(ps: list[int]) -> str:
        """Why ranks ``ps`` seem absent when they came to another call: the ranks are out of step."""
        seen = [p for p in ps if p in other]
        return "" if not seen else (
            f" (rank {seen[0]} is behind: it sent the token of its monitored_barrier call {other[seen[0]]}, "
            f"this is call {serial} on rank 0; if a rank skipped a call, the ranks are out of step: use a new "
            "group)")

    def ranks(ps: list[int]) -> str:
        return (f"rank {ps[0]} (world rank {world_ranks[ps[0]]})" if len(ps) == 1 else
                f"ranks {ps} (world ranks {[world_ranks[p] for p in ps]})")

    if r != 0:
        send(0)
        receive(0, lambda: f"monitored_barrier: rank {r} waited {seconds:g} s for rank 0 to answer: some rank did "
                           f"not reach monitored_barrier; in gloo's words: Rank {r} successfully reached "
                           "monitoredBarrier, but received errors while waiting for send/recv from rank 0. Please "
                           "check rank 0 logs for faulty rank.")
        return
    missing: list[int] = []
    for p in range(1, size):
        if deadline - time.monotonic() < 0 and not wait_all_ranks:      # (as gloo: its time is up first)
            came = list(range(1, p))
            raise RuntimeError(f"monitored_barrier: rank 0's {seconds:g} s ran out before it saw "
                               f"{ranks(list(range(p, size)))}{step([p])}" +
                               (f"; {ranks(came)} came" if came else "") +
                               f"; in gloo's words: Rank 0 timed out in monitoredBarrier after {ms} ms.")
        try:
            receive(p, lambda p=p: f"monitored_barrier: {ranks([p])} did not reach it within {seconds:g} s"
                                   f"{step([p])}; in gloo's words: [Rank 0]: Rank {p} failed to pass "
                                   f"monitoredBarrier in {ms} ms")
        except RuntimeError:
            if not wait_all_ranks:
                raise
            missing.append(p)
    if missing:
        raise RuntimeError(f"monitored_barrier: {ranks(missing)} did not reach it within {seconds:g} s"
                           f"{step(missing)}; in gloo's words: [Rank 0]: Rank{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(map(str, missing))} failed to pass monitoredBarrier in {ms} ms")
    for p in range(1, size):
        send(p)


def on_a_cpu_backend(backend: str) -> None:
    """torch < 2.14's ``dist.monitored_barrier`` refuses every backend but gloo by its name; torch
    2.14 takes any group with a CPU backend and calls the group's. There, the function (torch's
    module's, and ``torch.distributed``'s name for it) does as 2.14 does for a group of ``backend``, and
    leaves every other group to torch's own."""
    c10d = dist.distributed_c10d
    original = c10d.monitored_barrier
    if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14) or \
            getattr(original, "_mpicoll", False):
        return

    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        if c10d._rank_not_in_group(group) or c10d.get_backend(group) != backend:
            return original(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d._get_default_timeout(backend)
        elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            timeout = timedelta(seconds=timeout)       # (torch's own takes seconds too, with a warning)
        c10d._check_valid_timeout(timeout)
        return (group or c10d._get_default_group()).monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier.__doc__, monitored_barrier.__wrapped__ = original.__doc__, original
    monitored_barrier._mpicoll = True
    c10d.monitored_barrier = dist.monitored_barrier = monitored_barrier
