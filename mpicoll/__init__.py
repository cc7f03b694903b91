"""mpicoll: HCCL/ATB/NCCL-style collective operators for numpy arrays over MPI (mpi4py).

Re-exports only; nothing runs at import (MPI itself is initialised by importing mpi4py.MPI).
"""
from ._domains import (Mesh, RankTable, declare_domains, domain, domain_members, init, load_rank_table, mesh,
                       rank_table)
from ._dtypes import ALL_DTYPES, HcclDataType, HcclReduceOp
from ._errors import CollectiveArgumentError, CollectiveError, CollectiveMismatchError, CollectiveTimeout
from ._params import CommMode, CommParam
from ._plan import Handle, Plan
from .hccl import Hccl
from .ops import *  # noqa: F401,F403 - every operator module's public names (ops.__all__)
from .ops import __all__ as _ops_all
from .quant import QuantAllReduceOperation, QuantAllReduceParam, dequantize, quantize

__version__ = "0.1.0"

__all__ = [
    "ALL_DTYPES", "CollectiveArgumentError", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeout",
    "CommMode", "CommParam", "Handle", "Hccl", "HcclDataType", "HcclReduceOp", "Mesh", "Plan", "QuantAllReduceOperation",
    "QuantAllReduceParam", "RankTable", "declare_domains", "dequantize", "domain", "domain_members", "init",
    "load_rank_table", "mesh", "quantize", "rank_table", *_ops_all,
]
