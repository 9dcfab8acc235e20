/* tessera/data.h: datasets. An IDX reader (the MNIST file format, gzip-compressed or not), the
 * Fashion-MNIST training and test sets as tensors held once on a device, and a loader that
 * yields mini-batches: zero-copy views when a batch is a contiguous range, and one gather
 * into a reused buffer when the order is shuffled. The shuffle order depends only on (seed,
 * epoch), so a resumed run sees the same batches. */
#ifndef TESSERA_DATA_H
#define TESSERA_DATA_H

#include <stdint.h>
#include <tessera/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads an IDX file (.gz or plain, detected by content) into a tensor on dev with the file's
 * shape: unsigned byte -> TS_U8, int -> TS_I32, float -> TS_F32, double -> TS_F64 (signed
 * byte and short are widened to TS_I32). TS_EIO if unreadable; TS_ECORRUPT naming the file for
 * a bad magic number, more than 8 dims, sizes that overflow, or data shorter or longer than
 * the header says. (transfer full) */
ts_status ts_idx_load(const char *path, ts_device *dev, ts_tensor **out);

/* The directory Debian's dataset-fashion-mnist package installs. */
#define TS_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Loads Fashion-MNIST (train: 60,000 images, else the 10,000 test images) from dir (NULL: the
 * default above): images (N, 1, 28, 28) float32 scaled to [0, 1], labels (N) int64. A missing
 * directory or file is TS_EIO naming the path and the Debian package to install. */
ts_status ts_fashion_mnist_load(const char *dir, int train, ts_device *dev, ts_tensor **images,
                                ts_tensor **labels);

/* Batches of (data[i], labels[i]) over the first dim. */
typedef struct ts_loader ts_loader;

/* batch_size >= 1. shuffle: a fresh permutation each epoch from (seed, epoch). drop_last: skip
 * a final short batch. Keeps references to data and labels. (transfer full) */
ts_status ts_loader_new(ts_tensor *data, ts_tensor *labels, int64_t batch_size, int shuffle,
                        uint64_t seed, int drop_last, ts_loader **out);
void ts_loader_free(ts_loader *l);

/* The next batch of the current epoch (transfer full on both), or *x == NULL at its end.
 * Unshuffled batches are views of data; shuffled ones are gathered into buffers the loader
 * reuses, so a caller must drop a batch before asking for the next (TS_ESTATE otherwise). */
ts_status ts_loader_next(ts_loader *l, ts_tensor **x, ts_tensor **y);
/* Delivers batches on dev rather than on the data's device (NULL, or the data's device:
 * back to that). Each batch is made where the data is (a view or a gather), copied into a
 * host staging buffer and uploaded into one of two batch buffers on dev used in turn; so a
 * batch must be released before the one after the next is asked for (TS_ESTATE otherwise).
 * pinned: the staging buffers are dev's pinned memory (ts_device_pinned_alloc) and the upload
 * is queued asynchronously (ts_device_copy_from_pinned): the next batch is prepared while dev
 * still works on this one, and the host waits only before it rewrites a staging buffer whose
 * upload has not finished. TS_ENOTSUP for pinned = 1 on a device without pinned memory. */
ts_status ts_loader_set_device(ts_loader *l, ts_device *dev, int pinned);
/* Starts epoch number `epoch` from its first batch. */
ts_status ts_loader_start_epoch(ts_loader *l, uint64_t epoch);
/* Where the loader is (for checkpoints) and how to get back there. */
void ts_loader_position(const ts_loader *l, uint64_t *epoch, int64_t *batch);
ts_status ts_loader_seek(ts_loader *l, uint64_t epoch, int64_t batch);
/* Batches per epoch. */
int64_t ts_loader_batches(const ts_loader *l);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_DATA_H */
