// Time oneCCL's collectives (float32 sum), nccl-tests sizes: allreduce, allgather, reduce_scatter, alltoall, broadcast.
#include <mpi.h>
#include <oneapi/ccl.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <string>

int main(int argc, char **argv) {
    ccl::init();
    MPI_Init(&argc, &argv);
    int size, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ccl::shared_ptr_class<ccl::kvs> kvs;
    ccl::kvs::address_type addr;
    if (rank == 0) { kvs = ccl::create_main_kvs(); addr = kvs->get_address(); }
    MPI_Bcast(addr.data(), addr.size(), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rank != 0) kvs = ccl::create_kvs(addr);
    auto comm = ccl::create_communicator(size, rank, kvs);
    const char *ops[] = {"AllReduce", "AllGather", "ReduceScatter", "AllToAll", "Broadcast"};
    // argv: [reps] [sizes in bytes ...] (default: 7; 8 B, 1 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB)
    std::vector<long> sizes = {8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20};
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (argc > 2) {
        sizes.clear();
        for (int i = 2; i < argc; i++) sizes.push_back(atol(argv[i]));
    }
    for (const char *op : ops) {
        for (long bytes : sizes) {
            long count = bytes / 4;     // nccl-tests: AllGather's output, ReduceScatter's input
            long per = std::max(count / size, 1L);
            if (std::string(op) == "AllGather" || std::string(op) == "ReduceScatter" || std::string(op) == "AllToAll")
                count = per * size;
            std::vector<float> a(count + size, 1.0f), b(count + size, 0.0f);
            auto run = [&]() {
                std::string o(op);
                if (o == "AllReduce") ccl::allreduce(a.data(), b.data(), count, ccl::reduction::sum, comm).wait();
                else if (o == "AllGather") {
                    std::vector<size_t> rc(size, per);
                    ccl::allgatherv(a.data(), per, b.data(), rc, comm).wait();
                } else if (o == "ReduceScatter") ccl::reduce_scatter(a.data(), b.data(), per, ccl::reduction::sum, comm).wait();
                else if (o == "AllToAll") ccl::alltoall(a.data(), b.data(), per, comm).wait();
                else ccl::broadcast(a.data(), count, 0, comm).wait();
            };
            int iters = bytes <= (1 << 16) ? 2000 : bytes <= (1 << 20) ? 200 : 10;
            for (int i = 0; i < 20; i++) run();
            std::vector<double> t;
            for (int r = 0; r < reps; r++) {
                MPI_Barrier(MPI_COMM_WORLD);
                auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < iters; i++) run();
                double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
                double mx; MPI_Allreduce(&us, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                t.push_back(mx);
            }
            std::sort(t.begin(), t.end());
            if (rank == 0) printf("%-14s %10ld %12.2f\n", op, bytes, t[t.size() / 2]);
            fflush(stdout);
        }
    }
    MPI_Finalize();
    return 0;
}
