/*
 * checkpoint.h — a training checkpoint as a folder (DESIGN.md
 * "Checkpoints"): every rank writes its own slices, an index maps each
 * logical tensor to them, and a load re-cuts them for any data-parallel
 * size, ZeRO stage, pipeline layout and compute dtype.
 *
 * A folder holds:
 *   rank-RRRRR.bin  one per rank of the world that saved (R = pipeline
 *                   stage * dp + dp rank): for each kind (compute
 *                   parameters in the compute dtype; fp32 master weights,
 *                   bf16/fp16 only; fp32 Adam exp_avg; fp32 exp_avg_sq),
 *                   for each unit of the rank's pipeline stage in order
 *                   (interleaved: its chunks' units in model order),
 *                   the unit's flat elements [d S, min((d + 1) S, total))
 *                   of dp rank d, back to back: the rank's own part, as the
 *                   ZeRO stage-3 shard would hold it (padding not written).
 *                   No rank gathers anything.
 *   extra files     written by rank 0 for its caller (trainer.json,
 *                   config.json), small.
 *   index.json      written last, by rank 0, once every rank's file is
 *                   durable: the format and version, the layout that saved
 *                   it (dtype, ZeRO stage, dp, pipeline stages, virtual
 *                   stages when more than one per rank, and split),
 *                   the optimizer's counters and loss scaler, the data
 *                   seed (a decimal string), every file with its byte
 *                   count and SHA-256, and for every tensor of the model
 *                   (Hugging Face name, global shape) and every kind the
 *                   slices that hold it: [file, first element, end
 *                   element, byte offset in the file]; sealed by the
 *                   SHA-256 of all that ("digest", version 2).
 * Every file goes through base/'s atomic write, so the folder is a
 * complete checkpoint exactly when index.json exists; a folder without it
 * is ignored (ts_checkpoint_latest) and an existing index is removed before
 * a new save into the same folder writes anything.
 *
 * Loading reads only the fp32 sources (master weights, or the parameters of
 * an fp32 checkpoint, and the moments), so the compute parameters of any
 * dtype are the round-to-nearest-even of the fp32 master weights: the bits
 * an uninterrupted run holds, whatever layout saved them. Host code; the
 * engine's buffers may live on a device.
 */
#ifndef TS_ENGINE_CHECKPOINT_H
#define TS_ENGINE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a slice of a tensor holds. */
typedef enum ts_checkpoint_kind {
  TS_CHECKPOINT_PARAM = 0,      /* compute parameters, the saving run's dtype */
  TS_CHECKPOINT_MASTER = 1,     /* fp32 master weights (bf16/fp16 runs only) */
  TS_CHECKPOINT_EXP_AVG = 2,    /* fp32 Adam first moment m */
  TS_CHECKPOINT_EXP_AVG_SQ = 3, /* fp32 Adam second moment v */
  TS_CHECKPOINT_NUM_KINDS = 4,
} ts_checkpoint_kind;

/* "param", "master", "exp_avg", "exp_avg_sq" (the index's keys). */
const char *ts_checkpoint_kind_name(ts_checkpoint_kind k);

#define TS_CHECKPOINT_FORMAT "tessera-checkpoint" /* index.json "format" */
#define TS_CHECKPOINT_VERSION 2 /* index.json "version", sealed by "digest": the only one read */
#define TS_CHECKPOINT_INDEX "index.json"          /* the file that commits a folder */

/* A small file rank 0 writes into the folder beside the slices (its bytes
 * borrowed), listed in the index with its checksum. */
typedef struct ts_checkpoint_extra {
  const char *name;  /* file name inside the folder, e.g. "trainer.json" */
  const void *data;  /* host bytes */
  size_t nbytes;     /* bytes */
} ts_checkpoint_extra;

/* Saves e's model and optimizer state into folder dir (created if absent;
 * an index.json already there is removed first), with n_extra files from
 * rank 0. Collective over world (every rank of the run, in grid order
 * rank = stage * dp + dp rank; NULL: one rank): each rank writes and
 * fsyncs rank-RRRRR.bin, the SHA-256s and sizes are gathered to rank 0,
 * which writes the extra files and then index.json; the call returns on
 * every rank after the index is committed (the success is agreed).
 * Between optimizer steps only (TS_ERR_INVALID_USAGE mid-step). Errors:
 * TS_ERR_IO naming the file, TS_ERR_OUT_OF_MEMORY, TS_ERR_MPI; on any
 * error no index.json is written (the folder is not a checkpoint). */
ts_status ts_checkpoint_save(ts_engine *e, ts_comm *world, const char *dir,
                             const ts_checkpoint_extra *extra, size_t n_extra);

/* An asynchronous save (PyTorch's dcp.async_save, DeepSpeed's decoupled
 * checkpointing): each rank's state as it is at the step boundary is copied
 * once into the engine's host staging (opts.async_save; the only stall),
 * a thread of its own hashes and writes the rank's file while training
 * goes on, and a later collective call commits the index. From a device
 * the copy is made in the call; on the CPU the thread makes it while the
 * next step's forward and backward run (they only read the state) and the
 * optimizer step, or anything else that changes the state (a tensor set, a
 * load), waits until it is done. Until the commit the folder is not a
 * checkpoint: a crash during the write leaves the previous checkpoint the
 * newest complete one. The saved bytes are the state at the save's step,
 * whatever training does meanwhile; the counters (optimizer step, loss
 * scaler) too. One save at a time per engine (its one staging buffer: a
 * second is refused); ts_engine_free abandons one still in flight. */
typedef struct ts_checkpoint_pending ts_checkpoint_pending;

/* Starts an asynchronous save of e into folder dir, collective as
 * ts_checkpoint_save (the same files in the end); extra files are copied.
 * Returns once every rank's writer runs (agreed; from a device its copy is
 * staged by then), *out the save in flight. TS_ERR_INVALID_USAGE
 * (mid-step, another asynchronous save of e in flight, or the engine made
 * without async_save), TS_ERR_IO, TS_ERR_OUT_OF_MEMORY, TS_ERR_MPI;
 * on error *out is NULL and nothing runs. */
ts_status ts_checkpoint_save_async(ts_engine *e, ts_comm *world, const char *dir,
                                   const ts_checkpoint_extra *extra, size_t n_extra,
                                   ts_checkpoint_pending **out);

/* 1 once this rank's writer is done (its file committed, or failed);
 * never blocks. Ranks agree on all of them (a MIN all-reduce) before
 * ts_checkpoint_finish, so no rank waits on another's disk. */
int ts_checkpoint_written(const ts_checkpoint_pending *p);

/* Collective: waits for this rank's writer, then as ts_checkpoint_save's
 * end: the checksums gathered, rank 0 writes the extra files and the index
 * (the commit), agreed. Frees p. The writer's error (TS_ERR_IO naming the
 * file) or the commit's. */
ts_status ts_checkpoint_finish(ts_checkpoint_pending *p);

/* After ts_checkpoint_save, ts_checkpoint_save_async or ts_checkpoint_finish
 * returned an error on this thread: the world rank that failed first when
 * every rank returns it (agreed: that rank keeps its own message, the others
 * say "rank R of N failed to save DIR"), so one rank can report it and none
 * need abort; -1 when the error was this rank's alone (not agreed). */
int ts_checkpoint_failed_rank(void);

/* Local, for error paths: waits for this rank's writer and frees p without
 * committing (the folder stays no checkpoint). NULL is a no-op. */
void ts_checkpoint_abandon(ts_checkpoint_pending *p);

/* Seconds engine e's state changes (its optimizer steps) waited for
 * asynchronous saves' copies to the staging, summed over its life: on the
 * CPU the copy runs in the writer thread beside the next forward and
 * backward, and only what it has not finished by the optimizer step
 * stalls training. 0 from a device (the copy is in the save's call). */
double ts_checkpoint_staging_wait_seconds(const ts_engine *e);

typedef struct ts_checkpoint ts_checkpoint; /* an opened index; owns its file handles */

/* Opens the checkpoint in folder dir: parses index.json as untrusted input
 * (its seal, version 2 only, every field, the slices' geometry and the
 * writer's order: engine/checkpoint_index.h; a folder named step-N holds
 * the index of optimizer.attempts N) and checks it against model
 * (borrowed; NULL: no check): every tensor of the model with its shape and
 * no other. TS_ERR_IO (no index.json: "DIR: not a complete checkpoint (no
 * index.json)"), TS_ERR_FORMAT naming the file, the field and what differs
 * ("DIR/index.json: tensor model.norm.weight has shape [128], the model
 * llama-tiny has [192]"; "DIR/index.json: field \"optimizer.attempts\" =
 * 19: expected 20, the step in the folder's name step-00000020"). *out is
 * NULL on error. */
ts_status ts_checkpoint_open(ts_checkpoint **out, const char *dir, const ts_model *model);

/* Checks the SHA-256 and size of the files i with i % size == rank (size
 * ranks share the work; 0, 1: all). TS_ERR_FORMAT naming the file ("is
 * missing", "has N bytes, the index says M", "sha256 differs from the
 * index: the file is corrupt"). */
ts_status ts_checkpoint_verify(const ts_checkpoint *ck, int rank, int size);

/* Loads the checkpoint into e (created for the same model, any layout):
 * each rank reads the parts of every tensor it holds, the parameters from
 * the fp32 master weights (else the fp32 parameters) cast to e's dtype, the
 * master weights and both moments, the optimizer's step count and, when
 * both runs use fp16, the loss scaler. Local (no collective) but for a
 * pipeline's tied-head replica, refreshed from stage 0 afterwards: call it
 * on every rank. TS_ERR_IO, TS_ERR_FORMAT (a short read). */
ts_status ts_checkpoint_load(ts_checkpoint *ck, ts_engine *e);

/* The whole tensor `name` of kind k as fp32 host values dst (numel
 * elements, the tensor's), consolidated from every rank's slices (param:
 * converted from the saving dtype). TS_ERR_INVALID_ARGUMENT (unknown name,
 * numel differs, a kind the checkpoint lacks), TS_ERR_IO. */
ts_status ts_checkpoint_read_tensor(ts_checkpoint *ck, const char *name, ts_checkpoint_kind k,
                                    float *dst, size_t numel);

/* An extra file's bytes (NUL-terminated, free() them), its checksum
 * checked. TS_ERR_FORMAT (not listed, or corrupt), TS_ERR_IO. */
ts_status ts_checkpoint_read_extra(const ts_checkpoint *ck, const char *name, char **out,
                                   size_t *len);

/* What the checkpoint says about the run that saved it. */
typedef struct ts_checkpoint_info {
  const char *dtype;   /* "fp32", "bf16", "fp16" */
  int zero_stage;      /* 0-3 */
  int dp;              /* data-parallel ranks */
  int pipeline;        /* pipeline stages */
  int world;           /* ranks: pipeline * dp, one rank-RRRRR.bin each */
  int optimizer_step;  /* AdamW updates applied (t) */
  int attempts;        /* optimizer steps finished, skipped (overflowed fp16, or non-finite
                          gradients or loss at any dtype) ones included: the training step
                          it was saved after */
  uint64_t data_seed;  /* the saving engine's seed (opts.seed), the trainer's data order */
  size_t n_tensors;    /* logical tensors */
  size_t bytes;        /* every file the index lists, summed */
  size_t bytes_read;   /* what this process read of them so far (verify and load), bytes */
} ts_checkpoint_info;
void ts_checkpoint_get_info(const ts_checkpoint *ck, ts_checkpoint_info *out);

/* The folder it was opened from (owned by ck). */
const char *ts_checkpoint_dir(const ts_checkpoint *ck);

/* Frees ck and closes its files; NULL is a no-op. */
void ts_checkpoint_close(ts_checkpoint *ck);

/* Sets e's parameters (and master weights) from the Hugging Face folder
 * dir (models/hf_folder.h: config.json with single or sharded safetensors
 * in F32, BF16 or F16), checked against e's model first: every rank reads
 * the tensors of its units (a tied head's stage the lender's too). Adam
 * moments stay zero and the step count 0: fine-tuning starts here. Local.
 * Errors: ts_hf_folder_open's and _check's (one line naming the file and
 * the tensor). */
ts_status ts_checkpoint_import_hf(ts_engine *e, const char *dir);

/* The newest complete checkpoint under root, as a folder path in out
 * (cap bytes): root itself when it holds index.json, else its child
 * "step-NNNNNNNN" with index.json and the largest N. Returns 1 when found,
 * 0 when none (out ""). *step receives N (root itself: 0). */
int ts_checkpoint_latest(const char *root, char *out, size_t cap, size_t *step);

/* ts_checkpoint_latest among the children "step-N" with N < below only
 * (root itself never): the next older checkpoint after one that is
 * damaged (`resume` auto). Returns 1 when found, else 0 (out ""). */
int ts_checkpoint_latest_below(const char *root, size_t below, char *out, size_t cap,
                               size_t *step);

/* Holds checkpoint folder dir against pruning while it is read: a shared
 * flock(2) on its index.json, taken blocking (a prune holds it briefly).
 * Returns the lock's file descriptor (close it to release), or -1 when the
 * folder has no index.json any more (a prune removed it first: it is no
 * complete checkpoint now). Works across processes on one host and on
 * file systems with working flock (local, NFSv4). */
int ts_checkpoint_hold(const char *dir);

/* Removes the complete checkpoints "step-N" under root but the `keep`
 * newest (keep 0: none is removed), and incomplete ones older than the
 * newest complete one. Their index goes first, so an interrupted removal
 * leaves an incomplete folder, never a checkpoint missing a file. A
 * checkpoint another process holds (ts_checkpoint_hold: a resume reading
 * it) is left for a later prune. TS_ERR_IO naming the folder. */
ts_status ts_checkpoint_prune(const char *root, size_t keep);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_CHECKPOINT_H */
