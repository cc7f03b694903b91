"""Accuracy of the int8 quantized all-reduce against the exact float32 all-reduce.

    mpirun -np 4 python benchmarks/quant_accuracy.py [--elements 1048576]

Every rank draws Gaussian float16 data (its own seed), quantizes it per block (symmetric absmax),
runs QuantAllReduce with float16 and with int8 AllGather, and compares with the float32 sum of the
original float16 data. Prints the max and RMS absolute error, both also relative to the RMS of the
exact result, per block size.
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import mpicoll


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--blocks", default="32,64,128,256,512,1024,2048,4096")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    me, n = comm.Get_rank(), comm.Get_size()
    x = np.random.default_rng(1234 + me).standard_normal(args.elements).astype(np.float16)
    exact = np.empty(args.elements, np.float32)
    comm.Allreduce(x.astype(np.float32), exact, MPI.SUM)         # the float32 reference, on the raw comm
    rms_exact = float(np.sqrt(np.mean(exact.astype(np.float64) ** 2)))
    fp16 = mpicoll.AllReduceOperation().execute(x).astype(np.float32)
    rows = [("fp16 AllReduce", "-", float(np.abs(fp16 - exact).max()),
             float(np.sqrt(np.mean((fp16 - exact).astype(np.float64) ** 2))))]
    for block in (int(b) for b in args.blocks.split(",")):
        q, s = mpicoll.quantize(x, block)
        for gather in ("float16", "int8"):
            op = mpicoll.QuantAllReduceOperation(mpicoll.QuantAllReduceParam(block_size=block, allgather_dtype=gather))
            err = op.execute(q, s).astype(np.float32) - exact
            rows.append((f"int8 / {gather} gather", block, float(np.abs(err).max()),
                         float(np.sqrt(np.mean(err.astype(np.float64) ** 2)))))
    rows = comm.gather(rows, root=0)
    if me == 0:
        # the same on every rank (an all-reduce): show rank 0's, and the worst max over ranks
        print(f"# int8 quantized all-reduce vs exact float32 sum: {n} ranks, {args.elements} Gaussian float16 "
              f"elements per rank, RMS of the exact result {rms_exact:.4f}")
        print(f"{'pipeline':<24}{'block':>7}{'max abs err':>14}{'RMS err':>12}{'max/RMS':>10}{'RMS/RMS':>10}")
        for i, (name, block, mx, rms) in enumerate(rows[0]):
            mx = max(r[i][2] for r in rows)
            print(f"{name:<24}{block!s:>7}{mx:>14.5f}{rms:>12.5f}{mx / rms_exact:>10.4f}{rms / rms_exact:>10.4f}")


if __name__ == "__main__":
    main()
