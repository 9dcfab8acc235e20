/* tools/benchmod/benchmod.h: the benchmark module, tessera-bench.so: what only `tessera bench`
 * needs and a user's `tessera train` must not carry. The host heap and thread-creation
 * counters interpose malloc and pthread_create, so the module is preloaded (LD_PRELOAD) into a
 * bench run, never linked into the tessera executable; the raw BLAS baseline links OpenBLAS,
 * which the executable does not. The executable finds these entry points with dlsym
 * (tools/bench_hooks.c); every one is optional there. */
#ifndef TESSERA_TOOLS_BENCHMOD_H
#define TESSERA_TOOLS_BENCHMOD_H

#include <stdint.h>

#define TSB_EXPORT __attribute__((visibility("default")))

/* malloc_count.c: host allocation counters: all calls, and those from the code of libtessera
 * or of the plugins at plugin_paths. Setup finds that code and zeroes the counters (counting
 * off); it returns 0 when counting is unavailable (sanitizer builds) or libtessera was not
 * found. Enable turns counting on (1) or off (0); read reads the counters. */
TSB_EXPORT int tsb_malloc_count_setup(const char *const *plugin_paths, int npaths);
TSB_EXPORT void tsb_malloc_count_enable(int on);
TSB_EXPORT void tsb_malloc_count_read(uint64_t *tessera, uint64_t *all);
/* thread_count.c: *created = threads the process has created so far (every pthread_create,
 * by any library); 0 when counting is unavailable (sanitizer builds), 1 otherwise. */
TSB_EXPORT int tsb_thread_count_read(uint64_t *created);
/* blas.c: C = op(A) op(B) in float32, row-major (cblas_sgemm, alpha 1, beta 0), on threads
 * threads (OpenBLAS's own count). Returns 0 when the module was built without a BLAS. */
TSB_EXPORT int tsb_sgemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc, int threads);

#endif /* TESSERA_TOOLS_BENCHMOD_H */
