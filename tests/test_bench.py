"""The benchmark harness on tiny sizes: table shape, JSON schema, exit status, bus factors, sizes,
the plot, and Ctrl-C during a sweep."""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from mpi4py import MPI

from mpicoll._bench_report import Row, size_label, size_ticks as _size_ticks
from mpicoll.bench import parse_size, size_steps
from mpicoll.checks import BENCHES

from _mpi import OPEN_MPI, launch_env, left_behind, mpirun, remove, within

single = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")
_HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not _HAVE_MATPLOTLIB, reason="matplotlib is not installed (pip install "
                                      "'.[plot]'): the plot itself cannot be drawn or inspected")


def test_parse_size():
    assert parse_size("8") == 8 and parse_size("1K") == 1024 and parse_size("64M") == 64 << 20
    assert parse_size("1G") == 1 << 30 and parse_size("2kb") == 2048 and parse_size("0") == 0
    for bad in ("x", "-1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="bad size"):
            parse_size(bad)


def test_size_steps():
    assert size_steps(8, 64, 2) == [8, 16, 32, 64]
    assert size_steps(8, 100, 4) == [8, 32]
    assert size_steps(0, 4, 2) == [0, 1, 2, 4]


def _mesh(n):
    """docs/benchmark.md's mesh of the AllToAll + AllGather operators: tp 2 at an even rank count, else 1."""
    tp = 2 if n % 2 == 0 else 1
    return n // tp, tp


#: The expected bus factor of every registered benchmark: docs/benchmark.md's table, nccl-tests'
#: factors for the collectives it has (src/*.cu: AllReduce 2(n-1)/n; AllGather, ReduceScatter,
#: AlltoAll, Gather, Scatter (n-1)/n; Broadcast, Reduce 1). A golden table, not a list to iterate: a
#: newly registered benchmark fails test_bus_factors_are_the_nccl_tests_ones until it is added here.
BUS_FACTORS = {
    **dict.fromkeys(("AllReduce", "QuantAllReduce"), lambda n: 2 * (n - 1) / n),
    **dict.fromkeys(("AllGather", "AllGatherV", "ReduceScatter", "ReduceScatterV", "AllToAll", "AllToAllV",
                     "AllToAllVV2", "Gather", "Scatter"), lambda n: (n - 1) / n),
    **dict.fromkeys(("Broadcast", "Reduce"), lambda n: 1.0),
    **dict.fromkeys(("AllToAllAllGather", "AlltoAllAllGatherBatchMatMul"),
                    lambda n: (_mesh(n)[0] - 1) / _mesh(n)[0] + (_mesh(n)[1] - 1)),
}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bus_factors_are_the_nccl_tests_ones(n):
    """Every registered benchmark's bus factor at ``n`` ranks (where it runs at ``n``)."""
    unknown = sorted(set(BENCHES) - set(BUS_FACTORS))
    assert not unknown, f"no expected bus factor for the registered benchmark(s) {unknown}: add it to BUS_FACTORS"
    for name, spec in BENCHES.items():
        if spec.skip_at(n) is None:
            assert spec.bus_factor(n) == pytest.approx(BUS_FACTORS[name](n)), (name, n)


def _bench(np_, *args, script=None):
    cmd = mpirun(np_, sys.executable)
    cmd += [script] if script else ["-m", "mpicoll.run"]
    return subprocess.run(cmd + ["bench", *args], capture_output=True, text=True, timeout=120, env=launch_env())


@pytest.mark.mpi(min_size=1)
@single
def test_table_and_json(tmp_path):
    out = tmp_path / "rows.json"
    asked = ("float16", "int32")
    res = _bench(3, "--op", "all", "-b", "8", "-e", "1K", "-f", "8", "-n", "2", "-w", "1", "-d", ",".join(asked),
                 "--compare", "mpi4py", "--json", str(out))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    data = [ln for ln in lines if ln and not ln.startswith("#")]
    headers = [ln for ln in lines if ln.startswith("# ") and "rank(s)" in ln]
    ops = {h.split(":")[0][2:] for h in headers}
    # every registered benchmark: a table per dtype it takes, or a line saying why it did not run
    runs = {name: [d for d in asked if d in spec.dtypes] for name, spec in BENCHES.items() if spec.skip_at(3) is None}
    assert ops == {name for name, dts in runs.items() if dts}
    assert len(headers) == sum(map(len, runs.values())) and len(data) == 3 * len(headers)   # sizes 8, 64, 512
    assert all(len(ln.split()) == 15 for ln in data)                         # 13 columns + mpi4py time, ratio
    assert "# Out of bounds values : 0 OK" in res.stdout and "# Avg bus bandwidth" in res.stdout
    for name, spec in BENCHES.items():                                       # --op all says why it skips one
        why = spec.skip_at(3) or (None if runs[name] else f"it takes {', '.join(spec.dtypes)} only (add it with -d)")
        assert (f"# {name}: skipped: {why}" in res.stdout) if why else name in ops, name
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
    from mpicoll.checks import BENCHES, BenchRun, BenchSpec

    class Zeros:
        def execute(self, out):
            return out

    def setup(c):
        out = np.zeros(max(c.count, 1), np.int32)
        expected = out.copy()
        expected[0] = c.rank + 1          # wrong on every rank
        return BenchRun(Zeros(), (out,), expected)

    BENCHES["BrokenForTest"] = BenchSpec("BrokenForTest", setup, lambda n: 1.0, dtypes=("int32",))
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
    res = _bench(2, "--op", "AllToAll", "-b", "64", "-e", "128", "-n", "1", "-w", "0", "--validate", "0",
                 "--plot", str(tmp_path / "p.png"))
    if _HAVE_MATPLOTLIB:
        assert res.returncode == 0, res.stderr
        assert (tmp_path / "p.png").stat().st_size > 1000
        from PIL import Image       # (matplotlib's own dependency)
        with Image.open(tmp_path / "p.png") as png:    # the title, kept in the PNG's metadata too
            title = png.info["Title"]
        assert f"execute(), validation off, 2 ranks on {MPI.Get_processor_name()}, float32" in title, title
    else:
        assert res.returncode == 2 and "pip install '.[plot]'" in res.stderr


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


@pytest.mark.mpi(min_size=1)
@single
def test_plot_without_matplotlib_is_a_usage_error_before_the_sweep(tmp_path):
    """``--plot`` where matplotlib cannot be imported (hidden here by a package on PYTHONPATH that
    fails to import, so the test runs whether or not it is installed): one message per job, exit
    status 2 on every rank, and no sweep."""
    hidden = tmp_path / "hide" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("hidden by the test")\n')
    path = os.pathsep.join([str(tmp_path / "hide"), os.environ.get("PYTHONPATH", "")])
    cmd = mpirun(3, sys.executable, "-m", "mpicoll.run", "bench", "--op", "AllReduce", "-b", "8", "-e", "64",
                 "--plot", str(tmp_path / "p.png"), "--json", str(tmp_path / "rows.json"))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=launch_env(PYTHONPATH=path))
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert res.stderr.count("--plot needs matplotlib") == 1, res.stderr
    assert "python -m mpicoll.run bench: error: --plot needs matplotlib, which world rank 0" in res.stderr
    assert "hidden by the test" in res.stderr and "pip install '.[plot]'" in res.stderr
    assert "Traceback" not in res.stderr
    assert [ln for ln in res.stdout.splitlines() if ln.strip()] == [], res.stdout      # the sweep never ran
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "rows.json").exists()


def test_size_labels_and_ticks():
    assert [size_label(v) for v in (8, 1024, 1536, 1 << 20, 64 << 20, 1 << 30)] == \
        ["8 B", "1 KiB", "1.5 KiB", "1 MiB", "64 MiB", "1 GiB"]
    assert _size_ticks(8, 64) == [8, 16, 32, 64]
    assert [size_label(t) for t in _size_ticks(8, 32 << 20)] == ["32 B", "1 KiB", "32 KiB", "1 MiB", "32 MiB"]
    for low, high in ((8, 100), (4, 64 << 20), (1, 1 << 40), (64, 128)):
        ticks = _size_ticks(low, high)
        assert 2 <= len(ticks) <= 8 and ticks == sorted(ticks), (low, high, ticks)
        assert all(t & (t - 1) == 0 for t in ticks)                 # powers of 2


def _rows(op, sizes, busbw, ip=True):
    return [Row(op, s, s // 4, "float32", "sum", -1, time_us=1.0, algbw=b, busbw=b, wrong=0,
                ip_busbw=b * 0.9 if ip else None) for s, b in zip(sizes, busbw)]


@pytest.mark.mpi(min_size=1)
@single
@needs_matplotlib
def test_plot_is_log_log_with_size_ticks_and_a_title_saying_what_was_timed():
    from mpicoll._bench_report import figure as _figure, mode_text as _mode, pyplot as _pyplot
    plt = _pyplot()
    sizes = [8 << (2 * k) for k in range(9)]                        # 8 B .. 512 KiB
    busbw = [1e-5 * 10 ** (k / 2) for k in range(9)]                # small ones too: 1e-5 GB/s at 8 B
    fig, title = _figure(plt, _rows("AllReduce", sizes, busbw) + _rows("Broadcast", sizes, busbw, ip=False), 2,
                         [], _mode(False, True), ["vm"])
    try:
        fig.canvas.draw()
        for ax in fig.axes[:2]:
            assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
            labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
            assert labels == [size_label(t) for t in _size_ticks(8, 512 << 10)] and "1 KiB" in labels, labels
            low, high = ax.get_ylim()
            assert 0 < low < 1e-5 and high > busbw[-1]                 # the small sizes are visible, not at 0
        assert "execute(), validation on" in title and "2 ranks on vm" in title and "float32" in title
    finally:
        plt.close(fig)
    # at 1 rank the bus factor of AllReduce is 0: nothing to draw on a log axis, and it says so
    fig, _ = _figure(plt, _rows("AllReduce", sizes, [0.0] * 9, ip=False), 1, [], _mode(True, False), ["vm"])
    try:
        assert any("bus factor 0 at 1 rank" in t.get_text() for t in fig.axes[0].texts)
    finally:
        plt.close(fig)
    # every title fits in the figure, one panel (bench --help's example: the figure's title is wider than
    # one panel) or several, with a long title (several dtypes, a comparison, several hosts)
    for ops, dtypes in ((["AllReduce"], ["float16"]), (["AllReduce", "AllGather", "Broadcast", "ReduceScatter"],
                                                       ["float16", "bfloat16", "float32"])):
        rows = [r for op in ops for d in dtypes for r in _rows(op, sizes, busbw)]
        for r, d in zip(rows, [d for _ in ops for d in dtypes for _ in sizes]):
            r.type = d
        fig, title = _figure(plt, rows, 4, ["mpi4py", "gloo"], _mode(True, True), ["host1", "host2"])
        try:
            fig.canvas.draw()
            box, renderer = fig.bbox, fig.canvas.get_renderer()
            texts = [fig._suptitle] + [ax.title for ax in fig.axes if ax.get_title()]
            for text in texts:
                extent = text.get_window_extent(renderer)
                assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and extent.y1 <= box.y1, (title, text.get_text())
            assert " ".join(fig._suptitle.get_text().split()) == title         # (wrapped, not cut)
        finally:
            plt.close(fig)
    # (the job's own plot: test_split_and_domain_and_plot_flag)


# ----------------------------------------------------------------------------- Ctrl-C

STALL = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import mpicoll.run as run
    from mpicoll.checks import BENCHES, BenchRun, BenchSpec

    class Stall:
        \"\"\"From the second size on, world rank 1 sleeps (in Python: Ctrl-C interrupts it) while
        the others wait for it inside an MPI barrier (in C: Ctrl-C cannot interrupt them).\"\"\"

        def __init__(self, case):
            self.case = case

        def execute(self, out):
            if self.case.count > 2:
                me = self.case.world_rank
                pid_file = os.path.join(os.path.dirname(sys.argv[1]), f"pid.{me}")
                if not os.path.exists(pid_file):      # (read by the test: printed pids may come cut by other lines)
                    with open(pid_file + ".new", "w") as f:
                        f.write(str(os.getpid()))
                    os.replace(pid_file + ".new", pid_file)
                print(f"@@ world rank {me} pid {os.getpid()} {'sleeps' if me == 1 else 'waits in MPI'}", flush=True)
                if me == 1:
                    time.sleep(60)
            self.case.comm.Barrier()
            return out

    def setup(case):
        out = np.zeros(max(case.count, 1), np.int32)
        return BenchRun(Stall(case), (out,), out.copy())

    BENCHES["StallForTest"] = BenchSpec("StallForTest", setup, lambda n: 1.0, dtypes=("int32",))
    run.entry(["bench", "--op", "StallForTest", "-b", "8", "-e", "64", "-d", "int32", "-n", "1", "-w", "0",
               "--json", sys.argv[1]])
""")


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


@pytest.mark.mpi(min_size=1)
@single
@pytest.mark.timeout_s(120)
@pytest.mark.parametrize("case", ["sweep", "ranks-inside-mpi", "one-rank-only"])
def test_ctrl_c_during_a_sweep_prints_one_line_and_saves_the_rows(tmp_path, case):
    """Ctrl-C (SIGINT to the job's process group, as a terminal sends it) during a sweep: one line
    on one rank, no traceback, the rows measured so far in --json, exit status 130, promptly, and
    no shared-memory file left. ``ranks-inside-mpi``: the rank that writes the JSON is blocked in
    an MPI call (its KeyboardInterrupt never comes) while another sleeps in Python.
    ``one-rank-only``: SIGINT reaches one rank that does not print (kill -INT of one process):
    after a grace period it ends the job itself, with a line of its own."""
    if OPEN_MPI:
        pytest.skip("MPICH's shared-memory files and hydra's Ctrl-C forwarding; Open MPI's launcher handles "
                    "Ctrl-C itself")
    out = tmp_path / "rows.json"
    if case == "sweep":
        cmd = mpirun(2, sys.executable, "-m", "mpicoll.run", "bench", "--op", "AllReduce", "-b", "8", "-e", "32M",
                     "-n", "200", "-w", "1", "--json", str(out))
    else:
        script = tmp_path / "stall.py"
        script.write_text(STALL)
        cmd = mpirun(3, sys.executable, str(script), str(out))
    before = set(glob.glob("/dev/shm/mpich_shm_*"))
    job = subprocess.Popen(cmd, env=launch_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_lines, args=(job.stdout, lines), daemon=True)
    reader.start()
    seen, pids = [], {}
    try:
        deadline = time.monotonic() + 60
        while True:                 # until 2 points are measured, or the stalled ranks are where we want them
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                line = ""
            assert line is not None, "the job ended before Ctrl-C: " + "".join(seen) + job.stderr.read()
            assert time.monotonic() < deadline, "the job never got there: " + "".join(seen)
            seen.append(line)
            for r in range(3):      # (from files: a pid printed by one rank may come cut by another's line)
                if r not in pids and (tmp_path / f"pid.{r}").exists():
                    pids[r] = int((tmp_path / f"pid.{r}").read_text())
            rows = [ln for ln in seen if ln.strip() and not ln.startswith(("#", "@@"))]
            if (case == "sweep" and len(rows) >= 2) or len(pids) == 3:
                break
        time.sleep(0.3)
        t0 = time.monotonic()
        if case == "one-rank-only":
            os.kill(pids[1], signal.SIGINT)
        else:
            os.killpg(job.pid, signal.SIGINT)
        job.wait(timeout=30)
        seconds = time.monotonic() - t0
        err = job.stderr.read()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    reader.join(timeout=5)
    while (line := lines.get(timeout=5)) is not None:
        seen.append(line)
    left = left_behind(before)
    remove(left)
    assert job.returncode == 130, (job.returncode, err)
    assert seconds < within(10 if case != "one-rank-only" else 15), seconds
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.count("interrupted (Ctrl-C)") == 1, err
    assert left == [], f"left behind: {left}"
    table = [ln.split() for ln in seen if ln.strip() and not ln.startswith(("#", "@@", "["))]
    if case == "one-rank-only":     # the rank that prints never got it: nothing saved, the job ended anyway
        assert "interrupted (Ctrl-C) on world rank 1, and the rank that prints did not end the job" in err, err
        assert not out.exists()
        return
    m = re.search(r"python -m mpicoll.run bench: interrupted \(Ctrl-C\) after (\d+) point\(s\); the rows "
                  r"measured so far are in (\S+)\n", err)
    assert m and m[2] == str(out), err
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True and len(doc["rows"]) == int(m[1])
    assert [r["size"] for r in doc["rows"]] == [int(t[0]) for t in table][:len(doc["rows"])]
    if case == "sweep":
        assert 2 <= len(doc["rows"]) < len(size_steps(8, 32 << 20, 2)), len(doc["rows"])
    else:                           # measured: the 8-byte point; rank 0 was inside MPI at the 16-byte one
        assert [r["size"] for r in doc["rows"]] == [8]
