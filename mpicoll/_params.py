"""The Param base dataclass, the camelCase alias table and the CommMode enum.

Params load from the accelerator stacks' JSON (``{"rank": 0, "rankSize": 4, "commDomain": "tp0"}``)
as well as from snake_case keys. Unknown keys are an error that names the key.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

from ._errors import CollectiveArgumentError


class CommMode(IntEnum):
    """How ranks map to workers (ATB's ``CommMode``)."""

    UNDEFINED = -1
    MULTI_PROCESS = 0
    MULTI_THREAD = 1

    @classmethod
    def parse(cls, value: object) -> "CommMode":
        if isinstance(value, str):
            key = value.upper().removeprefix("COMM_")
            if key in cls.__members__:
                return cls[key]
        elif isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
            return cls(value)
        raise CollectiveArgumentError(
            f"comm_mode={value!r}: must be CommMode.MULTI_PROCESS (0) or MULTI_THREAD (1)", param="comm_mode")


#: The accelerator stacks' keys that are not the camelCase of a field name (every field also loads
#: from its camelCase, ``rankSize`` -> ``rank_size``). One table for all Params.
ALIASES: dict[str, str] = {
    "hcclComm": "comm",
    "allReduceType": "reduce_type",
}


def _frozen(value: Any) -> Any:
    """A list or array field's value as (nested) tuples: an in-place change then raises too."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def camel(name: str) -> str:
    """``rank_size`` -> ``rankSize``."""
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)
#: Documented keys that carry nothing for mpicoll (the C structs' reserved bytes).
IGNORED_KEYS = frozenset({"rsv"})


@dataclass
class CommParam:
    """Fields every operator's Param has.

    Args:
        rank: this rank in the operator's communicator; None or -1 = take it from the communicator.
        rank_size: the communicator's size; None = take it; 0 is an error ("cannot be 0").
        rank_root: root rank for rooted operators (Broadcast).
        backend: "mpi"; "hccl", "lccl" and "nccl" are accepted as aliases.
        comm: a user ``mpi4py.MPI.Comm`` (HCCL's ``hcclComm``); mpicoll works on a duplicate of it
            and never frees it.
        comm_mode: ``CommMode.MULTI_PROCESS`` (default) or ``MULTI_THREAD`` (needs ``comm`` and MPI
            thread level MULTIPLE).
        rank_table_file: HCCL rank-table JSON, validated against the MPI world.
        comm_domain: name of a comm domain; "" = the world. Ranks naming the same domain form one
            sub-communicator.
    """

    rank: int | None = None
    rank_size: int | None = None
    rank_root: int = 0
    backend: str = "mpi"
    comm: Any = None
    comm_mode: CommMode = CommMode.MULTI_PROCESS
    rank_table_file: str = ""
    comm_domain: str = ""

    OP: ClassVar[str] = "Param"

    def freeze(self, op: str) -> None:
        """Bind the Param to an operation (at its first call, which reads it): its list and array
        fields become tuples, and assigning a field raises. A change after that would otherwise be
        ignored (the operation keeps what it read): make a new Param and operation instead."""
        if "_bound_to" in self.__dict__:
            return
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list) or hasattr(value, "tolist") and hasattr(value, "ndim") and value.ndim:
                object.__setattr__(self, f.name, _frozen(value))
        object.__setattr__(self, "_bound_to", op)

    def __setattr__(self, name: str, value: Any) -> None:
        op = self.__dict__.get("_bound_to")
        if op is not None:
            raise CollectiveArgumentError(
                f"{type(self).__name__}.{name}: this Param is bound to its operation ({op}) since that one's "
                f"first call, which read it: make a new Param and operation (dataclasses.replace(param, {name}=...))",
                op=op, param=name)
        object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls, d: dict) -> "CommParam":
        """Build from a dict with camelCase or snake_case keys.

        Raises:
            CollectiveArgumentError: a key that is not a field of this Param.
        """
        if not isinstance(d, dict):
            raise CollectiveArgumentError(f"{cls.__name__}.from_dict: expected a dict, got {type(d).__name__}",
                                          param="param")
        names = {f.name for f in dataclasses.fields(cls)}
        keys = {camel(n): n for n in names} | {k: v for k, v in ALIASES.items() if v in names} | {n: n for n in names}
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            if key in IGNORED_KEYS:
                continue
            name = keys.get(key)
            if name is None:
                raise CollectiveArgumentError(
                    f"{cls.__name__}: unknown key {key!r}; known keys: {', '.join(sorted(keys))}", param=key)
            if name == "comm" and value is not None:
                raise CollectiveArgumentError(
                    f"{cls.__name__}: key {key!r} must be null in JSON; pass an mpi4py Comm as comm=",
                    param=key)
            if name == "comm_mode":
                value = CommMode.parse(value)
            kwargs[name] = value
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> "CommParam":
        """Build from a JSON object text (see :meth:`from_dict`)."""
        try:
            d = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise CollectiveArgumentError(f"{cls.__name__}.from_json: not a JSON object: {exc}",
                                          param="json") from exc
        return cls.from_dict(d)

    def to_dict(self) -> dict:
        """camelCase dict of the JSON-representable fields (``comm`` is left out)."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "comm":
                continue
            value = getattr(self, f.name)
            out[camel(f.name)] = int(value) if isinstance(value, IntEnum) else value
        return out


@dataclass
class ReduceTypeParam(CommParam):
    """Adds ``reduce_type``: "sum" | "prod" | "max" | "min"."""

    reduce_type: str = "sum"
