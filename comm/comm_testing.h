/*
 * comm_testing.h — a hook for comm's own tests, not for production code.
 *
 * comm splits every transfer into MPI messages of at most "max message
 * bytes" (1 GiB by default, so that MPI's int counts never overflow whatever
 * the element count). Lowering the limit lets a test run the splitting and
 * large-count code paths (message pieces, the point-to-point all-gather) on
 * small buffers.
 */
#ifndef TS_COMM_COMM_TESTING_H
#define TS_COMM_COMM_TESTING_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the largest MPI message comm sends in one call, in bytes, clamped to
 * 1 .. 1 GiB, and returns the previous value. Every rank must set the same
 * value, between collectives (no request in flight). Not thread-safe. */
size_t ts_comm_testing_set_max_message_bytes(size_t nbytes);

#ifdef __cplusplus
}
#endif

#endif /* TS_COMM_COMM_TESTING_H */
