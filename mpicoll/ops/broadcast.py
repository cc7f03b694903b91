"""Broadcast: the root's array overwrites every rank's array, in place."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _validate as V
from .._dtypes import BY_NP, DTYPES, MPI_BY_NUM
from .._golden import BenchRun, BenchSpec, CheckSpec, bench_data, rank_data, register_bench, register_check, torch_view
from .._params import CommParam
from ._base import Operation, mpi_of_c


@dataclass
class BroadcastParam(CommParam):
    """Broadcast parameters: the common fields; ``rank_root`` is the source."""


class BroadcastOperation(Operation):
    """Copy rank ``rank_root``'s ``x`` into every rank's ``x``, in place.

    ``execute(x)`` -> x (filled with the root's data). x must be a C-contiguous, writable array of
    the same shape and dtype on every rank.

    Example (4 ranks, root 0, ``x = np.array([[rank]], np.int32)``)::

        BroadcastOperation(BroadcastParam(rank_root=0)).execute(x)   # [[0]] on every rank
    """

    NAME = "Broadcast"
    PARAM = BroadcastParam
    USES_ROOT = True

    def _check(self, args, kwargs, h):
        x = _bcast_args(*args, **kwargs)
        self._writable(x)
        self._check_x(x, h)
        return (x,), {}

    def _writable(self, x):
        if not isinstance(x, np.ndarray) or not x.flags.c_contiguous or not x.flags.writeable:
            raise V.arg_error(self.NAME, "x", type(x).__name__ if not isinstance(x, np.ndarray) else "non-contiguous "
                              "or read-only array", self.rank, "must be a C-contiguous writable numpy array "
                              "(it is filled in place)")

    def _checked(self):
        general, finish, tmpl, codes, plain, _ = self._plain_kit()
        dtype_at, shape_at, max_dims = V.H_DTYPE, V.H_SIZE, V.MAX_DIMS

        def execute(*args, **kwargs):
            h = None
            try:          # (nothing here may raise on one rank alone: anything odd goes to the general path)
                if len(args) == 1 and not kwargs:
                    x = args[0]
                    h = plain(x, tmpl, codes, dtype_at, shape_at, max_dims)
                    if h is not None and not x.flags.writeable:
                        h = None
            except Exception:  # noqa: BLE001
                h = None
            if h is not None:
                return finish((x,), {}, h)
            return general(*args, **kwargs)
        return execute

    def _fast(self):
        call, root, slow, mpi_of, table = self.comm.Bcast, self._root, self._run, mpi_of_c(), MPI_BY_NUM

        def execute(x):
            m = mpi_of(x, table)
            if m is not None:
                call([x, m], root)
                return x
            return slow(x)
        return execute

    def _run(self, x):
        if type(x) is not np.ndarray or not x.flags.c_contiguous:
            self._writable(x)
        dt = BY_NP.get(x.dtype) or V.check_array(self.NAME, "x", x, self.rank)
        self.comm.Bcast([x, dt.mpi], self._root)
        return x


def _bcast_args(x):
    return x


_SHAPES = {"small": (4, 3), "zero": (0,), "scalar": (), "large": (300_001,)}


def _cases(n):
    return [f"{s}:root{r}" for s in ("small",) for r in range(n)] + ["zero:root0", "scalar:root0",
                                                                     f"large:root{n - 1}"]


def _run_case(case, dtype, comm_domain, rank, n, seed, validate=True):
    family, root = case.split(":")
    root = int(root.removeprefix("root"))
    dt = DTYPES[dtype]
    inputs = [rank_data(seed, f"Broadcast/{case}/{dtype}", r, _SHAPES[family], dt) for r in range(n)]
    op = BroadcastOperation(BroadcastParam(comm_domain=comm_domain, rank_size=n, rank_root=root), validate=validate)
    x = inputs[rank].copy()
    got = op.execute(x)
    return got, inputs[root], True


register_check(CheckSpec("Broadcast", _cases, _run_case))


def _bench(c) -> BenchRun:
    x = bench_data(c.rank, c.count, c.dtype)
    work = x.copy()
    op = BroadcastOperation(BroadcastParam(comm_domain=c.comm_domain, rank_size=c.n, rank_root=c.root),
                            validate=c.validate)
    comm, t, root = c.comm, c.dtype.mpi, c.root    # locals in the raw call, as a user's loop has them

    def torch_call(dist, torch, group):
        t = torch_view(torch, work)
        return lambda: dist.broadcast(t, group=group, group_src=c.root)
    return BenchRun(run=None, inplace=lambda: op.execute(work), reset=lambda: np.copyto(work, x), result=lambda: work,
                    expected=bench_data(c.root, c.count, c.dtype), raw=lambda: comm.Bcast([work, t], root),
                    torch_call=torch_call)


register_bench(BenchSpec("Broadcast", _bench, lambda n: 1.0, uses_root=True))
