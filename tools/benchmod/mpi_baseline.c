/* tools/benchmod/mpi_baseline.c: tessera-bench-mpi.so, the raw MPI baseline of `tessera bench
 * dist`: MPI_Allreduce called directly on the caller's buffer, on MPI_COMM_WORLD, once the
 * comm_mpi plugin has initialised MPI (the same libmpi: one instance per process). Loaded with
 * dlopen by that benchmark only; the tessera executable links no MPI. */
#include <mpi.h>

int tsb_mpi_ready(void);
int tsb_mpi_allreduce_f32(float *buf, long count);

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
