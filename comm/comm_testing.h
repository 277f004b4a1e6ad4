/*
 * comm_testing.h — a hook for comm's own tests, not for production code:
 * the test-only library //comm:testing (comm_testing.c), which production
 * binaries do not link.
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
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the largest MPI message comm sends in one call, in bytes, clamped to
 * 1 .. 1 GiB, and returns the previous value. Every rank must set the same
 * value, between collectives (no request in flight). Not thread-safe. */
size_t ts_comm_testing_set_max_message_bytes(size_t nbytes);

/* Before each call it runs, every communication thread (ts_comm_set_thread)
 * sleeps a random time, uniform in [0, max_us] microseconds, drawn from a
 * generator seeded by seed and the group's rank (0: no delay, the
 * default). Moves every completion in time, and so tests that overlap
 * moves no bit. Threads started after the call draw from the new seed;
 * set it before any thread runs. */
void ts_comm_testing_set_thread_delay(unsigned max_us, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif /* TS_COMM_COMM_TESTING_H */
