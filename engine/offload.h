/*
 * offload.h — private to engine/: this rank's optimizer state (the fp32
 * master weights when the compute dtype is bf16/fp16, Adam's m and v) in a
 * scratch file under opts.offload_dir instead of in memory (DESIGN.md
 * "Offload"; ZeRO-Infinity's NVMe offload, Rajbhandari et al. 2021, §5),
 * streamed per unit through TS_OFFLOAD_SLOTS buffers by one I/O thread.
 *
 * The file: one per rank, made under the folder with a unique name, sized
 * at open (posix_fallocate: a disk too small fails there, not mid-run) and
 * unlinked at once, so nothing is left behind however the run ends; the
 * units' blocks follow each other, each array (master, m, v) 4 KiB-aligned,
 * read and written with O_DIRECT where the file system takes it (else
 * through the page cache). Its bytes are charged to the ledger's disk
 * account (master, optim); the slots to the device's (the CPU's).
 *
 * A unit's state is in memory between ts_offload_acquire and its
 * ts_offload_release: s->master, s->m and s->v point into a slot then and
 * are NULL otherwise. The I/O thread runs the jobs in the order they were
 * queued (a read into a slot queued after that slot's write-back reads
 * after it), so a release's write-back overlaps whatever runs next (the
 * next unit's AdamW, the next step's forward) and a prefetch the current
 * unit's update. On a plan engine (TS_K_PLAN) the same calls charge the
 * same bytes and touch no file.
 */
#ifndef TS_ENGINE_OFFLOAD_H
#define TS_ENGINE_OFFLOAD_H

#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_offload ts_offload; /* offload.c's */

/* Where the state's bytes go: the scratch file (ts_offload_file_store, the
 * default) or nowhere (ts_offload_no_store: the plan device's, set up by
 * plan.c, whose buffers have no memory). open makes the store ready for
 * o's bytes (o->disk of them, in the folder e->opts.offload_dir). */
typedef struct ts_offload_store {
  ts_status (*open)(ts_offload *o, ts_engine *e);
} ts_offload_store;
extern const ts_offload_store ts_offload_file_store, ts_offload_no_store;

/* Units whose state is in memory at once: the one updated, the next read
 * ahead, the last still being written. */
enum { TS_OFFLOAD_SLOTS = 3 };

/* Opens e's offload for the units of its stage (their layouts set):
 * creates, sizes and unlinks the scratch file under e->opts.offload_dir,
 * allocates the slots and starts the I/O thread. Every unit's state reads
 * as zeros until written. Errors: TS_ERR_IO naming the option, the folder
 * and the system's reason ("`offload_dir` /x: cannot create a scratch file
 * there: Permission denied"; "`offload_dir` /x: N bytes of optimizer state
 * do not fit: No space left on device"), TS_ERR_OUT_OF_MEMORY. */
ts_status ts_offload_open(ts_engine *e);

/* Waits for every queued job, stops the thread, frees the slots, closes
 * the file and takes its bytes off the disk account. NULL offload: no-op. */
void ts_offload_close(ts_engine *e);

/* Unit u's state in memory (s->master, s->m, s->v set; master stays NULL
 * in fp32) until the matching release; nested acquires of one unit count.
 * Reads it unless a slot has it (a prefetch, an earlier use). Errors: the
 * first I/O error of any job so far (TS_ERR_IO: "`offload_dir` DIR: write
 * of unit U's optimizer state (N bytes at offset O of the scratch file):
 * Input/output error"); TS_ERR_INTERNAL when every slot is held. */
ts_status ts_offload_acquire(ts_engine *e, int u);

/* Ends one acquire of unit u; dirty: its state changed. When the last
 * acquire ends the pointers go NULL and, if any release said dirty, the
 * state is written back (queued: the I/O thread writes it while the caller
 * goes on). Errors: the first I/O error so far. */
ts_status ts_offload_release(ts_engine *e, int u, int dirty);

/* Starts reading unit u's state into a slot no one holds (the least
 * recently used), unless a slot has it already or u is outside the stage.
 * Never waits. */
void ts_offload_prefetch(ts_engine *e, int u);

/* A copy of unit u's state array `array` (0 master, 1 m, 2 v) in a buffer
 * of the offload's (host, outside the ledger: for engine_testing.h's
 * ts_engine_optimizer_state), valid until the next peek; NULL for the
 * master in fp32, or when an I/O error happened (the error set). */
const float *ts_offload_peek(ts_engine *e, int u, int array);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_OFFLOAD_H */
