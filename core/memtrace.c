/* core/memtrace.c: the observers of core/pool.c: the event hook, debug-mode sequence
 * numbers, the Chrome Trace Event writer (buffered; the file is kept valid JSON at every
 * flush by writing the closing "]}" and seeking back over it) and the leak report. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "memtrace.h"

#define TRACE_BUF (64 * 1024)
#define TRACE_EVENT_MAX 512 /* an event never takes more than this */

static const char trace_tail[] = "\n]}\n";

atomic_uint ts__mem_hooks;
static atomic_uint_fast64_t mem_seq = 1;
static _Atomic(ts_memory_event_fn) cb_fn;
static _Atomic(void *) cb_user;

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_file;
static char *trace_buf;
static size_t trace_len;
static uint64_t trace_events;
static struct timespec trace_t0;
static int trace_pid;
static unsigned trace_gen; /* which trace is open: a thread names its track once in each */

/* Each thread's kernel track: tid 2, 3, ... in the order threads first write to a trace. */
static atomic_int next_tid = 2;
static _Thread_local int my_tid;
static _Thread_local unsigned my_gen;

/* ---- hooks ------------------------------------------------------------------------------ */

TS_API void ts_memory_set_callback(ts_memory_event_fn fn, void *user)
{
    atomic_store(&cb_user, user);
    atomic_store(&cb_fn, fn);
    if (fn)
        atomic_fetch_or(&ts__mem_hooks, TS__MEM_CALLBACK);
    else
        atomic_fetch_and(&ts__mem_hooks, ~TS__MEM_CALLBACK);
}

void ts__mem_dispatch(const ts_memory_event *ev)
{
    ts_memory_event_fn fn = atomic_load(&cb_fn);
    if (fn)
        fn(ev, atomic_load(&cb_user));
}

TS_API int ts_memory_debug(int on)
{
    unsigned old = on ? atomic_fetch_or(&ts__mem_hooks, TS__MEM_DEBUG)
                      : atomic_fetch_and(&ts__mem_hooks, ~TS__MEM_DEBUG);
    return (old & TS__MEM_DEBUG) != 0;
}

TS_API uint64_t ts_memory_mark(void)
{
    return atomic_load(&mem_seq);
}

uint64_t ts__mem_next_seq(void)
{
    return atomic_fetch_add(&mem_seq, 1) + 1;
}

/* ---- the trace -------------------------------------------------------------------------- */

/* Writes the buffer, then the closing tail, and seeks back over the tail so that the next
 * write replaces it. Called with trace_lock held. */
static void trace_flush_locked(void)
{
    if (!trace_file)
        return;
    if (trace_len)
        fwrite(trace_buf, 1, trace_len, trace_file);
    trace_len = 0;
    fputs(trace_tail, trace_file);
    fflush(trace_file);
    fseek(trace_file, -(long)(sizeof trace_tail - 1), SEEK_CUR);
}

static double trace_now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - trace_t0.tv_sec) * 1e6 + (double)(t.tv_nsec - trace_t0.tv_nsec) / 1e3;
}

/* Copies s into a JSON string body (without quotes), truncating at 64 characters. */
static const char *json_name(char out[128], const char *s)
{
    size_t n = 0;
    for (; *s && n < 64; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c >= 0x20 && c < 0x7f) {
            out[n++] = (char)c;
        } else {
            out[n++] = '?';
        }
    }
    out[n] = '\0';
    return out;
}

/* Room for one more event, with its separator written. Called with trace_lock held;
 * returns where to write, or NULL when no trace is open. */
static char *trace_reserve(void)
{
    if (!trace_file)
        return NULL;
    if (trace_len + TRACE_EVENT_MAX > TRACE_BUF)
        trace_flush_locked();
    if (trace_events++)
        trace_buf[trace_len++] = ',';
    trace_buf[trace_len++] = '\n';
    return trace_buf + trace_len;
}

void ts__memtrace_counter(const char *pool, uint64_t in_use, uint64_t reserved,
                          uint64_t cached)
{
    char name[128];
    pthread_mutex_lock(&trace_lock);
    char *w = trace_reserve();
    if (w) {
        int n = snprintf(w, TRACE_EVENT_MAX,
                         "{\"name\":\"pool %s\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,\"tid\":0,"
                         "\"args\":{\"in_use\":%llu,\"reserved\":%llu,\"cached\":%llu}}",
                         json_name(name, pool), trace_now_us(), trace_pid,
                         (unsigned long long)in_use, (unsigned long long)reserved,
                         (unsigned long long)cached);
        trace_len += (size_t)n;
    }
    pthread_mutex_unlock(&trace_lock);
}

void ts__memtrace_roles(const char *pool, const uint64_t *b)
{
    char name[128];
    pthread_mutex_lock(&trace_lock);
    char *w = trace_reserve();
    if (w) {
        int n = snprintf(w, TRACE_EVENT_MAX,
                         "{\"name\":\"roles %s\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,\"tid\":0,"
                         "\"args\":{\"parameter\":%llu,\"gradient\":%llu,\"optimizer\":%llu,"
                         "\"activation\":%llu,\"data\":%llu,\"other\":%llu}}",
                         json_name(name, pool), trace_now_us(), trace_pid,
                         (unsigned long long)b[TS_ROLE_PARAMETER],
                         (unsigned long long)b[TS_ROLE_GRADIENT],
                         (unsigned long long)b[TS_ROLE_OPTIMIZER],
                         (unsigned long long)b[TS_ROLE_ACTIVATION],
                         (unsigned long long)b[TS_ROLE_DATA], (unsigned long long)b[TS_ROLE_OTHER]);
        trace_len += (size_t)n;
    }
    pthread_mutex_unlock(&trace_lock);
}

void ts__memtrace_oom(const char *pool, uint64_t nbytes)
{
    char name[128];
    pthread_mutex_lock(&trace_lock);
    char *w = trace_reserve();
    if (w) {
        int n = snprintf(w, TRACE_EVENT_MAX,
                         "{\"name\":\"out of memory in pool %s\",\"ph\":\"i\",\"s\":\"p\","
                         "\"ts\":%.3f,\"pid\":%d,\"tid\":0,\"args\":{\"requested\":%llu}}",
                         json_name(name, pool), trace_now_us(), trace_pid,
                         (unsigned long long)nbytes);
        trace_len += (size_t)n;
    }
    pthread_mutex_unlock(&trace_lock);
}

/* The calling thread's kernel track, named in the trace the first time it is used there.
 * Called with trace_lock held and a trace open. */
static int kernel_tid_locked(void)
{
    if (!my_tid)
        my_tid = atomic_fetch_add(&next_tid, 1);
    if (my_gen != trace_gen) {
        my_gen = trace_gen;
        char *w = trace_reserve();
        trace_len += (size_t)snprintf(w, TRACE_EVENT_MAX,
                                      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,"
                                      "\"tid\":%d,\"args\":{\"name\":\"kernels (thread %d)\"}}",
                                      trace_pid, my_tid, my_tid - 1);
    }
    return my_tid;
}

/* Trace microseconds of a ts__profile_begin stamp (monotonic nanoseconds + 1). */
static double stamp_us(uint64_t stamp)
{
    int64_t t0 = (int64_t)trace_t0.tv_sec * 1000000000 + trace_t0.tv_nsec;
    return (double)((int64_t)(stamp - 1) - t0) / 1e3;
}

void ts__memtrace_kernel(const char *name, uint64_t t0, uint64_t t1, const ts_operand *out)
{
    char nm[128], dims[256] = "";
    if (out && out->ndim >= 0 && out->ndim <= TS_MAX_DIMS)
        ts__shape_str(out->ndim, out->shape, dims, sizeof dims);
    pthread_mutex_lock(&trace_lock);
    if (trace_file && t0 && t1 >= t0) {
        int tid = kernel_tid_locked();
        char *w = trace_reserve();
        trace_len += (size_t)snprintf(
            w, TRACE_EVENT_MAX,
            "{\"name\":\"%s\",\"cat\":\"kernel\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
            "\"pid\":%d,\"tid\":%d,\"args\":{\"dtype\":\"%s\",\"shape\":\"%s\"}}",
            json_name(nm, name ? name : "?"), stamp_us(t0), (double)(t1 - t0) / 1e3, trace_pid,
            tid, out ? ts_dtype_name(out->dtype) : "bytes", dims);
    }
    pthread_mutex_unlock(&trace_lock);
}

TS_API void ts_memtrace_step(int64_t step)
{
    if (!(atomic_load_explicit(&ts__mem_hooks, memory_order_relaxed) & TS__MEM_TRACE))
        return;
    pthread_mutex_lock(&trace_lock);
    char *w = trace_reserve();
    if (w)
        trace_len += (size_t)snprintf(w, TRACE_EVENT_MAX,
                                      "{\"name\":\"step\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,"
                                      "\"tid\":1,\"args\":{\"step\":%lld}}",
                                      trace_now_us(), trace_pid, (long long)step);
    pthread_mutex_unlock(&trace_lock);
}

TS_API void ts_memtrace_marker(const char *name, int phase)
{
    char nm[128];
    if (!name || phase < -2 || phase > 2)
        return;
    pthread_mutex_lock(&trace_lock);
    if (trace_file && (phase == 2 || phase == -2)) {
        int tid = kernel_tid_locked();
        char *w = trace_reserve();
        trace_len += (size_t)snprintf(w, TRACE_EVENT_MAX,
                                      "{\"name\":\"%s\",\"ph\":\"%s\",\"ts\":%.3f,\"pid\":%d,"
                                      "\"tid\":%d}",
                                      json_name(nm, name), phase > 0 ? "B" : "E",
                                      trace_now_us(), trace_pid, tid);
        pthread_mutex_unlock(&trace_lock);
        return;
    }
    char *w = trace_reserve();
    if (w) {
        /* phase 0: an instant across the whole trace; 1 / -1: a slice begins / ends (its own
         * track, tid 1, so that it never nests with anything else) */
        int n = phase == 0
                    ? snprintf(w, TRACE_EVENT_MAX,
                               "{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,"
                               "\"pid\":%d,\"tid\":1}",
                               json_name(nm, name), trace_now_us(), trace_pid)
                    : snprintf(w, TRACE_EVENT_MAX,
                               "{\"name\":\"%s\",\"ph\":\"%s\",\"ts\":%.3f,\"pid\":%d,"
                               "\"tid\":1}",
                               json_name(nm, name), phase > 0 ? "B" : "E", trace_now_us(),
                               trace_pid);
        trace_len += (size_t)n;
    }
    pthread_mutex_unlock(&trace_lock);
}

void ts__memtrace_flush(void)
{
    pthread_mutex_lock(&trace_lock);
    trace_flush_locked();
    pthread_mutex_unlock(&trace_lock);
}

/* ts_memtrace_start without the snapshot of existing pools, which needs the registry lock
 * (the environment's trace starts under it, before any pool exists). */
/* new_only: the path comes from the environment (TESSERA_MEMTRACE), which a root shell may
 * have kept from another user (sudo -E): it may only create a new file, never replace one. */
static ts_status trace_open(const char *path, int new_only)
{
    if (!path || !*path)
        return ts__fail(TS_EINVAL, "memtrace: no path given");
    pthread_mutex_lock(&trace_lock);
    if (trace_file) {
        pthread_mutex_unlock(&trace_lock);
        return ts__fail(TS_ESTATE, "memtrace: a trace is already being written; call "
                                   "ts_memtrace_stop first");
    }
    char *buf = ts__malloc(TRACE_BUF);
    if (!buf) {
        pthread_mutex_unlock(&trace_lock);
        return ts__fail(TS_ENOMEM, "memtrace: out of memory");
    }
    /* Never through a symbolic link, never into a FIFO or device, never another user's file
     * (a planted name in a shared directory must not redirect or take over a root process's
     * writes): a new file of the caller's, renamed into place. */
    int fd;
    ts_status s = ts__create_output(path, "the memory trace", new_only, &fd);
    FILE *f = s ? NULL : fdopen(fd, "w");
    if (!f) {
        if (!s) {
            close(fd);
            s = ts__fail(TS_ENOMEM, "memtrace: out of memory");
        }
        free(buf);
        pthread_mutex_unlock(&trace_lock);
        return ts__fail_prefix(s, "memtrace: ");
    }
    trace_file = f;
    trace_buf = buf;
    trace_events = 0;
    trace_gen++;
    trace_pid = (int)getpid();
    clock_gettime(CLOCK_MONOTONIC, &trace_t0);
    trace_len = (size_t)snprintf(trace_buf, TRACE_BUF, "{\"displayTimeUnit\":\"ms\","
                                                       "\"traceEvents\":[");
    char *w = trace_reserve();
    trace_len += (size_t)snprintf(w, TRACE_EVENT_MAX,
                                  "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
                                  "\"tid\":0,\"args\":{\"name\":\"tessera memory\"}}",
                                  trace_pid);
    static const char *const tracks[] = {"pools", "marks"}; /* tid 0 and 1 */
    for (int i = 0; i < 2; i++) {
        w = trace_reserve();
        trace_len += (size_t)snprintf(w, TRACE_EVENT_MAX,
                                      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,"
                                      "\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                                      trace_pid, i, tracks[i]);
    }
    trace_flush_locked();
    atomic_fetch_or(&ts__mem_hooks, TS__MEM_TRACE);
    pthread_mutex_unlock(&trace_lock);
    return TS_OK;
}

TS_API ts_status ts_memtrace_start(const char *path)
{
    ts_status st = trace_open(path, 0);
    if (st == TS_OK)
        ts__pools_trace_snapshot();
    return st;
}

TS_API void ts_memtrace_stop(void)
{
    pthread_mutex_lock(&trace_lock);
    atomic_fetch_and(&ts__mem_hooks, ~TS__MEM_TRACE);
    if (trace_file) {
        trace_flush_locked();
        fclose(trace_file); /* the tail stays: the seek back did not truncate it */
        trace_file = NULL;
        free(trace_buf);
        trace_buf = NULL;
    }
    pthread_mutex_unlock(&trace_lock);
}

__attribute__((destructor)) static void memtrace_fini(void)
{
    ts_memtrace_stop();
}

void ts__memtrace_env_init(void)
{
    const char *d = ts__getenv("TESSERA_DEBUG_MEMORY");
    if (d && (!strcmp(d, "1") || !strcmp(d, "true") || !strcmp(d, "yes") || !strcmp(d, "on")))
        ts_memory_debug(1);
    const char *path = ts__getenv("TESSERA_MEMTRACE");
    if (path && *path && trace_open(path, 1) != TS_OK)
        ts__log(TS_LOG_WARN, "TESSERA_MEMTRACE: %s", ts_last_error());
}

/* ---- the leak report -------------------------------------------------------------------- */

typedef struct leak {
    char pool[64];
    const void *ptr;
    uint64_t nbytes, block_bytes, seq;
    char tag[352]; /* a copy: a debug-mode name goes with its block (op, 8 dims, dtype) */
    int has_tag;
} leak;

typedef struct leak_list {
    leak *v;
    size_t n, cap;
    int failed;
} leak_list;

static void leak_collect(const ts_memory_block_info *b, void *user)
{
    leak_list *l = user;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        leak *v = ts__realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->failed = 1;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    leak *k = &l->v[l->n++];
    snprintf(k->pool, sizeof k->pool, "%s", b->pool);
    k->ptr = b->ptr;
    k->nbytes = b->nbytes;
    k->block_bytes = b->block_bytes;
    k->seq = b->seq;
    k->has_tag = b->tag != NULL;
    snprintf(k->tag, sizeof k->tag, "%s", b->tag ? b->tag : "");
}

static int leak_cmp(const void *a, const void *b)
{
    const leak *x = a, *y = b;
    int c = strcmp(x->pool, y->pool);
    if (c)
        return c;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

TS_API ts_status ts_memory_leak_report(FILE *out, uint64_t since, uint64_t *count)
{
    if (count)
        *count = 0;
    if (!out)
        return ts__fail(TS_EINVAL, "ts_memory_leak_report: out is NULL");
    leak_list l = {0};
    ts_memory_live_blocks(since, leak_collect, &l);
    if (l.failed) {
        free(l.v);
        return ts__fail(TS_ENOMEM, "ts_memory_leak_report: out of host memory");
    }
    if (l.n)
        qsort(l.v, l.n, sizeof *l.v, leak_cmp);
    uint64_t total = 0;
    for (size_t i = 0; i < l.n; i++) {
        char sz[32];
        fprintf(out, "pool '%s': %s (%llu bytes asked) tag '%s' seq %llu at %p\n", l.v[i].pool,
                ts__fmt_bytes(sz, l.v[i].block_bytes), (unsigned long long)l.v[i].nbytes,
                l.v[i].has_tag ? l.v[i].tag : "(none)", (unsigned long long)l.v[i].seq, l.v[i].ptr);
        total += l.v[i].block_bytes;
    }
    if (l.n) {
        char sz[32];
        fprintf(out, "%zu live block%s, %s%s\n", l.n, l.n == 1 ? "" : "s",
                ts__fmt_bytes(sz, total),
                atomic_load(&ts__mem_hooks) & TS__MEM_DEBUG ? ""
                    : " (set TESSERA_DEBUG_MEMORY=1 for sequence numbers)");
    }
    if (count)
        *count = l.n;
    free(l.v);
    return TS_OK;
}
