"""The benchmark harness on tiny sizes: table shape, JSON schema, exit status, bus factors, sizes."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from mpi4py import MPI

from mpicoll.bench import parse_size, size_steps
from mpicoll._golden import BENCHES

from _mpi import launch_env, mpirun

single = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")


def test_parse_size():
    assert parse_size("8") == 8 and parse_size("1K") == 1024 and parse_size("64M") == 64 << 20
    assert parse_size("1G") == 1 << 30 and parse_size("2kb") == 2048 and parse_size("0") == 0
    for bad in ("x", "-1", "1.5"):
        with pytest.raises(Exception):
            parse_size(bad)


def test_size_steps():
    assert size_steps(8, 64, 2) == [8, 16, 32, 64]
    assert size_steps(8, 100, 4) == [8, 32]
    assert size_steps(0, 4, 2) == [0, 1, 2, 4]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bus_factors_are_the_nccl_tests_ones(n):
    f = {name: spec.bus_factor(n) for name, spec in BENCHES.items()}
    assert f["AllReduce"] == pytest.approx(2 * (n - 1) / n)
    for name in ("AllGather", "AllGatherV", "ReduceScatter", "ReduceScatterV", "AllToAll", "AllToAllV", "AllToAllVV2"):
        assert f[name] == pytest.approx((n - 1) / n)
    assert f["Broadcast"] == 1.0


def _bench(np_, *args, script=None):
    cmd = mpirun(np_, sys.executable)
    cmd += [script] if script else ["-m", "mpicoll.run"]
    return subprocess.run(cmd + ["bench", *args], capture_output=True, text=True, timeout=120, env=launch_env())


@pytest.mark.mpi(min_size=1)
@single
def test_table_and_json(tmp_path):
    out = tmp_path / "rows.json"
    res = _bench(3, "--op", "all", "-b", "8", "-e", "1K", "-f", "8", "-n", "2", "-w", "1", "-d", "float16,int32",
                 "--compare", "mpi4py", "--json", str(out))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    data = [ln for ln in lines if ln and not ln.startswith("#")]
    headers = [ln for ln in lines if ln.startswith("# ") and "rank(s)" in ln]
    ops = {h.split(":")[0][2:] for h in headers}
    assert ops == {name for name, spec in BENCHES.items() if "int32" in spec.dtypes}   # int8-only ops skip
    assert len(headers) == 2 * len(ops) and len(data) == 3 * len(headers)    # sizes 8, 64, 512 per table
    assert all(len(ln.split()) == 15 for ln in data)                         # 13 columns + mpi4py time, ratio
    assert "# Out of bounds values : 0 OK" in res.stdout and "# Avg bus bandwidth" in res.stdout
    assert "# QuantAllReduce: skipped: it takes int8 only (add it with -d)" in res.stdout   # --op all says why
    doc = json.loads(out.read_text())
    assert doc["ranks"] == 3 and doc["compare"] == ["mpi4py"]
    # where the ranks sit: 3 on this node, unbound (plain mpirun); the note says so when they
    # outnumber the cores
    place = doc["placement"]
    assert place["local_ranks"] == 3 and place["cores"] >= 1 and place["bound"] is False
    assert place["oversubscribed"] == (place["cores"] < 3)
    assert ("# note: 3 ranks share" in res.stdout) == place["oversubscribed"]
    row = doc["rows"][0]
    for key in ("op", "size", "count", "type", "redop", "root", "time_us", "algbw", "busbw", "wrong", "ip_time_us",
                "ip_busbw", "ip_wrong", "compare", "ratio"):
        assert key in row
    # the mpicoll/raw ratio is the median of ratios paired per repetition: with one repetition and
    # the raw time present, it is that repetition's ratio (positive), else n/a
    for r in doc["rows"]:
        raw, ratio = r["compare"]["mpi4py"], r["ratio"].get("mpi4py")
        assert (ratio is None) == (raw is None) and (ratio is None or ratio > 0), r
    assert all(r["wrong"] in (0, None) and r["ip_wrong"] in (0, None) for r in doc["rows"])


BROKEN = textwrap.dedent("""
    import numpy as np
    import mpicoll.run as run
    from mpicoll._golden import BenchRun, BenchSpec, register_bench

    class Zeros:
        def execute(self, out):
            return out

    def setup(c):
        out = np.zeros(max(c.count, 1), np.int32)
        expected = out.copy()
        expected[0] = c.rank + 1          # wrong on every rank
        return BenchRun(Zeros(), (out,), expected)

    register_bench(BenchSpec("BrokenForTest", setup, lambda n: 1.0, dtypes=("int32",)))
    import sys
    sys.argv = sys.argv[:1] + sys.argv[2:]
    run.entry(["bench", "--op", "BrokenForTest", "-b", "8", "-e", "8", "-d", "int32", "-n", "1", "-w", "0"])
""")


@pytest.mark.mpi(min_size=1)
@single
def test_wrong_results_exit_1(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(BROKEN)
    res = _bench(2, script=str(script))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "# Out of bounds values : 2 FAILED" in res.stdout


@pytest.mark.mpi(min_size=1)
@single
def test_split_and_domain_and_plot_flag(tmp_path):
    res = _bench(4, "--op", "AllReduce", "-b", "64", "-e", "64", "-n", "1", "-w", "0", "--split", "MOD 2")
    assert res.returncode == 0, res.stderr
    assert "2 rank(s)" in res.stdout
    res = _bench(3, "--op", "Broadcast", "-b", "64", "-e", "64", "-n", "1", "-w", "0", "--domain", "0,2", "-r", "1")
    assert res.returncode == 0, res.stderr
    assert "Broadcast: 2 rank(s)" in res.stdout
    res = _bench(2, "--op", "AllToAll", "-b", "64", "-e", "128", "-n", "1", "-w", "0", "--plot", str(tmp_path / "p.png"))
    assert res.returncode == 0, res.stderr
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "p.png").stat().st_size > 1000
    except ImportError:
        assert "pip install '.[plot]'" in res.stderr


@pytest.mark.mpi(min_size=1)
@single
def test_in_place_columns_ratio_labels_and_a_named_domain(tmp_path):
    domains = tmp_path / "domains.json"
    domains.write_text(json.dumps({"pair": [1, 2]}))
    res = _bench(3, "--op", "AllGather,ReduceScatter,AllToAll", "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-w",
                 "1", "-d", "float32,float16", "--compare", "mpi4py", "--domains", str(domains), "--domain", "pair")
    assert res.returncode == 0, res.stderr
    headers = [ln for ln in res.stdout.splitlines() if ln.startswith("# ") and "rank(s)" in ln]
    assert len(headers) == 6 and all(h.split(": ")[1].startswith("2 rank(s)") for h in headers)   # the pair
    assert all("compare mpi4py (mpicoll/<peer>: time ratio, < 1 = mpicoll faster)" in h for h in headers)
    assert "mpicoll/mpi4py" in res.stdout and "gloo" not in res.stdout          # only the peers compared
    data = [ln.split() for ln in res.stdout.splitlines() if ln and not ln.startswith("#")]
    assert data and all(row[8] == "0" and row[12] == "0" for row in data)   # in place measured, none wrong
    bad = _bench(3, "--op", "AllGather", "-b", "8", "-e", "8", "--domain", "nope")
    assert bad.returncode == 2 and "nor a domain declared with --domains FILE" in bad.stderr
