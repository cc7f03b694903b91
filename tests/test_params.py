"""Param dataclasses and their JSON forms (no communication)."""
from __future__ import annotations

import json

import pytest

import mpicoll
from mpicoll import CollectiveArgumentError, CommMode

PARAMS = [cls.PARAM for cls in mpicoll.OPERATIONS.values()]


@pytest.mark.parametrize("name", list(mpicoll.OPERATIONS))
def test_every_operator_exports_its_param_and_operation(name):
    """Every registered operator ``X`` is public as ``mpicoll.XOperation`` with ``mpicoll.XParam``,
    its own Param class (not the shared base)."""
    cls = mpicoll.OPERATIONS[name]
    assert f"{name}Operation" in mpicoll.__all__ and getattr(mpicoll, f"{name}Operation") is cls
    assert f"{name}Param" in mpicoll.__all__ and getattr(mpicoll, f"{name}Param") is cls.PARAM
    assert cls.PARAM is not mpicoll.CommParam and cls.PARAM.__name__ == f"{name}Param"


@pytest.mark.parametrize("cls", PARAMS)
def test_camel_case_json(cls):
    p = cls.from_json(json.dumps({"rank": 1, "rankSize": 4, "rankRoot": 2, "backend": "hccl", "commDomain": "tp0",
                                  "rankTableFile": "", "commMode": 0, "hcclComm": None, "rsv": [0] * 64}))
    assert (p.rank, p.rank_size, p.rank_root, p.backend, p.comm_domain) == (1, 4, 2, "hccl", "tp0")
    assert p.comm_mode is CommMode.MULTI_PROCESS and p.comm is None


@pytest.mark.parametrize("cls", PARAMS)
def test_snake_case_and_round_trip(cls):
    p = cls.from_dict({"rank": 0, "rank_size": 2, "comm_domain": "x"})
    assert p.rank_size == 2 and p.comm_domain == "x"
    assert cls.from_dict(p.to_dict()) == p


def test_reduce_type_aliases():
    assert mpicoll.AllReduceParam.from_json('{"allReduceType": "max"}').reduce_type == "max"
    assert mpicoll.ReduceScatterParam.from_json('{"reduceType": "min"}').reduce_type == "min"


def test_alltoallv_plan_keys():
    p = mpicoll.AllToAllVParam.from_json('{"sendCounts": [1, 2], "sdispls": [0, 1], "recvCounts": [2, 1], '
                                         '"rdispls": [0, 2]}')
    assert (p.send_counts, p.sdispls, p.recv_counts, p.rdispls) == ([1, 2], [0, 1], [2, 1], [0, 2])


@pytest.mark.parametrize("text,fragment", [
    ('{"rankSize": 2, "bogus": 1}', "unknown key 'bogus'"),
    ('{"allReduceType": "sum"}', "unknown key 'allReduceType'"),
    ('{"hcclComm": 5}', "must be null"),
    ('{"commMode": "COMM_FOO"}', "comm_mode"),
    ("[1, 2]", "expected a dict"),
    ("{nope", "not a JSON object"),
])
def test_bad_json(text, fragment):
    with pytest.raises(CollectiveArgumentError, match=fragment.replace("(", r"\(")):
        mpicoll.BroadcastParam.from_json(text)


def test_comm_mode_spellings():
    assert CommMode.parse("COMM_MULTI_THREAD") is CommMode.MULTI_THREAD
    assert CommMode.parse(1) is CommMode.MULTI_THREAD
    assert CommMode.parse("multi_process") is CommMode.MULTI_PROCESS


def test_wrong_param_class_is_refused():
    with pytest.raises(CollectiveArgumentError, match="must be AllReduceParam"):
        mpicoll.AllReduceOperation(mpicoll.BroadcastParam())


def test_dtype_table_lookup():
    from mpicoll._dtypes import HcclDataType, lookup
    assert lookup(HcclDataType.BFP16).name == "bfloat16"
    assert lookup("float16").name == lookup(3).name == "float16"
    with pytest.raises(CollectiveArgumentError, match="unsupported dtype"):
        lookup("complex64")
