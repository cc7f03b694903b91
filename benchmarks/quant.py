"""int8 quantized all-reduce vs float16 and float32 AllReduce of the same tensor: time and bytes.

    mpirun -np 2 python benchmarks/quant.py [-b 1K -e 64M -f 4] [--block 128] [--reps 7]

Sizes are those of the float16 tensor (1K = 512 elements). Every rank holds its own Gaussian
float16 data; the fp32 AllReduce gets the same values as float32, the quantized pipeline their
``quantize(x, block)``. Timing is the bench harness' (``mpicoll.bench._time``: the slowest rank's
mean per call); the implementations are interleaved, in a rotating order, for ``--reps`` rounds
and the median round is kept. Bytes are those each rank sends to the other ranks on the
algorithm's data path: an AllReduce as reduce-scatter + all-gather (2 (n-1)/n x the tensor), the
pipeline as an int8 AllToAll (+ scales) and a float16 (or int8 + scales) AllGather.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.bench import _time, parse_size, size_steps
from mpicoll.ops.quant import bytes_per_rank


def _human(size: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", type=parse_size, default=parse_size("1K"))
    ap.add_argument("-e", type=parse_size, default=parse_size("64M"))
    ap.add_argument("-f", type=int, default=4)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    mpicoll.init()
    comm = MPI.COMM_WORLD
    n, me = comm.Get_size(), comm.Get_rank()
    rows = []
    for size in size_steps(args.b, args.e, args.f):          # size = bytes of the float16 tensor
        count = max(size // 2, 1)
        x16 = np.random.default_rng(me).standard_normal(count).astype(np.float16)
        x32 = x16.astype(np.float32)
        q, s = mpicoll.quantize(x16, args.block)
        out16, out32 = np.empty_like(x16), np.empty_like(x32)
        ar16 = mpicoll.AllReduceOperation(validate=False)
        ar32 = mpicoll.AllReduceOperation(validate=False)
        qf = mpicoll.QuantAllReduceOperation(mpicoll.QuantAllReduceParam(block_size=args.block), validate=False)
        qi = mpicoll.QuantAllReduceOperation(mpicoll.QuantAllReduceParam(block_size=args.block,
                                                                         allgather_dtype="int8"), validate=False)
        impls = {"fp32": lambda: ar32.execute(x32, out=out32), "fp16": lambda: ar16.execute(x16, out=out16),
                 "q8/f16": lambda: qf.execute(q, s, out=out16), "q8/i8": lambda: qi.execute(q, s, out=out16),
                 "quant": lambda: mpicoll.quantize(x16, args.block)}
        iters = max(2, min(200, int(4e7 // max(size, 1))))
        times: dict[str, list[float]] = {k: [] for k in impls}
        for fn in impls.values():
            fn()
        names = list(impls)
        for r in range(args.reps):
            for k in names[r % len(names):] + names[:r % len(names)]:
                times[k].append(_time(comm, impls[k], iters))
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        share = 2 * (n - 1) / n
        rows.append((size, int(count * 4 * share), int(count * 2 * share),
                     bytes_per_rank(count, n, args.block, "float16"), bytes_per_rank(count, n, args.block, "int8"), med))
        del x16, x32, q, s, out16, out32, ar16, ar32, qf, qi, impls
    if me == 0:
        print(f"# QuantAllReduce vs AllReduce of the same tensor: {n} ranks, block {args.block}; times in us "
              f"(slowest rank's mean per call, median of {args.reps} interleaved rounds)")
        print("# q8/f16 = int8 AllToAll + float16 AllGather, q8/i8 = int8 both ways, quant = quantize() of the "
              "float16 input; ratios are time / fp16 AllReduce time (< 1: the pipeline is faster)")
        print(f"{'fp16':>5} |{'B/rank fp32':>12}{'fp16':>10}{'q8/f16':>10}{'q8/i8':>10} |{'us fp32':>10}{'fp16':>9}"
              f"{'q8/f16':>9}{'q8/i8':>9}{'quant':>9} |{'q8/f16':>7}{'q8/i8':>7}{'+quant':>7}{'fp32':>6}")
        for size, b32, b16, bq, bqi, m in rows:
            print(f"{_human(size):>5} |{b32:>12}{b16:>10}{bq:>10}{bqi:>10} |{m['fp32']:>10.1f}{m['fp16']:>9.1f}"
                  f"{m['q8/f16']:>9.1f}{m['q8/i8']:>9.1f}{m['quant']:>9.1f} |{m['q8/f16'] / m['fp16']:>7.2f}"
                  f"{m['q8/i8'] / m['fp16']:>7.2f}{(m['q8/f16'] + m['quant']) / m['fp16']:>7.2f}"
                  f"{m['fp32'] / m['fp16']:>6.2f}")


if __name__ == "__main__":
    main()
