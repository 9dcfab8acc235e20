/* tools/model_gpt.h: a GPT-2 style character-level language model, written with tessera's
 * public API only (modules of your own: tessera/nn.h), as a user would write it. */
#ifndef TESSERA_TOOLS_MODEL_GPT_H
#define TESSERA_TOOLS_MODEL_GPT_H

#include <tessera/tessera.h>

typedef struct cli_gpt_config {
    int64_t vocab;   /* 256 for bytes */
    int64_t context; /* the longest sequence (learned positions) */
    int64_t layers, heads, embd;
    double dropout;  /* on attention weights and residual branches while training; 0: none */
} cli_gpt_config;

/* The model: token and position embeddings, `layers` pre-norm blocks (causal self-attention,
 * then an MLP of width 4 embd with GELU), a final layer norm and an output head tied to the
 * token embedding. Weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 layers)),
 * biases 0, norms 1 and 0. Parameters are named like GPT-2's (transformer.wte.weight,
 * transformer.h.0.attn.c_attn.weight, ...). Its forward takes token ids (B, T) int64, T at
 * most context, and returns logits (B, T, vocab). rng: initialisation and dropout (borrowed:
 * must outlive the model). (transfer full) on *out. */
ts_status cli_gpt_build(const cli_gpt_config *cfg, ts_device *dev, ts_rng *rng, ts_module **out);
/* The mean cross-entropy of the next-token prediction: logits (B, T, vocab) against targets
 * (B, T). (transfer full) on *loss. */
ts_status cli_gpt_loss(ts_tensor *logits, ts_tensor *targets, ts_tensor **loss);
/* Gives AdamW's weight decay to the matrices of the blocks only: none to biases, norms or
 * the embeddings (the tied head included). */
void cli_gpt_decay_groups(ts_optim *opt);

/* Generation with a key/value cache: each new token costs one position, not the whole
 * context. cache_new makes an empty cache for gpt (keys and values of every layer, up to the
 * context); step feeds the token at the next position and gives the logits (vocab) of the
 * token after it, (transfer full); the cache is full after `context` steps (TS_ESHAPE). Runs
 * with grad mode off and the model in eval mode (no dropout). */
typedef struct cli_gpt_cache cli_gpt_cache;
ts_status cli_gpt_cache_new(ts_module *gpt, cli_gpt_cache **out);
ts_status cli_gpt_step(ts_module *gpt, cli_gpt_cache *c, int64_t token, ts_tensor **logits);
void cli_gpt_cache_free(cli_gpt_cache *c);
/* The configuration gpt was built with. */
const cli_gpt_config *cli_gpt_config_of(const ts_module *gpt);

/* Limits of the options (and of a checkpoint's train.arch). */
#define CLI_GPT_MAX_CONTEXT 4096
#define CLI_GPT_MAX_LAYERS 64
#define CLI_GPT_MAX_HEADS 64
#define CLI_GPT_MAX_EMBD 8192
/* train.format of a GPT checkpoint. */
#define CLI_GPT_FORMAT "tessera-train-gpt-1"

/* The architecture as train.arch stores it: "gpt --context C --layers L --heads H --embd E
 * --dropout D". Returns buf. */
const char *cli_gpt_describe(const cli_gpt_config *c, char *buf, size_t len);
/* (tools/cli_checkpoint.c) Parses that text strictly (within the limits above, heads dividing embd) into cfg
 * (vocab 256): 0, or 1. */
int cli_gpt_parse_arch(const char *arch, cli_gpt_config *cfg);
/* Opens a GPT checkpoint the one way train --resume, eval and generate all do: train.model
 * "gpt", train.format CLI_GPT_FORMAT, train.arch parsed into *cfg. The parameters are then
 * restored with cli_restore_model, which checks them against the tensors present. Prints the
 * error; returns 0 ((transfer full) on *ck), or the exit status. */
int cli_gpt_open(const char *path, ts_device *dev, ts_checkpoint **ck, cli_gpt_config *cfg);
/* The number of parameters of cfg, and a lower bound of the bytes a run needs (training: the
 * weights, gradients, AdamW's moments and the activations of batch sequences; otherwise the
 * weights and one key/value cache), computed before anything is built. */
double cli_gpt_params(const cli_gpt_config *c);
double cli_gpt_bytes(const cli_gpt_config *c, int64_t batch, int training);
/* 1, after an error message naming the sizes, when that bound is over dev's pool limit. */
int cli_gpt_too_big(const cli_gpt_config *c, int64_t batch, int training, ts_device *dev);

#endif /* TESSERA_TOOLS_MODEL_GPT_H */
