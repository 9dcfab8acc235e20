/* tessera/checkpoint.h: checkpoints in the safetensors format: an 8-byte little-endian header
 * length, a JSON header ({"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}),
 * then the raw little-endian tensor bytes, so Python's safetensors and PyTorch read them.
 *
 * Saving is atomic and safe in a directory others can write: the bytes go to a temporary file
 * created exclusively (O_EXCL | O_NOFOLLOW) under an unpredictable name in the same directory,
 * which is fsynced and renamed over the target (and the directory fsynced), so a crash during
 * a save never destroys the previous checkpoint and no planted link is ever followed. A target
 * that exists and is not a regular file (a symlink, FIFO, device, socket, directory) is
 * refused. Loading validates everything before trusting it (header size bounds, JSON, dtypes,
 * shapes, offsets inside the file, no overlaps or holes) and rejects corrupt or truncated
 * files with TS_ECORRUPT naming the file and the defect, never reading out of bounds; it reads
 * no tensor bytes: a tensor is read when it is asked for (docs/checkpoints.md). */
#ifndef TESSERA_CHECKPOINT_H
#define TESSERA_CHECKPOINT_H

#include <stddef.h>
#include <stdio.h>
#include <tessera/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A set of named tensors and string metadata, being built for a save or read from a file. */
typedef struct ts_checkpoint ts_checkpoint;

/* An empty checkpoint. (transfer full): ts_checkpoint_free. */
ts_status ts_checkpoint_new(ts_checkpoint **out);
void ts_checkpoint_free(ts_checkpoint *ck);

/* Adds a tensor under a unique name (TS_EINVAL for a duplicate or an empty name, or one that
 * is not valid UTF-8, which the JSON header must be); keeps a reference to t until the
 * checkpoint is freed, so save it before changing t. */
ts_status ts_checkpoint_add(ts_checkpoint *ck, const char *name, ts_tensor *t);
/* Sets a metadata string (replacing an earlier value of key). Key and value must be valid
 * UTF-8 (TS_EINVAL otherwise). */
ts_status ts_checkpoint_set_meta(ts_checkpoint *ck, const char *key, const char *value);

/* Writes the checkpoint to path atomically (see above). The file written is always a new one
 * owned by the caller: 0666 less the umask, or the permission bits of the caller's own file it
 * replaces where they are no wider than that (a 0600 file stays 0600; a 0666 one does not
 * stay 0666). An existing file that belongs to another user is refused (TS_EIO saying so),
 * never adopted: in a shared directory it may have been planted to take over the save. A file
 * size limit (RLIMIT_FSIZE) is an error, not a SIGXFSZ: the calling thread blocks SIGXFSZ
 * during the save. TS_EIO naming the path, the step and errno; the old file is left as it
 * was and no temporary file remains. */
ts_status ts_checkpoint_save(const ts_checkpoint *ck, const char *path);

/* Whether ts_checkpoint_save could write path now: it is absent or a regular file of the
 * caller's (not a link, directory, FIFO, device or another user's file) and a file can be
 * created next to it. Creates and removes
 * one temporary file there, touches nothing else. For a program to refuse a bad --save path
 * before hours of training rather than after. TS_EIO with the reason. */
ts_status ts_checkpoint_check_path(const char *path);
/* The same for any file ts_file_save would write; what names it in messages ("the picture"). */
ts_status ts_file_check_path(const char *path, const char *what);

/* Writes whatever write puts on its stream to path with the same rule as ts_checkpoint_save:
 * a temporary file created exclusively next to path, synced and renamed over it, never through
 * a link, never over a special file or another user's file. write returns 0 on success;
 * anything else (or a stream error) leaves path as it was. what names the file in messages
 * ("the picture"). For a program's own outputs (tessera memplot's SVG). TS_EIO with the
 * reason. */
typedef int (*ts_file_writer)(FILE *f, void *user);
ts_status ts_file_save(const char *path, const char *what, ts_file_writer write, void *user);

/* Opens and validates path, and keeps it open until ts_checkpoint_free: tensors are read from
 * it when asked for, ts_checkpoint_get creating them on dev (NULL: the default device; dev
 * must outlive the checkpoint). TS_EIO if it cannot be read, TS_ECORRUPT for any defect.
 * (transfer full) */
ts_status ts_checkpoint_load(const char *path, ts_device *dev, ts_checkpoint **out);

/* Number of tensors, and the i-th name (in file/insertion order). (transfer none) */
size_t ts_checkpoint_count(const ts_checkpoint *ck);
const char *ts_checkpoint_name(const ts_checkpoint *ck, size_t i);
/* The tensor named name, or NULL (absent, or it could not be read: ts_last_error() says).
 * In a loaded checkpoint the first get reads the tensor from the file and keeps it until
 * ts_checkpoint_free; concurrent gets are safe. (transfer none) */
ts_tensor *ts_checkpoint_get(const ts_checkpoint *ck, const char *name);
/* The dtype, ndim and shape (TS_MAX_DIMS entries) of the tensor named name, without reading
 * it; any out-parameter may be NULL. TS_EINVAL if absent. */
ts_status ts_checkpoint_tensor_info(const ts_checkpoint *ck, const char *name, int32_t *dtype,
                                    int *ndim, int64_t *shape);
/* The dtype as the file stores it ("F32", ..., or "F16", "BF16", "BOOL": those load as
 * float32, float32 and uint8, with a warning in the log); NULL if absent. (transfer none) */
const char *ts_checkpoint_stored_dtype(const ts_checkpoint *ck, const char *name);
/* A metadata value, or NULL. (transfer none) */
const char *ts_checkpoint_meta(const ts_checkpoint *ck, const char *key);
/* Number of metadata entries, and the i-th key (file/insertion order). (transfer none) */
size_t ts_checkpoint_meta_count(const ts_checkpoint *ck);
const char *ts_checkpoint_meta_key(const ts_checkpoint *ck, size_t i);

/* Copies the tensor named name into dst (any device). TS_EINVAL if absent; TS_ESHAPE /
 * TS_EDTYPE naming both shapes / dtypes when they differ (checked before anything is read).
 * A loaded tensor not yet read is read for the copy and not kept. A BF16 or F16 tensor (which
 * loads as such) also restores into a float32 or float64 destination, widened exactly. */
ts_status ts_checkpoint_restore(const ts_checkpoint *ck, const char *name, ts_tensor *dst);

/* ---- a module's state (PyTorch's state_dict) ---------------------------------------- */

typedef struct ts_module ts_module;

/* Adds every parameter and buffer of m to ck under prefix + its name (prefix NULL or "":
 * none; "model." puts several modules in one checkpoint). */
ts_status ts_module_save(ts_module *m, const char *prefix, ts_checkpoint *ck);
/* Copies every parameter and buffer of m from ck (prefix + name). All are checked first
 * (present, same dtype and shape: TS_EINVAL / TS_ESHAPE naming the first that is not), so a
 * mismatched file leaves m as it was; tensors of ck that m lacks are ignored. */
ts_status ts_module_load(ts_module *m, const char *prefix, const ts_checkpoint *ck);
/* The same, one module to or from one file (saved atomically). */
ts_status ts_module_save_file(ts_module *m, const char *path);
ts_status ts_module_load_file(ts_module *m, const char *path);

/* ---- NumPy .npy files ---------------------------------------------------------------- */

/* Writes t (any device, any strides) to path as a NumPy .npy file exactly as numpy.save
 * writes it: format 1.0, C order, little-endian ('<f4' float32, '<f8' float64, '<i4' int32,
 * '<i8' int64, '|u1' uint8), the data at a multiple of 64 bytes. Saved atomically and
 * link-safe, like a checkpoint. TS_EIO naming the path and the step. */
ts_status ts_npy_save(const ts_tensor *t, const char *path);
/* Reads a .npy file (format 1.0, 2.0 or 3.0) into a new tensor on dev (NULL: the default
 * device), C or Fortran order, little- or big-endian. float32, float64, int32, int64 and
 * uint8 load as they are; float16 as float32, bool as uint8, int8, int16 and uint16 as
 * int32, uint32 as int64 (all exact). The whole file is checked before any element is read:
 * TS_ECORRUPT naming the file and the defect (no magic, a version other than 1.0/2.0/3.0, a
 * header that is not numpy's dict literal or over 1 MiB, a shape whose byte count overflows,
 * truncated data or bytes after it), TS_EDTYPE for a dtype tessera has no equivalent of
 * (complex, objects, strings, structured arrays, uint64) naming it, TS_EINVAL for more than
 * TS_MAX_DIMS dimensions, TS_EIO for what cannot be opened (a directory, a FIFO, a device).
 * (transfer full) */
ts_status ts_npy_load(const char *path, ts_device *dev, ts_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_CHECKPOINT_H */
