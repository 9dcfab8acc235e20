/* tessera/nn.h: layers (modules) with named parameters. A module owns its parameters (leaf
 * tensors requiring grad) and, for batch norm, its running statistics; a sequential container
 * owns its children. Forward records the autograd graph like any op. Parameters are named
 * "child.weight" after their place in the tree ("conv1.weight", "fc2.bias"), which is also
 * how checkpoints store them. Initialisation draws from the core's seeded generator, so the
 * same seed gives the same network on every backend. */
#ifndef TESSERA_NN_H
#define TESSERA_NN_H

#include <stddef.h>
#include <tessera/ops.h>
#include <tessera/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_module ts_module;

/* How weights are initialised. Biases start at zero except with TS_INIT_KAIMING_UNIFORM,
 * PyTorch's default, where they are U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
typedef enum ts_init_kind {
    TS_INIT_KAIMING_UNIFORM = 0, /* U(-b, b), b = sqrt(6 / ((1 + 5) fan_in)): PyTorch's default */
    TS_INIT_KAIMING_NORMAL = 1,  /* N(0, sqrt(2 / fan_in)), for ReLU networks */
    TS_INIT_XAVIER_UNIFORM = 2,  /* U(-b, b), b = sqrt(6 / (fan_in + fan_out)) */
    TS_INIT_NORMAL = 3           /* N(0, std) */
} ts_init_kind;

typedef struct ts_weight_init {
    int32_t kind; /* ts_init_kind */
    double std;   /* TS_INIT_NORMAL */
    ts_rng *rng;  /* the generator to draw from (required) */
} ts_weight_init;

/* Defaults to start from (C initialisers):
 *     ts_weight_init init = TS_INIT_DEFAULT(&rng);      PyTorch's Kaiming-uniform
 *     ts_conv2d_params c = TS_CONV2D_PAD(2);            stride 1, padding 2
 *     ts_pool2d_params p = TS_POOL2D(2);                2x2 window, stride 2 */
#define TS_INIT_DEFAULT(rng) {TS_INIT_KAIMING_UNIFORM, 0.0, (rng)}
#define TS_CONV2D_DEFAULTS {1, 1, 0, 0, 1, 1, 1} /* stride 1, no padding, dilation 1, 1 group */
#define TS_CONV2D_PAD(p) {1, 1, (p), (p), 1, 1, 1}
#define TS_POOL2D(k) {(k), (k), (k), (k), 0, 0, 0} /* k x k window, stride k, no padding */

/* ---- layers (transfer full on *out; dev NULL: the default device) ------------------------ */

/* y = x @ W^T + b: x (..., in), W (out, in), b (out). */
ts_status ts_nn_linear(ts_device *dev, int64_t in, int64_t out, int bias, const ts_weight_init *init,
                       ts_module **m);
/* x (N, in_ch, H, W) -> (N, out_ch, P, Q); weight (out_ch, in_ch/groups, kh, kw). */
ts_status ts_nn_conv2d(ts_device *dev, int64_t in_ch, int64_t out_ch, int kh, int kw,
                       const ts_conv2d_params *p, int bias, const ts_weight_init *init, ts_module **m);
ts_status ts_nn_max_pool2d(const ts_pool2d_params *p, ts_module **m);
ts_status ts_nn_avg_pool2d(const ts_pool2d_params *p, ts_module **m);
ts_status ts_nn_relu(ts_module **m);
ts_status ts_nn_gelu(ts_module **m);
/* GELU's tanh approximation (GPT-2's). */
ts_status ts_nn_gelu_tanh(ts_module **m);
ts_status ts_nn_tanh(ts_module **m);
/* (N, ...) -> (N, prod(...)). */
ts_status ts_nn_flatten(ts_module **m);
/* Zeroes each element with probability p while training, scaling the rest by 1/(1-p); the
 * identity in eval mode. Draws from rng (borrowed; must outlive the module). */
ts_status ts_nn_dropout(double p, ts_rng *rng, ts_module **m);
/* Batch norm over (N, H, W) per channel of (N, C, H, W), with learnable scale and shift and
 * running mean/variance (updated while training with momentum, used in eval mode). */
ts_status ts_nn_batchnorm2d(ts_device *dev, int64_t channels, double eps, double momentum,
                            ts_module **m);
/* Layer norm over the last ndim dims (whose sizes are shape), with learnable scale/shift. */
ts_status ts_nn_layernorm(ts_device *dev, int ndim, const int64_t *shape, double eps,
                          ts_module **m);
/* Rows of a (num, dim) table at integer indices of any shape. */
ts_status ts_nn_embedding(ts_device *dev, int64_t num, int64_t dim, const ts_weight_init *init,
                          ts_module **m);
/* An empty sequential container. */
ts_status ts_nn_sequential(ts_module **m);
/* Appends child under name ([A-Za-z0-9_]+, unique); the container takes ownership of child,
 * also on failure. */
ts_status ts_nn_sequential_add(ts_module *seq, const char *name, ts_module *child);
/* Activation checkpointing (PyTorch's checkpoint_sequential, one segment per child): with on,
 * while gradients are recorded each child keeps only its input and runs again during
 * backward (ts_grad_checkpoint_rng), replaying what it drew from rng (its dropout's generator,
 * or NULL): the activations of one child at a time for one more forward; the same gradients,
 * bit for bit. */
ts_status ts_nn_sequential_checkpoint(ts_module *seq, ts_rng *rng, int on);

/* ---- modules of your own ---------------------------------------------------------------- */
/* A module defined in C: its forward function, its own parameters and buffers, and named
 * children (built-in layers, sequential containers or modules of your own), named for
 * checkpoints like the built-in ones ("h.0.attn.c_attn.weight"). A transformer block is
 * written this way (docs/nn.md). */
typedef struct ts_module_def {
    const char *kind; /* shown by ts_module_kind and in error messages; static storage */
    /* y = forward(m, x): reach the module's state with ts_module_param, ts_module_child and
     * ts_module_user; run children with ts_module_forward. Records autograd like any op. */
    ts_status (*forward)(ts_module *m, ts_tensor *x, ts_tensor **y);
    /* (optional) frees user when the module is freed. */
    void (*free_user)(void *user);
} ts_module_def;

/* A module of kind def (copied) holding user (handed to free_user at the end). (transfer
 * full) on *m; on failure user is freed through free_user. */
ts_status ts_module_custom(const ts_module_def *def, void *user, ts_module **m);
/* Registers t under name ([A-Za-z0-9_]+, unique among the module's parameters, buffers and
 * children) as a parameter (it is made to require grad) or a buffer. The module takes its own
 * reference. A shared parameter is one another module owns (weight tying: an output head
 * that uses the token embedding's weight): the forward may use it, gradients accumulate on
 * the one tensor, and ts_module_parameters lists it once, under its owner's name. */
ts_status ts_module_add_param(ts_module *m, const char *name, ts_tensor *t);
ts_status ts_module_add_shared_param(ts_module *m, const char *name, ts_tensor *t);
ts_status ts_module_add_buffer(ts_module *m, const char *name, ts_tensor *t);
/* Adds child under name to a module of your own or a sequential container (where it comes
 * last in the chain); m takes ownership of child, also on failure. */
ts_status ts_module_add_child(ts_module *m, const char *name, ts_module *child);
/* The parameter, buffer or child called name, or NULL. (transfer none) */
ts_tensor *ts_module_param(const ts_module *m, const char *name);
ts_module *ts_module_child(const ts_module *m, const char *name);
void *ts_module_user(const ts_module *m);
/* Whether m is in training mode (ts_module_train). */
int ts_module_is_training(const ts_module *m);

/* ---- using modules ----------------------------------------------------------------------- */

/* y = m(x). (transfer full) on *y. */
ts_status ts_module_forward(ts_module *m, ts_tensor *x, ts_tensor **y);
/* Training (dropout active, batch norm uses batch statistics) or eval mode; recursive. */
void ts_module_train(ts_module *m, int training);
/* Frees the module and everything it owns. NULL: no-op. */
void ts_module_free(ts_module *m);
/* The kind: "linear", "conv2d", "sequential", ... (transfer none, static) */
const char *ts_module_kind(const ts_module *m);

/* A parameter or buffer with its dotted name. */
typedef struct ts_named_tensor {
    char name[96];
    ts_tensor *tensor; /* (transfer none) */
} ts_named_tensor;

/* Fills up to cap entries with the parameters (learnable, requiring grad) and returns how
 * many there are in all (call with cap 0 to count). */
size_t ts_module_parameters(ts_module *m, ts_named_tensor *out, size_t cap);
/* Same for buffers (batch norm running statistics): saved in checkpoints, not learned. */
size_t ts_module_buffers(ts_module *m, ts_named_tensor *out, size_t cap);
/* Total number of parameter elements. */
int64_t ts_module_num_params(ts_module *m);
/* Converts every floating-point parameter and buffer of m and its children to dtype (TS_F32
 * or TS_F64), in place, like PyTorch's module.double(): the tensors keep their identity, so
 * tied parameters stay tied and pointers taken with ts_module_param stay valid; gradients are
 * dropped. Call it before making an optimizer (whose state has the old dtype). All or
 * nothing: on an error (out of memory) nothing changed. Integer buffers are left alone. */
ts_status ts_module_to_dtype(ts_module *m, int32_t dtype);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_NN_H */
