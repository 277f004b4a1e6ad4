/* base.c — status names, the thread-local last-error message, dtypes. */
#include "base/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *ts_status_str(ts_status s) {
  switch (s) {
    case TS_OK: return "ok";
    case TS_ERR_INVALID_ARGUMENT: return "invalid argument";
    case TS_ERR_INVALID_USAGE: return "invalid usage";
    case TS_ERR_OUT_OF_MEMORY: return "out of memory";
    case TS_ERR_IO: return "I/O error";
    case TS_ERR_FORMAT: return "format error";
    case TS_ERR_MPI: return "MPI error";
    case TS_ERR_CUDA: return "CUDA error";
    case TS_ERR_NCCL: return "NCCL error";
    case TS_ERR_INTERNAL: return "internal error";
    case TS_ERR_UNSUPPORTED: return "unsupported";
    case TS_ERR_NUMERIC: return "numerical failure";
  }
  return "unknown status";
}

const char *ts_last_error(void) { return last_error; }

void ts_clear_error(void) { last_error[0] = '\0'; }

ts_status ts_set_error(ts_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return s;
}

void ts_assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "tessera: assertion failed: %s (%s:%d)\n", expr, file, line);
  abort();
}

size_t ts_dtype_size(ts_dtype dt) { return dt == TS_FP32 ? 4 : 2; }

const char *ts_dtype_name(ts_dtype dt) {
  switch (dt) {
    case TS_FP32: return "fp32";
    case TS_BF16: return "bf16";
    case TS_FP16: return "fp16";
  }
  return "?";
}

ts_status ts_dtype_parse(const char *name, ts_dtype *out) {
  static const ts_dtype all[] = {TS_FP32, TS_BF16, TS_FP16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    if (name && strcmp(name, ts_dtype_name(all[i])) == 0) {
      *out = all[i];
      return TS_OK;
    }
  }
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "dtype '%s': expected fp32, bf16 or fp16",
                      name ? name : "(null)");
}

const char *ts_device_name(ts_device d) {
  switch (d) {
    case TS_DEVICE_CPU: return "cpu";
    case TS_DEVICE_CUDA: return "cuda";
    case TS_DEVICE_COUNT: break;
  }
  return "?";
}
