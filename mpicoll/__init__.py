"""mpicoll: HCCL/ATB/NCCL-style collective operators for numpy arrays over MPI (mpi4py).

Re-exports only; nothing runs at import (MPI itself is initialised by importing mpi4py.MPI).
"""
from ._domains import (Mesh, RankTable, declare_domains, domain, domain_members, init, load_rank_table, mesh,
                       rank_table)
from ._dtypes import ALL_DTYPES, HcclDataType, HcclReduceOp
from ._errors import CollectiveArgumentError, CollectiveError, CollectiveMismatchError, CollectiveTimeout
from ._params import CommMode, CommParam
from .ops import OPERATIONS, Operation
from .ops.allgather import AllGatherOperation, AllGatherParam, AllGatherVOperation, AllGatherVParam
from .ops.allreduce import AllReduceOperation, AllReduceParam
from .ops.alltoall import (AllToAllOperation, AllToAllParam, AllToAllVOperation, AllToAllVParam,
                           AllToAllVV2Operation, AllToAllVV2Param)
from .ops.broadcast import BroadcastOperation, BroadcastParam
from .quant import QuantAllReduceOperation, QuantAllReduceParam, dequantize, quantize
from .ops.reduce_scatter import (ReduceScatterOperation, ReduceScatterParam, ReduceScatterVOperation,
                                 ReduceScatterVParam)

__version__ = "0.1.0"

__all__ = [
    "ALL_DTYPES", "AllGatherOperation", "AllGatherParam", "AllGatherVOperation", "AllGatherVParam",
    "AllReduceOperation", "AllReduceParam", "AllToAllOperation", "AllToAllParam", "AllToAllVOperation",
    "AllToAllVParam", "AllToAllVV2Operation", "AllToAllVV2Param", "BroadcastOperation", "BroadcastParam",
    "CollectiveArgumentError", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeout", "CommMode",
    "CommParam", "HcclDataType", "HcclReduceOp", "Mesh", "OPERATIONS", "Operation", "RankTable",
    "QuantAllReduceOperation", "QuantAllReduceParam", "ReduceScatterOperation", "ReduceScatterParam",
    "ReduceScatterVOperation", "ReduceScatterVParam", "declare_domains", "dequantize", "quantize", "domain", "domain_members", "init", "load_rank_table", "mesh", "rank_table",
]
