/* tools/benchmod/mpi_baseline.c: tessera-bench-mpi.so, the raw MPI baseline of `tessera bench
 * dist`: MPI_Allreduce called directly on the caller's buffer, on MPI_COMM_WORLD, once the
 * comm_mpi plugin has initialised MPI (the same libmpi: one instance per process). Loaded with
 * dlopen by that benchmark only; the tessera executable links no MPI. */
#include <mpi.h>

int tsb_mpi_ready(void);
int tsb_mpi_allreduce_f32(float *buf, long count);
int tsb_mpi_reduce_scatter_f32(const float *send, float *recv, long count);
int tsb_mpi_allgather(const void *send, void *recv, long nbytes);

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
