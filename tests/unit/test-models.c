/* tests/unit/test-models.c: the model registry of tessera/models.h. Defaults and checks for
 * every model; a configuration written to checkpoint metadata reads back the same, every
 * hostile value is refused naming its key; a checkpoint of the format before the model.* keys
 * (train.model, train.arch) still reads; the same configuration and seed build the same
 * weights, bit for bit. */
#include <math.h>
#include <string.h>

#include "../tap.h"

static ts_device *dev;

static void setup(void)
{
    dev = tap_start();
}

static void test_list_and_defaults(void)
{
    setup();
    const char *names[8], *sums[8];
    size_t n = ts_model_list(names, sums, 8);
    CHECK_INT_EQ(n, 4);
    CHECK_INT_EQ(ts_model_list(NULL, NULL, 0), 4);
    static const char *const want[] = {"mlp", "lenet5", "cnn", "gpt"};
    for (size_t i = 0; i < n; i++) {
        CHECK(strcmp(names[i], want[i]) == 0);
        CHECK(strlen(sums[i]) > 10);
        ts_model_config c;
        CHECK_OK(ts_model_defaults(names[i], &c));
        CHECK_OK(ts_model_check(&c));
    }
    ts_model_config c;
    CHECK_OK(ts_model_defaults("mlp", &c));
    CHECK_INT_EQ(c.nhidden, 2);
    CHECK_INT_EQ(c.hidden[0], 256);
    CHECK_INT_EQ(c.hidden[1], 128);
    CHECK_OK(ts_model_defaults("gpt", &c));
    CHECK_INT_EQ(c.gpt.context, 128);
    CHECK_INT_EQ(c.gpt.vocab, 256);
    char b[256];
    CHECK(strcmp(ts_model_describe(&c, b, sizeof b),
                 "gpt --context 128 --layers 4 --heads 4 --embd 128 --dropout 0") == 0);
    c.gpt.dropout = 0.1; /* the fewest digits that read back as the value */
    CHECK_MSG(strcmp(ts_model_describe(&c, b, sizeof b),
                     "gpt --context 128 --layers 4 --heads 4 --embd 128 --dropout 0.1") == 0,
              "%s", b);
    CHECK_FAILS(ts_model_defaults("resnet", &c), TS_EINVAL, "unknown model 'resnet'", "lenet5");
    CHECK_OK(ts_model_defaults("cnn", &c));
    c.nhidden = 1, c.hidden[0] = 100, c.init = TS_INIT_NORMAL, c.init_std = 0.01;
    CHECK(strcmp(ts_model_describe(&c, b, sizeof b),
                 "cnn --channels 32,64 --hidden 100 --init normal:0.01") == 0);
    tap_end();
}

static void test_checks(void)
{
    setup();
    ts_model_config c;
    CHECK_OK(ts_model_defaults("lenet5", &c));
    c.nhidden = 1, c.hidden[0] = 10;
    CHECK_FAILS(ts_model_check(&c), TS_EINVAL, "hidden layers apply to mlp and cnn");
    CHECK_OK(ts_model_defaults("mlp", &c));
    c.nchannels = 1, c.channels[0] = 8;
    CHECK_FAILS(ts_model_check(&c), TS_EINVAL, "apply to cnn");
    CHECK_OK(ts_model_defaults("cnn", &c));
    c.nchannels = 5;
    for (int i = 0; i < 5; i++)
        c.channels[i] = 4;
    CHECK_FAILS(ts_model_check(&c), TS_EINVAL, "at most 4");
    CHECK_OK(ts_model_defaults("mlp", &c));
    c.hidden[1] = 0;
    CHECK_FAILS(ts_model_check(&c), TS_EINVAL, "hidden layer 2 has 0 features");
    CHECK_OK(ts_model_defaults("mlp", &c));
    c.init = TS_INIT_NORMAL, c.init_std = NAN;
    CHECK_FAILS(ts_model_check(&c), TS_EINVAL, "standard deviation");
    CHECK_OK(ts_model_defaults("gpt", &c));
    c.gpt.heads = 3;
    CHECK_FAILS(ts_model_check(&c), TS_EINVAL, "not a multiple of heads 3");
    c.gpt.heads = 4, c.gpt.layers = 65;
    CHECK_FAILS(ts_model_check(&c), TS_EINVAL, "layers 65");
    ts_rng rng = TS_RNG(1);
    ts_module *m = (ts_module *)1;
    CHECK_FAILS(ts_model_new(&c, dev, &rng, &m), TS_EINVAL, "layers 65");
    CHECK(m == NULL);
    tap_end();
}

/* c written to a fresh checkpoint and read back. */
static void round_trip(const ts_model_config *c)
{
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_model_save_config(c, ck));
    ts_model_config back;
    CHECK_OK(ts_model_load_config(ck, &back));
    char a[256], b[256];
    CHECK_MSG(strcmp(ts_model_describe(c, a, sizeof a), ts_model_describe(&back, b, sizeof b)) == 0,
              "%s came back as %s", a, b);
    CHECK(back.init_std == c->init_std);
    CHECK(memcmp(&back.gpt, &c->gpt, sizeof back.gpt) == 0 || strcmp(c->name, "gpt") != 0);
    ts_checkpoint_free(ck);
}

static void test_metadata_round_trip(void)
{
    setup();
    ts_model_config c;
    CHECK_OK(ts_model_defaults("mlp", &c));
    round_trip(&c);
    c.nhidden = 3, c.hidden[2] = 7, c.init = TS_INIT_NORMAL, c.init_std = 0.0123456789012345;
    round_trip(&c);
    CHECK_OK(ts_model_defaults("lenet5", &c));
    c.init = TS_INIT_XAVIER_UNIFORM;
    round_trip(&c);
    CHECK_OK(ts_model_defaults("cnn", &c));
    round_trip(&c);
    c.nchannels = 4, c.channels[2] = 3, c.channels[3] = 5, c.nhidden = 1, c.hidden[0] = 9;
    round_trip(&c);
    CHECK_OK(ts_model_defaults("gpt", &c));
    c.gpt = (ts_gpt_config){256, 64, 3, 2, 32, 0.125, 0};
    round_trip(&c);
    /* the keys themselves */
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_model_save_config(&c, ck));
    CHECK(strcmp(ts_checkpoint_meta(ck, "model.name"), "gpt") == 0);
    CHECK(strcmp(ts_checkpoint_meta(ck, "model.layers"), "3") == 0);
    CHECK(strcmp(ts_checkpoint_meta(ck, "model.dropout"), "0.125") == 0);
    ts_checkpoint_free(ck);
    tap_end();
}

/* A checkpoint holding c's keys with key set to value (NULL: removed), refused naming
 * the key. */
static void refused(const char *name, const char *key, const char *value, const char *needle)
{
    ts_model_config c;
    CHECK_OK(ts_model_defaults(name, &c));
    ts_checkpoint *good, *ck;
    CHECK_OK(ts_checkpoint_new(&good));
    CHECK_OK(ts_model_save_config(&c, good));
    CHECK_OK(ts_checkpoint_new(&ck));
    for (size_t i = 0; i < ts_checkpoint_meta_count(good); i++) {
        const char *k = ts_checkpoint_meta_key(good, i);
        if (strcmp(k, key) != 0)
            CHECK_OK(ts_checkpoint_set_meta(ck, k, ts_checkpoint_meta(good, k)));
    }
    if (value)
        CHECK_OK(ts_checkpoint_set_meta(ck, key, value));
    ts_model_config out;
    CHECK_FAILS(ts_model_load_config(ck, &out), TS_ECORRUPT, needle);
    ts_checkpoint_free(ck);
    ts_checkpoint_free(good);
}

static void test_hostile_metadata(void)
{
    setup();
    refused("mlp", "model.name", "resnet", "model.name");
    refused("mlp", "model.hidden", "4x", "'model.hidden' = '4x'");
    refused("mlp", "model.hidden", "-4", "'model.hidden' = '-4'");
    refused("mlp", "model.hidden", "1,,2", "model.hidden");
    refused("mlp", "model.hidden", "70000", "model.hidden");
    refused("mlp", "model.hidden", NULL, "'model.hidden' = '(missing)'");
    refused("mlp", "model.layers", "4", "'model.layers' = '4': no such key for this model");
    refused("lenet5", "model.hidden", "10", "no such key for this model");
    refused("cnn", "model.channels", "8,8,8,8,8", "model configuration");
    refused("cnn", "model.init", "orthogonal", "model.init");
    refused("cnn", "model.init_std", "0.1", "not normal");
    refused("gpt", "model.layers", "0", "'model.layers' = '0'");
    refused("gpt", "model.layers", "65", "'model.layers' = '65'");
    refused("gpt", "model.embd", "0x10", "model.embd");
    refused("gpt", "model.heads", "3", "not a multiple of heads 3");
    refused("gpt", "model.dropout", "nan", "model.dropout");
    refused("gpt", "model.dropout", "1", "model.dropout");
    refused("gpt", "model.context", "99999999999999999999", "model.context");
    /* a terminal escape in a value is shown, not sent */
    refused("cnn", "model.init", "\x1b]0;PWNED\x07", "'\\x1b]0;PWNED\\x07'");
    /* none at all */
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    ts_model_config out;
    CHECK_FAILS(ts_model_load_config(ck, &out), TS_EINVAL, "names no model");
    ts_checkpoint_free(ck);
    tap_end();
}

/* train.model + train.arch, as tessera wrote them before the model.* keys. */
static void test_legacy_metadata(void)
{
    setup();
    static const struct {
        const char *model, *arch, *want; /* want NULL: refused */
    } cases[] = {
        {"mlp", "mlp --hidden 500 --init normal:0.01", "mlp --hidden 500 --init normal:0.01"},
        {"mlp", "mlp --hidden 256,128", "mlp --hidden 256,128"},
        {"lenet5", "lenet5 --init xavier", "lenet5 --init xavier"},
        {"cnn", "cnn --channels 16 --hidden 32", "cnn --channels 16 --hidden 32"},
        {"gpt", "gpt --context 128 --layers 4 --heads 4 --embd 128 --dropout 0",
         "gpt --context 128 --layers 4 --heads 4 --embd 128 --dropout 0"},
        {"mlp", NULL, "mlp --hidden 256,128"}, /* older still: the defaults */
        {"mlp", "mlp --save /x48", NULL},
        {"mlp", "mlp --hidden 48 --device /tmp/x.so", NULL},
        {"mlp", "lenet5", NULL},
        {"gpt", "gpt --context 128 --layers 4 --heads 4", NULL},
        {"gpt", "gpt --context 128 --layers 99 --heads 4 --embd 128 --dropout 0", NULL},
        {"resnet", "resnet", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ts_checkpoint *ck;
        CHECK_OK(ts_checkpoint_new(&ck));
        CHECK_OK(ts_checkpoint_set_meta(ck, "train.model", cases[i].model));
        if (cases[i].arch)
            CHECK_OK(ts_checkpoint_set_meta(ck, "train.arch", cases[i].arch));
        ts_model_config c;
        if (cases[i].want) {
            CHECK_OK(ts_model_load_config(ck, &c));
            char b[256];
            CHECK_MSG(strcmp(ts_model_describe(&c, b, sizeof b), cases[i].want) == 0,
                      "%s read as %s", cases[i].arch, b);
        } else {
            CHECK_FAILS(ts_model_load_config(ck, &c), TS_ECORRUPT, "model configuration");
        }
        ts_checkpoint_free(ck);
    }
    tap_end();
}

/* All parameters of a and b equal, bit for bit. */
static int same_weights(ts_module *a, ts_module *b)
{
    size_t n = ts_module_parameters(a, NULL, 0);
    if (n != ts_module_parameters(b, NULL, 0))
        return 0;
    ts_named_tensor pa[64], pb[64];
    if (n > 64)
        return 0;
    ts_module_parameters(a, pa, n);
    ts_module_parameters(b, pb, n);
    int same = 1;
    for (size_t i = 0; i < n && same; i++) {
        size_t bytes = (size_t)ts_tensor_numel(pa[i].tensor) * 4;
        float *x = malloc(bytes), *y = malloc(bytes);
        same = x && y && !strcmp(pa[i].name, pb[i].name) &&
               ts_tensor_to_host(pa[i].tensor, x, bytes) == TS_OK &&
               ts_tensor_to_host(pb[i].tensor, y, bytes) == TS_OK && !memcmp(x, y, bytes);
        free(x);
        free(y);
    }
    return same;
}

static void test_build_is_deterministic(void)
{
    setup();
    static const char *const names[] = {"mlp", "lenet5", "cnn", "gpt", "cnn", "mlp"};
    for (int i = 0; i < 6; i++) {
        ts_model_config c;
        CHECK_OK(ts_model_defaults(names[i], &c));
        if (!strcmp(names[i], "gpt"))
            c.gpt = (ts_gpt_config){256, 8, 1, 2, 8, 0, 0};
        if (i == 4) /* 4 blocks (28 -> 14 -> 7 -> 3 -> 1) and hidden layers */
            c.nchannels = 4, c.channels[2] = 3, c.channels[3] = 5, c.nhidden = 2,
            c.hidden[0] = 7, c.hidden[1] = 3;
        if (i == 5)
            c.nhidden = 1, c.hidden[0] = 5;
        ts_rng r1 = TS_RNG(5), r2 = TS_RNG(5), r3 = TS_RNG(6);
        ts_module *a, *b, *d;
        CHECK_OK(ts_model_new(&c, dev, &r1, &a));
        CHECK_OK(ts_model_new(&c, NULL, &r2, &b)); /* NULL: the default device */
        CHECK_OK(ts_model_new(&c, dev, &r3, &d));
        CHECK_MSG(same_weights(a, b), "%s: the same seed built other weights", names[i]);
        CHECK_MSG(ts_model_params(&c) == (double)ts_module_num_params(a),
                  "%s: ts_model_params %g, the module has %lld", names[i], ts_model_params(&c),
                  (long long)ts_module_num_params(a));
        CHECK_MSG(!same_weights(a, d), "%s: another seed built the same weights", names[i]);
        ts_module_free(a);
        ts_module_free(b);
        ts_module_free(d);
    }
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_list_and_defaults), TAP_TEST(test_checks),
        TAP_TEST(test_metadata_round_trip), TAP_TEST(test_hostile_metadata),
        TAP_TEST(test_legacy_metadata), TAP_TEST(test_build_is_deterministic),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
