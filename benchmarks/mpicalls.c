/* A PMPI shim that counts the MPI calls a process makes, by name (mpicoll's and anyone's).
 *
 *   mpicc -shared -fPIC -O2 -o libmpicalls.so benchmarks/mpicalls.c
 *   LD_PRELOAD=$PWD/libmpicalls.so mpirun -np 2 python ...
 *
 * Read the counts from Python with benchmarks/mpicalls.py (ctypes: mpicalls_read, mpicalls_reset).
 * Every wrapper counts its call and forwards it to the PMPI_ name, unchanged.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

enum { ALLGATHER, ALLGATHERV, ALLREDUCE, ALLTOALL, ALLTOALLV, BCAST, REDUCE, REDUCE_SCATTER,
       REDUCE_SCATTER_BLOCK, GATHER, GATHERV, SCATTER, SCATTERV, BARRIER,
       IALLGATHER, IALLGATHERV, IALLREDUCE, IALLTOALL, IALLTOALLV, IBCAST, IREDUCE, IREDUCE_SCATTER,
       IREDUCE_SCATTER_BLOCK, IGATHER, IGATHERV, ISCATTER, ISCATTERV, IBARRIER,
       SEND, RECV, ISEND, IRECV, START, STARTALL, WIN_FENCE, WIN_SYNC, N_CALLS };
static const char *NAMES[N_CALLS] = {
    "Allgather", "Allgatherv", "Allreduce", "Alltoall", "Alltoallv", "Bcast", "Reduce", "Reduce_scatter",
    "Reduce_scatter_block", "Gather", "Gatherv", "Scatter", "Scatterv", "Barrier",
    "Iallgather", "Iallgatherv", "Iallreduce", "Ialltoall", "Ialltoallv", "Ibcast", "Ireduce", "Ireduce_scatter",
    "Ireduce_scatter_block", "Igather", "Igatherv", "Iscatter", "Iscatterv", "Ibarrier",
    "Send", "Recv", "Isend", "Irecv", "Start", "Startall", "Win_fence", "Win_sync"};
static long COUNTS[N_CALLS];

/* "name count\n" for every name counted since the last reset, into buf; returns the length. */
int mpicalls_read(char *buf, int len) {
    int at = 0;
    buf[0] = 0;
    for (int i = 0; i < N_CALLS; i++)
        if (COUNTS[i] && at < len)
            at += snprintf(buf + at, len - at, "%s %ld\n", NAMES[i], COUNTS[i]);
    return at;
}

void mpicalls_reset(void) { memset(COUNTS, 0, sizeof COUNTS); }

#define C(k) COUNTS[k]++
int MPI_Allgather(const void *a, int b, MPI_Datatype c, void *d, int e, MPI_Datatype f, MPI_Comm g)
{ C(ALLGATHER); return PMPI_Allgather(a, b, c, d, e, f, g); }
int MPI_Allgatherv(const void *a, int b, MPI_Datatype c, void *d, const int *e, const int *f, MPI_Datatype g,
                   MPI_Comm h) { C(ALLGATHERV); return PMPI_Allgatherv(a, b, c, d, e, f, g, h); }
int MPI_Allreduce(const void *a, void *b, int c, MPI_Datatype d, MPI_Op e, MPI_Comm f)
{ C(ALLREDUCE); return PMPI_Allreduce(a, b, c, d, e, f); }
int MPI_Alltoall(const void *a, int b, MPI_Datatype c, void *d, int e, MPI_Datatype f, MPI_Comm g)
{ C(ALLTOALL); return PMPI_Alltoall(a, b, c, d, e, f, g); }
int MPI_Alltoallv(const void *a, const int *b, const int *c, MPI_Datatype d, void *e, const int *f, const int *g,
                  MPI_Datatype h, MPI_Comm i) { C(ALLTOALLV); return PMPI_Alltoallv(a, b, c, d, e, f, g, h, i); }
int MPI_Bcast(void *a, int b, MPI_Datatype c, int d, MPI_Comm e) { C(BCAST); return PMPI_Bcast(a, b, c, d, e); }
int MPI_Reduce(const void *a, void *b, int c, MPI_Datatype d, MPI_Op e, int f, MPI_Comm g)
{ C(REDUCE); return PMPI_Reduce(a, b, c, d, e, f, g); }
int MPI_Reduce_scatter(const void *a, void *b, const int *c, MPI_Datatype d, MPI_Op e, MPI_Comm f)
{ C(REDUCE_SCATTER); return PMPI_Reduce_scatter(a, b, c, d, e, f); }
int MPI_Reduce_scatter_block(const void *a, void *b, int c, MPI_Datatype d, MPI_Op e, MPI_Comm f)
{ C(REDUCE_SCATTER_BLOCK); return PMPI_Reduce_scatter_block(a, b, c, d, e, f); }
int MPI_Gather(const void *a, int b, MPI_Datatype c, void *d, int e, MPI_Datatype f, int g, MPI_Comm h)
{ C(GATHER); return PMPI_Gather(a, b, c, d, e, f, g, h); }
int MPI_Gatherv(const void *a, int b, MPI_Datatype c, void *d, const int *e, const int *f, MPI_Datatype g, int h,
                MPI_Comm i) { C(GATHERV); return PMPI_Gatherv(a, b, c, d, e, f, g, h, i); }
int MPI_Scatter(const void *a, int b, MPI_Datatype c, void *d, int e, MPI_Datatype f, int g, MPI_Comm h)
{ C(SCATTER); return PMPI_Scatter(a, b, c, d, e, f, g, h); }
int MPI_Scatterv(const void *a, const int *b, const int *c, MPI_Datatype d, void *e, int f, MPI_Datatype g, int h,
                 MPI_Comm i) { C(SCATTERV); return PMPI_Scatterv(a, b, c, d, e, f, g, h, i); }
int MPI_Barrier(MPI_Comm a) { C(BARRIER); return PMPI_Barrier(a); }
int MPI_Iallgather(const void *a, int b, MPI_Datatype c, void *d, int e, MPI_Datatype f, MPI_Comm g, MPI_Request *r)
{ C(IALLGATHER); return PMPI_Iallgather(a, b, c, d, e, f, g, r); }
int MPI_Iallgatherv(const void *a, int b, MPI_Datatype c, void *d, const int *e, const int *f, MPI_Datatype g,
                    MPI_Comm h, MPI_Request *r) { C(IALLGATHERV); return PMPI_Iallgatherv(a, b, c, d, e, f, g, h, r); }
int MPI_Iallreduce(const void *a, void *b, int c, MPI_Datatype d, MPI_Op e, MPI_Comm f, MPI_Request *r)
{ C(IALLREDUCE); return PMPI_Iallreduce(a, b, c, d, e, f, r); }
int MPI_Ialltoall(const void *a, int b, MPI_Datatype c, void *d, int e, MPI_Datatype f, MPI_Comm g, MPI_Request *r)
{ C(IALLTOALL); return PMPI_Ialltoall(a, b, c, d, e, f, g, r); }
int MPI_Ialltoallv(const void *a, const int *b, const int *c, MPI_Datatype d, void *e, const int *f, const int *g,
                   MPI_Datatype h, MPI_Comm i, MPI_Request *r)
{ C(IALLTOALLV); return PMPI_Ialltoallv(a, b, c, d, e, f, g, h, i, r); }
int MPI_Ibcast(void *a, int b, MPI_Datatype c, int d, MPI_Comm e, MPI_Request *r)
{ C(IBCAST); return PMPI_Ibcast(a, b, c, d, e, r); }
int MPI_Ireduce(const void *a, void *b, int c, MPI_Datatype d, MPI_Op e, int f, MPI_Comm g, MPI_Request *r)
{ C(IREDUCE); return PMPI_Ireduce(a, b, c, d, e, f, g, r); }
int MPI_Ireduce_scatter(const void *a, void *b, const int *c, MPI_Datatype d, MPI_Op e, MPI_Comm f, MPI_Request *r)
{ C(IREDUCE_SCATTER); return PMPI_Ireduce_scatter(a, b, c, d, e, f, r); }
int MPI_Ireduce_scatter_block(const void *a, void *b, int c, MPI_Datatype d, MPI_Op e, MPI_Comm f, MPI_Request *r)
{ C(IREDUCE_SCATTER_BLOCK); return PMPI_Ireduce_scatter_block(a, b, c, d, e, f, r); }
int MPI_Igather(const void *a, int b, MPI_Datatype c, void *d, int e, MPI_Datatype f, int g, MPI_Comm h,
                MPI_Request *r) { C(IGATHER); return PMPI_Igather(a, b, c, d, e, f, g, h, r); }
int MPI_Igatherv(const void *a, int b, MPI_Datatype c, void *d, const int *e, const int *f, MPI_Datatype g, int h,
                 MPI_Comm i, MPI_Request *r) { C(IGATHERV); return PMPI_Igatherv(a, b, c, d, e, f, g, h, i, r); }
int MPI_Iscatter(const void *a, int b, MPI_Datatype c, void *d, int e, MPI_Datatype f, int g, MPI_Comm h,
                 MPI_Request *r) { C(ISCATTER); return PMPI_Iscatter(a, b, c, d, e, f, g, h, r); }
int MPI_Iscatterv(const void *a, const int *b, const int *c, MPI_Datatype d, void *e, int f, MPI_Datatype g, int h,
                  MPI_Comm i, MPI_Request *r) { C(ISCATTERV); return PMPI_Iscatterv(a, b, c, d, e, f, g, h, i, r); }
int MPI_Ibarrier(MPI_Comm a, MPI_Request *r) { C(IBARRIER); return PMPI_Ibarrier(a, r); }
int MPI_Send(const void *a, int b, MPI_Datatype c, int d, int e, MPI_Comm f)
{ C(SEND); return PMPI_Send(a, b, c, d, e, f); }
int MPI_Recv(void *a, int b, MPI_Datatype c, int d, int e, MPI_Comm f, MPI_Status *g)
{ C(RECV); return PMPI_Recv(a, b, c, d, e, f, g); }
int MPI_Isend(const void *a, int b, MPI_Datatype c, int d, int e, MPI_Comm f, MPI_Request *r)
{ C(ISEND); return PMPI_Isend(a, b, c, d, e, f, r); }
int MPI_Irecv(void *a, int b, MPI_Datatype c, int d, int e, MPI_Comm f, MPI_Request *r)
{ C(IRECV); return PMPI_Irecv(a, b, c, d, e, f, r); }
int MPI_Start(MPI_Request *r) { C(START); return PMPI_Start(r); }
int MPI_Startall(int n, MPI_Request *r) { C(STARTALL); return PMPI_Startall(n, r); }
int MPI_Win_fence(int a, MPI_Win w) { C(WIN_FENCE); return PMPI_Win_fence(a, w); }
int MPI_Win_sync(MPI_Win w) { C(WIN_SYNC); return PMPI_Win_sync(w); }

/* The large-count forms (MPI 4: what mpi4py calls where the MPI has them), counted under the same names. */
#define CC const MPI_Count *
#define CA const MPI_Aint *
int MPI_Allgather_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, MPI_Count e, MPI_Datatype f, MPI_Comm g)
{ C(ALLGATHER); return PMPI_Allgather_c(a, b, c, d, e, f, g); }
int MPI_Allgatherv_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, CC e, CA f, MPI_Datatype g, MPI_Comm h)
{ C(ALLGATHERV); return PMPI_Allgatherv_c(a, b, c, d, e, f, g, h); }
int MPI_Allreduce_c(const void *a, void *b, MPI_Count c, MPI_Datatype d, MPI_Op e, MPI_Comm f)
{ C(ALLREDUCE); return PMPI_Allreduce_c(a, b, c, d, e, f); }
int MPI_Alltoall_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, MPI_Count e, MPI_Datatype f, MPI_Comm g)
{ C(ALLTOALL); return PMPI_Alltoall_c(a, b, c, d, e, f, g); }
int MPI_Alltoallv_c(const void *a, CC b, CA c, MPI_Datatype d, void *e, CC f, CA g, MPI_Datatype h, MPI_Comm i)
{ C(ALLTOALLV); return PMPI_Alltoallv_c(a, b, c, d, e, f, g, h, i); }
int MPI_Bcast_c(void *a, MPI_Count b, MPI_Datatype c, int d, MPI_Comm e) { C(BCAST); return PMPI_Bcast_c(a, b, c, d, e); }
int MPI_Reduce_c(const void *a, void *b, MPI_Count c, MPI_Datatype d, MPI_Op e, int f, MPI_Comm g)
{ C(REDUCE); return PMPI_Reduce_c(a, b, c, d, e, f, g); }
int MPI_Reduce_scatter_c(const void *a, void *b, CC c, MPI_Datatype d, MPI_Op e, MPI_Comm f)
{ C(REDUCE_SCATTER); return PMPI_Reduce_scatter_c(a, b, c, d, e, f); }
int MPI_Reduce_scatter_block_c(const void *a, void *b, MPI_Count c, MPI_Datatype d, MPI_Op e, MPI_Comm f)
{ C(REDUCE_SCATTER_BLOCK); return PMPI_Reduce_scatter_block_c(a, b, c, d, e, f); }
int MPI_Gather_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, MPI_Count e, MPI_Datatype f, int g, MPI_Comm h)
{ C(GATHER); return PMPI_Gather_c(a, b, c, d, e, f, g, h); }
int MPI_Gatherv_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, CC e, CA f, MPI_Datatype g, int h, MPI_Comm i)
{ C(GATHERV); return PMPI_Gatherv_c(a, b, c, d, e, f, g, h, i); }
int MPI_Scatter_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, MPI_Count e, MPI_Datatype f, int g, MPI_Comm h)
{ C(SCATTER); return PMPI_Scatter_c(a, b, c, d, e, f, g, h); }
int MPI_Scatterv_c(const void *a, CC b, CA c, MPI_Datatype d, void *e, MPI_Count f, MPI_Datatype g, int h, MPI_Comm i)
{ C(SCATTERV); return PMPI_Scatterv_c(a, b, c, d, e, f, g, h, i); }
int MPI_Iallgather_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, MPI_Count e, MPI_Datatype f, MPI_Comm g,
                     MPI_Request *r) { C(IALLGATHER); return PMPI_Iallgather_c(a, b, c, d, e, f, g, r); }
int MPI_Iallgatherv_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, CC e, CA f, MPI_Datatype g, MPI_Comm h,
                      MPI_Request *r) { C(IALLGATHERV); return PMPI_Iallgatherv_c(a, b, c, d, e, f, g, h, r); }
int MPI_Iallreduce_c(const void *a, void *b, MPI_Count c, MPI_Datatype d, MPI_Op e, MPI_Comm f, MPI_Request *r)
{ C(IALLREDUCE); return PMPI_Iallreduce_c(a, b, c, d, e, f, r); }
int MPI_Ialltoall_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, MPI_Count e, MPI_Datatype f, MPI_Comm g,
                    MPI_Request *r) { C(IALLTOALL); return PMPI_Ialltoall_c(a, b, c, d, e, f, g, r); }
int MPI_Ialltoallv_c(const void *a, CC b, CA c, MPI_Datatype d, void *e, CC f, CA g, MPI_Datatype h, MPI_Comm i,
                     MPI_Request *r) { C(IALLTOALLV); return PMPI_Ialltoallv_c(a, b, c, d, e, f, g, h, i, r); }
int MPI_Ibcast_c(void *a, MPI_Count b, MPI_Datatype c, int d, MPI_Comm e, MPI_Request *r)
{ C(IBCAST); return PMPI_Ibcast_c(a, b, c, d, e, r); }
int MPI_Ireduce_c(const void *a, void *b, MPI_Count c, MPI_Datatype d, MPI_Op e, int f, MPI_Comm g, MPI_Request *r)
{ C(IREDUCE); return PMPI_Ireduce_c(a, b, c, d, e, f, g, r); }
int MPI_Ireduce_scatter_c(const void *a, void *b, CC c, MPI_Datatype d, MPI_Op e, MPI_Comm f, MPI_Request *r)
{ C(IREDUCE_SCATTER); return PMPI_Ireduce_scatter_c(a, b, c, d, e, f, r); }
int MPI_Ireduce_scatter_block_c(const void *a, void *b, MPI_Count c, MPI_Datatype d, MPI_Op e, MPI_Comm f,
                                MPI_Request *r) { C(IREDUCE_SCATTER_BLOCK); return PMPI_Ireduce_scatter_block_c(a, b, c, d, e, f, r); }
int MPI_Igather_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, MPI_Count e, MPI_Datatype f, int g, MPI_Comm h,
                  MPI_Request *r) { C(IGATHER); return PMPI_Igather_c(a, b, c, d, e, f, g, h, r); }
int MPI_Igatherv_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, CC e, CA f, MPI_Datatype g, int h, MPI_Comm i,
                   MPI_Request *r) { C(IGATHERV); return PMPI_Igatherv_c(a, b, c, d, e, f, g, h, i, r); }
int MPI_Iscatter_c(const void *a, MPI_Count b, MPI_Datatype c, void *d, MPI_Count e, MPI_Datatype f, int g, MPI_Comm h,
                   MPI_Request *r) { C(ISCATTER); return PMPI_Iscatter_c(a, b, c, d, e, f, g, h, r); }
int MPI_Iscatterv_c(const void *a, CC b, CA c, MPI_Datatype d, void *e, MPI_Count f, MPI_Datatype g, int h, MPI_Comm i,
                    MPI_Request *r) { C(ISCATTERV); return PMPI_Iscatterv_c(a, b, c, d, e, f, g, h, i, r); }
int MPI_Send_c(const void *a, MPI_Count b, MPI_Datatype c, int d, int e, MPI_Comm f)
{ C(SEND); return PMPI_Send_c(a, b, c, d, e, f); }
int MPI_Recv_c(void *a, MPI_Count b, MPI_Datatype c, int d, int e, MPI_Comm f, MPI_Status *g)
{ C(RECV); return PMPI_Recv_c(a, b, c, d, e, f, g); }
int MPI_Isend_c(const void *a, MPI_Count b, MPI_Datatype c, int d, int e, MPI_Comm f, MPI_Request *r)
{ C(ISEND); return PMPI_Isend_c(a, b, c, d, e, f, r); }
int MPI_Irecv_c(void *a, MPI_Count b, MPI_Datatype c, int d, int e, MPI_Comm f, MPI_Request *r)
{ C(IRECV); return PMPI_Irecv_c(a, b, c, d, e, f, r); }
