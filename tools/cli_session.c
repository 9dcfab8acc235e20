/* tools/cli_session.c: what every training command starts and stops around its loop: the
 * core, the distributed job, the stop signals, the memory trace and the device. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

int cli_session_begin(cli_session *ss, const char *config, const char *device, const char *save,
                      const char *memtrace, const char *memplot, const char *const keep[3])
{
    ts_status s = ts_init(config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    /* Under mpirun (or with [dist] backend), one rank of several: each takes its part of
     * every batch; rank 0 alone prints and saves. */
    if ((s = ts_dist_init(NULL))) {
        cli_fail(s, "cannot join the distributed job");
        ts_shutdown();
        return 1;
    }
    ss->rank = ts_dist_rank();
    ss->world = ts_dist_size();
    ss->memplot = memplot;
    ss->trace[0] = 0;
    int rc = 1;
    cli_stop_signals_install();
    if (ss->rank != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "tessera: error: rank %d: cannot silence stdout\n", ss->rank);
        goto fail;
    }
    /* a --save path that cannot be written is refused now, not after the first epoch */
    if (save && ss->rank == 0 && (s = ts_checkpoint_check_path(save))) {
        cli_fail(s, "--save");
        if (ss->world > 1) /* the other ranks go on into collectives: end the job */
            ts_dist_abort(1, "rank 0: --save: %s", ts_last_error());
        goto fail;
    }
    if ((rc = cli_memtrace_begin(ss->trace, sizeof ss->trace, memtrace, memplot, keep, ss->rank,
                                 ss->world)))
        goto fail;
    rc = 1;
    /* a device-buffer backend (NCCL) trains on its own device unless told otherwise */
    ss->dev = ts_dist_device() ? ts_dist_device() : ts_default_device();
    if (device && (s = ts_device_get(device, &ss->dev))) {
        cli_fail(s, "--device");
        goto fail;
    }
    return 0;
fail:
    return cli_session_end(ss, rc, NULL);
}

int cli_session_refuse_differing(cli_session *ss, int differ)
{
    if (differ > 0) {
        ts_dist_barrier(); /* every rank has printed its refusal */
        ts_dist_shutdown();
        ss->world = 1; /* each rank stops on its own: none waits in a collective */
    }
    return differ;
}

int cli_session_end(cli_session *ss, int rc, const cli_common *common)
{
    if (cli_memtrace_end(ss->trace, ss->memplot,
                         common && (rc == 0 || ss->stopped) && ss->rank == 0, common) &&
        rc == 0)
        rc = 1;
    ss->trace[0] = 0;
    /* the other ranks would wait for this one in a collective; a signal stops every rank
     * after the same step, cleanly */
    if (rc && ss->world > 1 && !ss->stopped)
        ts_dist_abort(rc, "rank %d of %d stopped: %s", ss->rank, ss->world,
                      ts_last_error()[0] ? ts_last_error() : "see its error above");
    ts_dist_shutdown();
    ts_shutdown();
    return rc;
}

const char *cli_sharded_text(const ts_optim *opt, int world, char *buf, size_t len)
{
    if (!ts_optim_sharded(opt))
        return "";
    snprintf(buf, len, "; the optimizer's state sharded over them, 1/%d on each ([dist] "
             "shard_optimizer)", world);
    return buf;
}

static void pool_stats(ts_device *dev, ts_memory_stats *st)
{
    memset(st, 0, sizeof *st);
    st->struct_size = sizeof *st;
    ts_device_memory_stats(dev, st);
}

const char *cli_pool_summary(ts_device *dev, char *buf, size_t len)
{
    ts_memory_stats st;
    pool_stats(dev, &st);
    char b1[32], b2[32], hits[64] = "";
    double h = ts_memory_hit_rate(&st);
    if (h >= 0)
        snprintf(hits, sizeof hits, "; cache hits %.2f%% of %llu allocations", 100 * h,
                 (unsigned long long)(st.cache_hits + st.cache_misses));
    snprintf(buf, len, "pool: peak in use %s, reserved %s%s; fragmentation %.0f%%",
             cli_bytes(st.peak_in_use, b1, sizeof b1), cli_bytes(st.reserved, b2, sizeof b2),
             hits, 100 * ts_memory_fragmentation(&st));
    return buf;
}

void cli_pool_record(ts_device *dev, cJSON *j)
{
    ts_memory_stats st;
    pool_stats(dev, &st);
    cJSON_AddNumberToObject(j, "pool_peak_in_use", (double)st.peak_in_use);
    cJSON_AddNumberToObject(j, "pool_reserved", (double)st.reserved);
    double h = ts_memory_hit_rate(&st);
    if (h >= 0)
        cJSON_AddNumberToObject(j, "pool_hit_rate", h);
    else
        cJSON_AddNullToObject(j, "pool_hit_rate");
    cJSON_AddNumberToObject(j, "pool_fragmentation", ts_memory_fragmentation(&st));
}
