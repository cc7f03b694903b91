"""Collectives in a graph on the mpicoll backend: torch's functional collectives and the in-place
dist.* collectives dynamo rewrites, inside torch.compile(fullgraph=True) (no graph break) with the
aot_eager and inductor backends, against numpy goldens; DTensor's distribute_tensor and sharded
matmuls. At 2 and 3 ranks only (a compile is slow on 2 cores). Skipped, with the reason, where
torch is not installed."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install '.[torch]' (torch 2.13 or later, CPU)")
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as fc  # noqa: E402

import mpicoll.torch  # noqa: E402, F401 - registers the backend and mpi://

from _mpi import RANK, SIZE  # noqa: E402
from _torch import world_group  # noqa: E402, F401 - the module's process group (autouse)

pytestmark = [pytest.mark.mpi(min_size=2),
              pytest.mark.skipif(SIZE not in (2, 3), reason="compiles at 2 and 3 ranks only (slow on 2 cores)")]



def _x(r):                     # rank r's inputs (small integers in float32: every sum is exact)
    return np.arange(4.0, dtype=np.float32) + r, np.arange(2.0 * SIZE, dtype=np.float32) + 10 * r


def _functional(x, y):
    pg = dist.group.WORLD
    n = SIZE
    return (fc.all_reduce(x, "sum", pg) * 1,
            fc.all_gather_tensor(x, 0, pg) + 0,
            fc.reduce_scatter_tensor(y, "sum", 0, pg),
            fc.all_to_all_single(y, None, None, pg),
            fc.all_to_all_single(y[:n * (n + 1) // 2], [RANK + 1] * n, list(range(1, n + 1)), pg),  # uneven
            fc.broadcast(x, 0, pg) + 0)


def _in_place(x, y):
    x = x * 2
    dist.all_reduce(x)
    out = torch.empty(SIZE * x.shape[0])
    dist.all_gather_into_tensor(out, x)
    rs = torch.empty(y.shape[0] // SIZE)
    dist.reduce_scatter_tensor(rs, y)
    a2a = torch.empty_like(y)
    dist.all_to_all_single(a2a, y)
    return x + 1, out, rs, a2a


def _goldens():
    xs, ys = zip(*[_x(r) for r in range(SIZE)])
    n = SIZE
    uneven = np.concatenate([ys[j][sum(range(1, RANK + 1)):sum(range(1, RANK + 2))] for j in range(n)])
    functional = [sum(xs), np.concatenate(xs), sum(ys)[2 * RANK:2 * RANK + 2],
                  np.concatenate([ys[j][2 * RANK:2 * RANK + 2] for j in range(n)]), uneven, xs[0]]
    doubled = sum(2 * x for x in xs)
    in_place = [doubled + 1, np.concatenate([doubled] * n), sum(ys)[2 * RANK:2 * RANK + 2],
                np.concatenate([ys[j][2 * RANK:2 * RANK + 2] for j in range(n)])]
    return functional, in_place


@pytest.mark.timeout_s(600)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_collectives_fullgraph(backend):
    """One compile of each function per backend: fullgraph=True raises on any graph break."""
    torch._dynamo.reset()
    x, y = (torch.from_numpy(a) for a in _x(RANK))
    want_f, want_i = _goldens()
    for fn, want in ((_functional, want_f), (_in_place, want_i)):
        got = torch.compile(fn, fullgraph=True, backend=backend)(x.clone(), y.clone())
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            assert np.array_equal(torch.as_tensor(g).numpy(), w), (fn.__name__, k, g, w)


def test_torch_dtensor_sharded_matmul():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (SIZE,))
    a = torch.arange(4.0 * SIZE * 6).reshape(4 * SIZE, 6) % 7        # the same on every rank
    b = torch.arange(6.0 * 2 * SIZE).reshape(6, 2 * SIZE) % 5
    want = a.numpy() @ b.numpy()
    rows = distribute_tensor(a, mesh, [Shard(0)]) @ distribute_tensor(b, mesh, [Replicate()])
    assert rows.placements == (Shard(0),) and np.array_equal(rows.full_tensor().numpy(), want)
    inner = distribute_tensor(a, mesh, [Shard(1)]) @ distribute_tensor(b, mesh, [Shard(0)])   # a partial sum
    assert inner.placements[0].is_partial() and np.array_equal(inner.full_tensor().numpy(), want)
    assert np.array_equal(inner.redistribute(mesh, [Shard(0)]).to_local().numpy(),
                          want[want.shape[0] // SIZE * RANK:want.shape[0] // SIZE * (RANK + 1)])


@pytest.mark.timeout_s(600)
def test_torch_compiled_ddp_trains_like_eager_ddp():
    """A DDP model under torch.compile (aot_eager): DDP's reducer calls the group from C++ while
    the compiled step runs; the parameters end as those of the same DDP model run eagerly."""
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    g = torch.Generator().manual_seed(RANK)
    batches = [(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for _ in range(3)]
    ends = []
    for compiled in (False, True):
        ddp = torch.nn.parallel.DistributedDataParallel(model())
        run = torch.compile(ddp, backend="aot_eager") if compiled else ddp
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.mse_loss(run(x), y).backward()
            opt.step()
        ends.append([p.detach().clone() for p in ddp.module.parameters()])
    for a, b in zip(*ends):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.mpi(min_size=1)
def test_the_group_is_wrapped_for_dynamo_when_dynamo_comes_not_before():
    """mpicoll.torch does not import dynamo (2.4 s of every process's start): its group's methods
    are wrapped by ``torch.compiler.disable`` right after dynamo's import (a lookup before it does
    not use the hook up), or at once if it came first. Checked in fresh interpreters (this one
    imported dynamo long ago)."""
    import subprocess
    import sys

    from _mpi import launch_env
    check = ("import sys, importlib.util, mpicoll.torch as m; late = 'torch._dynamo' not in sys.modules; "
             "importlib.util.find_spec('torch._dynamo'); "            # (a lookup that imports nothing)
             "import torch._dynamo; f = m.ProcessGroupMpicoll.allreduce; "
             "print(late, getattr(f, '_torchdynamo_disable', False))")
    first = ("import torch._dynamo, mpicoll.torch as m; "
             "print(getattr(m.ProcessGroupMpicoll.allreduce, '_torchdynamo_disable', False))")
    if RANK == 0:
        late = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120,
                              env=launch_env())
        assert late.stdout.split() == ["True", "True"], late.stderr[-2000:]
        early = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, timeout=120,
                              env=launch_env())
        assert early.stdout.split() == ["True"], early.stderr[-2000:]
