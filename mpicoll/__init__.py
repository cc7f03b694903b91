"""mpicoll: HCCL/ATB/NCCL-style collective operators for numpy arrays over MPI (mpi4py).

Re-exports only; nothing runs at import (MPI itself is initialised by importing mpi4py.MPI).
"""
from ._domains import declare_domains, domain, domain_members, init
from ._mesh import Mesh, mesh
from ._ranktable import RankTable, load_rank_table, rank_table
from ._dtypes import ALL_DTYPES, HcclDataType, HcclReduceOp
from ._errors import CollectiveArgumentError, CollectiveError, CollectiveMismatchError, CollectiveTimeout
from ._params import CommMode, CommParam
from ._handle import Handle
from ._plan import Plan
from ._shm import node_buffer
from .hccl import Hccl
from .tracing import trace, trace_report
from .ops import *  # noqa: F401,F403 - every operator module's public names (ops.__all__)
from .ops import __all__ as _ops_all

__version__ = "0.1.0"

__all__ = [
    "ALL_DTYPES", "CollectiveArgumentError", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeout",
    "CommMode", "CommParam", "Handle", "Hccl", "HcclDataType", "HcclReduceOp", "Mesh", "Plan", "RankTable",
    "declare_domains", "domain", "domain_members", "init", "load_rank_table", "mesh", "node_buffer", "rank_table",
    "trace", "trace_report", *_ops_all,
]
