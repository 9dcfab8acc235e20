/* tools/benchmod/mpi_baseline.c: tessera-bench-mpi.so, the raw MPI baseline of `tessera bench
 * dist`: MPI_Allreduce called directly on the caller's buffer, on MPI_COMM_WORLD, once the
 * comm_mpi plugin has initialised MPI (the same libmpi: one instance per process). Loaded with
 * dlopen by that benchmark only; the tessera executable links no MPI. */
#include <mpi.h>
#include <stdlib.h>

int tsb_mpi_ready(void);
int tsb_mpi_allreduce_f32(float *buf, long count);
int tsb_mpi_reduce_scatter_f32(const float *send, float *recv, long count);
int tsb_mpi_allgather(const void *send, void *recv, long nbytes);
int tsb_mpi_hier_allreduce_f32(float *buf, long count, int per_node);

__attribute__((visibility("default"))) int tsb_mpi_ready(void)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    return inited && !finalized;
}

/* buf (count floats) = its sum over the ranks, in place; counts above 2^30 in chunks, as the
 * plugin does. 0 on success. */
__attribute__((visibility("default"))) int tsb_mpi_allreduce_f32(float *buf, long count)
{
    const long chunk = 1L << 30;
    for (long at = 0; at < count; at += chunk) {
        long n = count - at < chunk ? count - at : chunk;
        if (MPI_Allreduce(MPI_IN_PLACE, buf + at, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) !=
            MPI_SUCCESS)
            return -1;
    }
    return 0;
}

/* recv (count floats) = the sum over the ranks of this rank's chunk of send (size x count):
 * MPI_Reduce_scatter_block. 0 on success. */
__attribute__((visibility("default"))) int tsb_mpi_reduce_scatter_f32(const float *send,
                                                                      float *recv, long count)
{
    return MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD) == MPI_SUCCESS
               ? 0
               : -1;
}

/* recv (size x nbytes) = every rank's send: MPI_Allgather. 0 on success. */
__attribute__((visibility("default"))) int tsb_mpi_allgather(const void *send, void *recv,
                                                             long nbytes)
{
    return MPI_Allgather(send, (int)nbytes, MPI_BYTE, recv, (int)nbytes, MPI_BYTE,
                         MPI_COMM_WORLD) == MPI_SUCCESS
               ? 0
               : -1;
}

/* The hierarchical all-reduce written with raw MPI calls, the algorithm tessera's runs with
 * [dist] hierarchical (machines of per_node consecutive ranks): MPI_Reduce_scatter_block within
 * each machine, MPI_Allreduce of each shard across the machines, MPI_Allgather within; the
 * tail past the last whole shard by one MPI_Allreduce. The communicators are split once and
 * the shard's buffer kept, as tessera does. buf: count floats (counts below 2^31). 0 on
 * success. */
__attribute__((visibility("default"))) int tsb_mpi_hier_allreduce_f32(float *buf, long count,
                                                                      int per_node)
{
    static MPI_Comm local = MPI_COMM_NULL, rail = MPI_COMM_NULL;
    static int made_for;
    static float *scratch;
    static long scratch_n;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (per_node < 1)
        return -1;
    if (local == MPI_COMM_NULL || made_for != per_node) {
        if (local != MPI_COMM_NULL)
            MPI_Comm_free(&local), MPI_Comm_free(&rail);
        if (MPI_Comm_split(MPI_COMM_WORLD, rank / per_node, rank, &local) != MPI_SUCCESS ||
            MPI_Comm_split(MPI_COMM_WORLD, rank % per_node, rank, &rail) != MPI_SUCCESS)
            return -1;
        made_for = per_node;
    }
    const long per = count / per_node;
    if (per > scratch_n) {
        float *nb = realloc(scratch, sizeof *scratch * (size_t)per);
        if (!nb)
            return -1;
        scratch = nb;
        scratch_n = per;
    }
    if (per && (MPI_Reduce_scatter_block(buf, scratch, (int)per, MPI_FLOAT, MPI_SUM, local) !=
                    MPI_SUCCESS ||
                MPI_Allreduce(MPI_IN_PLACE, scratch, (int)per, MPI_FLOAT, MPI_SUM, rail) !=
                    MPI_SUCCESS ||
                MPI_Allgather(scratch, (int)per, MPI_FLOAT, buf, (int)per, MPI_FLOAT, local) !=
                    MPI_SUCCESS))
        return -1;
    if (count > per * per_node &&
        MPI_Allreduce(MPI_IN_PLACE, buf + per * per_node, (int)(count - per * per_node),
                      MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        return -1;
    return 0;
}
