"""One module per operator family; importing this package registers every operator."""
from . import allgather, allreduce, alltoall, broadcast, reduce_scatter  # noqa: F401
from ._base import OPERATIONS, Operation

__all__ = ["OPERATIONS", "Operation"]
