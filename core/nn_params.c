/* core/nn_params.c: a module tree's parameters and buffers, named by the tree
 * ("conv1.weight", "bn1.running_mean"), their count and their dtype. */
#include <stdio.h>
#include <stdlib.h>

#include "nn_impl.h"

/* ---- parameters ------------------------------------------------------------------------ */

static void add_named(ts_named_tensor *out, size_t cap, size_t *n, const char *prefix,
                      const char *name, ts_tensor *t)
{
    if (!t)
        return;
    if (*n < cap) {
        snprintf(out[*n].name, sizeof out[*n].name, "%s%s%s", prefix, prefix[0] ? "." : "",
                 name);
        out[*n].tensor = t;
    }
    (*n)++;
}

static void collect(ts_module *m, const char *prefix, int buffers, ts_named_tensor *out,
                    size_t cap, size_t *n)
{
    if (m->kind == M_SEQUENTIAL || m->kind == M_CUSTOM) {
        for (size_t i = 0; i < m->nt; i++) /* a custom module's own, in order */
            if (m->tensors[i].role == (buffers ? ROLE_BUFFER : ROLE_PARAM))
                add_named(out, cap, n, prefix, m->tensors[i].name, m->tensors[i].t);
        for (size_t i = 0; i < m->n; i++) {
            char p[96];
            snprintf(p, sizeof p, "%s%s%s", prefix, prefix[0] ? "." : "", m->names[i]);
            collect(m->children[i], p, buffers, out, cap, n);
        }
        return;
    }
    add_named(out, cap, n, prefix, buffers ? "running_mean" : "weight",
              buffers ? m->running_mean : m->weight);
    add_named(out, cap, n, prefix, buffers ? "running_var" : "bias",
              buffers ? m->running_var : m->bias);
}

TS_API size_t ts_module_parameters(ts_module *m, ts_named_tensor *out, size_t cap)
{
    size_t n = 0;
    if (m)
        collect(m, "", 0, out, cap, &n);
    return n;
}

TS_API size_t ts_module_buffers(ts_module *m, ts_named_tensor *out, size_t cap)
{
    size_t n = 0;
    if (m)
        collect(m, "", 1, out, cap, &n);
    return n;
}

TS_API ts_status ts_module_to_dtype(ts_module *m, int32_t dtype)
{
    if (!m)
        return ts__fail(TS_EINVAL, "ts_module_to_dtype: module is NULL");
    if (dtype != TS_F32 && dtype != TS_F64)
        return ts__fail(TS_EINVAL, "ts_module_to_dtype: dtype %d is not float32 or float64",
                        (int)dtype);
    size_t np = ts_module_parameters(m, NULL, 0), nb = ts_module_buffers(m, NULL, 0);
    ts_named_tensor *all = ts__calloc(np + nb + 1, sizeof *all);
    ts_tensor **conv = ts__calloc(np + nb + 1, sizeof *conv);
    ts_status s = all && conv ? TS_OK
                              : ts__fail(TS_ENOMEM, "ts_module_to_dtype: out of host memory");
    if (!s) {
        ts_module_parameters(m, all, np);
        ts_module_buffers(m, all + np, nb);
    }
    /* Every conversion first; then, when all succeeded, every tensor takes its new storage. */
    ts_no_grad_enter();
    for (size_t i = 0; !s && i < np + nb; i++) {
        ts_tensor *t = all[i].tensor;
        if (t->dtype != dtype && (t->dtype == TS_F32 || t->dtype == TS_F64))
            s = ts_cast(t, dtype, &conv[i]);
    }
    ts_no_grad_exit();
    for (size_t i = 0; !s && i < np + nb; i++)
        if (conv[i])
            ts__tensor_adopt(all[i].tensor, conv[i]);
    for (size_t i = 0; conv && i < np + nb; i++)
        ts_tensor_unref(conv[i]);
    free(all);
    free(conv);
    return s;
}

TS_API int64_t ts_module_num_params(ts_module *m)
{
    size_t n = ts_module_parameters(m, NULL, 0);
    ts_named_tensor *p = ts__calloc(n ? n : 1, sizeof *p);
    int64_t total = 0;
    if (!p)
        return -1;
    ts_module_parameters(m, p, n);
    for (size_t i = 0; i < n; i++)
        total += ts_tensor_numel(p[i].tensor);
    free(p);
    return total;
}
