/* tessera/models.h: the built-in models. Each is a configuration plus a build function; one
 * registry names them, fills in their defaults, checks a configuration, builds it, and writes
 * it to and reads it from checkpoint metadata as plain keys (model.name, model.hidden, ...),
 * so a checkpoint says what it holds without a command line. The models are written with the
 * public API only (modules of one's own: tessera/nn.h), as a user would write them. */
#ifndef TESSERA_MODELS_H
#define TESSERA_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include <tessera/checkpoint.h>
#include <tessera/nn.h>
#include <tessera/optim.h>
#include <tessera/status.h>
#include <tessera/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the GPT ------------------------------------------------------------------------- */

/* A GPT-2 style language model over bytes (or any vocabulary of vocab tokens). */
typedef struct ts_gpt_config {
    int64_t vocab;   /* 256 for bytes */
    int64_t context; /* the longest sequence (learned positions), 1..TS_GPT_MAX_CONTEXT */
    int64_t layers, heads, embd; /* embd a multiple of heads */
    double dropout;  /* on attention weights and residual branches while training; [0, 1) */
    int checkpoint;  /* non-zero: activation checkpointing (ts_nn_sequential_checkpoint on the
                      * blocks): while training each block keeps only its input and is run
                      * again in backward, a block's activations instead of all of them for a
                      * third more compute; the same gradients. Not part of the weights. */
} ts_gpt_config;

#define TS_GPT_MAX_CONTEXT 4096
#define TS_GPT_MAX_LAYERS 64
#define TS_GPT_MAX_HEADS 64
#define TS_GPT_MAX_EMBD 8192

/* The model: token and position embeddings, `layers` pre-norm blocks (causal self-attention,
 * then an MLP of width 4 embd with GELU), a final layer norm and an output head tied to the
 * token embedding. Weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 layers)),
 * biases 0, norms 1 and 0. Parameters are named like GPT-2's (transformer.wte.weight,
 * transformer.h.0.attn.c_attn.weight, ...). Its forward takes token ids (B, T) int64, T at
 * most context, and returns logits (B, T, vocab). rng: initialisation and dropout (borrowed:
 * must outlive the model). TS_EINVAL naming what is out of range. (transfer full) on *out. */
ts_status ts_gpt_new(const ts_gpt_config *cfg, ts_device *dev, ts_rng *rng, ts_module **out);
/* The configuration gpt was built with, or NULL for a module ts_gpt_new did not make.
 * (transfer none) */
const ts_gpt_config *ts_gpt_config_of(const ts_module *gpt);
/* The mean cross-entropy of the next-token prediction: logits (B, T, vocab) against targets
 * (B, T). (transfer full) on *loss. */
ts_status ts_gpt_loss(ts_tensor *logits, ts_tensor *targets, ts_tensor **loss);
/* Gives AdamW's weight decay to the matrices of the blocks only: none to biases, norms or
 * the embeddings (the tied head included), as GPT-2 training does. */
void ts_gpt_decay_groups(ts_optim *opt);
/* Generation with a key/value cache: each new token costs one position, not the whole
 * context. cache_new makes an empty cache for gpt (keys and values of every layer, up to the
 * context); step feeds the token at the next position and gives the logits (vocab) of the
 * token after it, (transfer full); the cache is full after `context` steps (TS_ESHAPE). Runs
 * with grad mode off and the model in eval mode (no dropout). Not thread-safe on one cache. */
typedef struct ts_gpt_cache ts_gpt_cache;
ts_status ts_gpt_cache_new(ts_module *gpt, ts_gpt_cache **out);
ts_status ts_gpt_cache_step(ts_module *gpt, ts_gpt_cache *c, int64_t token, ts_tensor **logits);
/* NULL is a no-op. */
void ts_gpt_cache_free(ts_gpt_cache *c);
/* A lower bound of the bytes a GPT needs, from its configuration alone (nothing is built):
 * training: the weights, their gradients, AdamW's two moments and the activations of batch
 * sequences of the full context; otherwise the weights and one key/value cache. For refusing
 * a model that cannot fit before building it. */
double ts_gpt_params(const ts_gpt_config *cfg);
double ts_gpt_bytes(const ts_gpt_config *cfg, int64_t batch, int training);

/* ---- the registry --------------------------------------------------------------------- */

#define TS_MODEL_MAX_LAYERS 16

/* A model of the registry, by name, with its configuration. The image classifiers (mlp, lenet5,
 * cnn) take 28x28 single-channel images (Fashion-MNIST's) to 10 classes; gpt is above. Start
 * from ts_model_defaults, change fields, then build. */
typedef struct ts_model_config {
    char name[16];      /* "mlp", "lenet5", "cnn" or "gpt" */
    /* mlp and cnn: the hidden linear layers (each followed by ReLU), then one to 10 classes */
    int32_t nhidden;
    int64_t hidden[TS_MODEL_MAX_LAYERS];
    /* cnn: blocks of 3x3 conv (pad 1) + ReLU + 2x2 max pool, at most 4 (28 -> 14 -> 7 -> 3 -> 1) */
    int32_t nchannels;
    int64_t channels[TS_MODEL_MAX_LAYERS];
    /* mlp, lenet5, cnn: the weights' initialisation (ts_init_kind), init_std for normal */
    int32_t init;
    double init_std;
    ts_gpt_config gpt; /* gpt */
} ts_model_config;

/* The models there are: names[i] for i < the count returned (cap 0 to count), each with a
 * one-line summary ("LeNet-5: two 5x5 convolutions, three linear layers"). (transfer none) */
size_t ts_model_list(const char **names, const char **summaries, size_t cap);
/* The defaults of model name into *out: mlp 784-256-128-10, lenet5, cnn with channels 32,64,
 * Kaiming-uniform; gpt context 128, 4 layers, 4 heads, embd 128, vocab 256, no dropout.
 * TS_EINVAL for an unknown name, listing the known ones. */
ts_status ts_model_defaults(const char *name, ts_model_config *out);
/* Whether cfg can be built: its fields for its model within range, none of another model's
 * set (--hidden for lenet5, say). TS_EINVAL naming the field, the value and the range. */
ts_status ts_model_check(const ts_model_config *cfg);
/* Builds cfg on dev (NULL: the default device), initialised from rng (borrowed: the GPT's
 * dropout keeps using it, so it must outlive the model). The same configuration and rng
 * state give the same weights, bit for bit. (transfer full) on *out. */
ts_status ts_model_new(const ts_model_config *cfg, ts_device *dev, ts_rng *rng,
                       ts_module **out);
/* How many parameters (learnable scalars) ts_model_new would make for cfg, computed from the
 * configuration alone; -1 when ts_model_check refuses it. For checking a configuration read
 * from a file against the tensors stored with it before building anything. */
double ts_model_params(const ts_model_config *cfg);
/* "mlp --hidden 256,128", "gpt --context 128 --layers 4 --heads 4 --embd 128 --dropout 0":
 * the configuration as the options of tessera train, for people and logs. Returns buf. */
const char *ts_model_describe(const ts_model_config *cfg, char *buf, size_t len);
/* Writes cfg to ck as metadata: model.name and the keys of its model (model.hidden = "256,128",
 * model.init = "kaiming-uniform", model.layers = "4", ...). */
ts_status ts_model_save_config(const ts_model_config *cfg, ts_checkpoint *ck);
/* Reads the configuration ck holds, every value parsed and checked as strictly as
 * ts_model_check: model.* keys, or the train.model / train.arch keys of checkpoints written
 * before them. TS_ECORRUPT naming the key and value; TS_EINVAL when ck names no model. */
ts_status ts_model_load_config(const ts_checkpoint *ck, ts_model_config *out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_MODELS_H */
