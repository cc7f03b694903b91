"""The call pipeline (Operation._call): the bugs that lived in its second copies, each in a fresh job.

Each test runs its own ``mpirun`` job (at 2 and 4 ranks), so no state of an earlier test hides a
set-up bug, and prints what every rank saw; the test reads it.
"""
from __future__ import annotations

import pytest
from mpi4py import MPI

from _mpi import said as _job

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]

SIZES = pytest.mark.parametrize("np_", [2, 4])


@SIZES
def test_validate_set_before_the_first_call_wins_over_the_job_default(tmp_path, np_):
    """Bug 1: ``op.validate = True`` set before the first call, under ``MPICOLL_VALIDATE=0``, stays
    True, so a dtype that differs on one rank (after the first call) is a named error on every
    rank, not garbage; and ``validate = False`` under the default stays False."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        op = mpicoll.AllReduceOperation()
        op.validate = True
        op.execute(np.ones(4, np.float32))
        x = np.ones(4, np.float64 if r == n - 1 else np.float32)
        try:
            op.execute(x)
            say(f"no error")
        except mpicoll.CollectiveMismatchError as e:
            say(f"{op.validate} {e.param}")
        off = mpicoll.AllReduceOperation(validate=None)
        off.validate = False
        off.execute(np.ones(4, np.float32))
        say(f"off {off.validate}")
    """, np_, env={"MPICOLL_VALIDATE": "0"})
    assert lines == sorted([f"rank {r}: True dtype" for r in range(np_)] + [f"rank {r}: off False" for r in range(np_)])


@SIZES
def test_a_remembered_call_keys_its_data_by_identity(tmp_path, np_):
    """Bug 2: QuantAllReduce's scale is data: a remembered call is the same arrays, so another
    array with equal contents is another call (it used to replay the first array: 6.0 for 2.0),
    and a plan re-reads a float64 array of scales (converted on every run)."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        op = mpicoll.QuantAllReduceOperation(validate=False)
        x, out = np.ones(8, np.int8), np.empty(8, np.float16)
        a = np.array([1.0], np.float32)
        for _ in range(3):
            op.execute(x, a, out)                  # remembered, then run as a plan
        a[:] = 3.0
        b = np.array([1.0], np.float32)            # the contents a had when it was remembered
        got_b = float(op.execute(x, b, out)[0])
        got_a = float(op.execute(x, a, out)[0])
        c = np.array([0.5])                        # float64: converted into float32 scales
        for _ in range(3):
            op.execute(x, c, out)
        c[:] = 2.0
        got_c = float(op.execute(x, c, out)[0])
        plan = op.prepare(x, c, out)
        c[:] = 0.25
        got_plan = float(plan.run()[0])
        say(f"{got_b / n} {got_a / n} {got_c / n} {got_plan / n}")
    """, np_)
    assert lines == [f"rank {r}: 1.0 3.0 2.0 0.25" for r in range(np_)]


@SIZES
def test_a_call_with_a_new_view_each_time_fills_one_compiled_call(tmp_path, np_):
    """A view made and freed on every call often lands at the address of the last one: its layout,
    not its identity, finds the compiled call, which the new view fills (one compiled layout, not
    one per view); the same view again repeats it; and AllToAllVV2, whose counts come with every
    call, is never compiled."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        counts, displs = [2] * n, [2 * i for i in range(n)]
        op = mpicoll.AllToAllOperation(validate=False)
        v2 = mpicoll.AllToAllVV2Operation(validate=False)
        x, o = np.arange(2 * n, dtype=np.float32), np.empty(2 * n, np.float32)
        for k in range(20):
            x[:] = np.arange(2 * n) + k
            op.execute(x, out=o.reshape(-1))
            v2.execute(x, counts, displs, counts, displs, out=o.reshape(1, -1))
        fresh = len(op._compiled)
        view = o.reshape(-1)
        for _ in range(3):
            op.execute(x, out=view)
        say(f"{fresh} {len(op._compiled)} {len(v2._compiled)} {o[2 * r:2 * r + 2].tolist() == [2.0 * r + 19, 2.0 * r + 20]}")
    """, np_)
    assert lines == [f"rank {r}: 1 1 0 True" for r in range(np_)]


@SIZES
def test_a_skipped_plan_run_is_a_named_error_on_every_rank(tmp_path, np_):
    """Bug 5: with ``MPICOLL_TIMEOUT`` set, the last rank skips a ``plan.run()`` (and a graph
    replay) and makes a validated call, or runs another plan: every rank raises the same
    CollectiveMismatchError; no rank returns another call's bytes."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpicoll import functional as F, graph
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        op = mpicoll.AllReduceOperation()
        x, out = np.full(4, r + 1.0), np.empty(4)
        plan = op.prepare(x, out)
        plan.run()
        for case in ("then a call", "then another plan"):
            other = op.prepare(x, np.empty(4))
            try:
                if r != n - 1:
                    plan.run()
                if case == "then a call":
                    op.execute(x, out)
                else:
                    other.run()
                say(f"{case}: no error {out}")
            except mpicoll.CollectiveMismatchError as e:
                say(f"{case}: {e.param}")
            MPI.COMM_WORLD.Barrier()
            op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain="d", rank_size=n))
            plan = op.prepare(x, out)
            plan.run()
        t = np.full(4, r + 1.0)
        with graph.capture() as g:
            F.all_reduce(t)
        g.replay()
        try:
            if r != n - 1:
                g.replay()
            F.all_reduce(t)
            say(f"graph: no error {t}")
        except mpicoll.CollectiveMismatchError as e:
            say(f"graph: {e.param}")
    """, np_, env={"MPICOLL_TIMEOUT": "20"})
    want = [f"rank {r}: then a call: operation" for r in range(np_)]
    want += [f"rank {r}: then another plan: operator parameters" for r in range(np_)]
    want += [f"rank {r}: graph: operation" for r in range(np_)]
    assert lines == sorted(want)


@SIZES
def test_a_param_is_frozen_once_its_operation_read_it(tmp_path, np_):
    """Bug 6: a Param changed after the operation's first call was silently ignored; now assigning
    a field raises a named error, and its list fields became tuples (an in-place change raises).
    A new Param (``dataclasses.replace``) is the way to change it."""
    lines = _job(tmp_path, """
        import dataclasses
        import numpy as np, mpicoll
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        ones = [1] * n
        p = mpicoll.AllToAllVParam(send_counts=ones, sdispls=list(range(n)), recv_counts=np.array(ones),
                                   rdispls=list(range(n)))
        p.send_counts = list(ones)                  # (before the first call: fine)
        op = mpicoll.AllToAllVOperation(p)
        op.execute(np.arange(n, dtype=np.int32))
        seen = []
        try:
            p.send_counts = [n] + [0] * (n - 1)
        except mpicoll.CollectiveArgumentError as e:
            seen.append(e.param)
        try:
            p.send_counts[0] = 0
        except TypeError:
            seen.append("in place")
        q = dataclasses.replace(p, rank_root=0)
        q.rank_root = 0                             # (a new Param is not bound yet)
        say(f"{seen} {type(p.recv_counts).__name__}")
    """, np_)
    assert lines == [f"rank {r}: ['send_counts', 'in place'] tuple" for r in range(np_)]


@SIZES
def test_counts_given_as_a_memoryview_are_values(tmp_path, np_):
    """Bug 8: counts as a memoryview (any iterable is accepted), validation off: the third call
    (a remembered one) used to fail hashing the memoryview after data moved."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        op = mpicoll.AllGatherVOperation(validate=False)
        out = np.empty(n)
        counts = np.ones(n, dtype=np.int64)
        for _ in range(4):
            op.execute(np.array([r + 1.0]), 1, memoryview(counts), memoryview(np.arange(n)), None, out)
        say(f"{out.tolist() == [float(k + 1) for k in range(n)]}")
    """, np_)
    assert lines == [f"rank {r}: True" for r in range(np_)]


def test_quant_caches_are_bounded(tmp_path):
    """Bug 9: QuantAllReduce kept a chunk layout for every element count it saw (20,000 sizes:
    +33 MiB); now the latest ``CHUNK_PLANS``."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpicoll.ops import quant
        from mpi4py import MPI
        r = MPI.COMM_WORLD.Get_rank()
        op = mpicoll.QuantAllReduceOperation(validate=False)
        for size in range(1, 3 * quant.CHUNK_PLANS):
            op.execute(np.ones(size, np.int8), 1.0)
        say(f"{len(op._chunks) <= quant.CHUNK_PLANS} {len(op._compiled) <= 8}")
    """, 2)
    assert lines == [f"rank {r}: True True" for r in range(2)]


@SIZES
def test_a_validated_call_that_comes_back_still_agrees(tmp_path, np_):
    """A validated call repeated with the same arrays reuses its record once every rank has sent the
    header it sent last time (a small one: its data rides in that agreement, landed from its kept
    rows): right results as the contents change; a rank that makes another call there (another
    shape) makes every rank raise the mismatch, and the call works again after."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpicoll import functional as F
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        op = mpicoll.AllReduceOperation()
        x, out = np.empty(3, np.float32), np.empty(3, np.float32)
        got = []
        for k in range(4):
            x[:] = r + k
            op.execute(x, out)
            got.append(float(out[0]))
        say(f"sums {got} plan {op._last is not None and op._last.args[0] is x}")
        bad, bad_out = np.ones(4, np.float32), np.empty(4, np.float32)
        try:
            op.execute(*((bad, bad_out) if r == n - 1 else (x, out)))
            say("no error")
        except mpicoll.CollectiveMismatchError as e:
            say(f"mismatch {e.param}")
        x[:] = 1
        op.execute(x, out)
        say(f"again {float(out[0])}")
        t = np.ones(2)
        for _ in range(3):
            t[:] = r
            F.all_reduce(t)
        say(f"functional {t.tolist()}")
    """, np_)
    total = np_ * (np_ - 1) / 2
    assert lines == sorted([f"rank {r}: sums {[total + np_ * k for k in range(4)]} plan True" for r in range(np_)]
                           + [f"rank {r}: mismatch x.shape" for r in range(np_)]
                           + [f"rank {r}: again {float(np_)}" for r in range(np_)]
                           + [f"rank {r}: functional {[total, total]}" for r in range(np_)]), lines


@SIZES
def test_a_validated_repeat_keeps_every_check(tmp_path, np_):
    """From the review of the validated repeat: (1) a rule on the contents of a remembered array
    (QuantAllReduce's scales, NaN on one rank) still raises on every rank; (2) validation turned on
    after unvalidated calls gives no spurious 'validate differs'; (3) a peer whose header changes in
    a way the checks accept (AllToAllVV2 with gaps in its sdispls: another MPI call) makes the
    others issue with the new table, and the results are right."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        q = mpicoll.QuantAllReduceOperation()
        x, s, out = np.ones(8, np.int8), np.array([1.0], np.float32), np.empty(8, np.float16)
        for _ in range(3):
            q.execute(x, s, out)
        if r == n - 1:
            s[0] = np.nan
        try:
            q.execute(x, s, out)
            say("quant: no error")
        except mpicoll.CollectiveArgumentError as e:
            say(f"quant: {e.param}")
        op = mpicoll.AllReduceOperation(validate=False)
        a, o = np.ones(2), np.empty(2)
        for _ in range(3):
            op.execute(a, o)
        op.validate = True
        try:
            op.execute(a, o if r == 0 else np.empty(2))
            say(f"toggled: {o.tolist() if r == 0 else 'ok'}")
        except mpicoll.CollectiveError as e:
            say(f"toggled: {type(e).__name__} {e.param}")
        v = mpicoll.AllToAllVV2Operation()
        src = np.arange(2 * n, dtype=np.float32) + 100 * r
        got = np.empty((1, n), np.float32)
        ones, dense = [1] * n, list(range(n))
        for k in range(3):
            gapped = k == 2 and r == n - 1                      # (its sdispls skip every other element)
            v.execute(src, ones, [2 * j for j in range(n)] if gapped else dense, ones, dense, None, got)
        want = [100.0 * p + (2 * r if p == n - 1 else r) for p in range(n)]
        say(f"v2: {got[0].tolist() == want}")
    """, np_)
    assert lines == sorted([f"rank {r}: quant: scale" for r in range(np_)] +
                           [f"rank {r}: toggled: {'[%s, %s]' % (float(np_), float(np_)) if r == 0 else 'ok'}"
                            for r in range(np_)] +
                           [f"rank {r}: v2: True" for r in range(np_)]), lines


@SIZES
def test_a_remembered_call_sees_its_arrays_flags(tmp_path, np_):
    """A remembered call is not described again (validated or not), so its key holds its arrays'
    strides and flags: an ``out`` made read-only in place, or an x whose strides change on a size-1
    dim (so that it no longer is ``out[r]``), is another call, which ``describe`` checks.
    Validated, the last rank's read-only ``out`` is an error on every rank; unvalidated, every
    rank's own is its own error."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        for validate in (True, False):
            op = mpicoll.AllReduceOperation(validate=validate)
            x, out = np.ones(4), np.empty(4)
            for _ in range(3):
                op.execute(x, out)
            if r == n - 1 or not validate:
                out.flags.writeable = False
            try:
                op.execute(x, out)
                say(f"{validate}: no error")
            except mpicoll.CollectiveArgumentError as e:
                say(f"{validate}: {e.param} rank {e.rank}")
            out.flags.writeable = True
            say(f"{validate}: again {op.execute(x, out).tolist() == [float(n)] * 4}")
        g = mpicoll.AllGatherOperation()          # (strides changed on a size-1 dim: x is no longer out[r])
        out = np.zeros((n, 1))
        x = out[r]
        for _ in range(3):
            g.execute(x, out)
        if r == n - 1:
            x.strides = (16,)
        try:
            g.execute(x, out)
            say("strides: no error")
        except mpicoll.CollectiveArgumentError as e:
            say(f"strides: {e.param} rank {e.rank}")
    """, np_)
    assert lines == sorted([f"rank {r}: True: out rank {np_ - 1}" for r in range(np_)]
                           + [f"rank {r}: False: out rank {r}" for r in range(np_)]
                           + [f"rank {r}: {v}: again True" for r in range(np_) for v in (True, False)]
                           + [f"rank {r}: strides: out rank {np_ - 1}" for r in range(np_)]), lines


@SIZES
def test_a_list_given_as_data_is_read_on_every_call(tmp_path, np_):
    """From the review of the validated repeat: x given as a list of arrays is copied into an array
    when the call is described, so such a call is not remembered (a repeat must copy the list's
    current contents again; it ran on the first copy: validated [0, 0, 0, 0], else [0, 2, 2, 2])."""
    lines = _job(tmp_path, """
        import numpy as np, mpicoll
        from mpi4py import MPI
        r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        for validate in (True, False):
            op = mpicoll.AllReduceOperation(validate=validate)
            a, b, out = np.zeros(2), np.zeros(2), np.empty((2, 2))
            got = []
            for k in range(4):
                a[:], b[:] = k, k
                got.append(float(op.execute([a, b], out)[1, 1]))
            say(f"{validate}: {got == [float(k * n) for k in range(4)]}")
    """, np_)
    assert lines == sorted(f"rank {r}: {v}: True" for r in range(np_) for v in (True, False)), lines


def test_a_second_thread_on_a_communicator_is_told_the_rule(tmp_path):
    """A thread that makes a call on a communicator while another thread of its rank is inside one
    raises a CollectiveError naming the rule (one thread at a time per communicator), on that rank;
    the call in progress completes (it used to fail with an IndexError)."""
    lines = _job(tmp_path, """
        import threading, time
        import numpy as np, mpicoll
        from mpi4py import MPI
        r = MPI.COMM_WORLD.Get_rank()
        op = mpicoll.AllReduceOperation()
        op.execute(np.ones(2))
        x = np.ones(1000, np.float32)
        def first():
            if r == 1:
                time.sleep(1.0)             # rank 0's call waits for rank 1 meanwhile
            say(f"first {op.execute(x)[0]}")
        t = threading.Thread(target=first)
        t.start()
        if r == 0:
            time.sleep(0.3)
            try:
                mpicoll.AllGatherOperation().execute(np.ones(2))
            except mpicoll.CollectiveError as e:
                say(f"{e.param}: {e}")
        t.join()
    """, 2)
    assert lines == ["rank 0: first 2.0",
                     "rank 0: thread: AllGather: another thread of rank 0 is inside a call on the world "
                     "(mpicoll.world): mpicoll's calls on one communicator come from one thread at a time (a "
                     "communicator per thread: comm_mode=MULTI_THREAD with a user comm each)",
                     "rank 1: first 2.0"]
