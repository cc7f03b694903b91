"""The fused MoE operators: AllToAll (ep) + AllGather (tp) + BatchMatMul, and its reverse.

``AlltoAllAllGatherBatchMatMul`` (the Ascend aclnn operator of that name; docs/fused.md): every
rank holds ``x`` of its tokens for every expert; an AllToAll over the expert-parallel domain sends
each expert's tokens to the rank holding it, an AllGather over the tensor-parallel domain completes
them (along H or along C, ``x_shard_type``), and each rank multiplies them by its experts' weights:

    shard 0, x: (E, C, H/tp):    y2[e, s*C + c, t*(H/tp) + h]        = x_(s,t)[my_ep*Ee + e, c, h]
    shard 1, x: (E, C/tp, H):    y2[e, (s*tp + t)*(C/tp) + c, h]     = x_(s,t)[my_ep*Ee + e, c, h]
    y3[e] = y2[e] @ weight[e] + bias[e];  y1 = act(y3)              (float32, rounded after each step)

with s, t the ep and tp ranks, Ee = E/ep. The work goes in chunks of experts: chunk k+1's
collectives are in flight while chunk k is multiplied (``go.start``/``go.wait``, and ``go.test``
between experts, since MPICH moves a non-blocking collective only inside MPI calls).

``BatchMatMulReduceScatterAlltoAll`` is its inverse: ``x`` (Ee, ep*C, M/tp) @ ``weight`` (Ee, M/tp, H)
gives every tp rank a partial (Ee, ep*C, H); a ReduceScatter over tp sums them and gives each its
share (along H, or along C, ``y_shard_type``), + bias, and an AllToAll over ep sends every token back
to its source rank: ``y`` has the forward's input layout, (E, C, H/tp) or (E, C/tp, H).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _validate as V
from .._dtypes import HALF_FLOATS, REDUCE_OPS
from .._params import CommParam
from .._call import Call
from .._plan import Plan
from .._mesh import check_domains, mesh_domains
from ._base import Operation
from ._modes import PREPARE, RUN
from ._moe import (bias_and_pack, blas_threads, bmm, bmm_part, pack_tile, place_tile, rows_of,
                   unpack_back)
from ._reduce import reduce_scatter

__all__ = ["AlltoAllAllGatherBatchMatMulOperation", "AlltoAllAllGatherBatchMatMulParam",
           "BatchMatMulReduceScatterAlltoAllOperation", "BatchMatMulReduceScatterAlltoAllParam", "ACT_TYPES"]

#: the documented ep and tp sizes
SIZES = (2, 4, 8, 16, 32)
#: act_type: 0 none, 1 GELU, 2 SiLU, 3 ReLU, 4 FastGELU (the accelerator's names accepted too)
ACT_TYPES = {"none": 0, "gelu": 1, "silu": 2, "relu": 3, "fastgelu": 4}
#: chunks of experts by default (measured, docs/fused.md): the work in at most this many chunks
DEFAULT_CHUNKS = 4


# ----------------------------------------------------------------------------- the forward operator

@dataclass
class AlltoAllAllGatherBatchMatMulParam(CommParam):
    """Parameters (JSON: ``groupEp``, ``groupTp``, ``epWorldSize``, ``tpWorldSize``, ``xShardType``,
    ``actType``, ``outputY2``, ``outputY3``).

    Args:
        group_ep, group_tp: the expert- and tensor-parallel comm-domain names (different).
        ep_world_size, tp_world_size: their sizes, 2, 4, 8, 16 or 32 (needed to form an undeclared
            domain; checked against a formed or declared one).
        x_shard_type: 0: x is split along H over tp (the AllGather completes H); 1: along C.
        act_type: 0 none, 1 GELU, 2 SiLU, 3 ReLU, 4 FastGELU, or "none", "gelu", "silu", "relu",
            "fastgelu".
        output_y2, output_y3: also return the gathered tokens (y2) and the matmul before the
            activation (y3; needs an activation).
        chunks: how many tiles the work goes in, over experts, then token rows (overlap: tile k+1's
            collectives in flight while tile k is multiplied); 0 = ``DEFAULT_CHUNKS``.
        comm_domain / comm: the whole ep x tp mesh, over which arguments are agreed (default: the world).
    """

    group_ep: str = ""
    group_tp: str = ""
    ep_world_size: int | None = None
    tp_world_size: int | None = None
    x_shard_type: int = 0
    act_type: Any = 0
    output_y2: bool = False
    output_y3: bool = False
    chunks: int = 0


class _Mesh(Operation):
    """What both fused operators bind: the ep and tp domains inside the mesh, their sizes checked."""

    SHARD_FIELD = "x_shard_type"

    def _bind_param(self) -> None:
        p, mesh, op, r = self.param, self._lib, self.NAME, self.rank
        # the collective set-up first (its domains, the node's cores), then the rules one rank may
        # break alone: their error is agreed at the first call, with every member past the set-up
        self._ep, self._tp = mesh_domains(op, r, p.group_ep, p.group_tp, p.ep_world_size, p.tp_world_size)
        self._threads = blas_threads(mesh)
        for name, v in (("ep_world_size", p.ep_world_size), ("tp_world_size", p.tp_world_size)):
            if v is not None and v not in SIZES:
                raise V.arg_error(op, name, v, r, f"must be one of {list(SIZES)}")
        shard = getattr(p, self.SHARD_FIELD)
        if shard not in (0, 1) or isinstance(shard, bool):
            raise V.arg_error(op, self.SHARD_FIELD, shard, r, "must be 0 (along H) or 1 (along C)")
        if isinstance(p.chunks, bool) or not isinstance(p.chunks, (int, np.integer)) or p.chunks < 0:
            raise V.arg_error(op, "chunks", p.chunks, r, "must be an int >= 0 (0: the default)")
        check_domains(op, r, mesh, self._ep, self._tp, p.ep_world_size, p.tp_world_size, SIZES)
        self._comms = (mesh, self._ep, self._tp)
        self._shard = int(shard)

    def _chunks(self, experts: int) -> list[tuple[int, int]]:
        """``chunks`` ranges of experts (at most one per expert)."""
        k = max(1, min(self.param.chunks or DEFAULT_CHUNKS, experts))
        bounds = [experts * i // k for i in range(k + 1)]
        return [(bounds[i], bounds[i + 1]) for i in range(k) if bounds[i + 1] > bounds[i]] or [(0, 0)]

    def _x(self, x: Any) -> tuple[np.ndarray, Any, np.ndarray | None]:
        """:meth:`_data` of x, whose dtype must be float16 or bfloat16 (both fused operators)."""
        x, dt, src = self._data(x)
        if dt.name not in HALF_FLOATS:
            raise V.arg_error(self.NAME, "x.dtype", dt.name, self.rank, f"must be {' or '.join(HALF_FLOATS)}")
        return x, dt, src


class AlltoAllAllGatherBatchMatMulOperation(_Mesh):
    """AllToAll over ep, AllGather over tp, then a batched matmul (+ bias, + activation): the
    tokens of every rank reach the rank holding their expert, and are multiplied there.

    Example (2 x 2 mesh, ``m = mpicoll.mesh(2, 2)``, E = 2, C = 2, H = 4, M = 6, float16)::

        op = AlltoAllAllGatherBatchMatMulOperation(AlltoAllAllGatherBatchMatMulParam(
            group_ep=m.ep_domain, group_tp=m.tp_domain, ep_world_size=2, tp_world_size=2, act_type="relu"))
        y1, y2, y3 = op.execute(x, w)   # x: (2, 2, 2), w: (1, 4, 3) -> y1: (1, 4, 3); y2, y3: None
    """

    NAME = "AlltoAllAllGatherBatchMatMul"
    PARAM = AlltoAllAllGatherBatchMatMulParam

    def execute(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                out: tuple | None = None) -> tuple:
        """Exchange, gather and multiply.

        Args:
            x: (E, C, H/tp) for shard 0, (E, C/tp, H) for shard 1; float16 or bfloat16; the same
                shape and dtype on every rank of the mesh.
            weight: (E/ep, H, M/tp), x's dtype: this rank's experts.
            bias: None, (E/ep, M/tp) or (E/ep, 1, M/tp); float16 for float16 x, float32 for bfloat16.
            out: preallocated ``(y1, y2, y3)`` (None for each output not asked for).

        Returns:
            ``(y1, y2, y3)``: y1 (E/ep, ep*C, M/tp); y2 (E/ep, ep*C, H) with ``output_y2``, else
            None; y3 (like y1) with ``output_y3``, else None.
        """
        return self._call((x, weight, bias, out), RUN)

    def prepare(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                out: tuple | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, weight, bias, out)``."""
        return self._call((x, weight, bias, out), PREPARE)

    def _bind_param(self) -> None:
        super()._bind_param()
        p, op, r = self.param, self.NAME, self.rank
        act = p.act_type
        if isinstance(act, str):
            act = ACT_TYPES.get(act.lower(), act)
        if act not in (0, 1, 2, 3, 4) or isinstance(act, bool):
            raise V.arg_error(op, "act_type", p.act_type, r, f"must be 0-4 or one of {list(ACT_TYPES)}")
        if p.output_y3 and act == 0:
            raise V.arg_error(op, "output_y3", True, r, "needs an activation (act_type 0: y3 would be y1)")
        self._act = int(act)

    def describe(self, x, weight, bias=None, out=None) -> Call:
        op, r, ep, tp = self.NAME, self.rank, self._ep.size, self._tp.size
        x, dt, src = self._x(x)
        if x.ndim != 3:
            raise V.arg_error(op, "x.shape", x.shape, r, "must be 3-D")
        E, c_in, h_in = x.shape
        if not 2 <= E <= 512 or E % ep or E // ep > 32:
            raise V.arg_error(op, "x.shape[0]", E, r, f"E must be in [2, 512], divisible by ep={ep}, E/ep <= 32")
        C, H = (c_in, h_in * tp) if self._shard == 0 else (c_in * tp, h_in)
        if c_in < 1 or not 1 <= H <= 65535:
            raise V.arg_error(op, "x.shape", x.shape, r, f"C must be > 0 and H (here {H}) in [1, 65535]")
        Ee = E // ep
        w = _weight(op, "weight", weight, dt, (Ee, H), r)
        mt = w.shape[2]
        b = _bias(op, bias, dt, Ee, mt, r)
        want = {"y1": (Ee, ep * C, mt), "y2": (Ee, ep * C, H) if self.param.output_y2 else None,
                "y3": (Ee, ep * C, mt) if self.param.output_y3 else None}
        outs = _outs(self, out, want, dt, x if src is None else src)
        call = Call(dt, x, outs[0], x.shape)
        call.src, call.result = src, tuple(outs)
        call.params = _digest(self._shard, self._act, self.param.output_y2, self.param.output_y3, mt,
                              self.param.chunks, b is not None)
        call.args = (w, b, Ee, C, H)
        return call

    def issue(self, call, table, go) -> None:
        x, dt = call.x, call.dt
        w, b, Ee, C, H = call.args
        y1, y2, y3 = call.result
        ep, tp, shard = self._ep.size, self._tp.size, self._shard
        cx, hx = x.shape[1:]                                # one expert's block: (C, H/tp) or (C/tp, H)
        m = dt.mpi
        gathered = y2 if y2 is not None else np.empty((Ee, ep * C, H), dt.np)
        bufs = []
        for e0, e1, c0, c1 in self._tiles(Ee, cx):
            k, cb = e1 - e0, c1 - c0
            bufs.append((e0, e1, c0, c1, np.empty((ep, k, cb, hx), dt.np), np.empty((ep, k, cb, hx), dt.np),
                         np.empty((tp, ep, k, cb, hx), dt.np)))

        def exchange(i):                                 # tile i's AllToAll over ep, started
            e0, e1, c0, c1, send, recv, _ = bufs[i]
            go.local(pack_tile, x, send, Ee, e0, e1, c0, c1)
            return go.start(self._ep, "Alltoall", [send, m], [recv, m])

        def gather(i):                                   # tile i's AllGather over tp, started
            return go.start(self._tp, "Allgather", [bufs[i][5], m], [bufs[i][6], m])
        # Tile i's AllGather waits for its AllToAll, its matmul for its AllGather. While tile i is
        # multiplied, tile i+1's AllToAll (first half of its steps), then tile i+1's AllGather and
        # tile i+2's AllToAll (second half) are in flight; between steps, MPI moves them on (go.test).
        a = {0: exchange(0)}
        go.wait(a[0])
        g = {0: gather(0)}
        if len(bufs) > 1:
            a[1] = exchange(1)
        for i, (e0, e1, c0, c1, _, _, gat) in enumerate(bufs):
            go.wait(g[i])
            go.local(place_tile, gat, gathered, e0, e1, c0, c1, shard)
            steps = [(e, r0, r1) for e in range(e0, e1) for r0, r1 in rows_of(ep, tp, C, cx, c0, c1, shard)]
            half = len(steps) // 2
            for k, (e, r0, r1) in enumerate(steps):
                if k == half and i + 1 < len(bufs):      # the next tile's AllGather, the one after's AllToAll
                    go.wait(a[i + 1])
                    g[i + 1] = gather(i + 1)
                    if i + 2 < len(bufs):
                        a[i + 2] = exchange(i + 2)
                go.local(bmm, gathered, w, b, y3, y1, e, r0, r1, self._act, self._threads)
                for t in (a.get(i + 1), g.get(i + 1), a.get(i + 2)):
                    if t is not None:
                        go.test(t)

    def _tiles(self, experts: int, cx: int) -> list[tuple[int, int, int, int]]:
        """The pipeline's tiles ``(e0, e1, c0, c1)``: ``chunks`` of them, over experts first, then
        over blocks of each expert's ``cx`` token rows."""
        k = max(1, self.param.chunks or DEFAULT_CHUNKS)
        if k <= experts:
            return [(e0, e1, 0, cx) for e0, e1 in self._chunks(experts)]
        q = max(1, min(-(-k // experts), cx))
        bounds = [cx * i // q for i in range(q + 1)]
        return [(e, e + 1, bounds[j], bounds[j + 1]) for e in range(experts) for j in range(q)
                if bounds[j + 1] > bounds[j]] or [(0, experts, 0, cx)]


def _weight(op: str, name: str, w: Any, dt, lead: tuple, rank: int) -> np.ndarray:
    if not isinstance(w, np.ndarray) or w.dtype != dt.np or w.ndim != 3 or w.shape[:2] != lead:
        raise V.arg_error(op, name, f"{getattr(w, 'dtype', type(w).__name__)}{list(getattr(w, 'shape', ()))}", rank,
                          f"must be {dt.name}[{lead[0]}, {lead[1]}, M/tp]")
    if not 1 <= w.shape[2] <= 65535:
        raise V.arg_error(op, f"{name}.shape[2]", w.shape[2], rank, "M/tp must be in [1, 65535]")
    return w


def _bias(op: str, b: Any, dt, Ee: int, n: int, rank: int) -> np.ndarray | None:
    if b is None:
        return None
    want = np.float16 if dt.name == "float16" else np.float32
    if not isinstance(b, np.ndarray) or b.dtype != want or b.shape not in ((Ee, n), (Ee, 1, n)):
        raise V.arg_error(op, "bias", f"{getattr(b, 'dtype', type(b).__name__)}{list(getattr(b, 'shape', ()))}",
                          rank, f"must be {np.dtype(want).name}[{Ee}, {n}] or [{Ee}, 1, {n}] ({np.dtype(want).name} "
                          f"for {dt.name} x)")
    return b


def _outs(op: Operation, out: Any, want: dict, dt, x: np.ndarray) -> list:
    """The outputs: given (a tuple, None where not asked for) or allocated."""
    names = list(want)
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != len(names)):
        raise V.arg_error(op.NAME, "out", type(out).__name__, op.rank, f"must be a tuple ({', '.join(names)}) with "
                          "None for an output not asked for")
    given = [None] * len(names) if out is None else list(out)
    result = []
    for name, shape, o in zip(names, want.values(), given):
        if shape is None:
            if o is not None:
                raise V.arg_error(op.NAME, f"out ({name})", "an array", op.rank, "must be None: not asked for")
            result.append(None)
        else:
            result.append(op._out(o, shape, dt.np, x, name=f"out ({name})"))
    return result


def _digest(*values: Any) -> int:
    """Operator parameters as one int64 for the agreed header."""
    h = 0
    for v in values:
        h = (h * 1_000_003 + int(v)) & 0x3FFFFFFFFFFFFFFF
    return h


# ----------------------------------------------------------------------------- the reverse operator

@dataclass
class BatchMatMulReduceScatterAlltoAllParam(CommParam):
    """Parameters of the reverse: as the forward's, with ``y_shard_type`` (0: y split along H over
    tp, 1: along C) instead of ``x_shard_type``, and no activation."""

    group_ep: str = ""
    group_tp: str = ""
    ep_world_size: int | None = None
    tp_world_size: int | None = None
    y_shard_type: int = 0
    chunks: int = 0


class BatchMatMulReduceScatterAlltoAllOperation(_Mesh):
    """The forward's inverse: a batched matmul, a ReduceScatter over tp (+ bias), an AllToAll over
    ep that sends every token back to its source rank.

    ``y_(s',t)[j*Ee + e, c, h']`` = the sum over tp ranks t' of ``(x_(j,t') @ weight_(j,t'))[e, row, col]``
    + ``bias_(j,t)[e, h']``, where (row, col) is the position the forward gathered from: shard 0:
    ``row = s'*C + c``, ``col = t*(H/tp) + h'``; shard 1: ``row = (s'*tp + t)*(C/tp) + c``, ``col = h'``.
    A forward then a reverse with matching weights round-trip a layer (docs/fused.md).
    """

    NAME = "BatchMatMulReduceScatterAlltoAll"
    PARAM = BatchMatMulReduceScatterAlltoAllParam
    SHARD_FIELD = "y_shard_type"

    def execute(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """Multiply, reduce-scatter over tp, add the bias, send back over ep.

        Args:
            x: (E/ep, ep*C, M/tp), float16 or bfloat16 (the forward's y1 layout).
            weight: (E/ep, M/tp, H), x's dtype.
            bias: None, (E/ep, H/tp) or (E/ep, 1, H/tp) for shard 0, (E/ep, H) or (E/ep, 1, H) for
                shard 1; float16 for float16 x, float32 for bfloat16.
            out: a preallocated y.

        Returns:
            y: (E, C, H/tp) for shard 0, (E, C/tp, H) for shard 1 (the forward's x layout).
        """
        return self._call((x, weight, bias, out), RUN)

    def prepare(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, weight, bias, out)``."""
        return self._call((x, weight, bias, out), PREPARE)

    def describe(self, x, weight, bias=None, out=None) -> Call:
        op, r, ep, tp = self.NAME, self.rank, self._ep.size, self._tp.size
        x, dt, src = self._x(x)
        if x.ndim != 3 or x.shape[1] % (ep * (tp if self._shard else 1)) or not 1 <= x.shape[0] <= 32:
            raise V.arg_error(op, "x.shape", x.shape, r, f"must be (E/ep <= 32, ep*C, M/tp) with ep*C divisible by "
                              f"ep={ep}" + (f" x tp={tp}" if self._shard else ""))
        Ee, rows, mt = x.shape
        C = rows // ep
        w = _weight(op, "weight", weight, dt, (Ee, mt), r)
        H = w.shape[2]
        if self._shard == 0 and H % tp:
            raise V.arg_error(op, "weight.shape[2]", H, r, f"H must be divisible by tp={tp} (y_shard_type 0)")
        share = H // tp if self._shard == 0 else H
        b = _bias(op, bias, dt, Ee, share, r)
        E = Ee * ep
        yshape = (E, C, H // tp) if self._shard == 0 else (E, C // tp, H)
        y = self._out(out, yshape, dt.np, x if src is None else src)
        call = Call(dt, x, y, x.shape)
        call.src = src
        call.params = _digest(self._shard, H, self.param.chunks, b is not None)
        call.args = (w, b, Ee, C, H)
        return call

    def issue(self, call, table, go) -> None:
        x, dt, y = call.x, call.dt, call.out
        w, b, Ee, C, H = call.args
        ep, tp, shard = self._ep.size, self._tp.size, self._shard
        block = (C, H // tp) if shard == 0 else (C // tp, H)    # one (expert, source) block of y
        m = dt.mpi
        prev = None
        for e0, e1 in self._chunks(Ee):
            k = e1 - e0
            part = np.empty((tp, k, ep, *block), dt.np)          # the partial products, in tp blocks
            mine = np.empty((k, ep, *block), dt.np)              # this rank's share, reduced over tp
            send, back = np.empty((ep, k, *block), dt.np), np.empty((ep, k, *block), dt.np)
            for e in range(e0, e1):                              # (the previous chunk's AllToAll in flight)
                go.local(bmm_part, x, w, part, e0, e, shard, self._threads)
                if prev is not None:
                    go.test(prev[0])
            reduce_scatter(go, self._tp, part.reshape(-1), [part[0].size] * tp, dt, REDUCE_OPS["sum"],
                           mine.reshape(-1))
            go.local(bias_and_pack, mine, b, e0, e1, send)
            if prev is not None:
                go.wait(prev[0])
                go.local(unpack_back, *prev[1:])
            prev = (go.start(self._ep, "Alltoall", [send, m], [back, m]), back, y, Ee, e0, e1)
        if prev is not None:
            go.wait(prev[0])
            go.local(unpack_back, *prev[1:])
