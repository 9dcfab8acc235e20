/* core/nn.c: layers. Each forward is a composition of recorded ops, so autograd needs nothing
 * layer-specific; the module owns its parameters (leaves requiring grad) and batch norm's
 * running statistics. Names follow the module tree: "conv1.weight", "bn1.running_mean". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#include "nn_impl.h"

static const char *const kind_names[] = {"linear",  "conv2d",  "max_pool2d", "avg_pool2d",
                                         "relu",    "gelu",    "tanh",       "flatten",
                                         "dropout", "batchnorm2d", "layernorm", "embedding",
                                         "sequential", "custom"};

static ts_status new_module(int k, ts_module **out)
{
    *out = NULL;
    ts_module *m = ts__calloc(1, sizeof *m);
    if (!m)
        return ts__fail(TS_ENOMEM, "out of host memory creating a %s layer", kind_names[k]);
    m->kind = k;
    m->training = 1;
    *out = m;
    return TS_OK;
}

TS_API void ts_module_free(ts_module *m)
{
    if (!m)
        return;
    ts_tensor_unref(m->weight);
    ts_tensor_unref(m->bias);
    ts_tensor_unref(m->running_mean);
    ts_tensor_unref(m->running_var);
    for (size_t i = 0; i < m->n; i++)
        ts_module_free(m->children[i]);
    for (size_t i = 0; i < m->nt; i++)
        ts_tensor_unref(m->tensors[i].t);
    free(m->tensors);
    if (m->kind == M_CUSTOM && m->def.free_user)
        m->def.free_user(m->user);
    free(m->children);
    free(m->names);
    free(m);
}

TS_API const char *ts_module_kind(const ts_module *m)
{
    return !m ? "none" : m->kind == M_CUSTOM ? m->def.kind : kind_names[m->kind];
}

/* ---- initialisation -------------------------------------------------------------------- */

/* A layer's weights need an initialisation: all-zero weights would never train. */
static ts_status no_init(const char *layer)
{
    return ts__fail(TS_EINVAL, "%s: init is NULL; pass a ts_weight_init with a generator, "
                    "e.g. {TS_INIT_KAIMING_UNIFORM, 0, &rng} (PyTorch's default)", layer);
}

/* A float32 parameter of shape drawn per init (or constant `fill` when init is NULL). */
static ts_status make_param(ts_device *dev, int ndim, const int64_t *shape, const ts_weight_init *init,
                            int64_t fan_in, int64_t fan_out, int is_bias, double fill,
                            ts_tensor **out)
{
    ts_status s;
    if (!init) {
        s = ts_tensor_full(dev, TS_F32, ndim, shape, fill, out);
    } else {
        if (!init->rng)
            return ts__fail(TS_EINVAL, "init: no generator (set ts_weight_init.rng)");
        double fi = (double)(fan_in > 0 ? fan_in : 1), fo = (double)(fan_out > 0 ? fan_out : 1);
        switch (init->kind) {
        case TS_INIT_KAIMING_UNIFORM: {
            double b = 1.0 / sqrt(fi); /* kaiming_uniform with a = sqrt(5), and its bias rule */
            s = ts_tensor_rand(dev, TS_F32, ndim, shape, -b, b, init->rng, out);
            break;
        }
        case TS_INIT_KAIMING_NORMAL:
            s = is_bias ? ts_tensor_zeros(dev, TS_F32, ndim, shape, out)
                        : ts_tensor_randn(dev, TS_F32, ndim, shape, 0, sqrt(2.0 / fi), init->rng,
                                          out);
            break;
        case TS_INIT_XAVIER_UNIFORM: {
            double b = sqrt(6.0 / (fi + fo));
            s = is_bias ? ts_tensor_zeros(dev, TS_F32, ndim, shape, out)
                        : ts_tensor_rand(dev, TS_F32, ndim, shape, -b, b, init->rng, out);
            break;
        }
        case TS_INIT_NORMAL:
            s = is_bias ? ts_tensor_zeros(dev, TS_F32, ndim, shape, out)
                        : ts_tensor_randn(dev, TS_F32, ndim, shape, 0, init->std, init->rng, out);
            break;
        default:
            return ts__fail(TS_EINVAL, "init: unknown kind %d", (int)init->kind);
        }
    }
    if (s == TS_OK && (s = ts_tensor_set_requires_grad(*out, 1))) {
        ts_tensor_unref(*out);
        *out = NULL;
    }
    if (s == TS_OK)
        ts_tensor_set_role(*out, TS_ROLE_PARAMETER);
    return s;
}

/* ---- constructors ---------------------------------------------------------------------- */

#define CHECK_OUT(m)                                                                        \
    do {                                                                                    \
        if (!(m))                                                                           \
            return ts__fail(TS_EINVAL, "nn: out is NULL");                                  \
        *(m) = NULL;                                                                        \
    } while (0)

TS_API ts_status ts_nn_linear(ts_device *dev, int64_t in, int64_t out, int bias,
                              const ts_weight_init *init, ts_module **m)
{
    CHECK_OUT(m);
    if (in < 1 || out < 1)
        return ts__fail(TS_EINVAL, "linear: sizes must be >= 1, got %lld -> %lld",
                        (long long)in, (long long)out);
    if (!init)
        return no_init("linear");
    ts_module *l;
    ts_status s = new_module(M_LINEAR, &l);
    if (s)
        return s;
    if ((s = make_param(dev, 2, (const int64_t[]){out, in}, init, in, out, 0, 0, &l->weight)) ||
        (bias && (s = make_param(dev, 1, &out, init, in, out, 1, 0, &l->bias)))) {
        ts_module_free(l);
        return s;
    }
    *m = l;
    return TS_OK;
}

TS_API ts_status ts_nn_conv2d(ts_device *dev, int64_t in_ch, int64_t out_ch, int kh, int kw,
                              const ts_conv2d_params *p, int bias, const ts_weight_init *init,
                              ts_module **m)
{
    CHECK_OUT(m);
    if (!p)
        return ts__fail(TS_EINVAL, "conv2d: params are NULL");
    if (in_ch < 1 || out_ch < 1 || kh < 1 || kw < 1 || p->groups < 1 || in_ch % p->groups ||
        out_ch % p->groups)
        return ts__fail(TS_EINVAL, "conv2d: %lld -> %lld channels, %dx%d kernel, %d groups: "
                        "sizes must be >= 1 and channels divisible by groups",
                        (long long)in_ch, (long long)out_ch, kh, kw, p->groups);
    if (!init)
        return no_init("conv2d");
    ts_module *c;
    ts_status s = new_module(M_CONV, &c);
    if (s)
        return s;
    c->conv = *p;
    int64_t fan_in = in_ch / p->groups * kh * kw, fan_out = out_ch / p->groups * kh * kw;
    const int64_t shape[4] = {out_ch, in_ch / p->groups, kh, kw};
    if ((s = make_param(dev, 4, shape, init, fan_in, fan_out, 0, 0, &c->weight)) ||
        (bias && (s = make_param(dev, 1, &out_ch, init, fan_in, fan_out, 1, 0, &c->bias)))) {
        ts_module_free(c);
        return s;
    }
    *m = c;
    return TS_OK;
}

static ts_status simple(int k, ts_module **m)
{
    CHECK_OUT(m);
    return new_module(k, m);
}

static ts_status pool2d(int k, const char *who, const ts_pool2d_params *p, ts_module **m)
{
    if (!p)
        return ts__fail(TS_EINVAL, "%s: params are NULL", who);
    ts_status s = simple(k, m);
    if (s == TS_OK)
        (*m)->pool = *p;
    return s;
}

TS_API ts_status ts_nn_max_pool2d(const ts_pool2d_params *p, ts_module **m)
{
    return pool2d(M_MAXPOOL, "max_pool2d", p, m);
}

TS_API ts_status ts_nn_avg_pool2d(const ts_pool2d_params *p, ts_module **m)
{
    return pool2d(M_AVGPOOL, "avg_pool2d", p, m);
}

TS_API ts_status ts_nn_relu(ts_module **m)
{
    return simple(M_RELU, m);
}

TS_API ts_status ts_nn_gelu(ts_module **m)
{
    return simple(M_GELU, m);
}

TS_API ts_status ts_nn_gelu_tanh(ts_module **m)
{
    ts_status s = simple(M_GELU, m);
    if (s == TS_OK)
        (*m)->p = 1; /* the tanh approximation */
    return s;
}

TS_API ts_status ts_nn_tanh(ts_module **m)
{
    return simple(M_TANH, m);
}

TS_API ts_status ts_nn_flatten(ts_module **m)
{
    return simple(M_FLATTEN, m);
}

TS_API ts_status ts_nn_dropout(double p, ts_rng *rng, ts_module **m)
{
    CHECK_OUT(m);
    if (!(p >= 0 && p < 1))
        return ts__fail(TS_EINVAL, "dropout: p must be in [0, 1), got %g", p);
    if (!rng && p > 0)
        return ts__fail(TS_EINVAL, "dropout: a generator is needed for p > 0");
    ts_status s = new_module(M_DROPOUT, m);
    if (s == TS_OK) {
        (*m)->p = p;
        (*m)->rng = rng;
    }
    return s;
}

TS_API ts_status ts_nn_batchnorm2d(ts_device *dev, int64_t channels, double eps, double momentum,
                                   ts_module **m)
{
    CHECK_OUT(m);
    if (channels < 1 || !(eps > 0) || !(momentum >= 0 && momentum <= 1))
        return ts__fail(TS_EINVAL, "batchnorm2d: need channels >= 1, eps > 0, momentum in "
                        "[0, 1]");
    ts_module *b;
    ts_status s = new_module(M_BATCHNORM, &b);
    if (s)
        return s;
    b->eps = eps;
    b->momentum = momentum;
    if ((s = make_param(dev, 1, &channels, NULL, 0, 0, 0, 1.0, &b->weight)) ||
        (s = make_param(dev, 1, &channels, NULL, 0, 0, 1, 0.0, &b->bias)) ||
        (s = ts_tensor_zeros(dev, TS_F32, 1, &channels, &b->running_mean)) ||
        (s = ts_tensor_ones(dev, TS_F32, 1, &channels, &b->running_var))) {
        ts_module_free(b);
        return s;
    }
    *m = b;
    return TS_OK;
}

TS_API ts_status ts_nn_layernorm(ts_device *dev, int ndim, const int64_t *shape, double eps,
                                 ts_module **m)
{
    CHECK_OUT(m);
    if (ndim < 1 || ndim > TS_MAX_DIMS || !shape || !(eps > 0))
        return ts__fail(TS_EINVAL, "layernorm: need 1 to %d normalised dims and eps > 0",
                        TS_MAX_DIMS);
    ts_module *l;
    ts_status s = new_module(M_LAYERNORM, &l);
    if (s)
        return s;
    l->eps = eps;
    l->norm_ndim = ndim;
    if ((s = make_param(dev, ndim, shape, NULL, 0, 0, 0, 1.0, &l->weight)) ||
        (s = make_param(dev, ndim, shape, NULL, 0, 0, 1, 0.0, &l->bias))) {
        ts_module_free(l);
        return s;
    }
    *m = l;
    return TS_OK;
}

TS_API ts_status ts_nn_embedding(ts_device *dev, int64_t num, int64_t dim, const ts_weight_init *init,
                                 ts_module **m)
{
    CHECK_OUT(m);
    if (num < 1 || dim < 1)
        return ts__fail(TS_EINVAL, "embedding: sizes must be >= 1");
    if (!init)
        return no_init("embedding");
    ts_module *e;
    ts_status s = new_module(M_EMBEDDING, &e);
    if (s)
        return s;
    /* PyTorch's embedding default is N(0, 1); a given init is used as is. */
    ts_weight_init normal = {TS_INIT_NORMAL, 1.0, init ? init->rng : NULL};
    const ts_weight_init *use = init && init->kind != TS_INIT_KAIMING_UNIFORM ? init : &normal;
    if (use->rng)
        s = make_param(dev, 2, (const int64_t[]){num, dim}, use, dim, num, 0, 0, &e->weight);
    else /* no generator given: a zero table (make_param's constant form) */
        s = make_param(dev, 2, (const int64_t[]){num, dim}, NULL, 0, 0, 0, 0.0, &e->weight);
    if (s) {
        ts_module_free(e);
        return s;
    }
    *m = e;
    return TS_OK;
}

TS_API ts_status ts_nn_sequential(ts_module **m)
{
    return simple(M_SEQUENTIAL, m);
}

/* name is [A-Za-z0-9_]+, shorter than NAME_MAX_LEN, and no parameter, buffer or child of m
 * has it yet; else TS_EINVAL naming who asked. */
static ts_status check_name(const ts_module *m, const char *who, const char *name)
{
    size_t len = strlen(name);
    int ok = len > 0 && len < NAME_MAX_LEN;
    for (size_t i = 0; ok && i < len; i++)
        ok = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
             (name[i] >= '0' && name[i] <= '9') || name[i] == '_';
    if (!ok)
        return ts__fail(TS_EINVAL, "%s: '%s' is not a name ([A-Za-z0-9_], at most %d "
                        "characters)", who, name, NAME_MAX_LEN - 1);
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->names[i], name) == 0)
            return ts__fail(TS_EINVAL, "%s: the name '%s' is taken", who, name);
    for (size_t i = 0; i < m->nt; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return ts__fail(TS_EINVAL, "%s: the name '%s' is taken", who, name);
    return TS_OK;
}

/* Appends child under name to m (which owns it from now on, also on failure). */
static ts_status add_child(ts_module *m, const char *who, const char *name, ts_module *child)
{
    ts_status s = check_name(m, who, name);
    if (s)
        goto fail;
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        ts_module **c = ts__realloc(m->children, cap * sizeof *c);
        if (c)
            m->children = c;
        char(*nm)[NAME_MAX_LEN] = c ? ts__realloc(m->names, cap * sizeof *nm) : NULL;
        if (!c || !nm) {
            s = ts__fail(TS_ENOMEM, "%s: out of host memory", who);
            goto fail;
        }
        m->names = nm;
        m->cap = cap;
    }
    m->children[m->n] = child;
    snprintf(m->names[m->n], NAME_MAX_LEN, "%s", name);
    m->n++;
    return TS_OK;
fail:
    ts_module_free(child);
    return s;
}

TS_API ts_status ts_nn_sequential_checkpoint(ts_module *seq, ts_rng *rng, int on)
{
    if (!seq || seq->kind != M_SEQUENTIAL)
        return ts__fail(TS_EINVAL, "sequential_checkpoint: need a sequential container");
    seq->checkpoint = on != 0;
    seq->rng = rng;
    return TS_OK;
}

TS_API ts_status ts_nn_sequential_add(ts_module *seq, const char *name, ts_module *child)
{
    if (!seq || seq->kind != M_SEQUENTIAL || !child || !name) {
        ts_module_free(child);
        return ts__fail(TS_EINVAL, "sequential_add: need a sequential container, a name and a "
                        "child");
    }
    return add_child(seq, "sequential_add", name, child);
}

/* ---- modules of your own --------------------------------------------------------------- */

TS_API ts_status ts_module_custom(const ts_module_def *def, void *user, ts_module **out)
{
    if (out)
        *out = NULL;
    ts_status s = TS_OK;
    if (!out || !def || !def->forward || !def->kind || !*def->kind)
        s = ts__fail(TS_EINVAL, "module_custom: need out and a definition with a kind and a "
                     "forward function");
    else if ((s = new_module(M_CUSTOM, out)) == TS_OK) {
        (*out)->def = *def;
        (*out)->user = user;
        return TS_OK;
    }
    if (def && def->free_user)
        def->free_user(user);
    return s;
}

static ts_status add_tensor(ts_module *m, const char *who, const char *name, ts_tensor *t,
                            int role)
{
    if (!m || !name || !t)
        return ts__fail(TS_EINVAL, "%s: NULL argument", who);
    if (m->kind != M_CUSTOM)
        return ts__fail(TS_EINVAL, "%s: '%s' is a %s; only modules made with ts_module_custom "
                        "take parameters and buffers this way", who, name, kind_names[m->kind]);
    ts_status s = check_name(m, who, name);
    if (s)
        return s;
    if (role == ROLE_PARAM && !ts_tensor_requires_grad(t) &&
        (s = ts_tensor_set_requires_grad(t, 1)))
        return ts__fail_prefix(s, "%s '%s': ", who, name);
    if (role == ROLE_SHARED && !ts_tensor_requires_grad(t))
        return ts__fail(TS_EINVAL, "%s: '%s' does not require grad: share a parameter another "
                        "module registered", who, name);
    if (m->nt == m->tcap) {
        size_t cap = m->tcap ? m->tcap * 2 : 4;
        struct mtensor *v = ts__realloc(m->tensors, cap * sizeof *v);
        if (!v)
            return ts__fail(TS_ENOMEM, "%s: out of host memory", who);
        m->tensors = v;
        m->tcap = cap;
    }
    struct mtensor *e = &m->tensors[m->nt++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->t = ts_tensor_ref(t);
    ts_tensor_set_role(t, TS_ROLE_PARAMETER); /* buffers too: the model's state */
    e->role = role;
    return TS_OK;
}

TS_API ts_status ts_module_add_param(ts_module *m, const char *name, ts_tensor *t)
{
    return add_tensor(m, "module_add_param", name, t, ROLE_PARAM);
}

TS_API ts_status ts_module_add_shared_param(ts_module *m, const char *name, ts_tensor *t)
{
    return add_tensor(m, "module_add_shared_param", name, t, ROLE_SHARED);
}

TS_API ts_status ts_module_add_buffer(ts_module *m, const char *name, ts_tensor *t)
{
    return add_tensor(m, "module_add_buffer", name, t, ROLE_BUFFER);
}

TS_API ts_status ts_module_add_child(ts_module *m, const char *name, ts_module *child)
{
    if (!m || (m->kind != M_CUSTOM && m->kind != M_SEQUENTIAL) || !name || !child) {
        ts_module_free(child);
        return ts__fail(TS_EINVAL, "module_add_child: need a module made with "
                        "ts_module_custom or ts_nn_sequential, a name and a child");
    }
    return add_child(m, "module_add_child", name, child);
}

TS_API ts_tensor *ts_module_param(const ts_module *m, const char *name)
{
    for (size_t i = 0; m && name && i < m->nt; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return m->tensors[i].t;
    return NULL;
}

TS_API ts_module *ts_module_child(const ts_module *m, const char *name)
{
    for (size_t i = 0; m && name && i < m->n; i++)
        if (strcmp(m->names[i], name) == 0)
            return m->children[i];
    return NULL;
}

TS_API void *ts_module_user(const ts_module *m)
{
    return m ? m->user : NULL;
}

TS_API int ts_module_is_training(const ts_module *m)
{
    return m && m->training;
}

/* ---- forward --------------------------------------------------------------------------- */

/* (x - mean) / sqrt(var + eps) over dims, in the current scope: with *mean NULL, the mean and
 * the (biased) variance of x over dims, left in *mean and *var; else the ones given. */
static ts_tensor *normalise(const ts_tensor *x, int nd, const int *dims, double eps,
                            ts_tensor **mean, ts_tensor **var)
{
    ts_tensor *xc;
    if (!*mean) {
        *mean = ts_s_mean(x, nd, dims, 1);
        xc = ts_s_sub(x, *mean);
        *var = ts_s_mean(ts_s_mul(xc, xc), nd, dims, 1);
    } else {
        xc = ts_s_sub(x, *mean);
    }
    return ts_s_mul(xc, ts_s_rsqrt(ts_s_add_scalar(*var, eps)));
}

/* running = (1 - m) running + m scale batch, in place under no_grad, in the current scope;
 * batch is (1, C, 1, 1). */
static void update_running(ts_tensor *running, ts_tensor *batch, double m, double scale)
{
    int64_t c = ts_tensor_numel(running);
    ts_no_grad_enter();
    ts_tensor *t = ts_s_mul_scalar(ts_s_reshape(batch, 1, &c), m * scale);
    if (t)
        ts_s_add_(ts_s_mul_scalar_(running, 1 - m), t);
    ts_no_grad_exit();
}

static ts_status batchnorm_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    char b[64];
    if (ts_tensor_ndim(x) != 4 || ts_tensor_shape(x)[1] != ts_tensor_numel(m->weight))
        return ts__fail(TS_ESHAPE, "batchnorm2d: input %s must be (N, %lld, H, W)",
                        ts_tensor_describe(x, b, sizeof b),
                        (long long)ts_tensor_numel(m->weight));
    const int64_t C = ts_tensor_numel(m->weight), n = ts_tensor_numel(x) / C;
    const int64_t view[4] = {1, C, 1, 1};
    static const int dims[3] = {0, 2, 3};
    ts_scope *sc = ts_scope_begin();
    ts_tensor *mean = NULL, *var = NULL, *xhat;
    if (m->training) {
        xhat = normalise(x, 3, dims, m->eps, &mean, &var);
        update_running(m->running_mean, mean, m->momentum, 1.0);
        update_running(m->running_var, var, m->momentum, /* the unbiased variance */
                       n > 1 ? (double)n / (double)(n - 1) : 1.0);
    } else {
        mean = ts_s_view(m->running_mean, 4, view);
        var = ts_s_view(m->running_var, 4, view);
        xhat = normalise(x, 3, dims, m->eps, &mean, &var);
    }
    ts_tensor *out = ts_s_add(ts_s_mul(xhat, ts_s_view(m->weight, 4, view)),
                              ts_s_view(m->bias, 4, view));
    return ts_scope_return(sc, out, y);
}

static ts_status layernorm_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    int nd = ts_tensor_ndim(x), k = m->norm_ndim;
    char b1[64], b2[64];
    int ok = nd >= k;
    for (int i = 0; ok && i < k; i++)
        ok = ts_tensor_shape(x)[nd - k + i] == ts_tensor_shape(m->weight)[i];
    if (!ok)
        return ts__fail(TS_ESHAPE, "layernorm: input %s does not end with the normalised shape "
                        "%s", ts_tensor_describe(x, b1, sizeof b1),
                        ts_tensor_describe(m->weight, b2, sizeof b2));
    /* one fused kernel each way where the device runs it */
    return ts_layer_norm(x, m->weight, m->bias, k, m->eps, y);
}

static ts_status dropout_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    if (!m->training || m->p == 0) { /* the identity */
        *y = ts_tensor_ref(x);
        return TS_OK;
    }
    ts_scope *sc = ts_scope_begin();
    ts_tensor *r = NULL; /* keep where uniform [0, 1) >= p, scaled by 1 / (1 - p); the draws
                          * of a 16-bit x (under autocast) in float32, the same as float32's */
    int32_t rdt = ts_tensor_dtype(x) == TS_F64 ? TS_F64 : TS_F32;
    r = TS_SCOPED(ts_tensor_rand(ts_tensor_device(x), rdt, ts_tensor_ndim(x),
                                      ts_tensor_shape(x), 0, 1, m->rng, &r), r);
    ts_tensor *keep = ts_s_cast(ts_s_binary_scalar(TS_BINARY_GE, r, m->p, 0), ts_tensor_dtype(x));
    return ts_scope_return(sc, ts_s_mul_scalar(ts_s_mul(x, keep), 1.0 / (1.0 - m->p)), y);
}

static ts_status linear_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    char b1[64], b2[64];
    int nd = ts_tensor_ndim(x);
    if (nd < 1 || ts_tensor_shape(x)[nd - 1] != ts_tensor_shape(m->weight)[1])
        return ts__fail(TS_ESHAPE, "linear: input %s must end with %lld features (weight %s)",
                        ts_tensor_describe(x, b1, sizeof b1),
                        (long long)ts_tensor_shape(m->weight)[1],
                        ts_tensor_describe(m->weight, b2, sizeof b2));
    /* x @ W^T: the transposed view reaches BLAS as a column-major operand, never copied. */
    ts_scope *sc = ts_scope_begin();
    /* Under autocast W is cast before it is transposed, not by the matmul after: a dense cast
     * rather than a strided one, and W's gradient comes back through the cast in W's own
     * layout, so the optimizer's gradient needs no copy. The bias joins the matmul's dtype, as
     * in PyTorch's addmm. */
    const int32_t ac = ts_autocast_dtype();
    ts_tensor *w = ac != TS_F32 && ts_tensor_dtype(m->weight) == TS_F32 ? ts_s_cast(m->weight, ac)
                                                                       : m->weight;
    ts_tensor *xw = ts_s_matmul(x, ts_s_transpose(w, 0, 1));
    ts_tensor *b = m->bias && ac != TS_F32 && ts_tensor_dtype(m->bias) == TS_F32
                       ? ts_s_cast(m->bias, ac)
                       : m->bias;
    return ts_scope_return(sc, b ? ts_s_add(xw, b) : xw, y);
}

/* A checkpointed sequential's child as a segment. */
static ts_status child_segment(void *child, int nin, ts_tensor *const *in, ts_tensor **out)
{
    (void)nin;
    return ts_module_forward(child, in[0], out);
}

TS_API ts_status ts_module_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    if (!y)
        return ts__fail(TS_EINVAL, "forward: out is NULL");
    *y = NULL;
    if (!m || !x)
        return ts__fail(TS_EINVAL, "forward: NULL module or input");
    switch (m->kind) {
    case M_LINEAR:
        return linear_forward(m, x, y);
    case M_CONV:
        return ts_conv2d(x, m->weight, m->bias, &m->conv, y);
    case M_MAXPOOL:
        return ts_max_pool2d(x, &m->pool, y, NULL);
    case M_AVGPOOL:
        return ts_avg_pool2d(x, &m->pool, y);
    case M_RELU:
        return ts_relu(x, y);
    case M_GELU:
        return m->p != 0 ? ts_gelu_tanh(x, y) : ts_gelu(x, y);
    case M_TANH:
        return ts_tanh(x, y);
    case M_FLATTEN: {
        if (ts_tensor_ndim(x) < 1)
            return ts__fail(TS_ESHAPE, "flatten: input is 0-d");
        if (ts_tensor_ndim(x) == 1) {
            *y = ts_tensor_ref(x);
            return TS_OK;
        }
        return ts_tensor_flatten(x, 1, -1, y);
    }
    case M_DROPOUT:
        return dropout_forward(m, x, y);
    case M_BATCHNORM:
        return batchnorm_forward(m, x, y);
    case M_LAYERNORM:
        return layernorm_forward(m, x, y);
    case M_EMBEDDING:
        return ts_embedding(m->weight, x, y);
    case M_SEQUENTIAL: {
        ts_tensor *h = ts_tensor_ref(x);
        const int ckpt = m->checkpoint && ts_grad_enabled();
        for (size_t i = 0; i < m->n; i++) {
            ts_tensor *o;
            ts_status s = ckpt ? ts_grad_checkpoint_rng(child_segment, m->children[i], m->rng, 1,
                                                        &h, &o)
                               : ts_module_forward(m->children[i], h, &o);
            ts_tensor_unref(h);
            if (s)
                return ts__fail_prefix(s, "%s (%s): ", m->names[i],
                                       ts_module_kind(m->children[i]));
            h = o;
        }
        *y = h;
        return TS_OK;
    }
    case M_CUSTOM: {
        ts_status s = m->def.forward(m, x, y);
        if (s) {
            ts_tensor_unref(*y);
            *y = NULL;
            return ts__fail_prefix(s, "%s: ", m->def.kind);
        }
        if (!*y)
            return ts__fail(TS_ESTATE, "%s: forward returned TS_OK without an output",
                            m->def.kind);
        return TS_OK;
    }
    }
    return ts__fail(TS_ESTATE, "forward: unknown module kind %d", m->kind);
}

TS_API void ts_module_train(ts_module *m, int training)
{
    if (!m)
        return;
    m->training = training != 0;
    for (size_t i = 0; i < m->n; i++)
        ts_module_train(m->children[i], training);
}

