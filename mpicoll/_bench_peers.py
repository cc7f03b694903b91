"""What the bench harness times mpicoll against beside mpi4py's raw call (``--compare``):
torch.distributed over gloo on the same ranks, and DeepSpeed's CPU shared-memory allreduce over that
process group."""
from __future__ import annotations

import os
import socket
import time

from mpi4py import MPI


class Gloo:
    """torch.distributed with the gloo backend over the same ranks, if torch is installed."""

    def __init__(self, world: MPI.Comm, colors: list[int]) -> None:
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        port = None
        if world.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = world.bcast(port, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.Get_rank(),
                                world_size=world.Get_size())
        self.group, self.deepspeed = None, None
        me = colors[world.Get_rank()]
        for color in sorted(c for c in set(colors) if c >= 0):   # new_group is collective: same order
            g = dist.new_group([r for r, c in enumerate(colors) if c == color])
            if color == me:
                self.group = g

    def close(self) -> None:
        self.dist.destroy_process_group()


class DeepSpeed:
    """DeepSpeed's CPU shared-memory allreduce (``deepspeed.comm.inference_all_reduce``, built from
    its ``shm.cpp`` on first use) over the gloo process group of ``gloo``; only AllReduce. In the
    shape of torch.distributed for the operators' ``torch_call``: ``all_reduce`` is DeepSpeed's
    call, any other collective is missing (n/a)."""

    def __init__(self, gloo: Gloo, world: MPI.Comm) -> None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ["LOCAL_SIZE"], os.environ["LOCAL_RANK"] = str(world.Get_size()), str(world.Get_rank())
        import deepspeed
        import deepspeed.comm
        deepspeed.init_distributed(dist_backend="gloo")     # (wraps the process group gloo made)
        self._comm, self.torch, self.ReduceOp = deepspeed.comm, gloo.torch, gloo.dist.ReduceOp

    def all_reduce(self, tensor, op, group=None):
        return self._comm.inference_all_reduce(tensor, op=op)


def settle_threads(comm: MPI.Comm, seconds: float = 0.05) -> None:
    """Let torch/gloo's helper threads go idle before the next timed block."""
    comm.Barrier()
    time.sleep(seconds)
    comm.Barrier()


def torch_fn(b, dist, gloo, comm: MPI.Comm):
    """The torch.distributed call (``dist``: torch.distributed over gloo, or DeepSpeed's) on this
    point's memory, or None (agreed on every rank) when the peer cannot run it (dtype or operation
    not supported)."""
    fn = None
    if b.torch_call is not None:
        try:
            fn = b.torch_call(dist, gloo.torch, gloo.group)
            fn()
        except Exception:  # noqa: BLE001 - unsupported by the peer: reported as n/a
            fn = None
    if comm.allreduce(fn is not None, op=MPI.LAND):
        return fn
    return None
