"""The Operation base class, the operator registry, and THE call pipeline (its sinks: :mod:`~._modes`).

Every call, in every mode, is one straight line of small stages over one record (docs/design.md)::

    lookup -> describe -> must it agree? -> agree -> take

* **bind** (the first call, :meth:`Operation._bind`): resolve the communicator, check the Param,
  decide the timeout (once: ``Operation.timeout``). Then the call runs here, or is captured into a
  graph, or is queued on the communicator's worker (``ASYNC``, ``async_op=True``: the rest of the
  pipeline runs there, in ``WORKER``, while the caller goes on, :mod:`mpicoll._async`).
* **lookup** (:mod:`~._compiled`): the call's layout compiled already (its arrays' dtypes, shapes
  and strides, its values): the very arguments of the last call run its bound steps again
  (:meth:`~._compiled.Compiled.repeat`); other arrays of that layout fill its slots and run it. Its
  validation is a step of it: one exchange, compared with the headers of its compilation.
* **describe** (the operator's own, local and pure): its arguments -> a :class:`~mpicoll._call.Call`;
  a failure is kept, to be raised through the agreement on every rank.
* **must it agree?** (:meth:`Operation._agrees`): with validation on, for the first call of an
  operation, for ``prepare``, and where the operator reads where every rank's input lies
  (``RESIDES``, a communicator with node buffers).
* **agree** (:func:`~._agree.agree_call`): one ``Allgather`` of agreement rows, which carries the
  payload too where every rank's fits its slot (then the data has moved: :meth:`Operation.land`
  finishes the call locally).
* **take**, the only stage that differs by mode (the sinks, :mod:`~._modes`): ``RUN`` compiles the
  call (small calls of a layout it can tell apart, :class:`~._compiled.Compiled`) and runs it, or
  runs it at once with the operation's :class:`~mpicoll._go.Runner`; ``PREPARE`` records a
  :class:`~mpicoll._plan.Plan`; a graph being captured (:mod:`mpicoll.graph`) takes it described,
  agreed with the whole graph at its end.

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

from .. import _comm, _trace
from .. import _validate as V
from .._async import submit
from .._comm import LibComm, check_live, finalized, op_code
from .._domains import resolve
from .._dtypes import BY_NP, DType, ReduceOp, reduce_op
from .._errors import CollectiveArgumentError, CollectiveError, arg_error, as_collective_error
from .._params import CommParam
from .._call import CAPTURING, Call, prologue
from .._go import Recorder, Runner, count_call
from ._compiled import COMPILED, MISS, Compiled
from ._slots import layout
from .._ranktable import rank_table
from ._agree import Slots, agree_call
from ._modes import ASYNC, WORKER, Mode
from ._observe import traced
from ._reduce import reduction
from .._thresholds import value

#: name -> Operation class, for every public operator (check, bench, the CLI and the tests iterate it).
OPERATIONS: dict[str, type["Operation"]] = {}


class Operation:
    """Base of every ``<Name>Operation``: binds a Param to its communicator(s) and runs calls.

    Args:
        param: the operator's Param (default: all defaults, on the world).
        validate: run the cross-rank checks on every call (default: ``MPICOLL_VALIDATE``, on). A
            validated call of at most ``ride`` a rank moves its data in its agreement: one
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
    #: how errors name the shape its header carries, where it is not x's ("block shape ...")
    SHAPE_NAME: ClassVar[str] = "x.shape"
    #: its issue reads where every rank's input lies (a node buffer, ``_shm.resident``): a fact
    #: exchanged whenever the communicator has node buffers, validation on or off
    RESIDES: ClassVar[bool] = False

    #: execute's arguments read as values when the call is described (counts, displacements,
    #: shapes, split sizes): a call repeated with other values is another call. Every other
    #: argument is data, read or written on every run (keyed by identity). The operator's own
    #: declaration, checked against its ``execute`` signature at import.
    VALUES: ClassVar[tuple[str, ...]] = ()
    #: the value arguments among ``VALUES`` that change with (almost) every call (AllToAllVV2's
    #: counts, a MoE layer's routing): the slots of the operation's one compiled call
    #: (:class:`~._compiled.Slotted`), which describes every call, never part of a layout (not for
    #: an operator whose issue reads where inputs lie: ``RESIDES``)
    SLOTS: ClassVar[tuple[str, ...]] = ()
    #: ``describe`` has a rule on the contents of a data argument (finite scales): its calls are
    #: described every time, never compiled (a compiled call is not described again)
    RULES_ON_DATA: ClassVar[bool] = False
    #: (from the signature) the position of ``out``, and the value arguments' positions
    _OUT_AT: ClassVar[int | None] = None
    _VALUES_AT: ClassVar[frozenset] = frozenset()
    _SLOTS_AT: ClassVar[frozenset] = frozenset()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("NAME"):     # (a subclass that keeps its parent's NAME does not replace it)
            cls.CODE = op_code(cls.NAME)
            if cls.PUBLIC:
                OPERATIONS[cls.NAME] = cls
        if "execute" in cls.__dict__:
            names = list(inspect.signature(cls.execute).parameters)[1:]
            unknown = [v for v in cls.VALUES if v not in names] if "VALUES" in cls.__dict__ else []
            if unknown:
                raise TypeError(f"{cls.__name__}.VALUES names {unknown}: not arguments of its execute {names}")
            cls._OUT_AT = names.index("out") if "out" in names else None
            cls._VALUES_AT = frozenset(i for i, n in enumerate(names) if n in cls.VALUES)
            cls._SLOTS_AT = frozenset(i for i, n in enumerate(names) if n in cls.SLOTS)

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
        self._runner = Runner(self)
        self._compiled: OrderedDict[tuple, Compiled] = OrderedDict()    # its compiled layouts
        self._last: Compiled | None = None                              # the one its last call ran
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
        self._compiled, self._last = OrderedDict(), None     # (they agree, or not, by the old flag)

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
        :data:`WORKER`, while the caller goes on; :mod:`mpicoll._async`), or here, now: one thread at
        a time per communicator (:meth:`~mpicoll._comm.LibComm.enter`), after the calls queued ahead
        of it there by another thread. ``failed``: a failure the caller found on this rank before it
        could make the call (a reduce op, a group, a tensor it cannot read: :mod:`mpicoll.functional`,
        the torch backend), raised through the call's agreement like an error of ``describe``, so
        that no peer waits."""
        if CAPTURING and mode is not WORKER:
            mode = CAPTURING[-1].sink(mode)
        lib = self._lib
        if lib is None or _comm.FREED:                  # (MPI finalizing counts: _comm._finalizing)
            lib = self._live()
        if mode.defers:
            return mode.take(self, *self._described(args, failed))
        if mode is ASYNC:
            return submit(self._comms, partial(self._call, args, WORKER, failed))
        if lib.pending:
            lib.drain(None)
        if not lib.busy.acquire(False):
            lib.enter(self.NAME)                        # (raises: another thread is inside a call on it)
        ring = lib.flight                               # (the flight recorder: this call, inline)
        k = ring.entered = ring.entered + 1             # (the k-th call on this communicator)
        ring.items[k % ring.size] = self.NAME
        try:
            result = traced(self, lib, args, mode, failed, k) if _trace.ON else self._here(lib, args, mode, failed)
        except BaseException as exc:
            ring.items[k % ring.size] = (self.NAME, type(exc).__name__)
            raise
        finally:
            ring.ended = k
            lib.busy.release()
        return result

    def _here(self, lib: LibComm, args: tuple, mode: "Mode", failed: CollectiveError | None) -> Any:
        """The call, here and now (the caller holds the communicator): the last call's compiled
        call again or filled with other arrays of its layout, else the pipeline."""
        last, described = self._last, None
        if last is not None and mode.compiles and failed is None:
            result = last.repeat(args)              # (the very arguments of the last call)
            if result is MISS:
                result = last.similar(args)         # (other arrays of its layout)
            if result is not MISS:
                return result
            described = last.described             # (a Slotted call's: described already)
        return self._pipeline(lib, args, mode, failed, described)

    def _pipeline(self, lib: LibComm, args: tuple, mode: "Mode", failed: CollectiveError | None,
                  described: tuple | None = None) -> Any:
        """THE pipeline of a call (see the module docstring): lookup -> describe -> must it agree?
        -> agree -> ``mode.take``. ``described``: ``(call, error)`` of this call, described once
        already (by a :class:`~._compiled.Slotted` call that could not run it)."""
        key = arrays = None
        compiles = mode.compiles and failed is None and not self.RULES_ON_DATA
        if compiles and self._SLOTS_AT:
            if not self.RESIDES:
                arrays = ()                             # (its values are slots: compiled whatever its arrays)
        elif compiles:
            key, mine, looks = layout(args, self._VALUES_AT, self._SLOTS_AT)
            found = None if key is None else self._compiled.get(key)
            if found is not None and found.fill(args, mine, looks):
                self._last = found
                return found.run()
            if key is not None and sum(a.nbytes for a in mine) <= value("compiled"):
                arrays = (mine, looks)                  # (it compiles: the layout and its arrays)
        call, err = described or self._described(args, failed)
        number = count_call(self._comms, self.NAME) if self._counted(lib) else 0
        if not self._agrees(mode, lib):
            if err is not None:
                raise err
            return mode.take(self, call, None, False, None, None, key, args, arrays)
        payload = self._payload(call) if mode.rides and err is None else None
        if payload is not None and (call.src is not None or call.before):
            prologue(call)                              # (its payload is read now, into the agreement)
        slots = Slots(lib) if arrays is not None and self._checks(lib) else self._scratch_slots(lib)
        table, rode = agree_call(lib, self, call, err, number, payload, slots)
        return mode.take(self, call, table, rode, slots, payload, key, args, arrays)

    def _agrees(self, mode: "Mode", lib: LibComm) -> bool:
        """Whether a call agrees (the one place this is decided): in a mode that always does
        (``prepare``), for the operation's first call, and wherever its calls agree
        (:meth:`_checks`)."""
        return mode.agrees or not self._agreed_once or self._checks(lib)

    def _checks(self, lib: LibComm) -> bool:
        """Whether its calls agree, every one: with validation on, and where its issue reads where
        every rank's input lies (``RESIDES``, on a communicator with node buffers: a fact of the
        other ranks it needs, agreed validation on or off)."""
        return self._validate or (self.RESIDES and bool(lib.buffers))

    def _counted(self, lib: LibComm) -> bool:
        """Whether its calls are counted (the one place this is decided): where the count is read,
        a watchdog on the communicator or a timeout on the operation (it names a call in a timeout
        as the user counts them)."""
        return not lib.plain or self.timeout is not None

    def _keep(self, c: Compiled) -> None:
        """Keep a compiled call (its layout's; the last run)."""
        kept = self._compiled
        kept[c.key] = c
        kept.move_to_end(c.key)
        if len(kept) > COMPILED:
            kept.popitem(last=False)
        self._last = c

    def _scratch_slots(self, lib: LibComm) -> Slots:
        """The agreement buffers of its calls that are not compiled (one set, reused: a call's
        table is read during the call only)."""
        if self._slots is None:
            self._slots = Slots(lib)
        return self._slots

    def _payload(self, call: Call) -> np.ndarray | None:
        """What this rank offers its agreement to carry: its :meth:`ride`, where it fits the slot."""
        payload = self.ride(call)
        return payload if payload is not None and payload.nbytes <= value("ride") else None

    def _described(self, args: tuple, failed: CollectiveError | None = None
                   ) -> tuple[Call | None, BaseException | None]:
        """``describe(*args)``, or the error it (or the Param, at binding, or the caller: ``failed``)
        raised on this rank."""
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

    @staticmethod
    def show_params(value: int) -> str:
        """How its header's operator parameters (``Call.params``) read in a mismatch: the number,
        unless the operator says more."""
        return str(value)

    # -- what an operator supplies ---------------------------------------------------------------
    def describe(self, *args: Any) -> Call:
        """Local and pure: this rank's arguments -> a :class:`~mpicoll._call.Call`; raise
        :class:`~mpicoll.CollectiveArgumentError` on a rule one rank can see."""
        raise NotImplementedError

    def issue(self, call: Call, table: np.ndarray | None, go: Any) -> None:
        """The MPI calls (``go.mpi``, ``go.start``/``go.wait``) and local work (``go.local``) of
        one call, in order. ``table`` is the agreed table, or None (not agreed): choices that depend
        on other ranks' values may only be made from it (:meth:`_agrees` says when it is there)."""
        raise NotImplementedError

    def ride(self, call: Call) -> np.ndarray | None:
        """This rank's payload, if the call's data can travel in its agreement (every rank's of at
        most ``ride``): an array (a view; any layout) whose contents the peers' :meth:`land`
        needs. None: the operator does not ride (its data always moves by ``issue``)."""
        return None

    def land(self, call: Call, rows: list[np.ndarray], table: np.ndarray, go: Any) -> None:
        """Finish a call whose data travelled in its agreement: ``rows[r]``, rank r's payload (1-D
        of the call's dtype, a view into the gathered ``table``). Local work only (``go.local``,
        as ``issue`` records it: a compiled call's landing is recorded once)."""
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
        x, dt = V.array(self.NAME, name, x, self.rank)   # (a list's contents copied: never compiled, a
        if x.flags.c_contiguous:                         # list of numbers has no layout)
            return x, dt, None
        return np.empty(x.shape, dtype=x.dtype), dt, x

    def _out(self, out: Any, shape: tuple, dtype: np.dtype, x: np.ndarray | None = None,
             in_place_ok: bool = False, name: str = "out") -> np.ndarray:
        """``out`` checked against the output's shape and dtype, or a new array (a compiled call
        allocates a new one on every call, as the first did)."""
        if out is None:
            return np.empty(shape, dtype=dtype)
        return V.check_out(self.NAME, out, shape, dtype, self.rank, x, in_place_ok, name)


class ReduceTypeOperation(Operation):
    """An operator with a ``reduce_type``, bound once."""

    def _bind_param(self) -> None:
        self._rop: ReduceOp = reduce_op(self.param.reduce_type, op=self.NAME, rank=self.rank)

    def _reduction(self, dt: DType) -> ReduceOp:
        """The reduce op's row for ``dt`` (:func:`~._reduce.reduction`)."""
        return reduction(self._rop, dt, self.NAME, "reduce_type", self.rank)
