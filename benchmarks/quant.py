"""int8 quantized all-reduce vs float16 and float32 AllReduce of the same tensor: time and bytes.

    mpirun -np 2 python benchmarks/quant.py [-b 1K -e 64M -f 4] [--block 128] [--reps 5]

Uses the bench harness' operator specs and timing (slowest rank's mean, interleaved repetitions,
median kept). Bytes are those each rank sends to other ranks, by the algorithm's data path:
fp16/fp32 AllReduce as reduce-scatter + all-gather, 2(n-1)/n x the tensor; the int8 pipeline as an
int8 AllToAll plus a float16 (or int8 + scales) AllGather. Times include quantizing the float16
input (what a user replacing an fp16 AllReduce pays) and, separately, the pipeline alone.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.bench import _time, parse_size, size_steps
from mpicoll.quant import bytes_per_rank


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", type=parse_size, default=parse_size("1K"))
    ap.add_argument("-e", type=parse_size, default=parse_size("64M"))
    ap.add_argument("-f", type=int, default=4)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
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
                 "quantize": lambda: mpicoll.quantize(x16, args.block)}
        iters = max(2, min(200, int(4e7 // max(size, 1))))
        times = {k: [] for k in impls}
        for fn in impls.values():
            fn()
        for _ in range(args.reps):
            for k, fn in impls.items():
                times[k].append(_time(comm, fn, iters))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        share = 2 * (n - 1) / n
        rows.append((size, count, int(count * 4 * share), int(count * 2 * share),
                     bytes_per_rank(count, n, args.block, "float16"), bytes_per_rank(count, n, args.block, "int8"), med))
    if me == 0:
        print(f"# int8 quantized all-reduce vs AllReduce, {n} ranks, block {args.block}; times in ms (slowest rank, "
              f"median of {args.reps}); q8/f16 = int8 AllToAll + fp16 AllGather, q8/i8 = int8 both ways; "
              "+q = plus quantizing the fp16 input")
        print(f"{'fp16 bytes':>11}{'B/rank fp32':>12}{'fp16':>10}{'q8/f16':>10}{'q8/i8':>10}"
              f"{'t fp32':>9}{'t fp16':>9}{'t q8/f16':>9}{'t q8/i8':>9}{'+q':>9}{'fp16/q8f16+q':>13}")
        for size, count, b32, b16, bq, bqi, m in rows:
            qtot = m["q8/f16"] + m["quantize"]
            print(f"{size:>11}{b32:>12}{b16:>10}{bq:>10}{bqi:>10}{m['fp32']:>9.3f}{m['fp16']:>9.3f}{m['q8/f16']:>9.3f}"
                  f"{m['q8/i8']:>9.3f}{qtot:>9.3f}{m['fp16'] / qtot:>13.2f}")


if __name__ == "__main__":
    main()
