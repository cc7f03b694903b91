"""Markdown summary of ``python -m mpicoll.run bench --compare mpi4py,gloo --json FILE`` results.

    python benchmarks/summarize.py FILE.json [FILE.json ...]
    python benchmarks/summarize.py --merge OUT.json [--plot OUT.png] BASE.json NEWER.json [...]
    python benchmarks/summarize.py --compact FILE.json      one line per operator

Per operator and dtype: busbw at the largest size, and over the sizes >= 64 KiB the median and worst
ratio mpicoll/raw mpi4py (time; < 1 = mpicoll faster), and over all sizes the smallest gloo/mpicoll
time ratio (> 1 = mpicoll faster) with the size where it happens.

``--merge``: one run's rows with some points re-measured by later runs (same rank count): every
(operator, dtype, redop, size) that a later file has replaces the earlier file's row. The merged document
keeps every command; ``--plot`` draws it as the bench's ``--plot`` does.
"""
from __future__ import annotations

import argparse
import json
import statistics


def _ratio(r, impl, stored="mpicoll/peer"):
    """mpicoll/raw (impl mpi4py) or gloo/mpicoll: from the per-repetition paired median the harness
    stores (``stored``: the file's convention; files before it stored gloo/mpicoll), or (older
    files) the ratio of the median times."""
    paired = r.get("ratio", {}).get(impl)
    if paired is not None:
        return 1 / paired if impl != "mpi4py" and stored == "mpicoll/peer" else paired
    return _mine(r) / r["compare"][impl] if impl == "mpi4py" else r["compare"][impl] / _mine(r)


def _mine(r):
    return r["time_us"] if r["time_us"] is not None else r["ip_time_us"]


def summarize(doc: dict) -> str:
    rows = doc["rows"]
    stored = doc.get("ratio", "gloo/mpicoll")       # the convention of the file (older ones: gloo/mpicoll)
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["op"], r["type"], r["redop"]), []).append(r)
    commands = doc["command"] if isinstance(doc["command"], list) else [doc["command"]]
    out = [f"**{doc['ranks']} ranks** (" + "; then ".join(f"`{c}`" for c in commands) + ")", "",
           "| op | dtype | busbw at max size (GB/s) | mpicoll/mpi4py >= 64 KiB: median, worst | "
           "gloo/mpicoll: smallest (at size) | #wrong |", "|---|---|---|---|---|---|"]
    for (op, dt, _), rs in groups.items():
        big = max(rs, key=lambda r: r["size"])
        bw = big["busbw"] if big["busbw"] is not None else big["ip_busbw"]
        raw = [_ratio(r, "mpi4py") for r in rs if r["size"] >= 65536 and r["compare"].get("mpi4py")]
        gl = [(_ratio(r, "gloo", stored), r["size"]) for r in rs if r["compare"].get("gloo")]
        wrong = sum((r["wrong"] or 0) + (r["ip_wrong"] or 0) for r in rs)
        rtxt = f"{statistics.median(raw):.2f}, {max(raw):.2f}" if raw else "n/a (no raw MPI reduction)"
        g = min(gl) if gl else None
        gtxt = f"{g[0]:.2f} ({_size(g[1])})" if g else ("n/a (gloo lacks the dtype)" if "gloo" in doc["compare"]
                                                          else "-")
        out.append(f"| {op} | {dt} | {bw:.2f} | {rtxt} | {gtxt} | {wrong} |")
    return "\n".join(out)


def compact(doc: dict) -> str:
    """One line per operator over every dtype: the mpicoll/mpi4py time ratio at each size from 64 KiB
    (median over the dtypes MPI reduces itself: float16's is MPICH's own slow sum, shown apart) and the
    smallest gloo/mpicoll ratio over every dtype and size."""
    rows = doc["rows"]
    stored = doc.get("ratio", "gloo/mpicoll")
    ops = list(dict.fromkeys(r["op"] for r in rows))
    sizes = sorted({r["size"] for r in rows if r["size"] >= 65536 and r["compare"].get("mpi4py")})
    has_gloo = "gloo" in doc["compare"]
    head = "| op | " + " | ".join(f"/raw {_size(s)}" for s in sizes) + " | float16 /raw |"
    head += " gloo/mpicoll: smallest (dtype, size), median | #wrong |" if has_gloo else " #wrong |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for op in ops:
        rs = [r for r in rows if r["op"] == op]
        cells = []
        for s in sizes:
            v = [_ratio(r, "mpi4py") for r in rs if r["size"] == s and r["compare"].get("mpi4py")
                 and r["type"] != "float16"]
            cells.append(f"{statistics.median(v):.2f}" if v else "n/a")
        f16 = [_ratio(r, "mpi4py") for r in rs if r["type"] == "float16" and r["size"] >= 65536
               and r["compare"].get("mpi4py") and r["redop"] != "none"]
        cells.append(f"{min(f16):.2f}-{max(f16):.2f}" if f16 else "-")
        if has_gloo:
            gl = [(_ratio(r, "gloo", stored), r["type"], r["size"]) for r in rs if r["compare"].get("gloo")]
            cells.append(f"{min(gl)[0]:.2f} ({min(gl)[1]}, {_size(min(gl)[2])}), {statistics.median(g[0] for g in gl):.1f}"
                         if gl else "n/a")
        cells.append(str(sum((r["wrong"] or 0) + (r["ip_wrong"] or 0) for r in rs)))
        out.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def merge(docs: list[dict]) -> dict:
    base = dict(docs[0])
    rows = list(base["rows"])
    commands = [base["command"]]
    for d in docs[1:]:
        if d["ranks"] != base["ranks"]:
            raise SystemExit(f"--merge: {d['command']!r} ran at {d['ranks']} ranks, the base at {base['ranks']}")
        redone = {(r["op"], r["type"], r["redop"], r["size"]) for r in d["rows"]}
        rows = [r for r in rows if (r["op"], r["type"], r["redop"], r["size"]) not in redone] + d["rows"]
        commands.append(d["command"])
    order = list(dict.fromkeys(r["op"] for r in docs[0]["rows"]))
    rows.sort(key=lambda r: (order.index(r["op"]) if r["op"] in order else len(order), r["type"], r["redop"],
                             r["size"]))
    base.update(rows=rows, command=commands)
    return base


def plot(doc: dict, path: str) -> None:
    from mpicoll._bench_report import Row, plot as draw
    draw(path, [Row(**r) for r in doc["rows"]], doc["ranks"], doc["compare"])


def _size(b: int) -> str:
    for unit, k in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= k:
            return f"{b // k} {unit}"
    return f"{b} B"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--merge", help="write the files merged to this JSON (a later file's row replaces the row of the same "
                    "operator, dtype, redop and size)")
    ap.add_argument("--plot", help="with --merge: draw the merged rows to this PNG")
    ap.add_argument("--compact", action="store_true", help="one line per operator (see compact())")
    args = ap.parse_args()
    docs = []
    for p in args.files:
        with open(p, encoding="utf-8") as fh:
            docs.append(json.load(fh))
    if args.merge:
        docs = [merge(docs)]
        with open(args.merge, "w", encoding="utf-8") as fh:
            json.dump(docs[0], fh, indent=1)
        if args.plot:
            plot(docs[0], args.plot)
    print("\n\n".join((compact if args.compact else summarize)(d) for d in docs))


if __name__ == "__main__":
    main()
