/* models/models.h: what the files of models/ share; never installed. */
#ifndef TESSERA_MODELS_INTERNAL_H
#define TESSERA_MODELS_INTERNAL_H

#include <tessera/models.h>

/* The image classifiers (mlp, lenet5, cnn) of a checked configuration (classifiers.c). */
ts_status ts__classifier_new(const ts_model_config *cfg, ts_device *dev, ts_rng *rng,
                             ts_module **out);

#endif /* TESSERA_MODELS_INTERNAL_H */
