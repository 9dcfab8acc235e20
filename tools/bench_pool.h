/* tools/bench_pool.h: `tessera bench pool`, the caching pool against malloc. */
#ifndef TESSERA_TOOLS_BENCH_POOL_H
#define TESSERA_TOOLS_BENCH_POOL_H

/* Times alloc+free pairs of a training-like size mix through a device's caching pool (the
 * host's pool over a host-memory plugin's raw memory) and through malloc/free, and prints ns per pair, the speedup, raw
 * allocations per 1000 pairs in steady state and peak reserved over peak in use.
 * argv[0] is the subcommand's name; options: --pairs N, --working-set N, --seed N,
 * --cache-limit BYTES, --json. Returns 0, 1 on failure, 2 on misuse. */
typedef struct cli_common cli_common;
int cli_bench_pool(int argc, char **argv, const cli_common *common);

#endif /* TESSERA_TOOLS_BENCH_POOL_H */
