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

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _validate as V
from .._dtypes import HALF_FLOATS, REDUCE_OPS
from .._numeric import from_f32, to_f32
from .._params import CommParam
from .._call import Call
from .._plan import Plan
from .._cpus import node_affinities
from .._mesh import check_domains, mesh_domains
from ._base import PREPARE, RUN, Operation
from ._reduce import reduce_scatter

__all__ = ["AlltoAllAllGatherBatchMatMulOperation", "AlltoAllAllGatherBatchMatMulParam",
           "BatchMatMulReduceScatterAlltoAllOperation", "BatchMatMulReduceScatterAlltoAllParam", "ACT_TYPES"]

#: the documented ep and tp sizes
SIZES = (2, 4, 8, 16, 32)
#: act_type: 0 none, 1 GELU, 2 SiLU, 3 ReLU, 4 FastGELU (the accelerator's names accepted too)
ACT_TYPES = {"none": 0, "gelu": 1, "silu": 2, "relu": 3, "fastgelu": 4}
#: chunks of experts by default (measured, docs/fused.md): the work in at most this many chunks
DEFAULT_CHUNKS = 4
#: rows of y2 one matmul step takes at most: between steps, MPI moves the collectives in flight on
ROWS_PER_STEP = 128


_ERFC = (np.float32(-0.82215223), np.float32(1.48851587), np.float32(-1.13520398), np.float32(0.27886807),
         np.float32(-0.18628806), np.float32(0.09678418), np.float32(0.37409196), np.float32(1.00002368),
         np.float32(-1.26551223))


def _erfc(x: np.ndarray) -> np.ndarray:
    """erfc of float32 ``x``, float32, with a relative error below 1.2e-7 everywhere (the Chebyshev
    fit of Press et al., Numerical Recipes 6.2): GELU of a large negative value keeps its
    significant bits, where 1 + erf(x) would cancel. numpy has no erf. In place, pass by pass."""
    z = np.abs(x)
    t = np.multiply(z, np.float32(0.5))
    t += np.float32(1)
    np.reciprocal(t, out=t)
    p = np.multiply(t, np.float32(0.17087277))
    for k in _ERFC[:-1]:
        p += k
        p *= t
    p += _ERFC[-1]
    np.multiply(z, z, out=z)
    p -= z
    np.exp(p, out=p)
    p *= t
    np.subtract(np.float32(2), p, out=p, where=x < 0)
    return p


def activate(act: int, v: np.ndarray) -> np.ndarray:
    """The activation ``act`` of float32 ``v``, in place (returns ``v``)."""
    if act == 1:                   # 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2)
        e = _erfc(v * np.float32(-1 / math.sqrt(2)))
        v *= np.float32(0.5)
        v *= e
    elif act in (2, 4):            # x sigmoid(x) and x sigmoid(1.702 x)
        d = np.multiply(v, np.float32(-1 if act == 2 else -1.702))
        with np.errstate(over="ignore"):                  # exp overflow: inf, then x / inf = -0, the limit
            np.exp(d, out=d)
        d += np.float32(1)
        v /= d
    elif act == 3:
        np.maximum(v, np.float32(0), out=v)
    return v


def _f32(a: np.ndarray) -> np.ndarray:
    """A float32 copy of a 16-bit float array (the C kernels where built)."""
    out = np.empty(a.shape, np.float32)
    if a.flags.c_contiguous:
        return to_f32(a.reshape(-1), out.reshape(-1)).reshape(a.shape)
    np.copyto(out, a)
    return out


def _round(v: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Round float32 ``v`` into 16-bit ``out`` (contiguous), to nearest even."""
    return from_f32(np.ascontiguousarray(v).reshape(-1), out.reshape(-1)).reshape(out.shape)


# ----------------------------------------------------------------------------- BLAS threads

_THREADS: dict[int, int] = {}
_CONTROLLER: list = []


def blas_threads(lib) -> int:
    """Cores per rank on this node: the cores this process may use, shared by the node's ranks of
    ``lib`` (collective over ``lib`` the first time, when the operation binds)."""
    if lib.ident not in _THREADS:
        lib.meet("count the cores of its node")
        sets, here = node_affinities(lib.mpi)
        _THREADS[lib.ident] = max(1, min(len(here), len(set().union(*sets)) // len(sets)))
    return _THREADS[lib.ident]


def _limit(threads: int):
    """threadpoolctl's limit of BLAS threads (the controller made once per process)."""
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=threads, user_api="blas")


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
            go.local(_pack_tile, x, send, Ee, e0, e1, c0, c1)
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
            go.local(_place, gat, gathered, e0, e1, c0, c1, shard)
            steps = [(e, r0, r1) for e in range(e0, e1) for r0, r1 in _rows_of(ep, tp, C, cx, c0, c1, shard)]
            half = len(steps) // 2
            for k, (e, r0, r1) in enumerate(steps):
                if k == half and i + 1 < len(bufs):      # the next tile's AllGather, the one after's AllToAll
                    go.wait(a[i + 1])
                    g[i + 1] = gather(i + 1)
                    if i + 2 < len(bufs):
                        a[i + 2] = exchange(i + 2)
                go.local(_bmm, gathered, w, b, y3, y1, e, r0, r1, self._act, self._threads)
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


def _rows_of(ep: int, tp: int, C: int, cx: int, c0: int, c1: int, shard: int):
    """The runs of y2's rows a tile fills, cut at ROWS_PER_STEP: token rows [c0, c1) of each
    source block, a block being ``s*C`` (shard 0, cx = C) or ``(s*tp + t)*(C/tp)`` (shard 1)."""
    if c0 == 0 and c1 == cx:
        runs = [(0, ep * C)]                          # (whole experts: one run)
    else:
        runs = [(blk * cx + c0, blk * cx + c1) for blk in range(ep if shard == 0 else ep * tp)]
    for first, end in runs:
        for r0 in range(first, end, ROWS_PER_STEP):
            yield r0, min(r0 + ROWS_PER_STEP, end)


def _pack_tile(x: np.ndarray, send: np.ndarray, Ee: int, e0: int, e1: int, c0: int, c1: int) -> None:
    """send[j] = x's experts [j*Ee + e0, j*Ee + e1), token rows [c0, c1): block j of dim 0 goes to ep
    rank j."""
    ep = send.shape[0]
    np.copyto(send, x.reshape(ep, Ee, *x.shape[1:])[:, e0:e1, c0:c1])


def _place(gat: np.ndarray, y2: np.ndarray, e0: int, e1: int, c0: int, c1: int, shard: int) -> None:
    """A gathered tile (tp, ep, k, rows c0..c1, H') into y2 by SPEC's index formulas."""
    tp, ep, k, _, h = gat.shape
    if shard == 0:    # y2[e, s*C + c, t*(H/tp) + h] = gat[t, s, e, c, h]
        C = y2.shape[1] // ep
        y2[e0:e1].reshape(k, ep, C, tp, h)[:, :, c0:c1] = gat.transpose(2, 1, 3, 0, 4)
    else:             # y2[e, (s*tp + t)*(C/tp) + c, h] = gat[t, s, e, c, h]
        cs = y2.shape[1] // (ep * tp)
        y2[e0:e1].reshape(k, ep, tp, cs, h)[:, :, :, c0:c1] = gat.transpose(2, 1, 0, 3, 4)


def _bmm(y2: np.ndarray, w: np.ndarray, b: np.ndarray | None, y3: np.ndarray | None, y1: np.ndarray, e: int,
         r0: int, r1: int, act: int, threads: int) -> None:
    """Rows [r0, r1) of expert e: y3 = round(f32(y2) @ f32(w) + f32(b)); y1 = round(act(f32(y3)))."""
    with _limit(threads):
        v = np.matmul(_f32(y2[e, r0:r1]), _f32(w[e]))
    if b is not None:
        v += _f32(b[e]).reshape(1, -1) if b.dtype != np.float32 else b[e].reshape(1, -1)
    if act == 0:
        _round(v, y1[e, r0:r1])
        return
    tgt = y3[e, r0:r1] if y3 is not None else np.empty(v.shape, y1.dtype)
    _round(v, tgt)
    _round(activate(act, _f32(tgt)), y1[e, r0:r1])


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
                go.local(_bmm_part, x, w, part, e0, e, shard, self._threads)
                if prev is not None:
                    go.test(prev[0])
            reduce_scatter(go, self._tp, part.reshape(-1), [part[0].size] * tp, dt, REDUCE_OPS["sum"],
                           mine.reshape(-1))
            go.local(_bias_and_pack, mine, b, e0, e1, send)
            if prev is not None:
                go.wait(prev[0])
                go.local(_unpack_back, *prev[1:])
            prev = (go.start(self._ep, "Alltoall", [send, m], [back, m]), back, y, Ee, e0, e1)
        if prev is not None:
            go.wait(prev[0])
            go.local(_unpack_back, *prev[1:])


def _bmm_part(x: np.ndarray, w: np.ndarray, part: np.ndarray, e0: int, e: int, shard: int, threads: int) -> None:
    """Expert e's partial product, rounded, into its tp blocks: part[t, e - e0, s] is the block of
    tokens from ep rank s that tp rank t keeps (by the forward's index formulas, inverted)."""
    with _limit(threads):
        v = np.matmul(_f32(x[e]), _f32(w[e]))                   # (ep*C, H)
    tp, _, ep, c, h = part.shape
    if shard == 0:    # row s*C + c, column t*(H/tp) + h
        src = v.reshape(ep, c, tp, h).transpose(2, 0, 1, 3)
    else:             # row (s*tp + t)*(C/tp) + c, column h
        src = v.reshape(ep, tp, c, h).transpose(1, 0, 2, 3)
    _round(np.ascontiguousarray(src), part[:, e - e0])


def _bias_and_pack(mine: np.ndarray, b: np.ndarray | None, e0: int, e1: int, send: np.ndarray) -> None:
    """send[s, e] = mine[e, s] + bias[e] (float32, rounded): what goes back to ep rank s."""
    if b is None:
        np.copyto(send, mine.transpose(1, 0, 2, 3))
        return
    k = e1 - e0
    v = _f32(mine) + (_f32(b[e0:e1]) if b.dtype != np.float32 else b[e0:e1]).reshape(k, 1, 1, -1)
    _round(np.ascontiguousarray(v.transpose(1, 0, 2, 3)), send)


def _unpack_back(back: np.ndarray, y: np.ndarray, Ee: int, e0: int, e1: int) -> None:
    """y[j*Ee + e, c, h] = back[j, e - e0, c, h]: expert owner j's results for this rank's tokens."""
    ep = back.shape[0]
    y.reshape(ep, Ee, *y.shape[1:])[:, e0:e1] = back
