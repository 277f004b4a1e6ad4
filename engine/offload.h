/*
 * offload.h — private to engine/: this rank's optimizer state (the fp32
 * master weights when the compute dtype is bf16/fp16, Adam's m and v) in a
 * scratch file under opts.offload_dir instead of in memory (DESIGN.md
 * "Offload"; ZeRO-Infinity's NVMe offload, Rajbhandari et al. 2021, §5),
 * streamed in pieces through TS_OFFLOAD_SLOTS buffers by one I/O thread.
 *
 * The file: one per rank, made under the folder with a unique name, sized
 * at open (posix_fallocate: a disk too small fails there, not mid-run) and
 * unlinked at once, so nothing is left behind however the run ends; each
 * unit's arrays (master, m, v) follow each other, 4 KiB-aligned, read and
 * written with O_DIRECT where the file system takes it (else through the
 * page cache). Its bytes are charged to the ledger's disk account (master,
 * optim); the slots to the host's (the CPU account; beside a GPU
 * page-locked, read and written by ts_engine_adamw_part's copies).
 *
 * A unit's arrays are cut into pieces of opts.offload_piece elements
 * (TS_OFFLOAD_PIECE by default; the last piece shorter): piece p holds
 * elements [p P, min((p + 1) P, n)) of each array, so memory holds three
 * pieces, whatever the size of the largest unit. A piece is in memory
 * between ts_offload_acquire and its ts_offload_release; s->master, s->m
 * and s->v stay NULL under offload. The I/O thread runs the jobs in the
 * order they were queued (a read into a slot queued after that slot's
 * write-back reads after it), so a release's write-back overlaps whatever
 * runs next (the next piece's AdamW, the next step's forward) and a
 * prefetch the current piece's update. On a plan engine the same calls
 * charge the same bytes and touch no file (ts_offload_no_store).
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

/* Pieces in memory at once: the one updated, the next read ahead, the
 * last still being written. A piece's default elements: 4 Mi (16 MiB per
 * array). */
enum { TS_OFFLOAD_SLOTS = 3, TS_OFFLOAD_PIECE = 1 << 22 };

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

/* Pieces of unit u's state (0 for a unit of another stage), and the first
 * element of piece p. */
int ts_offload_pieces(const ts_engine *e, int u);
size_t ts_offload_piece_first(const ts_engine *e, int p);

/* Piece p of unit u's state in memory until the matching release: arr[0]
 * master (NULL in fp32), arr[1] m, arr[2] v, each at the piece's first
 * element (host, fp32). Nested acquires of one piece count. Reads it unless
 * a slot has it (a prefetch, an earlier use). Errors: the first I/O error
 * of any job so far (TS_ERR_IO: "`offload_dir` DIR: write of unit U's
 * optimizer state (N bytes at offset O of the scratch file): Input/output
 * error"); TS_ERR_INTERNAL when every slot is held. */
ts_status ts_offload_acquire(ts_engine *e, int u, int p, float *arr[3]);

/* Ends one acquire of piece p of unit u; dirty: it changed. When the last
 * acquire ends and any release said dirty, the piece is written back
 * (queued: the I/O thread writes it while the caller goes on). Errors: the
 * first I/O error so far. */
ts_status ts_offload_release(ts_engine *e, int u, int p, int dirty);

/* Starts reading piece p of unit u into a slot no one holds (the least
 * recently used), unless a slot has it already or it does not exist.
 * Never waits. */
void ts_offload_prefetch(ts_engine *e, int u, int p);

/* Runs fn over elements [lo, lo + n) of unit u's state a piece at a time:
 * fn(arg, at, first, count) with at[a] pointing at element `first` of
 * array a (master NULL in fp32) and count elements from there in memory;
 * dirty: fn changes them (written back). The first error, fn's or I/O's. */
ts_status ts_offload_each(ts_engine *e, int u, size_t lo, size_t n, int dirty,
                          ts_status (*fn)(void *arg, float *const at[3], size_t first,
                                          size_t count),
                          void *arg);

/* A copy of unit u's state array `array` (0 master, 1 m, 2 v) in a buffer
 * of the offload's (host, outside the ledger: for engine_testing.h's
 * ts_engine_optimizer_state), valid until the next peek; NULL for the
 * master in fp32, or when an I/O error happened (the error set). */
const float *ts_offload_peek(ts_engine *e, int u, int array);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_OFFLOAD_H */
