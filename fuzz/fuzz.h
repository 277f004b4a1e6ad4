/*
 * fuzz.h — what every fuzz target of fuzz/ shares: libFuzzer's entry point
 * (https://llvm.org/docs/LibFuzzer.html), which tools/fuzz.sh links with
 * clang's -fsanitize=fuzzer, and replay_main.c with gcc for the suite;
 * and a scratch file for parsers that read a path.
 */
#ifndef TS_FUZZ_FUZZ_H
#define TS_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One input (size bytes, host; not NUL-terminated). Returns 0; any crash,
 * sanitizer report or leak is the finding. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes data to this process's scratch file ($TMPDIR or /tmp,
 * ts-fuzz-PID-NAME) and returns its path (static storage), or NULL if it
 * cannot be written. */
const char *ts_fuzz_file(const char *name, const uint8_t *data, size_t size);

/* data as a NUL-terminated copy (free() it), or NULL when out of memory. */
char *ts_fuzz_text(const uint8_t *data, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* TS_FUZZ_FUZZ_H */
