/*
 * base.h — the vocabulary every tessera module shares: status codes, the
 * last-error message, check macros, storage dtypes and device kinds.
 *
 * Invariants: ts_status values never change once released (NCCL style);
 * library code never prints or exits, it returns a status and leaves a
 * "what, where, why" message in ts_last_error() (thread-local).
 * This target (//base) has no dependencies, so every layer (comm/, shard/,
 * models/, kernels/, engine/) uses it without pulling in another.
 */
#ifndef TS_BASE_BASE_H
#define TS_BASE_BASE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Result of every fallible library call. Values are fixed forever. */
typedef enum ts_status {
  TS_OK = 0,
  TS_ERR_INVALID_ARGUMENT = 1, /* a value out of range, a bad shape, bad input data */
  TS_ERR_INVALID_USAGE = 2,    /* calls in the wrong order, unsupported combination */
  TS_ERR_OUT_OF_MEMORY = 3,    /* an allocation or a workspace was too small */
  TS_ERR_IO = 4,               /* open/read/write/fsync/rename failed */
  TS_ERR_FORMAT = 5,           /* a file's contents are malformed */
  TS_ERR_MPI = 6,
  TS_ERR_CUDA = 7,
  TS_ERR_NCCL = 8,
  TS_ERR_INTERNAL = 9,         /* a bug in tessera */
  TS_ERR_UNSUPPORTED = 10,     /* valid request this build/device cannot do */
  TS_ERR_NUMERIC = 11,         /* training cannot go on: e.g. fp16 overflow at the minimum loss scale */
} ts_status;

/* Name of a status, e.g. "invalid argument". Never NULL. */
const char *ts_status_str(ts_status s);

/* The message of the last failure on this thread ("" if none). The pointer
 * stays valid until the next ts_set_error on this thread. */
const char *ts_last_error(void);

/* Records a printf-formatted message (one line, no trailing newline) as the
 * last error and returns s, so callers write `return ts_set_error(...)`. */
ts_status ts_set_error(ts_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Clears the last-error message. */
void ts_clear_error(void);

/* Propagate a failing status to the caller. */
#define TS_CHECK(expr)                 \
  do {                                 \
    ts_status ts_s_ = (expr);          \
    if (ts_s_ != TS_OK) return ts_s_;  \
  } while (0)

/* Store a failing status in `st` and jump to `label` (one cleanup path). */
#define TS_CHECK_GOTO(expr, st, label) \
  do {                                 \
    (st) = (expr);                     \
    if ((st) != TS_OK) goto label;     \
  } while (0)

/* Programmer errors only: prints file:line and aborts. */
void ts_assert_fail(const char *expr, const char *file, int line);
#define TS_ASSERT(cond) \
  do {                  \
    if (!(cond)) ts_assert_fail(#cond, __FILE__, __LINE__); \
  } while (0)

/* Storage dtype of compute parameters, activations and gradients.
 * Master weights and optimizer moments are always fp32. */
typedef enum ts_dtype {
  TS_FP32 = 0,
  TS_BF16 = 1,
  TS_FP16 = 2,
} ts_dtype;

/* Bytes per element: 4, 2, 2. */
size_t ts_dtype_size(ts_dtype dt);
/* "fp32", "bf16", "fp16". */
const char *ts_dtype_name(ts_dtype dt);
/* Parses a name as above; TS_ERR_INVALID_ARGUMENT (message lists the choices). */
ts_status ts_dtype_parse(const char *name, ts_dtype *out);

/* The most tensors one unit of a model (one flat buffer of parameters)
 * holds: models/ lays units out within it, shard/ partitions them. A
 * LLaMA block has 9, a BERT layer 16. */
#define TS_UNIT_MAX_TENSORS 32

/* Where a buffer lives and a kernel runs: host memory and the CPU, or one
 * CUDA GPU (the one the process selected). Values index per-device tables. */
typedef enum ts_device {
  TS_DEVICE_CPU = 0,
  TS_DEVICE_CUDA = 1,
  TS_DEVICE_COUNT = 2, /* number of device kinds, not a device */
} ts_device;

/* "cpu", "cuda" ("?" for anything else). */
const char *ts_device_name(ts_device d);

#ifdef __cplusplus
}
#endif

#endif /* TS_BASE_BASE_H */
