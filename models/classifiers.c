/* models/classifiers.c: the image classifiers of tessera/models.h, 28x28 single-channel
 * images to 10 classes, each a ts_nn_sequential of the library's layers:
 *   mlp:    flatten, then the hidden linear layers with ReLU, then linear to 10;
 *   lenet5: conv 5x5 (pad 2) 6, ReLU, pool; conv 5x5 16, ReLU, pool; 400-120-84-10;
 *   cnn:    blocks of conv 3x3 (pad 1), ReLU, 2x2 max pool, then as mlp.
 * Layers are created in that order from the one rng, so a configuration and a seed give the
 * same weights on every run. */
#include <stdio.h>
#include <string.h>

#include <tessera/tessera.h>
#include <tessera/models.h>

#include "../core/internal.h" /* TS_API */
#include "models.h"

/* A layer made by call, appended to seq under name. */
#define ADD(seq, name, call)                                                                \
    do {                                                                                    \
        ts_module *m_;                                                                      \
        if ((s = (call)) || (s = ts_nn_sequential_add(seq, name, m_)))                       \
            goto fail;                                                                      \
    } while (0)

ts_status ts__classifier_new(const ts_model_config *m, ts_device *dev, ts_rng *rng,
                             ts_module **out)
{
    ts_module *seq;
    *out = NULL;
    ts_status s = ts_nn_sequential(&seq);
    if (s)
        return s;
    ts_weight_init init = {m->init, m->init_std, rng};
    ts_pool2d_params pool2 = {.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
    char name[32];
    if (strcmp(m->name, "lenet5") == 0) { /* the first conv padded for 28x28 */
        ts_conv2d_params c1 = {1, 1, 2, 2, 1, 1, 1}, c2 = {1, 1, 0, 0, 1, 1, 1};
        ADD(seq, "conv1", ts_nn_conv2d(dev, 1, 6, 5, 5, &c1, 1, &init, &m_));
        ADD(seq, "relu1", ts_nn_relu(&m_));
        ADD(seq, "pool1", ts_nn_max_pool2d(&pool2, &m_));
        ADD(seq, "conv2", ts_nn_conv2d(dev, 6, 16, 5, 5, &c2, 1, &init, &m_));
        ADD(seq, "relu2", ts_nn_relu(&m_));
        ADD(seq, "pool2", ts_nn_max_pool2d(&pool2, &m_));
        ADD(seq, "flatten", ts_nn_flatten(&m_));
        ADD(seq, "fc1", ts_nn_linear(dev, 400, 120, 1, &init, &m_));
        ADD(seq, "relu3", ts_nn_relu(&m_));
        ADD(seq, "fc2", ts_nn_linear(dev, 120, 84, 1, &init, &m_));
        ADD(seq, "relu4", ts_nn_relu(&m_));
        ADD(seq, "fc3", ts_nn_linear(dev, 84, 10, 1, &init, &m_));
        *out = seq;
        return TS_OK;
    }
    ts_conv2d_params c = {1, 1, 1, 1, 1, 1, 1};
    int64_t ch = 1, hw = 28;
    for (int i = 0; i < m->nchannels; i++) { /* cnn */
        snprintf(name, sizeof name, "conv%d", i + 1);
        ADD(seq, name, ts_nn_conv2d(dev, ch, m->channels[i], 3, 3, &c, 1, &init, &m_));
        snprintf(name, sizeof name, "relu%d", i + 1);
        ADD(seq, name, ts_nn_relu(&m_));
        snprintf(name, sizeof name, "pool%d", i + 1);
        ADD(seq, name, ts_nn_max_pool2d(&pool2, &m_));
        ch = m->channels[i];
        hw /= 2;
    }
    int64_t feat = ch * hw * hw; /* features entering the linear layers */
    ADD(seq, "flatten", ts_nn_flatten(&m_));
    for (int i = 0; i <= m->nhidden; i++) {
        int64_t o = i < m->nhidden ? m->hidden[i] : 10;
        snprintf(name, sizeof name, "fc%d", i + 1);
        ADD(seq, name, ts_nn_linear(dev, feat, o, 1, &init, &m_));
        if (i < m->nhidden) {
            snprintf(name, sizeof name, "relu%d", m->nchannels + i + 1);
            ADD(seq, name, ts_nn_relu(&m_));
        }
        feat = o;
    }
    *out = seq;
    return TS_OK;
fail:
    ts_module_free(seq);
    return s;
}
