"""``python -m mpicoll.run trace DIR``: what the per-rank files of a trace or of a flight-recorder
dump say (docs/trace.md).

For a trace (``trace.<rank>.json``): per operator, the calls, bytes, time and time spent waiting for
the last rank to arrive; the ranks ranked by how often and how long they made the others wait (the
stragglers: the last to arrive at a call that agreed); optionally the merged trace as one file and,
with matplotlib, a picture of the timeline with the late arrivals marked. For a dump
(``flight.<rank>.json``): per communicator, the first call some rank never entered, and which ranks
those are (and what each rank was doing: its last call, ended or in flight).
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections import defaultdict


def load_trace(path: str) -> list[dict]:
    """The events of one rank's trace file (a JSON array, closed or not: a job that ended early
    leaves it open)."""
    with open(path, encoding="utf-8") as f:
        text = f.read().strip()
    if not text.endswith("]"):
        text = text.rstrip(",\n ") + "]"
    return [e for e in json.loads(text) if e]


def files(where: str, kind: str) -> dict[int, str]:
    """``kind`` ("trace" or "flight") file of each rank in ``where``, by rank."""
    found = {}
    for name in os.listdir(where):
        m = re.fullmatch(rf"{kind}\.(\d+)\.json", name)
        if m:
            found[int(m.group(1))] = os.path.join(where, name)
    return dict(sorted(found.items()))


# ----------------------------------------------------------------------------- a trace

def summary(events: list[dict]) -> list[dict]:
    """Per operator (and category): calls, bytes, total time and time waiting (us), over every rank's
    complete events."""
    rows: dict[tuple, dict] = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        a = e.get("args", {})
        row = rows.setdefault((e.get("cat", ""), e["name"]), {"cat": e.get("cat", ""), "op": e["name"], "calls": 0,
                                                             "bytes": 0, "time_us": 0.0, "wait_us": 0.0, "errors": 0})
        row["calls"] += 1
        row["bytes"] += int(a.get("bytes") or 0)
        row["time_us"] += float(e.get("dur", 0.0))
        row["wait_us"] += float(a.get("wait_us") or 0.0)
        row["errors"] += a.get("outcome", "ok") != "ok"
    return sorted(rows.values(), key=lambda r: -r["time_us"])


def stragglers(events: list[dict]) -> list[dict]:
    """The world ranks that arrived last at calls that agreed, by how long they made the others
    wait (each call counted once: the event of the rank that waited longest names it)."""
    worst: dict[tuple, tuple[float, int]] = {}
    for e in events:
        a = e.get("args", {})
        if e.get("ph") != "X" or a.get("last_rank") is None:
            continue
        key = (a.get("comm"), e["name"], a.get("seq"))
        late = float(a.get("late_us") or 0.0)
        if key not in worst or late > worst[key][0]:
            worst[key] = (late, int(a["last_rank"]))
    by: dict[int, dict] = {}
    for late, rank in worst.values():
        row = by.setdefault(rank, {"rank": rank, "last": 0, "late_us": 0.0, "worst_us": 0.0})
        row["last"] += 1
        row["late_us"] += late
        row["worst_us"] = max(row["worst_us"], late)
    return sorted(by.values(), key=lambda r: (-r["late_us"], -r["last"]))


def late_calls(events: list[dict]) -> list[dict]:
    """Every call that agreed, once, with the rank that came last and how late (us): the call's
    events merged (for a test, or to look one call up)."""
    seen: dict[tuple, dict] = {}
    for e in events:
        a = e.get("args", {})
        if e.get("ph") != "X" or a.get("last_rank") is None:
            continue
        key = (a.get("comm"), e["name"], a.get("seq"))
        row = seen.setdefault(key, {"op": e["name"], "comm": a.get("comm"), "seq": a.get("seq"),
                                    "last_rank": a["last_rank"], "late_us": 0.0})
        row["late_us"] = max(row["late_us"], float(a.get("late_us") or 0.0))
    return sorted(seen.values(), key=lambda r: (str(r["comm"]), r["seq"] or 0))


def merged(where: str, out: str) -> int:
    """Write every rank's events of ``where`` into ``out``, one Chrome trace; the events written."""
    every = []
    for path in files(where, "trace").values():
        every += load_trace(path)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": every, "displayTimeUnit": "ns"}, f)
    return len(every)


def picture(events: list[dict], out: str) -> None:
    """A timeline (matplotlib: an optional extra): a row per rank, a bar per call, the calls where a
    rank came last marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    calls = [e for e in events if e.get("ph") == "X"]
    if not calls:
        raise ValueError("no events to draw")
    t0 = min(e["ts"] for e in calls)
    ranks = sorted({e["pid"] for e in calls})
    fig, ax = plt.subplots(figsize=(12, 1 + 0.5 * len(ranks)))
    names = sorted({e["name"] for e in calls})
    colours = {n: plt.cm.tab20(i % 20) for i, n in enumerate(names)}
    for e in calls:
        y = ranks.index(e["pid"])
        ax.barh(y, max(e["dur"], 0.5), left=e["ts"] - t0, height=0.6, color=colours[e["name"]])
        a = e.get("args", {})
        if a.get("last_rank") is not None and a.get("last_rank") == e["pid"] and a.get("late_us", 0) > 0:
            ax.plot(e["ts"] - t0, y, marker="v", color="red", markersize=7)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_xlabel("us since the first event")
    ax.set_title("mpicoll trace (red: the rank that arrived last at a call)", fontsize=10)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names], labels=names,
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- a dump

def never_entered(dumps: dict[int, dict]) -> list[dict]:
    """Per communicator (its label and world ranks), the first call some rank never entered: its
    sequence number there, its operator and call number (from a rank that entered it), and the world
    ranks that never did; and each rank's last call with its outcome. Communicators whose every
    member dumped and entered as many calls are left out."""
    comms: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for rank, d in dumps.items():
        for c in d.get("comms", []):
            comms[(c["label"], tuple(c["world_ranks"]))][rank] = c
    found = []
    for (label, members), seen in comms.items():
        counts = {r: seen[r]["entered"] for r in members if r in seen}
        missing_dumps = [r for r in members if r not in seen]
        if not counts:
            continue
        low, high = min(counts.values()), max(counts.values())
        if low == high and not missing_dumps:
            in_flight = {r: c for r, c in seen.items() if c["ended"] < c["entered"]}
            if in_flight:
                found.append({"comm": label, "world_ranks": list(members), "seq": None, "op": None,
                              "missing": [], "no_dump": [], "last": _last_calls(seen)})
            continue
        call = next((c for r, sc in seen.items() for c in sc["calls"] if c["seq"] == low + 1), None)
        found.append({"comm": label, "world_ranks": list(members), "seq": low + 1,
                      "op": None if call is None else call["op"],
                      "missing": sorted(r for r, k in counts.items() if k == low), "no_dump": missing_dumps,
                      "last": _last_calls(seen)})
    return found


def _last_calls(seen: dict[int, dict]) -> dict[int, dict | None]:
    return {r: (c["calls"][-1] if c["calls"] else None) for r, c in sorted(seen.items())}


def load_dumps(where: str) -> dict[int, dict]:
    dumps = {}
    for rank, path in files(where, "flight").items():
        with open(path, encoding="utf-8") as f:
            dumps[rank] = json.load(f)
    return dumps


# ----------------------------------------------------------------------------- the report

def main(argv: list[str]) -> int:
    """``python -m mpicoll.run trace DIR [--merge FILE] [--plot FILE]`` (one process, no mpirun)."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m mpicoll.run trace",
                                description="Read the per-rank files of a trace (MPICOLL_TRACE, mpicoll.trace) or "
                                            "of the flight recorders' dumps (MPICOLL_DUMP_DIR) and say what they "
                                            "show (docs/trace.md).")
    p.add_argument("dir", help="the directory of trace.<rank>.json or flight.<rank>.json files")
    p.add_argument("--merge", metavar="FILE", help="also write every rank's events into FILE, one Chrome trace")
    p.add_argument("--plot", metavar="FILE", help="also draw the timeline into FILE (needs matplotlib)")
    a = p.parse_args(argv)
    try:
        print(report(a.dir, a.merge, a.plot))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"python -m mpicoll.run trace: error: {exc}\n")
        return 2
    except ImportError as exc:
        sys.stderr.write(f"python -m mpicoll.run trace: error: --plot needs matplotlib ({exc})\n")
        return 2
    return 0


def report(where: str, merge: str | None = None, plot: str | None = None) -> str:
    """The text ``python -m mpicoll.run trace DIR`` prints.

    Raises:
        FileNotFoundError: ``where`` holds neither trace nor flight-recorder files.
    """
    traces, dumps = files(where, "trace"), load_dumps(where)
    if not traces and not dumps:
        raise FileNotFoundError(f"{where}: no trace.<rank>.json or flight.<rank>.json files")
    lines = []
    if traces:
        events: list[dict] = []
        for path in traces.values():
            events += load_trace(path)
        lines.append(f"# trace of {len(traces)} rank(s): {where}")
        lines.append(f"{'category':<11}{'operator':<28}{'calls':>8}{'bytes':>14}{'time (us)':>13}{'waiting (us)':>14}"
                     f"{'errors':>8}")
        for r in summary(events):
            lines.append(f"{r['cat']:<11}{r['op']:<28}{r['calls']:>8}{r['bytes']:>14}{r['time_us']:>13.1f}"
                         f"{r['wait_us']:>14.1f}{r['errors']:>8}")
        late = stragglers(events)
        if late:
            lines.append("# who made the others wait (the last to arrive at a call that agreed)")
            lines.append(f"{'world rank':<12}{'times last':>11}{'late (us)':>12}{'worst (us)':>12}")
            for r in late:
                lines.append(f"{r['rank']:<12}{r['last']:>11}{r['late_us']:>12.1f}{r['worst_us']:>12.1f}")
            worst = sorted(late_calls(events), key=lambda r: -r["late_us"])[:5]
            lines.append("# the latest arrivals (call: its number on its communicator)")
            for r in worst:
                lines.append(f"{r['comm']} call {r['seq']} ({r['op']}): world rank {r['last_rank']} came "
                             f"{r['late_us']:.1f} us after the first")
        else:
            lines.append("# no call agreed with its arrival times (validation off): no straggler to name")
        if merge:
            lines.append(f"# merged: {merged(where, merge)} events in {merge}")
        if plot:
            picture(events, plot)
            lines.append(f"# picture: {plot}")
    if dumps:
        lines.append(f"# flight recorders of {len(dumps)} rank(s): {where} "
                     f"({', '.join(sorted({d.get('reason', '?') for d in dumps.values()}))})")
        stuck = never_entered(dumps)
        if not stuck:
            lines.append("# every rank entered the same calls on every communicator, and ended them")
        for s in stuck:
            if s["seq"] is None:
                lines.append(f"{s['comm']}: every member entered {_count(s)}; some are still in it")
            else:
                lines.append(f"{s['comm']}: call {s['seq']} there ({s['op']}) was never entered "
                             f"by world rank(s) {s['missing']}" + (f"; no dump from {s['no_dump']}" if s["no_dump"]
                                                                    else ""))
            for r, c in s["last"].items():
                lines.append(f"    world rank {r}: " + ("no call" if c is None else
                                                        f"last {c['op']} (call {c['seq']}): "
                                                        f"{c['outcome']}"))
    return "\n".join(lines)


def _count(s: dict) -> str:
    last = [c for c in s["last"].values() if c is not None]
    return f"{max(c['seq'] for c in last) + 1} calls" if last else "no call"

