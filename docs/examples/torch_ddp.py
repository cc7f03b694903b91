"""DDP on the mpicoll backend (docs/torch.md): each rank trains on its shard of every batch, and the
model ends where one process trained on the whole batches would.

    pip install ".[torch]"
    mpirun -np 2 python docs/examples/torch_ddp.py          # any rank count; across hosts too
"""
import torch
import torch.distributed as dist
from mpi4py import MPI

import mpicoll.torch  # noqa: F401 - registers the "mpicoll" backend and the mpi:// init method

dist.init_process_group("mpicoll", init_method="mpi://")   # rank and world size from MPI
rank, world = dist.get_rank(), dist.get_world_size()


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


g = torch.Generator().manual_seed(1)
per_rank, steps = 4, 5
batches = [(torch.randn(per_rank * world, 8, generator=g), torch.randn(per_rank * world, 4, generator=g))
           for _ in range(steps)]

ddp = torch.nn.parallel.DistributedDataParallel(model())     # gradients all-reduced by mpicoll
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
mine = slice(rank * per_rank, (rank + 1) * per_rank)
for x, y in batches:
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x[mine]), y[mine])
    loss.backward()
    opt.step()

# The same steps in one process on the whole batches: the same parameters (float32 tolerance).
single = model()
opt = torch.optim.SGD(single.parameters(), lr=0.1)
for x, y in batches:
    opt.zero_grad()
    torch.nn.functional.mse_loss(single(x), y).backward()
    opt.step()
for a, b in zip(ddp.module.parameters(), single.parameters()):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

hosts = [None] * world
dist.all_gather_object(hosts, MPI.Get_processor_name())
if rank == 0:
    print(f"DDP on mpicoll: {world} ranks on {len(set(hosts))} host(s), {steps} steps, last loss (rank 0's shard) "
          f"{loss.item():.4f}; parameters equal to one process on the whole batches")
dist.destroy_process_group()
