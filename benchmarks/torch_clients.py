"""torch's own parallel clients on the mpicoll backend against gloo: one training step each, same
ranks, same run, interleaved.

    mpirun -np 2 python benchmarks/torch_clients.py [--width 1024] [--steps 4] [--reps 5]

- FSDP2: ``fully_shard`` of each linear layer and of the model (a 1-D mesh of the group);
- tensor parallel: ``parallelize_module`` of pairs of layers (ColwiseParallel, then RowwiseParallel);
- pipeline: ``torch.distributed.pipelining``, one stage per rank, GPipe and 1F1B, 4 micro-batches.

Each prints ms per step (forward, backward, SGD step; medians over ``--reps`` interleaved blocks of
``--steps`` steps, the slowest rank per block) for the mpicoll group and the gloo group, and their
ratio (< 1: mpicoll faster), and the same step on torch's fake group (``no data moved``: collectives
and messages that return at once, moving nothing), with its ratio to gloo's: with one rank per
core, the least any backend's step can take (a pipeline moving nothing also loses its bubble: a
later stage never waits for an earlier one); with more ranks than cores no bound (every rank then
computes at once). Pipeline stages are given their
micro-batches' shapes (no shape inference, which the fake group cannot make). gloo's group comes
from a TCP store on 127.0.0.1 (one host); the mpicoll group is ``dist.new_group(backend="mpicoll")``
over the same ranks. BLAS runs one thread per rank.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist
from threadpoolctl import threadpool_limits
from torch.distributed.device_mesh import DeviceMesh

from torch_backend import RANK, SIZE, block, mpicoll_beside_gloo   # (this folder's: the groups, the timing)


def mlp(width: int, layers: int = 4) -> torch.nn.Sequential:
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def _training(model: torch.nn.Module, width: int):
    """One SGD step of ``model`` on a fixed batch of 32 (an MSE loss)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, width), torch.randn(32, width)

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return step


def fsdp2(group, width: int):
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(group, "cpu")
    model = mlp(width)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return _training(model, width)


def tensor_parallel(group, width: int):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = DeviceMesh.from_group(group, "cpu")
    model = mlp(width)
    plan = {str(k): (ColwiseParallel() if (k // 2) % 2 == 0 else RowwiseParallel()) for k in range(0, len(model), 2)}
    parallelize_module(model, mesh, plan)
    return _training(model, width)


def pipeline(group, width: int, schedule: str):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    model = mlp(width, layers=2 * SIZE)
    per = len(model) // SIZE + 1
    stage_mod = torch.nn.Sequential(*list(model)[RANK * per:(RANK + 1) * per])
    mb = torch.empty(32 // 4, width)        # (a micro-batch's shape, in and out of every stage: no shape inference)
    stage = PipelineStage(stage_mod, RANK, SIZE, torch.device("cpu"), input_args=mb, output_args=mb,
                          input_grads=mb, output_grads=mb, group=group)
    kind = ScheduleGPipe if schedule == "GPipe" else Schedule1F1B
    sched = kind(stage, n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=1e-3)
    x, y = torch.randn(32, width), torch.randn(32, width)

    def step():
        opt.zero_grad()
        if RANK == 0:
            sched.step(x)
        elif RANK == SIZE - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--clients", default="FSDP2,TP,GPipe,1F1B")
    args = ap.parse_args()
    groups = mpicoll_beside_gloo()
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers "fake": calls that move no data
    groups["no data moved"] = dist.new_group(backend="fake")
    makers = {"FSDP2": fsdp2, "TP": tensor_parallel, "GPipe": lambda g, w: pipeline(g, w, "GPipe"),
              "1F1B": lambda g, w: pipeline(g, w, "1F1B")}
    with threadpool_limits(limits=1, user_api="blas"):
        torch.set_num_threads(1)
        if RANK == 0:
            print(f"# torch's clients, one training step, {SIZE} ranks, MLP width {args.width}, batch 32 "
                  f"(ms per step, median of {args.reps} interleaved blocks of {args.steps})", flush=True)
            print(f"{'client':<8}{'mpicoll':>10}{'gloo':>10}{'ratio':>8}{'no data moved':>15}{'/ gloo':>8}",
                  flush=True)
        for name in args.clients.split(","):
            steps = {k: makers[name](g, args.width) for k, g in groups.items()}
            for fn in steps.values():
                fn()                                    # (warm-up: buffers, plans)
            got: dict = {k: [] for k in steps}
            for rep in range(args.reps):
                order = list(steps) if rep % 2 == 0 else list(reversed(steps))
                for k in order:
                    got[k].append(block(steps[k], args.steps))
            med = {k: statistics.median(v) for k, v in got.items()}
            ratios = {k: statistics.median(a / b for a, b in zip(got[k], got["gloo"]))
                      for k in ("mpicoll", "no data moved")}
            if RANK == 0:
                print(f"{name:<8}{med['mpicoll'] * 1e3:>10.1f}{med['gloo'] * 1e3:>10.1f}{ratios['mpicoll']:>8.2f}"
                      f"{med['no data moved'] * 1e3:>15.1f}{ratios['no data moved']:>8.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
