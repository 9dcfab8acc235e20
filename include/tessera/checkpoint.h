/* tessera/checkpoint.h: checkpoints in the safetensors format: an 8-byte little-endian header
 * length, a JSON header ({"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}),
 * then the raw little-endian tensor bytes, so Python's safetensors and PyTorch read them.
 *
 * Saving is atomic: the bytes go to a temporary file in the same directory, which is fsynced
 * and renamed over the target (and the directory fsynced), so a crash during a save never
 * destroys the previous checkpoint. Loading validates everything before trusting it (header
 * size bounds, JSON, dtypes, shapes, offsets inside the file, no overlaps or holes) and
 * rejects corrupt or truncated files with TS_ECORRUPT naming the file and the defect, never
 * reading out of bounds. */
#ifndef TESSERA_CHECKPOINT_H
#define TESSERA_CHECKPOINT_H

#include <stddef.h>
#include <tessera/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A set of named tensors and string metadata, being built for a save or read from a file. */
typedef struct ts_checkpoint ts_checkpoint;

/* An empty checkpoint. (transfer full): ts_checkpoint_free. */
ts_status ts_checkpoint_new(ts_checkpoint **out);
void ts_checkpoint_free(ts_checkpoint *ck);

/* Adds a tensor under a unique name (TS_EINVAL for a duplicate or an empty name); keeps a
 * reference to t until the checkpoint is freed, so save it before changing t. */
ts_status ts_checkpoint_add(ts_checkpoint *ck, const char *name, ts_tensor *t);
/* Sets a metadata string (replacing an earlier value of key). */
ts_status ts_checkpoint_set_meta(ts_checkpoint *ck, const char *key, const char *value);

/* Writes the checkpoint to path atomically (see above). TS_EIO naming the path and errno. */
ts_status ts_checkpoint_save(const ts_checkpoint *ck, const char *path);

/* Reads and validates path; tensors are created on dev (NULL: the default device).
 * TS_EIO if it cannot be read, TS_ECORRUPT for any defect. (transfer full) */
ts_status ts_checkpoint_load(const char *path, ts_device *dev, ts_checkpoint **out);

/* Number of tensors, and the i-th name (in file/insertion order). (transfer none) */
size_t ts_checkpoint_count(const ts_checkpoint *ck);
const char *ts_checkpoint_name(const ts_checkpoint *ck, size_t i);
/* The tensor named name, or NULL. (transfer none) */
ts_tensor *ts_checkpoint_get(const ts_checkpoint *ck, const char *name);
/* A metadata value, or NULL. (transfer none) */
const char *ts_checkpoint_meta(const ts_checkpoint *ck, const char *key);

/* Copies the tensor named name into dst (any device). TS_EINVAL if absent; TS_ESHAPE /
 * TS_EDTYPE naming both shapes / dtypes when they differ. */
ts_status ts_checkpoint_restore(const ts_checkpoint *ck, const char *name, ts_tensor *dst);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_CHECKPOINT_H */
