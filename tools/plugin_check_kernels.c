/* tools/plugin_check_kernels.c: the kernel suites of `tessera plugin-check`: every claimed
 * (op, dtype) at its cases in five layouts against the float64 reference, the error paths,
 * and the claimed kernels run from several threads at once. The cases and their runner are
 * the kernel-case table's (kernel_cases.h), which the kernel tests of make check run too. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernel_cases.h"
#include "plugin_check.h"

/* One case with the checker's seed for (op, layout). */
static int run_case(checker *c, const kcase *k, oph_layout l, char *why, size_t whylen)
{
    return kc_run(c->dev, k, l, c->seed ^ ((uint64_t)k->op << 32) ^ (uint64_t)l, why, whylen);
}

void pc_check_kernels(checker *c)
{
    int claimed = 0;
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++)
        for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            claimed++;
            char name[96];
            snprintf(name, sizeof name, "kernel: %s %s", ts_op_name(op), ts_dtype_name(dt));
            caselist l = {0};
            kc_build(c->dev, op, dt, &l);
            int passed = 0, skipped = 0, failed = 0, declined = 0;
            char why[512] = "";
            for (int i = 0; i < l.n && !failed; i++)
                for (int lay = 0; lay < OPH_NLAYOUTS && !failed; lay++) {
                    char w[512] = "";
                    int r = run_case(c, &l.v[i], (oph_layout)lay, w, sizeof w);
                    if (c->verbose)
                        printf("      %s, %s: %s\n", l.v[i].what, oph_layout_name(lay),
                               r == 2   ? "declined (the host's reference kernels run it)"
                               : r > 0  ? "ok"
                               : r == 0 ? w
                                        : "reference does not do it");
                    if (r == 2)
                        declined++;
                    else if (r > 0)
                        passed++;
                    else if (r < 0)
                        skipped++;
                    else {
                        failed++;
                        snprintf(why, sizeof why, "%s (%s layout)", w, oph_layout_name(lay));
                    }
                }
            free(l.v);
            c->kernel_failed[op][dt] = failed > 0;
            if (failed)
                pc_report(c, 0, name, "%s", why);
            else if (passed == 0 && declined)
                pc_report(c, -1, name, "declines all %d cases: the host runs them on its "
                          "reference kernels, so the claim does nothing", declined);
            else if (passed == 0)
                pc_report(c, -1, name, "no case this suite knows for it (%d combinations the "
                          "reference does not do)", skipped);
            else if (declined)
                pc_report(c, 1, name, "%d cases agree with the reference; %d declined (the "
                          "host runs them on its reference kernels)", passed, declined);
            else
                pc_report(c, 1, name, "%d cases agree with the reference", passed);
        }
    if (!claimed)
        pc_report(c, -1, "kernels", "the plugin claims none%s",
                  (TS_HAS_MEMBER(ts_device_desc(c->dev), ts_plugin_desc, flags) &&
                (ts_device_desc(c->dev)->flags & TS_PLUGIN_HOST_MEMORY))
                   ? " (the core runs its reference kernels on its host memory)"
                   : "");
}

/* ---- error paths ----------------------------------------------------------------------- */

/* Runs a bad call; it must fail with a status and a message (and not crash). */
static void expect_error(checker *c, const char *name, const kcase *k)
{
    char why[256];
    kc_buf in[KC_MAX_IN], out[KC_MAX_OUT];
    int nin = 0, nout = 0;
    uint64_t rng = c->seed;
    ts_status s = TS_OK;
    for (; nin < k->nin && !s; nin++)
        s = kc_make_buf(c->dev, &k->in[nin], OPH_CONTIG, &rng, &in[nin]);
    for (; nout < k->nout && !s; nout++)
        s = kc_make_buf(c->dev, &k->out[nout], OPH_CONTIG, &rng, &out[nout]);
    if (s) {
        snprintf(why, sizeof why, "setting up: %s", pc_err());
        pc_report(c, 0, name, "%s", why);
    } else {
        ts_operand din[KC_MAX_IN], dout[KC_MAX_OUT];
        for (int i = 0; i < nin; i++)
            din[i] = in[i].op, din[i].data = in[i].dptr;
        for (int i = 0; i < nout; i++)
            dout[i] = out[i].op, dout[i].data = out[i].dptr;
        ts_kernel_call call = {.struct_size = sizeof call, .op = k->op, .ninputs = k->nin,
                               .noutputs = k->nout, .inputs = din, .outputs = dout,
                               .params = k->params_size ? k->params : NULL,
                               .params_size = k->params_size};
        ts_clear_error();
        s = ts_device_run(c->dev, &call);
        if (!s)
            s = ts_device_synchronize(c->dev);
        pc_report(c, s != TS_OK && ts_last_error()[0], name, "%s: %s", ts_status_name(s),
                  s ? pc_err() : "the bad call succeeded");
    }
    for (int i = 0; i < nin; i++)
        kc_free_buf(c->dev, &in[i]);
    for (int i = 0; i < nout; i++)
        kc_free_buf(c->dev, &out[i]);
}

void pc_check_errors(checker *c)
{
    int any = 0;
    int64_t n5[2] = {5, 4}, n3 = 3, n4 = 4;
    for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
        for (int add = 0; add < 2; add++) { /* index_select (5,4)->(3,4), index_add back */
            int32_t op = add ? TS_OP_INDEX_ADD : TS_OP_INDEX_SELECT;
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            kcase k = {.op = op, .nin = 2, .nout = 1};
            int64_t n34[2] = {3, 4};
            k.in[0] = kc_spec(dt, 2, add ? n34 : n5);
            k.in[1] = kc_spec(TS_I64, 1, &n3);
            k.in[1].v = V_BADINDEX;
            k.in[1].range = 5;
            k.out[0] = kc_spec(dt, 2, add ? n5 : n34);
            ts_dim_params p = {0};
            kc_set_params(&k, &p, sizeof p);
            char name[96];
            snprintf(name, sizeof name, "errors: %s %s with an index out of range",
                     add ? "index_add" : "index_select", ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
        for (int bwd = 0; bwd < 2; bwd++) {
            int32_t op = bwd ? TS_OP_CROSS_ENTROPY_BWD : TS_OP_CROSS_ENTROPY;
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            kcase k = {.op = op, .nin = bwd ? 3 : 2, .nout = 1};
            k.in[0] = kc_spec(dt, 2, n5);
            k.in[1] = kc_spec(TS_I64, 1, n5);
            k.in[1].v = V_BADINDEX;
            k.in[1].range = 4;
            k.in[2] = kc_spec(dt, 1, n5);
            k.out[0] = bwd ? kc_spec(dt, 2, n5) : kc_spec(dt, 1, n5);
            char name[96];
            snprintf(name, sizeof name, "errors: %s %s with a target out of range",
                     ts_op_name(op), ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
        if ((dt == TS_I32 || dt == TS_I64) && ts_device_supports(c->dev, TS_OP_BINARY, dt)) {
            kcase k = {.op = TS_OP_BINARY, .nin = 2, .nout = 1};
            k.in[0] = k.out[0] = kc_spec(dt, 1, &n4);
            k.in[1] = kc_spec(dt, 1, &n4);
            k.in[1].v = V_INDEX; /* values in [0, 1): all zero */
            k.in[1].range = 1;
            ts_binary_params p = {TS_BINARY_DIV};
            kc_set_params(&k, &p, sizeof p);
            char name[96];
            snprintf(name, sizeof name, "errors: integer division by zero (%s)",
                     ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
        if (kc_is_float(dt) && ts_device_supports(c->dev, TS_OP_CONV2D, dt)) {
            kcase k = {.op = TS_OP_CONV2D, .nin = 2, .nout = 1};
            int64_t x[4] = {1, 2, 5, 5}, w[4] = {3, 2, 3, 3}, y[4] = {1, 3, 3, 3};
            k.in[0] = kc_spec(dt, 4, x);
            k.in[1] = kc_spec(dt, 4, w);
            k.out[0] = kc_spec(dt, 4, y);
            char name[96];
            snprintf(name, sizeof name, "errors: conv2d %s without its params",
                     ts_dtype_name(dt));
            expect_error(c, name, &k);
            any = 1;
        }
    }
    /* Every claimed op, called with no operands at all: an error, not a crash. */
    int nbad = 0, nclaimed = 0;
    char first_bad[160] = "";
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++) {
        int32_t dt = 0;
        while (dt < TS_DTYPE_COUNT && !ts_device_supports(c->dev, op, dt))
            dt++;
        if (dt == TS_DTYPE_COUNT)
            continue;
        nclaimed++;
        ts_operand none[1];
        memset(none, 0, sizeof none);
        ts_kernel_call call = {.struct_size = sizeof call, .op = op, .inputs = none,
                               .outputs = none};
        ts_clear_error();
        ts_status s = ts_device_run(c->dev, &call);
        if (s == TS_OK || !ts_last_error()[0]) {
            if (!nbad++)
                snprintf(first_bad, sizeof first_bad, "%s returned %s%s", ts_op_name(op),
                         ts_status_name(s), s ? " without a message" : "");
        }
    }
    if (nclaimed) {
        if (nbad)
            pc_report(c, 0, "errors: every claimed op refuses a call without operands",
                      "%s (and %d more)", first_bad, nbad - 1);
        else
            pc_report(c, 1, "errors: every claimed op refuses a call without operands", "%d ops",
                      nclaimed);
        any = 1;
    }
    if (!any)
        pc_report(c, -1, "errors: kernel argument checks", "the plugin claims no kernel with a "
                  "documented error (index, target, integer division, conv params)");
}

/* ---- concurrent run calls --------------------------------------------------------------- */

#define TH_THREADS 4    /* threads running kernels at once */
#define TH_PER_OP 6     /* cases per claimed (op, dtype), spread over its list */
#define TH_REPS 8       /* runs of each case per thread, back to back, layouts in turn */
#define TH_DEADLINE 120 /* seconds for all of it (well under a second for the shipped plugins) */

/* Threads that have finished, for the deadline. */
typedef struct th_done {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n;
} th_done;

typedef struct th_job {
    checker *c;
    th_done *done;
    const kcase *cases;
    int ncases;
    unsigned id;
    int runs, declined, failed;
    char why[600];
} th_job;

/* Every thread runs the same cases in the same order, so that they run the same kernel at
 * the same time, each on its own buffers and its own values (its own seed): a plugin that
 * keeps per-call state in shared memory (a static or per-context scratch buffer, a cached
 * object whose fields a call sets) hands one thread's result to another. */
static void *th_run(void *arg)
{
    th_job *j = arg;
    for (int i = 0; i < j->ncases && !j->failed; i++)
        for (int r = 0; r < TH_REPS && !j->failed; r++) {
            uint64_t seed = j->c->seed ^ (0x9e3779b97f4a7c15ull * (j->id + 1)) ^
                            ((uint64_t)(i * TH_REPS + r) << 40);
            oph_layout l = (oph_layout)(r % OPH_NLAYOUTS);
            char w[512] = "";
            int res = kc_run(j->c->dev, &j->cases[i], l, seed, w, sizeof w);
            if (res == 0) {
                j->failed = 1;
                snprintf(j->why, sizeof j->why, "thread %u: %s (%s layout)", j->id, w,
                         oph_layout_name(l));
            } else if (res == 2) {
                j->declined++;
            } else if (res > 0) {
                j->runs++;
            }
        }
    pthread_mutex_lock(&j->done->lock);
    j->done->n++;
    pthread_cond_signal(&j->done->cond);
    pthread_mutex_unlock(&j->done->lock);
    return NULL;
}

void pc_check_threads(checker *c)
{
    const char *name = "threads: concurrent run calls";
    caselist all = {0};
    int nops = 0, nbad = 0;
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++)
        for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
            if (!ts_device_supports(c->dev, op, dt))
                continue;
            if (c->kernel_failed[op][dt]) { /* wrong alone already: reported above */
                nbad++;
                continue;
            }
            caselist l = {0};
            kc_build(c->dev, op, dt, &l);
            int take = l.n < TH_PER_OP ? l.n : TH_PER_OP;
            for (int t = 0; t < take; t++)
                *kc_add(&all, op, "-") = l.v[(size_t)t * (size_t)l.n / (size_t)take];
            nops += take > 0;
            free(l.v);
        }
    if (all.n == 0) {
        free(all.v);
        pc_report(c, -1, name,
                  nbad ? "every claimed kernel failed its kernel check"
                    : "the plugin claims no kernel");
        return;
    }
    th_job jobs[TH_THREADS];
    pthread_t t[TH_THREADS];
    th_done done = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    int started = 0, err_no = 0, timed_out = 0, ndone;
    for (unsigned i = 0; i < TH_THREADS; i++) {
        jobs[i] = (th_job){.c = c, .done = &done, .cases = all.v, .ncases = all.n, .id = i};
        if ((err_no = pthread_create(&t[i], NULL, th_run, &jobs[i])) != 0)
            break;
        started++;
    }
    /* A plugin that deadlocks or spins under concurrent calls must not hang the suite. */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += TH_DEADLINE;
    pthread_mutex_lock(&done.lock);
    while (done.n < started && !timed_out)
        timed_out = pthread_cond_timedwait(&done.cond, &done.lock, &deadline) == ETIMEDOUT;
    ndone = done.n;
    pthread_mutex_unlock(&done.lock);
    if (timed_out) {
        /* The threads are stuck inside the plugin: nothing can be unloaded or freed safely. */
        pc_report(c, 0, name,
                  "%d of %d threads still running after %d s (one thread takes well under a "
                  "second): a deadlock or a corrupted state under concurrent run calls "
                  "(docs/writing-a-plugin.md, Threading)",
                  started - ndone, started, TH_DEADLINE);
        printf("plugin-check %s: %d passed, %d failed, %d skipped\n", ts_device_name(c->dev),
               c->npass, c->nfail, c->nskip);
        fflush(stdout);
        _exit(1);
    }
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    int ncases = all.n;
    free(all.v);
    if (started < TH_THREADS) {
        pc_report(c, 0, name, "could not start thread %d: %s", started, strerror(err_no));
        return;
    }
    int runs = 0, declined = 0;
    for (int i = 0; i < TH_THREADS; i++) {
        if (jobs[i].failed) {
            pc_report(c, 0, name,
                      "%s; while other threads ran the same kernel on other buffers (alone the "
                      "case agrees, see the kernel checks): keep per-call state on the stack or in "
                      "pool scratch and guard shared state (docs/writing-a-plugin.md, Threading)",
                      jobs[i].why);
            return;
        }
        runs += jobs[i].runs;
        declined += jobs[i].declined;
    }
    char dec[96] = "";
    if (declined)
        snprintf(dec, sizeof dec, " (%d calls declined, for the reference kernels)", declined);
    pc_report(c, runs > 0 ? 1 : -1, name,
              "%d threads ran %d cases of %d claimed kernels %d times each at once; all %d "
              "results agree with the reference%s%s",
              TH_THREADS, ncases, nops, TH_REPS, runs, dec,
              nbad ? " (kernels that failed their kernel check left out)" : "");
}

/* ---- a short training run -------------------------------------------------------------- */

