"""The fused MoE operators at 4 ranks (a 2 x 2 ep x tp mesh): every shard type, mesh layout, dtype,
bias form and activation against a golden written from SPEC's index formulas; the unfused
reference (AllToAll + AllGather as numpy indexing, numpy matmul); plans on new contents; the
reverse operator and the round trip; every documented constraint agreed on every rank. (The
generic tests run their golden cases too.)"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveArgumentError, CollectiveMismatchError
from mpicoll._dtypes import DTYPES
from mpicoll.checks import CHECKS
from mpicoll.checks._golden import SEED, count_wrong, rank_data
from mpicoll.ops.fused import (AlltoAllAllGatherBatchMatMulOperation as Fused,
                               AlltoAllAllGatherBatchMatMulParam as FusedParam,
                               BatchMatMulReduceScatterAlltoAllOperation as Reverse,
                               BatchMatMulReduceScatterAlltoAllParam as ReverseParam)

from _mpi import RANK, SIZE, raises_everywhere

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(SIZE != 4, reason=f"the fused operators need an ep x tp mesh of ep, tp in "
                                                  f"{{2, 4, 8, 16, 32}}: these tests run it at 4 ranks (2 x 2), not "
                                                  f"{SIZE}")]
EP = TP = 2
ACTS = ["none", "gelu", "silu", "relu", "fastgelu"]


def _mesh(layout: str):
    return mpicoll.mesh(EP, TP, "tp_contiguous" if layout == "tp" else "ep_contiguous", prefix="fused-test:")


def _where(layout: str):
    return (lambda s, t: s * TP + t) if layout == "tp" else (lambda s, t: t * EP + s)


def _golden(xs, w, b, s, shard, act, dtype, where):
    """y1, y2, y3 of rank (s, .) straight from SPEC's formulas (loops), matmul and activation in float64
    on the float32 values, rounded as SPEC says (after the matmul + bias, after the activation)."""
    dt = DTYPES[dtype].np
    E = xs[0].shape[0]
    Ee = E // EP
    C, H = (xs[0].shape[1], xs[0].shape[2] * TP) if shard == 0 else (xs[0].shape[1] * TP, xs[0].shape[2])
    y2 = np.zeros((Ee, EP * C, H), dt)
    for e in range(Ee):
        for s2 in range(EP):
            for t2 in range(TP):
                x = xs[where(s2, t2)]
                for c in range(x.shape[1]):
                    for h in range(x.shape[2]):
                        if shard == 0:
                            y2[e, s2 * C + c, t2 * (H // TP) + h] = x[s * Ee + e, c, h]
                        else:
                            y2[e, (s2 * TP + t2) * (C // TP) + c, h] = x[s * Ee + e, c, h]
    v = y2.astype(np.float32) @ w.astype(np.float32)
    if b is not None:
        v = v + b.astype(np.float32).reshape(Ee, 1, -1)
    y3 = v.astype(dt)
    f = y3.astype(np.float64)
    erfc = np.vectorize(math.erfc)
    a = {"none": f, "gelu": 0.5 * f * erfc(-f / math.sqrt(2)), "silu": f / (1 + np.exp(-f)),
         "relu": np.maximum(f, 0), "fastgelu": f / (1 + np.exp(-1.702 * f))}[act]
    return a.astype(np.float32).astype(dt), y2, y3


def _data(key, shape, dtype, rank=RANK, scale=1.0):
    return (rank_data(SEED, f"fused-test/{key}", rank, shape, DTYPES[dtype], "random") * scale).astype(
        DTYPES[dtype].np)


@pytest.mark.parametrize("layout", ["tp", "ep"])
@pytest.mark.parametrize("shard", [0, 1])
@pytest.mark.parametrize("dtype", CHECKS["AlltoAllAllGatherBatchMatMul"].dtypes)
def test_every_activation_and_bias_against_the_index_formulas(dtype, shard, layout):
    m = _mesh(layout)
    where = _where(layout)
    E, C, H, M = 4, 4, 6, 8
    xshape = (E, C, H // TP) if shard == 0 else (E, C // TP, H)
    bdt = "float16" if dtype == "float16" else "float32"
    failures = []
    for k, (act, bias) in enumerate((a, b) for a in ACTS for b in ("none", "2d", "3d")):
        key = f"{dtype}/{shard}/{layout}/{act}/{bias}"
        xs = [_data(key + "/x", xshape, dtype, r) for r in range(SIZE)]
        w = _data(key + "/w", (E // EP, H, M // TP), dtype, scale=0.5)
        b = None if bias == "none" else _data(key + "/b", (E // EP, M // TP) if bias == "2d" else
                                              (E // EP, 1, M // TP), bdt)
        op = Fused(FusedParam(group_ep=m.ep_domain, group_tp=m.tp_domain, ep_world_size=EP, tp_world_size=TP,
                              x_shard_type=shard, act_type=act, output_y2=True, output_y3=act != "none",
                              chunks=(1, 2, 5)[k % 3]))           # 5: tiles over experts and token rows
        y1, y2, y3 = op.execute(xs[RANK], w, b)
        g1, g2, g3 = _golden(xs, w, b, m.ep_rank, shard, act, dtype, where)
        if y2.tobytes() != g2.tobytes() or (act != "none" and y3.tobytes() != g3.tobytes()) or \
                (act == "none" and y3 is not None) or count_wrong(y1, g1, exact=False):
            failures.append((act, bias, count_wrong(y1, g1, exact=False)))
    assert not failures, failures


@pytest.mark.parametrize("shard", [0, 1])
def test_equal_to_the_unfused_reference(shard):
    """The unfused layer in numpy, bit for bit: every rank's x moved as AllToAll over ep and
    AllGather over tp would move it (array indexing, no communication), then numpy's matmul."""
    m = _mesh("tp")
    s = m.ep_rank
    E, C, H, M = 8, 6, 8, 6
    Ee = E // EP
    xshape = (E, C, H // TP) if shard == 0 else (E, C // TP, H)
    xs = [_data(f"ref/{shard}/x", xshape, "bfloat16", r) for r in range(SIZE)]
    w = _data(f"ref/{shard}/w", (E // EP, H, M // TP), "bfloat16")
    rank_of = _where("tp")
    # AllToAll over ep: tp rank t2's z holds block s (of Ee experts) of every ep peer's x, peer by peer;
    # AllGather over tp: every tp rank's z, stacked -> g[t2, s2] = block s of x of mesh rank (s2, t2)
    g = np.stack([np.stack([xs[rank_of(s2, t2)][s * Ee:(s + 1) * Ee] for s2 in range(EP)]) for t2 in range(TP)])
    y2 = (g.transpose(2, 1, 3, 0, 4) if shard == 0 else g.transpose(2, 1, 0, 3, 4)).reshape(Ee, EP * C, H)
    ref = np.matmul(y2.astype(np.float32), w.astype(np.float32)).astype(w.dtype)
    for chunks in (1, 2, 4):
        y1, _, _ = Fused(FusedParam(group_ep=m.ep_domain, group_tp=m.tp_domain, x_shard_type=shard,
                                    chunks=chunks)).execute(xs[RANK], w)
        assert y1.tobytes() == ref.tobytes(), chunks


@pytest.mark.parametrize("shard", [0, 1])
def test_the_reverse_round_trips_a_layer(shard):
    """Forward with weights that copy (act none), reverse with weights that put back: y == x."""
    m = _mesh("ep")
    s, t = m.ep_rank, m.tp_rank
    E, C, H = 4, 4, 6
    hs = H // TP
    x = _data(f"round/{shard}", (E, C, hs) if shard == 0 else (E, C // TP, H), "float16")
    Ee = E // EP
    if shard == 0:                      # forward keeps tp rank t's H slice; reverse puts it back in place
        fw = np.zeros((Ee, H, hs), np.float16)
        rw = np.zeros((Ee, hs, H), np.float16)
        fw[:, t * hs:(t + 1) * hs, :] = np.eye(hs)
        rw[:, :, t * hs:(t + 1) * hs] = np.eye(hs)
    else:                               # forward keeps all of H; only tp rank 0's partial counts back
        fw = np.tile(np.eye(H, dtype=np.float16), (Ee, 1, 1))
        rw = fw * np.float16(t == 0)
    common = dict(group_ep=m.ep_domain, group_tp=m.tp_domain, ep_world_size=EP, tp_world_size=TP, chunks=2)
    y1, _, _ = Fused(FusedParam(x_shard_type=shard, **common)).execute(x, fw)
    back = Reverse(ReverseParam(y_shard_type=shard, **common)).execute(y1, rw)
    assert back.shape == x.shape and back.tobytes() == x.tobytes()


def test_param_json_act_names_and_plan():
    m = _mesh("tp")
    p = FusedParam.from_json(json.dumps({"groupEp": m.ep_domain, "groupTp": m.tp_domain, "epWorldSize": 2,
                                         "tpWorldSize": 2, "xShardType": 1, "actType": "FastGELU", "outputY2": True,
                                         "outputY3": True}))
    assert (p.x_shard_type, p.act_type, p.output_y2, p.output_y3) == (1, "FastGELU", True, True)
    op = Fused(p)
    x = _data("plan/x", (4, 2, 4), "float16")
    w = _data("plan/w", (2, 4, 3), "float16")

    def check(got, key):
        """``got`` against _golden's numpy formulas (FastGELU, x_shard_type 1), every rank's x from ``key``."""
        y1, y2, y3 = _golden([_data(key, x.shape, "float16", r) for r in range(SIZE)], w, None, m.ep_rank, 1,
                             "fastgelu", "float16", _where("tp"))
        assert count_wrong(got[0], y1, exact=False) == 0, key
        assert got[1].tobytes() == y2.tobytes() and got[2].tobytes() == y3.tobytes(), key
    check(op.execute(x, w), "plan/x")
    with op.prepare(x, w) as plan:
        for key in ("plan/x", "plan/x2"):           # the plan reads x's current contents on every run
            x[...] = _data(key, x.shape, "float16")
            check(plan.run(), key)


def _bad(case):
    """(the last rank's call, message fragments): one documented rule broken on the last rank."""
    m = _mesh("tp")
    last = RANK == SIZE - 1
    kw = dict(group_ep=m.ep_domain, group_tp=m.tp_domain, ep_world_size=EP, tp_world_size=TP)
    x = _data("bad/x", (4, 2, 3), "float16")
    w = _data("bad/w", (2, 6, 4), "float16")
    b = None
    if case == "x dtype" and last:
        x = x.astype(np.float32)
    elif case == "weight dtype" and last:
        w = w.astype(np.float32)
    elif case == "bias dtype" and last:
        b = np.zeros((2, 4), np.float32)          # float16 x needs a float16 bias
    elif case == "weight shape" and last:
        w = w[:, :5]
    elif case == "bias shape" and last:
        b = np.zeros((2, 5), np.float16)
    elif case == "E not divisible" and last:
        x = _data("bad/x3", (3, 2, 3), "float16")
    elif case == "y3 without activation" and last:
        kw["output_y3"] = True
    elif case == "same domains" and last:
        kw["group_tp"] = kw["group_ep"]
    elif case == "tp size" and last:
        kw["tp_world_size"] = 4
    op = Fused(FusedParam(**kw))
    return lambda: op.execute(x, w, b)


@pytest.mark.parametrize("case,fragments", [
    ("x dtype", ("x.dtype='float32' on rank 3", "must be float16 or bfloat16")),
    ("weight dtype", ("weight='float32[2, 6, 4]' on rank 3", "must be float16[2, 6, M/tp]")),
    ("bias dtype", ("bias='float32[2, 4]' on rank 3", "must be float16[2, 4] or [2, 1, 4]")),
    ("weight shape", ("weight='float16[2, 5, 4]' on rank 3",)),
    ("bias shape", ("bias='float16[2, 5]' on rank 3",)),
    ("E not divisible", ("x.shape[0]=3 on rank 3", "divisible by ep=2")),
    ("y3 without activation", ("output_y3=True on rank 3", "needs an activation")),
    ("same domains", ("group_tp=", "must differ from group_ep")),
    ("tp size", ("tp_world_size=4 on rank 3", "the domain has 2 members")),
])
def test_every_documented_rule_broken_on_one_rank_is_agreed(case, fragments):
    raises_everywhere(_bad(case), CollectiveArgumentError, "AlltoAllAllGatherBatchMatMul: ", *fragments)


def test_a_mesh_size_outside_the_documented_ones():
    m = mpicoll.mesh(4, 1, prefix="fused-test-41:")
    op = Fused(FusedParam(group_ep=m.ep_domain, group_tp=m.tp_domain))
    raises_everywhere(lambda: op.execute(_data("x41", (4, 2, 3), "float16"), _data("w41", (1, 3, 2), "float16")),
                      CollectiveArgumentError, "tp_world_size=1", "must be one of [2, 4, 8, 16, 32]")


def test_shapes_that_differ_across_ranks_are_a_mismatch():
    m = _mesh("tp")
    x = _data("mm/x", (4, 2 + (RANK == SIZE - 1), 3), "float16")
    op = Fused(FusedParam(group_ep=m.ep_domain, group_tp=m.tp_domain))
    raises_everywhere(lambda: op.execute(x, _data("mm/w", (2, 6, 4), "float16")), CollectiveMismatchError,
                      "x.shape differs")
