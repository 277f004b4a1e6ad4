/*
 * comm_testing.c — comm's test seam (comm_testing.h), a test-only library
 * (//comm:testing): it turns backend.h's knobs, which production code
 * leaves at their defaults.
 */
#include "comm/comm_testing.h"

#include "comm/backend.h"

size_t ts_comm_testing_set_max_message_bytes(size_t nbytes) {
  size_t old = ts_comm_max_message;
  if (nbytes < 1) nbytes = 1;
  if (nbytes > ((size_t)1 << 30)) nbytes = (size_t)1 << 30;
  ts_comm_max_message = nbytes;
  return old;
}

void ts_comm_testing_set_thread_delay(unsigned max_us, uint64_t seed) {
  ts_comm_thread_delay_max_us = max_us;
  ts_comm_thread_delay_seed = seed ? seed : 1;
}
