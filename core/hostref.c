/* core/hostref.c: composing what a plugin does not implement. For a plugin that declares
 * TS_PLUGIN_HOST_MEMORY (its blocks are plain host memory), every op/dtype its supports()
 * does not claim runs on the reference host kernels (kernels/host/refkern.c, compiled into
 * libtessera single-threaded). ts_reference_run gives the same kernels to conformance checks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "refkern.h" /* kernels/host */

/* ts_reference_run has no device: its scratch is plain aligned host memory. */
static ts_status ref_scratch_alloc(const ts_host *self, size_t nbytes, const char *tag,
                                   void **ptr)
{
    (void)self;
    (void)tag;
    if (posix_memalign(ptr, 64, nbytes ? nbytes : 64) != 0) {
        *ptr = NULL;
        return ts__fail(TS_ENOMEM, "reference kernel: out of memory for %zu bytes of scratch",
                        nbytes);
    }
    return TS_OK;
}

static void ref_scratch_free(const ts_host *self, void *ptr)
{
    (void)self;
    free(ptr);
}

int ts__hostref_supports(int32_t op, int32_t dtype)
{
    return hk_ref_supports(op, dtype);
}

ts_status ts__hostref_run(const ts_host *host, const ts_kernel_call *call)
{
    hk_dev hd = {.host = host, .name = "reference", .threads = 1};
    int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
    if (!hk_ref_supports(call->op, dtype))
        return ts__fail(TS_ENOTSUP, "the reference kernels do not implement %s for %s",
                        ts_op_name(call->op), ts_dtype_name(dtype));
    return hk_ref_run(&hd, call);
}

static ts_status ref_fail(const ts_host *self, ts_status code, const char *fmt, ...)
{
    (void)self;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ts__fail(code, "reference kernel: %s", msg);
}

static void ref_log(const ts_host *self, int level, const char *fmt, ...)
{
    (void)self;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts__log(level, "reference kernel: %s", msg);
}

TS_API int ts_reference_supports(int op, int dtype)
{
    return hk_ref_supports(op, dtype);
}

TS_API ts_status ts_reference_run(const ts_kernel_call *call)
{
    if (!call || (call->ninputs && !call->inputs) || (call->noutputs && !call->outputs) ||
        call->ninputs < 0 || call->noutputs < 0)
        return ts__fail(TS_EINVAL, "ts_reference_run: NULL or inconsistent call");
    static const ts_host host = {
        .abi_major = TS_PLUGIN_ABI_MAJOR,
        .abi_minor = TS_PLUGIN_ABI_MINOR,
        .struct_size = sizeof(ts_host),
        .fail = ref_fail,
        .log = ref_log,
        .host_memory = ts__host_memory,
        .scratch_alloc = ref_scratch_alloc,
        .scratch_free = ref_scratch_free,
    };
    return ts__hostref_run(&host, call);
}
