"""The Operation base class, the operator registry, and the reduce-scatter building blocks.

One call flows in one straight line (docs/design.md), every mode through one dispatcher::

    _dispatch(args) = live-check (bind) -> [remembered plan] -> count -> describe -> [agree]
    execute(args)   = _dispatch -> issue(call, table, Runner)                 (at once)
    prepare(args)   = _dispatch (always agreeing) -> issue(..., Recorder) -> Plan  (run many times)
    _start(args)    = _dispatch -> issue(..., Recorder) -> Handle              (one-shot, non-blocking)

The first call of an operation always agrees, whatever its ``validate``: that is where a Param
error on one rank, or a ``validate`` set differently across ranks, is raised on every rank. A
captured graph describes its calls with the same steps and agrees them at once (:func:`agree_calls`).

An operator subclass supplies ``describe`` (local and pure: its arguments -> a
:class:`~mpicoll._plan.Call`, raising on a rule one rank can see) and ``issue`` (the only place that
picks its MPI calls, from the call and, when validated, the agreed header table), and its public
``execute`` / ``prepare`` with its real signature, each one line.
"""
from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any, ClassVar

import numpy as np
from mpi4py import MPI

from .. import _shm
from .. import _validate as V
from .._comm import OP_NAMES, LibComm, check_live, finalized, op_code
from .._domains import resolve
from .._ranktable import rank_table
from .._dtypes import BY_NP, DType, ReduceOp, reduce_op
from .._errors import (CollectiveArgumentError, CollectiveError, CollectiveMismatchError, agree, agreed, arg_error,
                       as_collective_error)
from .._numeric import prefix, reduce_chunks
from .._params import CommParam
from .._plan import CAPTURING, Call, Handle, Plan, Recorder, Runner, count_call

#: name -> Operation class, for every public operator (check, bench, the CLI and the tests iterate it).
OPERATIONS: dict[str, type["Operation"]] = {}
#: operator code -> class, for every named operation (a graph's agreement names a peer's calls)
_CLASSES: dict[int, type["Operation"]] = {}


class Operation:
    """Base of every ``<Name>Operation``: binds a Param to its communicator(s) and runs calls.

    Args:
        param: the operator's Param (default: all defaults, on the world).
        validate: run the cross-rank checks on every call (default: ``MPICOLL_VALIDATE``, on). Off
            saves one small ``Allgather`` per ``execute`` after the first (the first call always
            agrees); bad input may then hang or give wrong results, as in raw MPI. ``prepare``
            always checks. Set it alike on every rank: the first call raises on every rank if not.
        timeout: seconds before a collective that some rank never joins raises
            :class:`~mpicoll.CollectiveTimeout` (and, by default, aborts the job); default
            the communicator's own (a torch group's), else ``MPICOLL_TIMEOUT``, unset = wait
            forever, as MPI does. Give it alike on every rank
            (or use ``MPICOLL_TIMEOUT``, which may be set on any rank): a timed call is the
            non-blocking form of the MPI call, which MPI does not match with a blocking one.
    """

    NAME: ClassVar[str] = ""
    PARAM: ClassVar[type[CommParam]] = CommParam
    CODE: ClassVar[int] = 0
    #: listed in OPERATIONS (False: an internal kind, e.g. the Hccl client's tasks)
    PUBLIC: ClassVar[bool] = True
    #: execute fills its input x in place (Broadcast): x must be a C-contiguous writable array
    WRITES_X: ClassVar[bool] = False
    #: how errors name the per-peer send / expect vectors of the count-pair rule (V operators)
    PAIR_NAMES: ClassVar[tuple[str, str] | None] = None

    #: execute's arguments read as values when the call is described (counts, displacements,
    #: shapes, split sizes): a call repeated with other values is another call. Every other
    #: argument is data, read or written on every run (keyed by identity). The operator's own
    #: declaration, checked against its ``execute`` signature at import.
    VALUES: ClassVar[tuple[str, ...]] = ()
    #: ``describe`` has a rule on the contents of a data argument (finite scales): a validated call
    #: is then described on every call, never remembered (a remembered call is not described again)
    RULES_ON_DATA: ClassVar[bool] = False
    #: (from the signature) the position of ``out``, and the value arguments' positions
    _OUT_AT: ClassVar[int | None] = None
    _VALUES_AT: ClassVar[frozenset] = frozenset()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("NAME"):     # (a subclass that keeps its parent's NAME does not replace it)
            cls.CODE = op_code(cls.NAME)
            OP_NAMES[cls.CODE] = cls.NAME
            _CLASSES[cls.CODE] = cls
            if cls.PUBLIC:
                OPERATIONS[cls.NAME] = cls
        if "execute" in cls.__dict__:
            names = list(inspect.signature(cls.execute).parameters)[1:]
            unknown = [v for v in cls.VALUES if v not in names] if "VALUES" in cls.__dict__ else []
            if unknown:
                raise TypeError(f"{cls.__name__}.VALUES names {unknown}: not arguments of its execute {names}")
            cls._OUT_AT = names.index("out") if "out" in names else None
            cls._VALUES_AT = frozenset(i for i, n in enumerate(names) if n in cls.VALUES)

    def __init__(self, param: CommParam | None = None, *, validate: bool | None = None,
                 timeout: float | None = None) -> None:
        if param is None:
            param = self.PARAM()
        if not isinstance(param, self.PARAM):
            raise CollectiveArgumentError(
                f"{self.NAME}: param is {type(param).__name__}: must be {self.PARAM.__name__}", op=self.NAME,
                param="param")
        self.param = param
        self._timeout = timeout           # (as given: the communicator's call_timeout takes it at binding)
        self.timeout: float | None = None
        self._validate = V.validate_default() if validate is None else bool(validate)
        self._validate_given = validate is not None
        self.comm: MPI.Comm | None = None
        self.rank, self.size = -1, 0
        self._lib: LibComm | None = None
        self._comms: tuple[LibComm, ...] = ()
        self._param_error: BaseException | None = None
        self._agreed_once = False
        self._fresh = False               # (describe allocated an output or copied a list: _out, _data)
        self._runner = Runner(self.NAME, self.timeout)
        #: its last unvalidated calls: key -> [its arguments (kept alive, so the key's identities stay
        #: theirs), its call, its plan once it came back]
        self._calls: "OrderedDict[tuple, list]" = OrderedDict()
        #: its last validated calls: key -> [its arguments, its call, its plan once it came back, its
        #: agreed header table]
        self._agreed_calls: "OrderedDict[tuple, list]" = OrderedDict()

    @property
    def validate(self) -> bool:
        """Whether every call agrees its arguments across ranks (see the class docstring). Set it
        before the first call or at any time after, alike on every rank: a value set here wins over
        the job's ``MPICOLL_VALIDATE``; ``MPICOLL_DEBUG`` turns it on at the first call, whatever was
        set before (docs/errors.md)."""
        return self._validate

    @validate.setter
    def validate(self, on: bool) -> None:
        self._validate, self._validate_given = bool(on), True

    # -- binding -------------------------------------------------------------------------------------
    def _bind(self) -> LibComm:
        """Resolve the communicator (first call), check the param against it and freeze it. A param
        error is kept, and raised on every rank by the first agreement."""
        if MPI.Is_finalized():
            raise finalized(self.NAME, "a call")
        lib = resolve(self.NAME, self.param.comm, self.param.comm_domain, self.param.rank_size, "comm_domain")
        self.comm, self.rank, self.size = lib.mpi, lib.rank, lib.size
        self._lib, self._comms = lib, (lib,)
        p = self.param
        try:       # (decided first, whatever else fails: a timed call's MPI form differs from an untimed one's)
            timeout = lib.call_timeout(self._timeout, self.NAME)
        except CollectiveError as exc:
            timeout, self._param_error = lib.call_timeout(), exc
        try:
            if p.comm is not None and p.comm_domain:
                raise arg_error(self.NAME, "comm_domain", p.comm_domain, self.rank,
                                "give either a user comm or a comm_domain, not both")
            if p.rank_table_file:
                rank_table(p.rank_table_file)
            V.check_param(self.NAME, p, self.size, self.rank)
            self._bind_param()
        except Exception as exc:  # noqa: BLE001 - agreed across ranks at the first call
            self._param_error = self._param_error or as_collective_error(exc, self.NAME, self.rank)
        p.freeze(self.NAME)
        if not self._validate_given:      # the default its members agreed when the communicator was made
            self._validate = lib.validate
        if timeout != self.timeout:
            self.timeout, self._runner = timeout, Runner(self.NAME, timeout)
        if lib.debug:
            self._validate = True
        return lib

    def _bind_param(self) -> None:
        """Operator-specific param checks and bindings, once the communicator is known."""

    def _live(self) -> None:
        """Before a call: bind (the first call), and raise if a communicator of it was freed."""
        if self._lib is None:
            self._bind()
        check_live(self._comms, self.NAME)

    # -- the call path: one dispatcher for every mode -------------------------------------------------
    def _execute(self, *args: Any) -> Any:
        """``execute``: :meth:`_dispatch`, then the call's steps at once (or its remembered plan)."""
        if CAPTURING:
            return CAPTURING[-1].add(self, args)
        self._live()
        lib = self._lib
        lib.enter(self.NAME)
        try:
            plan, call, table = self._dispatch(args)
            if plan is not None:
                return plan.run()
            if call.src is not None:
                np.copyto(call.x, call.src)
            self.issue(call, table, self._runner)
            return call.result
        finally:
            lib.leave()

    def _start(self, *args: Any) -> Handle:
        """A one-shot non-blocking call (the functional API's ``async_op=True``): :meth:`_dispatch`,
        then the call's steps recorded and started at once (``I`` calls, no persistent requests),
        completed in ``wait()``."""
        if CAPTURING:
            return CAPTURING[-1].add(self, args, started=True)
        self._live()
        lib = self._lib
        lib.enter(self.NAME)
        try:
            plan, call, table = self._dispatch(args)
            if plan is None:
                rec = Recorder()
                self._record(call, table, rec, count=False)
                plan = Plan(rec, self.timeout, persistent=False)
            return plan.start()
        finally:
            lib.leave()

    def _prepare(self, *args: Any) -> Plan:
        """``prepare``: :meth:`_dispatch` (always agreeing), then the steps recorded into a Plan."""
        self._live()
        lib = self._lib
        lib.enter(self.NAME)
        try:
            _, call, table = self._dispatch(args, always=True)
            rec = Recorder()
            self._record(call, table, rec, count=True)
            return Plan(rec, self.timeout, rounds=call.rounds > 1)
        finally:
            lib.leave()

    def _dispatch(self, args: tuple, always: bool = False) -> tuple[Plan | None, Call | None, np.ndarray | None]:
        """THE dispatcher of a call, whatever runs it next: live-check (and bind, the first call) ->
        remembered plan? -> count -> describe -> agree.

        Agreement runs when validation is on, for ``prepare`` (``always``) and for the first call of
        every operation. A call that writes only into arrays it was given (``out`` given, or none
        in the signature) is remembered (the last ``REMEMBERED``): when the very same call comes
        back (the same data arrays, unmoved; equal values, ``VALUES``), its steps are recorded once
        and it runs as a plan, returned here (``call`` None). Without agreement that is all; with
        it (:meth:`_agree_again`), the call still agrees, sending the header it sent last time: if
        every rank's is as last time, the plan runs.

        Returns:
            ``(plan, None, table)`` for a remembered call (``table`` None without agreement), else
            ``(None, call, table)``: the described call and the agreed header table (None without
            agreement).
        """
        self._live()
        agree = always or self._validate or not self._agreed_once
        key = None
        at = self._OUT_AT
        if not always and (at is None or (len(args) > at and args[at] is not None)):   # (it fills arrays given)
            key = _key(args, self._VALUES_AT)
            entry = self._calls.get(key) if key is not None and not agree else None
            if entry is not None:
                plan = entry[2] or self._remembered(entry)
                if plan._state == 0:                    # (idle: not started)
                    return plan, None, None
        number = count_call(self._comms, self.NAME)
        if MPI.Is_finalized():
            raise finalized(self.NAME, "a call")
        self._fresh = False
        if agree:
            entry = self._agreed_calls.get(key) if key is not None and self._lib.plain else None
            if entry is not None:
                return self._agree_again(entry, number)
            call, err = self._described(args)
            table = agree_call(self._lib, self, call, err, self.timeout, number)
            if key is not None and err is None and self._validate and not self._fresh and _small(args) \
                    and not self.RULES_ON_DATA:
                _remember(self._agreed_calls, key, [args, call, None, table])
            return None, call, table
        failed = self._param_error or _found(args)       # (no agreement: a local error is this rank's alone)
        if failed is not None:
            raise failed
        call = self.describe(*args)
        if key is not None and not self._fresh:          # (an output made or a list copied: a repeat needs another)
            _remember(self._calls, key, [args, call, None])
        return None, call, None

    def _agree_again(self, entry: list, number: int) -> tuple[Plan | None, Call | None, np.ndarray]:
        """A validated call that came back (``entry``: the same key, so the same arrays, strides,
        flags and values, which ``describe`` would describe alike): agree it with the row it sent last time
        (the same Allgather as :func:`agree_call`, so that a peer making another call meets it
        there). Every rank's row as last time: its plan (recorded once, with that table). Else
        another rank's call changed: the table is checked as always (a mismatch raises on every
        rank) and this call issued with it."""
        lib, call, table = self._lib, entry[1], entry[3]
        if lib.pending:
            lib.drain(None)
        now = agree(lib, table[lib.rank], None, self.timeout, self.NAME, number)   # (sent, never written)
        if now.tobytes() == table.tobytes():
            plan = entry[2]
            if plan is None:
                rec = Recorder()
                self._record(call, table, rec, count=False)     # (this dispatch counted the call)
                plan = entry[2] = Plan(rec, self.timeout, persistent=False)
            if plan._state == 0:
                return plan, None, table
            return None, call, table
        V.check_agreed(lib, self.NAME, now, self.PAIR_NAMES)
        entry[2], entry[3] = None, now
        return None, call, now

    def _remembered(self, entry: list) -> Plan:
        """Record the plan of a remembered call (at its first repeat)."""
        rec = Recorder()
        self._record(entry[1], None, rec, count=True)
        plan = entry[2] = Plan(rec, self.timeout, persistent=False)
        return plan

    def _described(self, args: tuple) -> tuple[Call | None, BaseException | None]:
        """``describe(*args)``, or the error it (or the Param, at binding) raised on this rank."""
        failed = self._param_error or _found(args)
        if failed is not None:
            return None, failed
        try:
            return self.describe(*args), None
        except Exception as exc:  # noqa: BLE001 - every local failure is agreed, never raised alone
            return None, as_collective_error(exc, self.NAME, self.rank)

    def _record(self, call: Call, table: np.ndarray | None, rec: Recorder, count: bool) -> None:
        """Record the call into a plan: one part per round (``call.rounds``: the Hccl client's
        ``repeat``, else 1; ``issue`` reads ``call.round``), each counting itself when it runs if
        ``count``."""
        for k in range(call.rounds):
            call.round = k
            rec.begin(self.NAME, self._comms, count)
            if call.src is not None:
                rec.local(np.copyto, call.x, call.src)
            self.issue(call, table, rec)
            rec.end(call.result)

    def describe(self, *args: Any) -> Call:
        """Local and pure: this rank's arguments -> a :class:`~mpicoll._plan.Call`; raise
        :class:`~mpicoll.CollectiveArgumentError` on a rule one rank can see."""
        raise NotImplementedError

    # -- what a captured graph asks (mpicoll.graph) ------------------------------------------------
    def coalesce_key(self, call: Call, exact: bool = True) -> tuple | None:
        """Calls of a graph with the same key (not None) may run as one (:meth:`issue_many`). The
        key may only depend on what every member of the communicator agreed (dtype, reduce op,
        root, the communicator): every member groups alike. ``exact``: only where every output
        stays bit-identical to issuing the calls one by one. Default: None (never)."""
        return None

    def issue_many(self, calls: list[Call], go: Any) -> None:
        """The MPI calls of several calls of one :meth:`coalesce_key`, as one."""
        raise NotImplementedError

    def _one_issue(self, base: type) -> bool:
        """Whether this class issues as ``base`` does (a subclass that adds steps does not coalesce)."""
        return type(self).issue is base.issue

    def issue(self, call: Call, table: np.ndarray | None, go: Any) -> None:
        """The MPI calls (``go.mpi``, ``go.start``/``go.wait``) and local work (``go.local``) of
        one call, in order. ``table`` is the agreed header table, or None (validation off):
        choices that depend on other ranks' values may only be made from it."""
        raise NotImplementedError

    # -- describe helpers ------------------------------------------------------------------------------
    def _data(self, x: Any, name: str = "x") -> tuple[np.ndarray, DType, np.ndarray | None]:
        """``(array MPI reads, dtype row, src)``: x itself when C-contiguous, else a buffer of its
        shape that the call refreshes from ``src`` (x) before it runs."""
        if type(x) is np.ndarray and x.flags.c_contiguous and (dt := BY_NP.get(x.dtype)) is not None:
            return x, dt, None                 # (the common case, in one test)
        given = x
        x, dt = V.array(self.NAME, name, x, self.rank)
        if x is not given:                  # (a list's contents copied now: a repeat must read them again)
            self._fresh = True
        if x.flags.c_contiguous:
            return x, dt, None
        return np.empty(x.shape, dtype=x.dtype), dt, x

    def _out(self, out: Any, shape: tuple, dtype: np.dtype, x: np.ndarray | None = None,
             in_place_ok: bool = False, name: str = "out") -> np.ndarray:
        """``out`` checked against the output's shape and dtype, or a fresh array (then the call is
        not remembered: a repeat must get a new output, as the first did)."""
        if out is None:
            self._fresh = True
            return np.empty(shape, dtype=dtype)
        return V.check_out(self.NAME, out, shape, dtype, self.rank, x, in_place_ok, name)


#: calls an operation remembers (see Operation._dispatch)
REMEMBERED = 8


def _found(args: tuple) -> CollectiveError | None:
    """A ``CollectiveError`` passed in place of an argument: a failure the caller found on this rank
    before it could make the call (:mod:`mpicoll.torch`: a tensor or a reduce op it cannot map),
    raised through the call's agreement like an error of ``describe``, so that no peer waits."""
    for a in args:
        if isinstance(a, CollectiveError):
            return a
    return None


_SCALARS = (int, float, bool, str, type(None))


def _key(args: tuple, values: frozenset) -> tuple | None:
    """What identifies a call: its data arrays by identity, shape, strides, dtype and flags
    (writeable, contiguous: what ``describe`` checks; their contents are read on every run; the
    remembered call keeps them referenced, so an identity stays theirs),
    its values (``Operation.VALUES``) by their contents. None when an argument is neither (an
    object the key cannot tell apart): such a call is not remembered."""
    key = []
    try:
        for i, a in enumerate(args):
            if i in values:
                key.append((a.dtype, a.shape, a.tobytes()) if type(a) is np.ndarray else _value(a))
            else:
                key.append(_data(a))
    except TypeError:
        return None
    return tuple(key)


def _remember(calls: OrderedDict, key: tuple, entry: list) -> None:
    """Keep ``entry`` under ``key`` among an operation's last ``REMEMBERED`` calls (oldest out first)."""
    calls[key] = entry
    if len(calls) > REMEMBERED:
        calls.popitem(last=False)


#: a validated call is remembered only when its arrays hold at most this many bytes together: the
#: describe and checks it skips cost microseconds, which matter for small calls only, and a
#: remembered call keeps its arrays alive (a fresh view of a large tensor each call must not)
REMEMBERED_BYTES = 1 << 16


def _small(args: tuple) -> bool:
    """Whether the arrays among ``args`` (in lists too) hold at most ``REMEMBERED_BYTES``."""
    total = 0
    for a in args:
        if type(a) is np.ndarray:
            total += a.nbytes
        elif isinstance(a, (list, tuple)):
            total += sum(x.nbytes for x in a if isinstance(x, np.ndarray))
    return total <= REMEMBERED_BYTES


def _data(a: Any) -> Any:
    """A data argument's part of :func:`_key` (TypeError: none)."""
    t = type(a)
    if t is np.ndarray:
        return (id(a), a.shape, a.strides, a.dtype, a.flags.num)
    if t in _SCALARS:
        return (t, a)                 # (2, 2.0 and True are equal, but not the same argument)
    if t is list or t is tuple:
        return tuple([_data(v) for v in a])
    raise TypeError(t)


def _value(a: Any) -> Any:
    """A value's contents, hashable and copied (a memoryview or an array may change later)."""
    t = type(a)
    if t in _SCALARS:
        return (t, a)
    if (t is list or t is tuple) and all(type(v) is int for v in a):
        return tuple(a)
    if t is list or t is tuple:
        return tuple([_value(v) for v in a])
    v = np.asarray(a)                          # (an array, a memoryview, a numpy scalar, ...)
    if v.dtype.hasobject:
        raise TypeError(t)
    return (v.dtype, v.shape, v.tobytes())


def buffers(call: Call) -> list[np.ndarray]:
    """Every array a call reads or writes (its x, out, src, result and extra arrays): what a
    graph compares to keep calls that touch the same memory in order."""
    found: list[np.ndarray] = []

    def walk(v: Any) -> None:
        if isinstance(v, np.ndarray):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            for w in v:
                walk(w)
    walk((call.x, call.out, call.src, call.result, getattr(call, "extra", None)))
    return found


def agree_call(lib: LibComm, op: Operation, call: Call | None, err: BaseException | None, timeout: float | None,
               number: int) -> np.ndarray:
    """Agree one described call over ``lib`` (one ``Allgather`` of header rows; a value that does not
    fit becomes a local error): every rank raises the same error, or every rank gets the same
    header table. A captured graph agrees all its calls at once: :func:`agree_calls`."""
    row, err = _row(lib, op, call, err)
    table = agree(lib, row, err, timeout, op.NAME, number)
    V.check_agreed(lib, op.NAME, table, op.PAIR_NAMES)
    op._agreed_once = True
    return table


def agree_calls(lib: LibComm, entries: list[tuple[Operation, Call | None, BaseException | None]],
                timeout: float | None, joins: list[bool]) -> list[tuple[np.ndarray, bool]]:
    """Agree the calls of a captured graph, at once, over ``lib`` (the graph's group): every rank
    sends one row per call (the call's communicator, its rank and size there, a local ``joins``
    bit, and its header row, ``V.header``), gathered from every rank in one exchange
    (``V.exchange_rows``). Then, for each communicator the calls run on (in the order the rows
    name them, the same on every rank), the members' subsequences of calls there must match call
    by call (``V.check_table``): every rank raises the same error, naming the first differing call
    by its index in the graph of the lowest rank that has it, or every rank gets, for each of its
    calls, its header table and its ``joins`` bit agreed (true on every member).

    A local error in any rank's calls (raised while it described them) is raised on every rank.
    """
    width = 4 + V.H_LEN + 2 * lib.size
    rows, err = np.zeros((len(entries), width), dtype=np.int64), None
    for i, (op, call, e) in enumerate(entries):
        ol = op._lib
        row, e = _row(ol, op, call, e)
        rows[i, :4] = (ol.ident, ol.rank, ol.size, joins[i])
        rows[i, 4:4 + row.size] = row
        err = err or e
    where = ("graph", 1, "its agreement (internal MPI Allgather/Allgatherv)")
    every, counts = V.exchange_rows(lib, rows, err, timeout, where)
    try:
        return _check_calls(lib, entries, every, counts)
    except CollectiveError as exc:
        raise agreed(exc, lib.world_ranks) from None


def _check_calls(lib: LibComm, entries: list, every: np.ndarray, counts: np.ndarray) -> list[tuple[np.ndarray, bool]]:
    """:func:`agree_calls`' comparison of the gathered rows (the same on every rank)."""
    owner = np.repeat(np.arange(lib.size), counts)
    local = np.concatenate([np.arange(c) for c in counts.tolist()]) if len(every) else np.zeros(0, np.int64)
    mine: dict[int, tuple[np.ndarray, bool]] = {}
    for ident in dict.fromkeys(every[:, 0].tolist()):
        sel = np.nonzero(every[:, 0] == ident)[0]
        size = int(every[sel[0], 2])
        on: dict[int, list[int]] = {}
        for k in sel.tolist():
            on.setdefault(int(owner[k]), []).append(k)
        members = sorted(on, key=lambda r: int(every[on[r][0], 1]))          # in the communicator's rank order
        first = min(on)
        where = f"the communicator of world ranks {[lib.world_ranks[r] for r in members]}"

        def name_of(k: int) -> str:
            cls = _CLASSES.get(int(every[k, 4 + V.H_OP]))
            return cls.NAME if cls else OP_NAMES.get(int(every[k, 4 + V.H_OP]), "?")
        if len(on) != size:
            k = on[first][0]
            raise CollectiveMismatchError(
                f"graph: graph call {int(local[k])} ({name_of(k)}) runs on a communicator of {size} ranks, but only "
                f"world ranks {[lib.world_ranks[r] for r in members]} captured calls on it: every member must capture "
                "the same calls, in the same order", op="graph", param="captured calls", rank=members[0])
        m = min(len(v) for v in on.values())
        for j in range(m):
            ks = [on[r][j] for r in members]
            table = every[ks, 4:4 + V.H_LEN + 2 * size]
            cls = _CLASSES.get(int(table[0, V.H_OP]))
            V.check_table_of(int(local[on[first][j]]), name_of(on[first][j]), table,
                             cls.PAIR_NAMES if cls else None, where)
            if lib.rank in on:
                mine[int(local[on[lib.rank][j]])] = (table, bool(every[ks, 3].all()))
        longer = [r for r in members if len(on[r]) > m]
        if longer:
            k = on[longer[0]][m]
            raise CollectiveMismatchError(
                f"graph: graph call {int(local[k])} ({name_of(k)}) on world rank {lib.world_ranks[longer[0]]} has no "
                f"counterpart on world ranks {[lib.world_ranks[r] for r in members if len(on[r]) == m]} ({where}): "
                "every member must capture the same calls, in the same order", op="graph", param="captured calls",
                rank=longer[0])
    for op, _, _ in entries:
        op._agreed_once = True
    return [mine[i] for i in range(len(entries))]


def _row(lib: LibComm, op: Operation, call: Call | None, err: BaseException | None
         ) -> tuple[np.ndarray, BaseException | None]:
    """The header row of one call, and its local error (a value that cannot travel is one). Work
    queued on the communicator starts its collectives first: the sequence number in the row must
    count them on every rank alike, whatever each rank's ``test()`` calls had started already."""
    if lib.pending:
        lib.drain(None)
    try:
        return V.header(lib.size, op.CODE, call, op._validate, 0 if lib.plain else lib.seq), err
    except V.HeaderOverflow as exc:          # a value this rank cannot send is its local error
        what, value = exc.args
        return V.header(lib.size, op.CODE, None, op.validate, 0), err or arg_error(
            op.NAME, what, value, lib.rank, "must fit in a signed 64-bit integer")


class ReduceTypeOperation(Operation):
    """An operator with a ``reduce_type``, bound once."""

    def _bind_param(self) -> None:
        self._rop: ReduceOp = reduce_op(self.param.reduce_type, op=self.NAME, rank=self.rank)

    def _reduction(self, dt: DType) -> ReduceOp:
        """The reduce op's row for ``dt`` (:func:`reduction`)."""
        return reduction(self._rop, dt, self.NAME, "reduce_type", self.rank)


def reduction(rop: ReduceOp, dt: DType, op: str, param: str, rank: int) -> ReduceOp:
    """``rop``'s row that reduces ``dt`` (:meth:`ReduceOp.on`: a bool's SUM is a logical or), what
    a call's ``reduce`` holds; an op that cannot reduce ``dt`` (AVG of integers) is an argument error."""
    why = rop.refuses(dt)
    if why is not None:
        raise arg_error(op, param, rop.name, rank, why)
    return rop.on(dt)


# ----------------------------------------------------------------------------- float32 reduction path

def ordered(comm: LibComm, dt: DType, rop: ReduceOp) -> bool:
    """THE reproducibility rule (docs/reproducibility.md): whether a reduction on ``comm`` must
    run on mpicoll's rank-order paths only (the shared window, :func:`alltoall_reduce`, a gather
    and :func:`~mpicoll._numeric.reduce_rows`), never in MPI's own reduction, whose order changes
    with the message size, the MPI library, even the rank: every float reduction over more than 1
    member, with ``MPICOLL_EXACT`` on (``comm.exact``, agreed), but a SUM or PROD over 2 (one
    commutative operation per element: the same bits on any path). Integers are exact anyway;
    a float MAX or MIN is not (MPI's ``a > b ? a : b`` drops a NaN or picks a signed zero by its
    operands' order, which MPI varies; numpy's maximum in rank order propagates NaN)."""
    return comm.exact and dt.floating and (comm.size > 2 or (comm.size == 2 and not rop.rounds))


def invariant(comm: LibComm, dt: DType, rop: ReduceOp) -> bool:
    """Whether a reduction's bits cannot depend on its path (the message size, fusion into a larger
    message): integers, one member (a copy), the :func:`ordered` reductions, a float SUM or PROD
    over 2 members."""
    return not dt.floating or comm.size == 1 or ordered(comm, dt, rop) or (comm.size == 2 and rop.rounds)


def alltoall_reduce(go: Any, comm: LibComm, flat: np.ndarray, dt: DType, rop: ReduceOp, counts: np.ndarray,
                    displs: np.ndarray | None, out: np.ndarray, recv: np.ndarray | None = None,
                    block_type: MPI.Datatype | None = None) -> None:
    """Reduce-scatter as an AllToAll of the blocks plus a local reduction of this rank's block from
    every rank (``reduce_chunks``, rank order): 16-bit floats travel as 16 bits and accumulate in
    float32; 8-bit integers reduce in numpy, faster than MPICH's own byte loop for large blocks.

    Block j (``counts[j]`` elements at ``displs[j]`` of ``flat``) goes to rank j; ``out`` receives
    this rank's reduced block (``counts[rank]`` elements). ``displs=None`` means packed and uniform
    counts (``Alltoall``, about 2x faster than ``Alltoallv`` in MPICH): callers pass it only when
    that holds on every rank. ``block_type``: one block per rank in this datatype (a block resized
    to a stride: the Hccl client's layouts). ``recv``: scratch of ``n * counts[rank]`` elements, or
    None (fresh).
    """
    n, c = comm.size, out.size
    recv = np.empty((n, c), dtype=dt.np) if recv is None else recv[:n * c].reshape(n, c)
    if block_type is not None:
        go.mpi(comm, "Alltoall", [flat, 1, block_type], [recv, c, dt.mpi])
    elif displs is None:
        go.mpi(comm, "Alltoall", [flat, dt.mpi], [recv, dt.mpi])
    else:
        go.mpi(comm, "Alltoallv", [flat, (counts, displs), dt.mpi], [recv, (np.full(n, c), np.arange(n) * c), dt.mpi])
    go.local(reduce_chunks, recv, dt, rop, out)


def reduce_scatter(go: Any, comm: LibComm, blocks: np.ndarray, counts: list[int], dt: DType, rop: ReduceOp,
                   out: np.ndarray, packed_everywhere: bool = True, block_type: MPI.Datatype | None = None,
                   recv: np.ndarray | None = None, inputs=None) -> None:
    """THE choice of a reduce-scatter's MPI calls (ReduceScatter, ReduceScatterV, the Hccl client).

    ``blocks``: this rank's blocks in rank order, packed (block j: ``counts[j]`` elements), or,
    with ``block_type``, one block per rank in that datatype. ``counts``: the blocks' sizes, the
    same list on every rank. ``packed_everywhere``: every rank's blocks are packed (agreed: a
    rank's layout is its own). On one node, packed blocks from ``_shm.REDUCE_SCATTER_BYTES`` on
    go through the node's shared window (:mod:`mpicoll._shm`). Otherwise MPI's own reduction runs
    for the dtypes it reduces natively when every rank's blocks are packed and the order cannot
    change the bits (not :func:`ordered`): ``Reduce_scatter_block`` for equal counts, else
    ``Reduce_scatter``; otherwise an AllToAll of the blocks and a rank-order reduction
    (:func:`alltoall_reduce`: float16/bfloat16 accumulated in float32). ``inputs``: every rank's
    ``blocks`` in a node buffer (:func:`_shm.resident`), read there by the window path.
    """
    equal = counts.count(counts[0]) == len(counts)
    if packed_everywhere and block_type is None and _shm.serves(comm, sum(counts) * dt.itemsize,
                                                                _shm.REDUCE_SCATTER_BYTES, inputs is None):
        _shm.reduce_scatter(go, comm, blocks, counts, dt, rop, out, inputs)     # one node: the shared window
        return
    if dt.reduce != "float32" and packed_everywhere and not ordered(comm, dt, rop):
        if equal:
            go.mpi(comm, "Reduce_scatter_block", [blocks, dt.mpi], [out, dt.mpi], rop.mpi)
        else:
            go.mpi(comm, "Reduce_scatter", [blocks, dt.mpi], [out, dt.mpi], counts, rop.mpi)
        return
    c = np.array(counts, dtype=np.int64)
    alltoall_reduce(go, comm, blocks, dt, rop, c, None if equal or block_type is not None else prefix(counts), out,
                    recv, block_type)
