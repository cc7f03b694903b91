"""int8 quantized all-reduce: int8 AllToAll, float32 dequantize-and-sum, float16 (or int8) AllGather.

    mpirun -np 4 python docs/examples/quant.py      (any rank count works)
"""
import numpy as np
from mpi4py import MPI

from mpicoll import (CollectiveArgumentError, QuantAllReduceOperation, QuantAllReduceParam, dequantize,
                     quantize)
from mpicoll.ops.quant import bytes_per_rank

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()


def show(label, value):
    """Print every rank's value on rank 0, in rank order."""
    values = world.gather(value, root=0)
    if rank == 0:
        for r, v in enumerate(values):
            print(f"{label:<24} rank {r}: {v}")


# 1. One scale per rank (block_size=0, the default): rank r holds int8 [r + 1] * 4 with scale 0.5.
x = np.full(4, rank + 1, dtype=np.int8)
out = QuantAllReduceOperation(QuantAllReduceParam()).execute(x, 0.5)
total = 0.5 * sum(r + 1 for r in range(n))                   # 1.5 at 2 ranks, 5.0 at 4 ranks
assert out.dtype == np.float16 and out.tolist() == [total] * 4
show("scalar scale", out.tolist())

# 2. Per-block scales from quantize(): each rank quantizes its own float data, 4 elements per block.
# 10 elements = 3 blocks (the last one has 2 elements); block 1 is all zeros, so its scale is 0.
block = 4
v = np.array([0.5, -1.0, 0.25, 2.0, 0, 0, 0, 0, 3.0, -0.75], dtype=np.float32) * (rank + 1)
q, scales = quantize(v, block)
assert q.dtype == np.int8 and scales.dtype == np.float32 and scales.shape == (3,) and scales[1] == 0
assert np.allclose(scales, [2.0 * (rank + 1) / 127, 0, 3.0 * (rank + 1) / 127])
op = QuantAllReduceOperation(QuantAllReduceParam(block_size=block))
out = op.execute(q, scales)
# The result is float16(sum over ranks, in the tree order, of float32(q_r) * scale_r): exactly what
# dequantize() gives on every rank's (q, scales), summed in float32 in that order
# (docs/reproducibility.md: 4 ranks sum as (x0 + x1) + (x2 + x3)).
pairs = world.allgather((q, scales))
everyone = [dequantize(qr, sr, block, dtype=np.float32) for qr, sr in pairs]


def tree(lo, hi):
    if hi - lo == 1:
        return everyone[lo]
    mid = lo + (1 << ((hi - lo - 1).bit_length() - 1))
    return tree(lo, mid) + tree(mid, hi)


exact32 = tree(0, len(everyone))
assert np.array_equal(out, exact32.astype(np.float16))
# ... and close to the sum of the original floats: each rank's error is at most half a scale step.
original = v / (rank + 1) * sum(r + 1 for r in range(n))
assert np.all(np.abs(out.astype(np.float32) - original) <= sum(sr for _, sr in pairs)[np.arange(10) // block] / 2
              + np.abs(original) * 2 ** -10)
show("per-block scales", out.tolist())

# 3. allgather_dtype="int8": the reduced chunks are re-quantized per block before the AllGather
# (half the bytes of the float16 gather, one more rounding step).
op8 = QuantAllReduceOperation(QuantAllReduceParam(block_size=block, allgather_dtype="int8"))
out8 = op8.execute(q, scales)
assert out8.dtype == np.float16 and np.array_equal(out8, dequantize(*quantize(exact32, block), block))
show("int8 gather", out8.tolist())

# 4. Bytes each rank sends for 1 Mi elements, against fp16 and fp32 AllReduce (2 (n-1)/n x the tensor).
size = 1 << 20
fp16, fp32 = int(2 * (n - 1) / n * 2 * size), int(2 * (n - 1) / n * 4 * size)
q16 = bytes_per_rank(size, n, 128)
q8 = bytes_per_rank(size, n, 128, "int8")
assert q8 < q16 < fp16 < fp32 if n > 1 else q8 == q16 == fp16 == fp32 == 0     # one rank sends nothing
if rank == 0:
    print(f"bytes per rank, {size} elements, {n} ranks: fp32 AllReduce {fp32}, fp16 AllReduce {fp16}, "
          f"QuantAllReduce block 128: {q16} (float16 gather), {q8} (int8 gather)")

# 5. Errors are agreed like every other argument error: here only the last rank passes a negative scale.
try:
    op.execute(q, scales * (-1 if rank == n - 1 else 1))
except CollectiveArgumentError as exc:
    assert exc.param == "scale" and exc.rank == n - 1
    messages = world.allgather(str(exc))
    assert len(set(messages)) == 1
    if rank == 0:
        print(f"{type(exc).__name__}: {exc}")
