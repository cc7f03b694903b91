"""Pipeline parallelism on the mpicoll backend (docs/torch.md): two stages, micro-batches, messages.

    pip install ".[torch]"
    mpirun -np 2 python docs/examples/torch_pipeline.py     # any even rank count: rank pairs are pipelines

Ranks 2k and 2k + 1 are pipeline k: stage 0 runs the first layers, stage 1 the last ones and the
loss. Each pipeline trains on its shard of every batch, in micro-batches: stage 0 sends each
micro-batch's activations (``dist.isend``, tag = the micro-batch), stage 1 receives them
(``dist.recv``), runs forward and backward and sends back their gradients, which stage 0 receives
all at once (``dist.batch_isend_irecv``) to run its backward. A stage's gradients are then averaged
over the pipelines (``all_reduce`` on the group of that stage's ranks). The model ends where one
process trained on the whole batches would.
"""
import torch
import torch.distributed as dist

import mpicoll.torch  # noqa: F401 - registers the "mpicoll" backend and the mpi:// init method

dist.init_process_group("mpicoll", init_method="mpi://")   # rank and world size from MPI
rank, world = dist.get_rank(), dist.get_world_size()
if world % 2:
    raise SystemExit(f"run at an even rank count (rank pairs are pipelines), not {world}")
stage, pipe, pipes = rank % 2, rank // 2, world // 2
peer = rank + 1 if stage == 0 else rank - 1                  # the other stage of this pipeline
stage_group = [dist.new_group(list(range(s, world, 2))) for s in (0, 1)][stage]   # (every rank makes both)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),              # stage 0
                               torch.nn.Linear(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))  # stage 1


WIDTH, MICRO, PER_PIPE, STEPS = 32, 4, 8, 3                   # 4 micro-batches of 2 samples per pipeline
part = model()[:2] if stage == 0 else model()[2:]
opt = torch.optim.SGD(part.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(PER_PIPE * pipes, 8, generator=g), torch.randn(PER_PIPE * pipes, 4, generator=g))
           for _ in range(STEPS)]

for x, y in batches:
    mine = slice(pipe * PER_PIPE, (pipe + 1) * PER_PIPE)
    xs, ys = x[mine].chunk(MICRO), y[mine].chunk(MICRO)
    opt.zero_grad()
    if stage == 0:
        acts = [part(xm) for xm in xs]
        sends = [dist.isend(a.detach(), dst=peer, tag=m) for m, a in enumerate(acts)]
        grads = [torch.empty_like(a) for a in acts]
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, gr, peer, tag=MICRO + m)
                                            for m, gr in enumerate(grads)]) + sends:
            work.wait()
        for a, gr in zip(acts, grads):
            a.backward(gr)
    else:
        for m, ym in enumerate(ys):
            a = torch.empty(ym.shape[0], WIDTH)
            dist.recv(a, src=peer, tag=m)
            a.requires_grad_()
            loss = torch.nn.functional.mse_loss(part(a), ym) / MICRO     # the mean over the pipeline's shard
            loss.backward()
            dist.send(a.grad, dst=peer, tag=MICRO + m)
    for p in part.parameters():                                          # data parallel across pipelines
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=stage_group)
    opt.step()

# The same steps in one process on the whole batches: this stage's layers end the same.
single = model()
opt = torch.optim.SGD(single.parameters(), lr=0.1)
for x, y in batches:
    opt.zero_grad()
    torch.nn.functional.mse_loss(single(x), y).backward()
    opt.step()
for a, b in zip(part.parameters(), (single[:2] if stage == 0 else single[2:]).parameters()):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
if rank == 0:
    print(f"pipeline on mpicoll: {pipes} pipeline(s) of 2 stages, {MICRO} micro-batches, {STEPS} steps; "
          "parameters equal to one process on the whole batches")
dist.destroy_process_group()
