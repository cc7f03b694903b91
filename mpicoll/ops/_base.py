"""The Operation base class, the operator registry, and THE call pipeline.

Every call, in every mode, is one straight line of small stages over one record (docs/design.md)::

    bind -> remembered? -> count -> describe -> agree -> sink

* **bind** (the first call, :meth:`Operation._bind`): resolve the communicator, check the Param,
  decide the timeout (once: ``Operation.timeout``). Then the call runs here, or is captured into a
  graph, or is queued on the communicator's worker (:data:`ASYNC`, ``async_op=True``: the rest of
  the pipeline runs there while the caller goes on, :mod:`mpicoll._async`).
* **remembered?** (:class:`Remembered`, one cache, one key rule): the very same call again (its
  data arrays by identity, its values by contents) skips describe and reuses its record, its
  agreement's header and buffers, and its plan.
* **count** (:func:`~mpicoll._plan.count_call`): the watchdog names calls as the user counts them.
* **describe** (the operator's own, local and pure): its arguments -> a :class:`~mpicoll._plan.Call`;
  a failure is kept, to be raised through the agreement on every rank.
* **agree** (:func:`~._agree.agree_call`): with validation on, for the first call of an
  operation, for ``prepare``, and whenever the operator needs facts about the other ranks to pick
  its MPI calls (:meth:`Operation.needs_facts`, whatever ``validate`` says): one ``Allgather`` of
  agreement rows, which carries the payload too where every rank's fits its slot (then the data
  has moved: :meth:`Operation.land` finishes the call locally).
* **sink**, the only part that differs by mode: :data:`RUN` (``execute``: land, run the remembered
  plan, or issue the MPI calls at once), :data:`PREPARE` (record a :class:`~mpicoll._plan.Plan`), or a graph being captured
  (:mod:`mpicoll.graph`: described only, agreed with the whole graph at its end).

An operator subclass supplies ``describe``, ``issue`` (the only place that picks its MPI calls, from
the call and, when agreed, the table), ``ride``/``land`` where its data can travel in the agreement,
and its public ``execute`` / ``prepare`` with its real signature, each one line.
"""
from __future__ import annotations

import inspect
from functools import partial
from collections import OrderedDict
from typing import Any, ClassVar

import numpy as np
from mpi4py import MPI

from .. import _comm
from .. import _validate as V
from .._async import submit
from .._comm import OP_NAMES, LibComm, check_live, finalized, op_code
from .._domains import resolve
from .._dtypes import BY_NP, DType, ReduceOp, reduce_op
from .._errors import CollectiveArgumentError, CollectiveError, arg_error, as_collective_error
from .._params import CommParam
from .._plan import CAPTURING, Call, Plan, Recorder, Runner, count_call, epilogue, prologue
from .._ranktable import rank_table
from ._agree import CLASSES, Slots, agree_call
from ._reduce import reduction

#: name -> Operation class, for every public operator (check, bench, the CLI and the tests iterate it).
OPERATIONS: dict[str, type["Operation"]] = {}


class Operation:
    """Base of every ``<Name>Operation``: binds a Param to its communicator(s) and runs calls.

    Args:
        param: the operator's Param (default: all defaults, on the world).
        validate: run the cross-rank checks on every call (default: ``MPICOLL_VALIDATE``, on). A
            validated call of at most ``RIDE_BYTES`` a rank moves its data in its agreement: one
            exchange; a larger one makes a small ``Allgather`` before its data calls. Off, bad input
            may hang or give wrong results, as in raw MPI; the first call always agrees, and so do
            ``prepare`` and the calls whose MPI calls depend on the other ranks (the operator's
            facts: node buffers, uniform all-to-all counts). Set it alike on every rank: the first
            call raises on every rank if not.
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
    #: its issue reads where every rank's input lies (a node buffer, ``_shm.resident``): a fact
    #: exchanged whenever the communicator has node buffers, validation on or off
    RESIDES: ClassVar[bool] = False

    #: execute's arguments read as values when the call is described (counts, displacements,
    #: shapes, split sizes): a call repeated with other values is another call. Every other
    #: argument is data, read or written on every run (keyed by identity). The operator's own
    #: declaration, checked against its ``execute`` signature at import.
    VALUES: ClassVar[tuple[str, ...]] = ()
    #: ``describe`` has a rule on the contents of a data argument (finite scales): its calls are
    #: described every time, never remembered (a remembered call is not described again)
    RULES_ON_DATA: ClassVar[bool] = False
    #: (from the signature) the position of ``out``, and the value arguments' positions
    _OUT_AT: ClassVar[int | None] = None
    _VALUES_AT: ClassVar[frozenset] = frozenset()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("NAME"):     # (a subclass that keeps its parent's NAME does not replace it)
            cls.CODE = op_code(cls.NAME)
            OP_NAMES[cls.CODE] = cls.NAME
            CLASSES[cls.CODE] = cls
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
        self._given = timeout             # (the argument: the communicator decides the timeout at binding)
        #: the watchdog timeout of its calls and plans, decided once when it binds (None: none)
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
        self._runner = Runner(self)
        self._calls = Remembered()
        self._slots: Slots | None = None

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
        self._calls = Remembered()                     # (their headers carry the old flag)

    # -- binding -------------------------------------------------------------------------------------
    def _bind(self) -> LibComm:
        """Resolve the communicator (first call), decide the timeout, check the param against the
        communicator and freeze it. A param error is kept, and raised on every rank by the first
        agreement."""
        if MPI.Is_finalized():
            raise finalized(self.NAME, "a call")
        lib = resolve(self.NAME, self.param.comm, self.param.comm_domain, self.param.rank_size, "comm_domain")
        self.comm, self.rank, self.size = lib.mpi, lib.rank, lib.size
        self._lib, self._comms = lib, (lib,)
        p = self.param
        try:       # (decided first, whatever else fails: a timed call's MPI form differs from an untimed one's)
            self.timeout = lib.call_timeout(self._given, self.NAME)
        except CollectiveError as exc:
            self.timeout, self._param_error = lib.call_timeout(), exc
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
        if lib.debug:
            self._validate = True
        return lib

    def _bind_param(self) -> None:
        """Operator-specific param checks and bindings, once the communicator is known."""

    def _live(self) -> LibComm:
        """Before a call: bind (the first call), and raise if a communicator of it was freed or MPI
        is finalized."""
        if MPI.Is_finalized():
            raise finalized(self.NAME, "a call")
        lib = self._lib or self._bind()
        check_live(self._comms, self.NAME)
        return lib

    # -- THE entry point of every call: one pipeline, a sink per mode ---------------------------------
    def _call(self, args: tuple, mode: "Mode", failed: CollectiveError | None = None) -> Any:
        """THE door of every call: where its pipeline runs. Captured into a graph being captured (its
        sink), queued on the communicator's worker (:data:`ASYNC`: the call runs there, in
        :data:`RUN`, while the caller goes on; :mod:`mpicoll._async`), or here, now. ``failed``: a
        failure the caller found on this rank before it could make the call (a reduce op, a group,
        a tensor it cannot read: :mod:`mpicoll.functional`, the torch backend), raised through the
        call's agreement like an error of ``describe``, so that no peer waits."""
        if CAPTURING:
            mode = CAPTURING[-1].sink(mode)
        lib = self._lib
        if lib is None or _comm.FREED or MPI.Is_finalized():
            lib = self._live()
        if mode is ASYNC:
            return submit(self._comms, partial(self._pipeline, lib, args, RUN, failed))
        return self._pipeline(lib, args, mode, failed)

    def _pipeline(self, lib: LibComm, args: tuple, mode: "Mode", failed: CollectiveError | None = None) -> Any:
        """THE pipeline of a call (see the module docstring): remembered? -> count -> describe ->
        agree -> ``mode.take``. Calls queued ahead of it on the communicator by another thread
        finish first; then one thread at a time per communicator (:meth:`~mpicoll._comm.LibComm.enter`)."""
        if lib.pending:
            lib.drain(None)
        if not lib.busy.acquire(False):
            lib.enter(self.NAME)                        # (raises: another thread is inside a call on it)
        try:
            key = entry = None
            at = self._OUT_AT
            if mode.remembers and failed is None and (at is None or (len(args) > at and args[at] is not None)):
                key = _key(args, self._VALUES_AT)       # (it fills arrays it was given: it may come back)
                entry = self._calls.get(key)
            number = count_call(self._comms, self.NAME) if mode.counts else 0
            if entry is not None:
                call, err = entry.call, None
            else:
                call, err = self._described(args, failed)
            if mode.defers:
                return mode.take(self, call, err)
            if not (mode.agrees or self._validate or not self._agreed_once or (err is None and self.needs_facts(call))):
                if err is not None:
                    raise err
                if entry is None and self._calls.keeps(key, args, self):
                    entry = self._calls.keep(key, args, call, None)
                return mode.take(self, call, None, False, entry)
            payload = None
            if mode.rides and err is None:
                payload = entry.payload if entry is not None and entry.slots is not None else self._payload(call)
                if payload is not None and (call.src is not None or call.before):
                    prologue(call)                      # (its payload is read now, into the agreement)
            if entry is not None and entry.slots is not None:
                # (its row as last time, unless its headers carry a sequence number: built anew)
                table, rode, headers = agree_call(lib, self, call, None, number, payload, entry.slots,
                                                  entry.last if lib.plain else None)
            else:
                kept = err is None and self._calls.keeps(key, args, self)
                slots = Slots(lib) if kept else self._scratch_slots(lib)
                table, rode, headers = agree_call(lib, self, call, err, number, payload, slots)
                if kept:
                    entry = self._calls.keep(key, args, call, slots)
                    entry.payload = payload if mode.rides else self._payload(call)
            if entry is not None and headers is not None:
                entry.agreed(headers)
            return mode.take(self, call, table, rode, entry)
        finally:
            lib.busy.release()

    def _scratch_slots(self, lib: LibComm) -> Slots:
        """The agreement buffers of its calls that are not remembered (one set, reused: a call's
        table is read during the call only)."""
        if self._slots is None:
            self._slots = Slots(lib)
        return self._slots

    def _payload(self, call: Call) -> np.ndarray | None:
        """What this rank offers its agreement to carry: its :meth:`ride`, where it fits the slot."""
        payload = self.ride(call)
        return payload if payload is not None and payload.nbytes <= V.RIDE_BYTES else None

    def _described(self, args: tuple, failed: CollectiveError | None = None
                   ) -> tuple[Call | None, BaseException | None]:
        """``describe(*args)``, or the error it (or the Param, at binding, or the caller: ``failed``)
        raised on this rank."""
        self._fresh = False
        failed = self._param_error or failed
        if failed is not None:
            return None, failed
        try:
            return self.describe(*args), None
        except Exception as exc:  # noqa: BLE001 - every local failure is agreed, never raised alone
            return None, as_collective_error(exc, self.NAME, self.rank)

    def _record(self, call: Call, table: np.ndarray | None, rec: Recorder, rows: list | None = None) -> None:
        """Record the call into a plan: one part per round (``call.rounds``: the Hccl client's
        ``repeat``, else 1; ``issue`` reads ``call.round``), its local work around it. ``rows``:
        its data rode its agreement (those rows): only its landing, and its local work after it."""
        for k in range(call.rounds):
            call.round = k
            rec.begin(self.NAME, self._comms)
            if rows is not None:
                self.land(call, rows, table, rec)
            else:
                if call.src is not None:
                    rec.local(np.copyto, call.x, call.src)
                for step in call.before:
                    rec.local(*step)
                self.issue(call, table, rec)
            for step in call.after:
                rec.local(*step)
            rec.end(call.result)

    # -- what an operator supplies ---------------------------------------------------------------
    def describe(self, *args: Any) -> Call:
        """Local and pure: this rank's arguments -> a :class:`~mpicoll._plan.Call`; raise
        :class:`~mpicoll.CollectiveArgumentError` on a rule one rank can see."""
        raise NotImplementedError

    def issue(self, call: Call, table: np.ndarray | None, go: Any) -> None:
        """The MPI calls (``go.mpi``, ``go.start``/``go.wait``) and local work (``go.local``) of
        one call, in order. ``table`` is the agreed table, or None (not agreed): choices that depend
        on other ranks' values may only be made from it (:meth:`needs_facts` says when it is there)."""
        raise NotImplementedError

    def needs_facts(self, call: Call) -> bool:
        """Whether ``issue`` needs the agreed table to pick this call's MPI calls (then the call
        agrees, validation on or off: ``validate=False`` never changes which MPI calls carry the
        data). Decided from what every rank holds alike for a valid call. Default: node buffers on
        the communicator, for an operator that reads them (``RESIDES``)."""
        return self.RESIDES and bool(self._lib.buffers)

    def ride(self, call: Call) -> np.ndarray | None:
        """This rank's payload, if the call's data can travel in its agreement (every rank's of at
        most ``RIDE_BYTES``): an array (a view; any layout) whose contents the peers' :meth:`land`
        needs. None: the operator does not ride (its data always moves by ``issue``)."""
        return None

    def land(self, call: Call, rows: list[np.ndarray], table: np.ndarray, go: Any) -> None:
        """Finish a call whose data travelled in its agreement: ``rows[r]``, rank r's payload (1-D
        of the call's dtype, a view into the gathered ``table``). Local work only (``go.local``,
        as ``issue`` records it: a remembered call's landing is recorded once)."""
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


# ----------------------------------------------------------------------------- the sinks

class Mode:
    """What a mode does with an agreed call (:meth:`take`), and which stages it takes: ``remembers``
    (look the call up, keep it), ``counts`` (count it now), ``agrees`` (always agree), ``rides``
    (offer its payload to the agreement), ``defers`` (take it described, unagreed: a capture)."""

    remembers = counts = rides = True
    agrees = defers = False

    def take(self, op: Operation, call: Call, table: np.ndarray | None, rode: bool, entry: "Entry | None") -> Any:
        raise NotImplementedError


class _Run(Mode):
    """``execute``: run a remembered call's plan (its landing, if it rode), else land or issue at once."""

    def take(self, op, call, table, rode, entry):
        plan = entry.plan(op, table, rode) if entry is not None else None
        if plan is not None:
            return plan.run()
        if rode:
            op.land(call, Slots.rows_of(op._lib, table, call), table, op._runner)
        else:
            if call.src is not None or call.before:
                prologue(call)
            op.issue(call, table, op._runner)
        if call.after:
            epilogue(call)
        return call.result


class _Async(Mode):
    """``async_op=True``: the call queued on its communicator's worker, which runs its pipeline in
    :data:`RUN` (:meth:`Operation._call`; a graph being captured takes it as an async call)."""


class _Prepare(Mode):
    """``prepare``: a Plan, each of whose runs counts as a call."""

    remembers = rides = False
    agrees = True

    def take(self, op, call, table, rode, entry):
        rec = Recorder()
        op._record(call, table, rec)
        return Plan(rec, op, rounds=call.rounds > 1)


RUN, ASYNC, PREPARE = _Run(), _Async(), _Prepare()


# ----------------------------------------------------------------------------- the remembered calls

#: calls an operation remembers
REMEMBERED = 8
#: a call is remembered only when its arrays hold at most this many bytes together: the describe
#: and checks it skips cost microseconds, which matter for small calls only, and a remembered call
#: keeps its arrays alive (a fresh view of a large tensor each call must not)
REMEMBERED_BYTES = 1 << 16


class Entry:
    """One remembered call: its arguments (kept alive: the key's identities stay theirs), its
    record, its agreement's buffers (``slots``: its row stays there from one call to the next), the
    headers every rank sent last time (``last``), its landing rows, its plan (recorded at its
    first repeat, for the table it was agreed with)."""

    __slots__ = ("args", "call", "slots", "payload", "last", "_plan", "_seen")

    def __init__(self, args: tuple, call: Call, slots: Slots | None) -> None:
        self.args, self.call, self.slots = args, call, slots
        self.payload = self.last = self._plan = None      # (payload: its ride, where it fits)
        self._seen = False

    def agreed(self, headers: bytes) -> None:
        """The call was agreed with headers that are new (a peer's call changed, or this is its
        first agreement): keep what a repeat compares, and drop the plan made for the old ones (it
        may land other rows, or pick other MPI calls)."""
        self.last, self._plan, self._seen = headers, None, False

    def plan(self, op: Operation, table: np.ndarray | None, rode: bool) -> Plan | None:
        """Its plan (its landing, if it ``rode``: the same on every repeat while the headers are),
        recorded at its first repeat; None at its first use, or while a start of the plan is in
        flight (the call then runs afresh)."""
        if not self._seen:
            self._seen = True
            return None
        if self._plan is None:
            rec = Recorder(counts=False)              # (the pipeline counts each repeat)
            op._record(self.call, table, rec, Slots.rows_of(op._lib, table, self.call) if rode else None)
            self._plan = Plan(rec, op, persistent=False)
        return self._plan if self._plan.idle else None


class Remembered(OrderedDict):
    """An operation's last ``REMEMBERED`` calls, by key (:func:`_key`: the one key rule), oldest first;
    a call is remembered when it comes back (the last calls seen once are kept too, with their
    arguments, so that a call made with a new view each time costs no entry: a view freed and
    another made at its address would otherwise come back under the same key)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: OrderedDict = OrderedDict()

    def keeps(self, key: tuple | None, args: tuple, op: Operation) -> bool:
        """Whether a call just described is remembered: its second time (not when it must be
        described again every time: its key cannot tell it apart, it allocated its output or copied
        a list, its arrays are large, or its rules read data)."""
        if key is None or op._fresh or op.RULES_ON_DATA or not _small(args):
            return False
        if key in self.seen:
            return True
        self.seen[key] = args           # (held: an identity in a key stays its array's, never reused)
        if len(self.seen) > REMEMBERED:
            self.seen.popitem(last=False)
        return False

    def keep(self, key: tuple, args: tuple, call: Call, slots: Slots | None) -> Entry:
        """Remember a call (:meth:`keeps`)."""
        entry = self[key] = Entry(args, call, slots)
        if len(self) > REMEMBERED:
            self.popitem(last=False)
        return entry


_SCALARS = (int, float, bool, str, type(None))


def _key(args: tuple, values: frozenset) -> tuple | None:
    """What identifies a call: its data arrays by identity, shape, strides, dtype and flags
    (writeable, contiguous: what ``describe`` checks; their contents are read on every run; the
    remembered call keeps them referenced, so an identity stays theirs), its values
    (``Operation.VALUES``) by their contents. None when an argument is neither (an object the key
    cannot tell apart): such a call is not remembered."""
    key = []
    try:
        for i, a in enumerate(args):
            if i in values:
                key.append(_value(a))
            elif type(a) is np.ndarray:     # (the common case, inline)
                key.append((id(a), a.shape, a.strides, a.dtype, a.flags.num))
            else:
                key.append(_data(a))
    except TypeError:
        return None
    return tuple(key)


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
    if t is np.ndarray:
        return (a.dtype, a.shape, a.tobytes())
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


def _small(args: tuple) -> bool:
    """Whether the arrays among ``args`` (in lists too) hold at most ``REMEMBERED_BYTES``."""
    total = 0
    for a in args:
        if type(a) is np.ndarray:
            total += a.nbytes
        elif isinstance(a, (list, tuple)):
            total += sum(x.nbytes for x in a if isinstance(x, np.ndarray))
    return total <= REMEMBERED_BYTES


class ReduceTypeOperation(Operation):
    """An operator with a ``reduce_type``, bound once."""

    def _bind_param(self) -> None:
        self._rop: ReduceOp = reduce_op(self.param.reduce_type, op=self.NAME, rank=self.rank)

    def _reduction(self, dt: DType) -> ReduceOp:
        """The reduce op's row for ``dt`` (:func:`~._reduce.reduction`)."""
        return reduction(self._rop, dt, self.NAME, "reduce_type", self.rank)
