/* core/nn_impl.h: the module struct, private to the nn files (nn.c: constructors, containers
 * and forward; nn_params.c: parameters, buffers and dtype). */
#ifndef TESSERA_NN_IMPL_H
#define TESSERA_NN_IMPL_H
#include "internal.h"

typedef enum kind {
    M_LINEAR,
    M_CONV,
    M_MAXPOOL,
    M_AVGPOOL,
    M_RELU,
    M_GELU,
    M_TANH,
    M_FLATTEN,
    M_DROPOUT,
    M_BATCHNORM,
    M_LAYERNORM,
    M_EMBEDDING,
    M_SEQUENTIAL,
    M_CUSTOM
} kind;

#define NAME_MAX_LEN 48

struct ts_module {
    int kind;
    int training;
    ts_tensor *weight, *bias;               /* owned parameters, or NULL */
    ts_tensor *running_mean, *running_var;  /* batch norm buffers (owned) */
    ts_conv2d_params conv;
    ts_pool2d_params pool;
    double p, eps, momentum;
    ts_rng *rng;                            /* dropout; a checkpointed sequential's (borrowed) */
    int checkpoint;                         /* sequential: each child recomputed in backward */
    int norm_ndim;                          /* layer norm */
    ts_module **children;                   /* sequential and custom (owned) */
    char (*names)[NAME_MAX_LEN];
    size_t n, cap;
    ts_module_def def;                      /* custom: the user's definition */
    void *user;
    struct mtensor {
        char name[NAME_MAX_LEN];
        ts_tensor *t;                       /* a reference of the module's own */
        int role;                           /* ROLE_* */
    } *tensors;                             /* custom: parameters and buffers, in order */
    size_t nt, tcap;
};

enum { ROLE_PARAM, ROLE_BUFFER, ROLE_SHARED };

#endif /* TESSERA_NN_IMPL_H */
