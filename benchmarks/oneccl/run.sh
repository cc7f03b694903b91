#!/usr/bin/env bash
# Intel oneCCL's collectives beside mpicoll's, interleaved, on this machine (docs/benchmark.md).
#
#   benchmarks/oneccl/run.sh [REPS]        (2 ranks, float32 sum, 8 B .. 64 MiB)
#
# oneCCL does not install as a clean pip extra here, so this script sets it up in a venv of its own
# (ONECCL_VENV, default /tmp/mpicoll-oneccl): pip's oneccl-cpu-devel 2022.1.2 (2022.2 needs a
# libfabric the index lacks) brings libccl.so.1, its headers and Intel MPI; that libccl.so.1 names a
# libccl.so.2 the wheel does not ship and takes only the Intel compiler runtime's symbols from it, so
# a stand-in libccl.so.2 links libintlc.so.5 (pip's intel-cmplr-lib-rt). cclbench.cpp times oneCCL
# under Intel MPI's mpiexec; mpicoll's own bench runs under the MPICH of the current environment.
# The two alternate REPS times (default 3); each prints its median per size. The table of
# docs/benchmark.md from the output:  benchmarks/oneccl/run.sh > out.txt; python benchmarks/oneccl/table.py out.txt
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=${ONECCL_VENV:-/tmp/mpicoll-oneccl}
reps=${1:-3}
if [[ ! -x $venv/cclbench ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q oneccl-cpu-devel==2022.1.2
    "$venv/bin/pip" install -q --no-deps intel-cmplr-lib-rt
    echo 'void mpicoll_ccl_standin(void) {}' > "$venv/standin.c"
    gcc -shared -fPIC -o "$venv/lib/libccl.so.2" "$venv/standin.c" -Wl,--no-as-needed -L"$venv/lib" -lintlc \
        -Wl,-rpath,"$venv/lib"
    g++ -O2 -std=c++17 -I"$venv/include" -I"$(dirname "$(command -v mpicc)")/../include" -o "$venv/cclbench" \
        "$here/cclbench.cpp" -L"$venv/lib" -lccl -lmpi -Wl,-rpath,"$venv/lib"
fi
sizes="8 1024 65536 1048576 16777216 67108864"
for ((k = 0; k < reps; k++)); do
    echo "# oneCCL, round $k: op bytes us"
    LD_LIBRARY_PATH=$venv/lib I_MPI_ROOT=$venv "$venv/bin/mpiexec" -n 2 "$venv/cclbench" 3 $sizes 2>/dev/null
    for v in 1 0; do
        echo "# mpicoll (validation $v) and raw mpi4py, round $k"
        for s in $sizes; do
            # (the iterations a block that cclbench.cpp times: 2000 calls up to 64 KiB, 200 up to 1 MiB, 10 above)
            iters=$(( s <= 65536 ? 2000 : s <= 1048576 ? 200 : 10 ))
            mpirun -bind-to core -np 2 python -m mpicoll.run bench --op AllReduce,AllGather,ReduceScatter,AllToAll,Broadcast \
                -b "$s" -e "$s" -n "$iters" -w 20 --validate "$v" --reps 3 --compare mpi4py -c 0 2>/dev/null | grep -E "^# [A-Za-z]+: |^ +[0-9]" || true
        done
    done
done
