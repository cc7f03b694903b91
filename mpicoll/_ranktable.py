"""HCCL rank tables: load and validate one (JSON paths in every error), check it against the MPI
world, and turn it into a host list for ``mpirun``."""
from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass

from mpi4py import MPI

from ._errors import CollectiveArgumentError


@dataclass(frozen=True)
class Device:
    device_id: int
    device_ip: str
    rank_id: int


@dataclass(frozen=True)
class Server:
    server_id: str
    devices: tuple[Device, ...]


@dataclass(frozen=True)
class RankTable:
    """A validated HCCL rank table."""

    version: str
    servers: tuple[Server, ...]
    source: str = "<dict>"

    @property
    def size(self) -> int:
        return sum(len(s.devices) for s in self.servers)

    def host_of(self, rank: int) -> str:
        for s in self.servers:
            if any(d.rank_id == rank for d in s.devices):
                return s.server_id
        raise CollectiveArgumentError(f"rank table {self.source}: no device has rank_id {rank}", param="rank_id")

    def hosts(self) -> str:
        """Host list for ``mpirun -hosts`` (hydra): ``"host1:2,host2:2"``, servers in rank order.

        Raises:
            CollectiveArgumentError: a server whose rank ids are not consecutive (hydra places
                ranks on hosts in blocks, so such a table has no host list).
        """
        order = sorted(self.servers, key=lambda s: min(d.rank_id for d in s.devices))
        for s in order:
            ids = sorted(d.rank_id for d in s.devices)
            if ids != list(range(ids[0], ids[0] + len(ids))):
                raise CollectiveArgumentError(f"rank table {self.source}: server {s.server_id!r} has rank ids {ids}: "
                                              "hosts() needs consecutive rank ids per server", param="rank_id")
        return ",".join(f"{s.server_id}:{len(s.devices)}" for s in order)

    def check_world(self, world_size: int) -> None:
        """Raise unless the table describes exactly ``world_size`` ranks."""
        if self.size != world_size:
            raise CollectiveArgumentError(
                f"rank table {self.source}: $.server_list has {self.size} devices: must equal the MPI world "
                f"size {world_size}", param="rank_table_file")


def _bad(src: str, path: str, value: object, rule: str) -> CollectiveArgumentError:
    return CollectiveArgumentError(f"rank table {src}: {path}={value!r}: {rule}", param=path)


def _int_str(src: str, path: str, value: object) -> int:
    if not isinstance(value, str) or not value.strip().isdigit():
        raise _bad(src, path, value, "must be a string holding a non-negative integer")
    return int(value)


def load_rank_table(source: str | dict) -> RankTable:
    """Load and validate an HCCL rank table (a path, a JSON text or a dict).

    Raises:
        CollectiveArgumentError: naming the JSON path of the first bad field
            (``$.server_list[1].device[0].rank_id``).
    """
    src = "<dict>"
    if isinstance(source, (str, os.PathLike)) and not str(source).lstrip().startswith("{"):
        src = str(source)
        try:
            with open(source, encoding="utf-8") as fh:
                source = json.load(fh)
        except OSError as exc:
            raise CollectiveArgumentError(f"rank table {src}: cannot read: {exc}", param="rank_table_file") from exc
        except json.JSONDecodeError as exc:
            raise CollectiveArgumentError(f"rank table {src}: not JSON: {exc}", param="rank_table_file") from exc
    elif isinstance(source, str):
        src = "<json>"
        try:
            source = json.loads(source)
        except json.JSONDecodeError as exc:
            raise CollectiveArgumentError(f"rank table {src}: not JSON: {exc}", param="rank_table_file") from exc
    if not isinstance(source, dict):
        raise _bad(src, "$", type(source).__name__, "must be a JSON object")
    if source.get("status") != "completed":
        raise _bad(src, "$.status", source.get("status"), 'must be "completed"')
    version = source.get("version")
    if not isinstance(version, str):
        raise _bad(src, "$.version", version, "must be a string")
    servers_json = source.get("server_list")
    if not isinstance(servers_json, list) or not servers_json:
        raise _bad(src, "$.server_list", servers_json, "must be a non-empty list")
    count = _int_str(src, "$.server_count", source.get("server_count"))
    if count != len(servers_json):
        raise _bad(src, "$.server_count", source.get("server_count"),
                   f"must equal the length of server_list ({len(servers_json)})")
    servers, seen = [], {}
    for i, sj in enumerate(servers_json):
        p = f"$.server_list[{i}]"
        if not isinstance(sj, dict):
            raise _bad(src, p, sj, "must be an object")
        sid = sj.get("server_id")
        if not isinstance(sid, str) or not sid:
            raise _bad(src, p + ".server_id", sid, "must be a non-empty string")
        devs_json = sj.get("device")
        if not isinstance(devs_json, list) or not devs_json:
            raise _bad(src, p + ".device", devs_json, "must be a non-empty list")
        devices = []
        for j, dj in enumerate(devs_json):
            q = f"{p}.device[{j}]"
            if not isinstance(dj, dict):
                raise _bad(src, q, dj, "must be an object")
            dev = _int_str(src, q + ".device_id", dj.get("device_id"))
            ip = dj.get("device_ip")
            try:
                ipaddress.ip_address(ip)
            except (TypeError, ValueError):
                raise _bad(src, q + ".device_ip", ip, "must be an IP address string") from None
            rid = _int_str(src, q + ".rank_id", dj.get("rank_id"))
            if rid in seen:
                raise _bad(src, q + ".rank_id", dj.get("rank_id"), f"duplicate of {seen[rid]}")
            seen[rid] = q + ".rank_id"
            devices.append(Device(dev, ip, rid))
        servers.append(Server(sid, tuple(devices)))
    ids = sorted(seen)
    if ids != list(range(len(ids))):
        missing = sorted(set(range(len(ids))) - set(ids))
        raise _bad(src, "$.server_list[*].device[*].rank_id", ids,
                   f"rank ids must be 0..{len(ids) - 1} exactly; missing {missing}")
    return RankTable(version, tuple(servers), src)


_TABLES: dict[str, RankTable] = {}


def rank_table(path: str) -> RankTable:
    """:func:`load_rank_table` cached by path, checked against the MPI world size."""
    table = _TABLES.get(path)
    if table is None:
        table = load_rank_table(path)
        table.check_world(MPI.COMM_WORLD.Get_size())
        _TABLES[path] = table
    return table
