"""benchmarks/model.py (docs/scaling.md): its bytes per host are the algorithms' known counts, the tree
order's paths send the optimum where hosts hold aligned blocks, and the scripts run. No MPI traffic:
checked once, at one rank (the bytes it predicts on the test bed are checked against the links'
counters by benchmarks/scaling.py --check, docs/scaling.md)."""
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from mpi4py import MPI

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)
import model as M  # noqa: E402

pytestmark = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="checks a model, not MPI: once, at 1 rank")

NET = replace(M.CLUSTER, net_hdr=0)        # payload bytes only
S = float(1 << 30)


@pytest.mark.parametrize("h,p", [(2, 2), (4, 2), (8, 4), (64, 8)])
def test_mpi_algorithms_send_their_known_bytes(h, p):
    block, rr = M.Group(h * p, p), M.Group(h * p, p, "rr")
    n = h * p
    assert M.mpi_ring(NET, block, S).link == pytest.approx(2 * (n - 1) / n * S)
    assert M.mpi_ring(NET, rr, S).link == pytest.approx(p * 2 * (n - 1) / n * S)
    # Rabenseifner pairs near ranks first: host-friendly in blocks, p times the optimum round-robin
    assert M.mpi_rabenseifner(NET, block, S).link == pytest.approx(2 * (h - 1) / h * S)
    assert M.mpi_rabenseifner(NET, rr, S).link == pytest.approx(p * 2 * (h - 1) / h * S)
    assert M.mpi_node_aware(NET, rr, S).link == pytest.approx(2 * (h - 1) / h * S)
    assert M.mpi_recursive_doubling(NET, block, S).link == pytest.approx(p * M._log2(h) * S)
    # MPICH's reduce-scatter is blind to hosts: each rank's blocks for other hosts go out unreduced
    assert M.mpi_reduce_scatter(NET, block, S).link == pytest.approx(p * (h - 1) / h * S)


@pytest.mark.parametrize("h,p", [(2, 1), (2, 2), (4, 8), (1024, 8)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tree_order_sends_the_optimum_on_aligned_hosts(h, p, dtype):
    g = M.Group(h * p, p)
    wide = 1.5 if dtype == "bfloat16" and p > 1 else 1.0      # (float32 partials in the reduce-scatter half)
    assert M.predict("tree", "AllReduce", NET, g, S, dtype).link == pytest.approx(wide * 2 * (h - 1) / h * S)
    assert M.predict("tree", "ReduceScatter", NET, g, S, dtype).link == pytest.approx(
        (2 if wide > 1 else 1) * (h - 1) / h * S)


@pytest.mark.parametrize("h,p", [(2, 2), (4, 4), (16, 8)])
def test_no_fixed_order_beats_the_round_robin_floor(h, p):
    """A fixed order whose groups interleave hosts gathers raw inputs: (p + 1) (h - 1) / h a host."""
    g = M.Group(h * p, p, "rr")
    floor = (p + 1) * (h - 1) / h * S
    assert M.predict("tree", "AllReduce", NET, g, S, "float32").link == pytest.approx(floor)
    assert M.rank_order_best(NET, g, S, False).link >= floor * 0.999


def test_the_scripts_run():
    for args in (["model.py"], ["scaling.py", "--targets"], ["scaling.py", "--slot"]):
        out = subprocess.run([sys.executable, os.path.join(BENCH, *args[:1]), *args[1:]], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip()
