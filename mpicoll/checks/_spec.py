"""What a checks module declares: :class:`CheckSpec` (its golden cases) and :class:`BenchSpec` (its
benchmark), and what the harnesses hand them (:class:`BenchCase`) and get back (:class:`Case`,
:class:`BenchRun`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .._dtypes import ALL_DTYPES, DTYPES, REDUCE_OPS, DType, ReduceOp


def runs_anywhere(n: int) -> str | None:
    """The default ``skip_at``: a spec that runs at every rank count."""
    return None


@dataclass
class Case:
    """One golden check: ``op.execute(*args, **kwargs)`` must give ``expected`` (an array, a tuple
    of them, or None for a root-only output on another rank), bit for bit when ``exact``."""

    op: object
    args: tuple
    kwargs: dict
    expected: object
    exact: bool = True

    def execute(self) -> object:
        return self.op.execute(*self.args, **self.kwargs)


@dataclass(frozen=True)
class CheckSpec:
    """How to check one operator: case families and a function building one :class:`Case`.

    ``families(n)`` names the cases at ``n`` ranks; ``make(case, dtype, comm_domain, rank, n, seed,
    validate=True)`` builds the operator on ``comm_domain`` (of ``n`` ranks, this one being
    ``rank``; "" = the world) and its inputs, and computes the expected output without any
    communication (every rank can rebuild every rank's input from the seed). ``skip_at(n)``: why
    it cannot be checked at ``n`` ranks (None: it can); it then has no case there.
    """

    name: str
    families: Callable[[int], list[str]]
    make: Callable[..., Case]
    dtypes: tuple[str, ...] = ALL_DTYPES
    skip_at: Callable[[int], str | None] = runs_anywhere

    def cases(self, n: int) -> list[str]:
        """The cases at ``n`` ranks (none where :attr:`skip_at` gives a reason)."""
        return [] if self.skip_at(n) else list(self.families(n))

    def cases_for(self, n: int, dtype: str) -> list[str]:
        """The cases at ``n`` ranks that apply to ``dtype``: a case named after a reduce op
        (``family:op``) that cannot reduce the dtype (AVG of integers) does not."""
        dt = DTYPES[dtype]
        return [c for c in self.cases(n)
                if all(REDUCE_OPS[part].refuses(dt) is None for part in c.split(":") if part in REDUCE_OPS)]

    def why_none(self, n: int, dtype: str | None = None) -> str | None:
        """Why no case runs at ``n`` ranks (in ``dtype``, if given); None when some case does."""
        if self.skip_at(n):
            return self.skip_at(n)
        if not self.cases(n):
            return f"it has no case at {n} rank(s)"
        if dtype is not None and not self.cases_for(n, dtype):
            return f"it has no case at {n} rank(s) in {dtype}"
        return None


@dataclass
class BenchCase:
    """What the benchmark harness asks an operator to set up: ``count`` elements in the op's
    nccl-tests size convention (the larger buffer: AllGather's output, ReduceScatter's input)."""

    count: int
    dtype: DType
    reduce: ReduceOp | None
    root: int
    n: int
    rank: int
    comm_domain: str
    validate: bool
    comm: object          # a raw mpi4py communicator over the same ranks, for the raw baseline
    world_rank: int = 0   # this rank in MPI.COMM_WORLD (to name sub-domains alike on every member)


@dataclass
class BenchRun:
    """The buffers and calls of one benchmark point.

    ``op.execute(*args, **kwargs)`` runs out of place into preallocated buffers (``args`` None: no
    such form); ``inplace`` is the ``(args, kwargs)`` of the in-place form (or None), ``reset``
    restores the input it overwrote. The harness times ``execute`` or, with ``--plan``, a plan
    prepared from the same arguments. ``expected`` is the golden of what the call returns (an
    array, a tuple of them, or None on a rank without a root-only output); ``raw`` makes the same
    collective with the plain mpi4py buffer call on the same arrays; ``torch_call(dist, torch,
    group)`` returns the torch.distributed equivalent on the same memory (or None); ``close()``
    releases what the setup made (called by the harness after the point)."""

    op: object
    args: tuple | None
    expected: object
    kwargs: dict = field(default_factory=dict)
    raw: Callable[[], object] | None = None
    inplace: tuple | None = None
    reset: Callable[[], object] | None = None
    torch_call: Callable[..., Callable[[], object] | None] | None = None
    exact: bool = True
    close: Callable[[], object] | None = None     # releases what setup made (collective: communicators)


@dataclass(frozen=True)
class BenchSpec:
    """How to benchmark one operator (nccl-tests style)."""

    name: str
    setup: Callable[[BenchCase], BenchRun]
    bus_factor: Callable[[int], float]
    count_multiple: Callable[[int], int] = lambda n: 1
    uses_reduce: bool = False
    uses_root: bool = False
    dtypes: tuple[str, ...] = ALL_DTYPES
    #: why it cannot run at ``n`` ranks (None: it can)
    skip_at: Callable[[int], str | None] = runs_anywhere
