/*
 * tensorboard.h — TensorBoard event files (train --tensorboard DIR): one
 * file per run, DIR/events.out.tfevents.<seconds>.<host>.<pid>.tessera,
 * a sequence of TFRecord records (TensorFlow's record format: a uint64
 * little-endian length, its masked CRC-32C, the bytes, their masked
 * CRC-32C; mask: ((c >> 15) | (c << 17)) + 0xa282ead8), each an Event
 * protocol buffer (engine/tensorboard.proto, through protobuf-c; CRC-32C
 * from ISA-L's crc32_iscsi). The first Event carries file_version
 * "brain.Event:2"; each scalar is an Event with wall_time, step and a
 * Summary value {tag, simple_value}. Host; rank 0 writes.
 */
#ifndef TS_ENGINE_TENSORBOARD_H
#define TS_ENGINE_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_tensorboard ts_tensorboard;

/* Creates DIR (and its parent) if needed and a new event file in it with
 * its file_version record, flushed. TS_ERR_IO naming the path, as
 * "`tensorboard_dir` DIR: ..." (a file in the way, no permission). *out
 * NULL on failure. */
ts_status ts_tensorboard_open(ts_tensorboard **out, const char *dir);

/* Appends the scalar `tag` = value at step (an Event record); the record
 * reaches the file's buffer, ts_tensorboard_flush writes it out. TS_ERR_IO
 * on a failed write. */
ts_status ts_tensorboard_scalar(ts_tensorboard *tb, const char *tag, int64_t step, double value);

/* Writes out what was appended (fflush; every step's records are whole
 * in the file after it). TS_ERR_IO. */
ts_status ts_tensorboard_flush(ts_tensorboard *tb);

/* The event file's path. */
const char *ts_tensorboard_path(const ts_tensorboard *tb);

/* Flushes and closes; NULL is a no-op. */
void ts_tensorboard_close(ts_tensorboard *tb);

/* CRC-32C (Castagnoli) of n bytes, and TFRecord's mask of it. */
uint32_t ts_tensorboard_crc32c(const void *p, size_t n);
uint32_t ts_tensorboard_masked_crc(uint32_t crc);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_TENSORBOARD_H */
