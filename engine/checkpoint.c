/*
 * checkpoint.c — save, open, verify and load a checkpoint folder
 * (checkpoint.h): the layout every rank's file follows, the index rank 0
 * writes from that same layout, and the re-cut at load.
 *
 * Invariant: the file of world rank R (pipeline stage s = R / dp, dp rank
 * d = R % dp) is, for each kind present, for each unit u of stage s (with
 * v model chunks, of its virtual stages s, s + P, ... in turn), the
 * unit's flat elements chunk(u, d) = [d S, min((d + 1) S, total)) in the
 * kind's dtype. One function (for_each_chunk) walks that order; the writer
 * follows it with the bytes and rank 0 follows it to write the index, so
 * they agree by construction and nothing but checksums is exchanged.
 * Reading a folder back is checkpoint_load.c; the folder of checkpoints
 * (the newest, pruning) is checkpoint_folder.c.
 */
#include "engine/checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/checksum.h"
#include "engine/checkpoint_index.h"
#include "engine/engine_internal.h"
#include "engine/engine_testing.h"

#define FORMAT TS_CHECKPOINT_FORMAT
#define VERSION TS_CHECKPOINT_VERSION
#define INDEX TS_CHECKPOINT_INDEX

const char *ts_checkpoint_kind_name(ts_checkpoint_kind k) {
  static const char *const names[TS_CHECKPOINT_NUM_KINDS] = {"param", "master", "exp_avg",
                                                             "exp_avg_sq"};
  return (int)k >= 0 && k < TS_CHECKPOINT_NUM_KINDS ? names[k] : "?";
}

static void fault_point(void) {
  const ts_engine_hooks *h = ts_engine_get_hooks();
  if (h && h->save_point) h->save_point(h->user);
}

/* The safetensors name of a compute dtype's elements. */
static const char *st_dtype(ts_dtype dt) {
  return dt == TS_FP32 ? "F32" : dt == TS_BF16 ? "BF16" : "F16";
}

/* ---- the layout of a rank's file -------------------------------------------- */

/* One chunk of a rank's file: unit u's flat elements [begin, end) of kind k
 * at byte offset `offset`, es bytes each. */
typedef struct chunk {
  int kind, unit;
  size_t begin, end, offset, es;
  const ts_flat_layout *layout;
} chunk;

typedef struct saver_layout {
  const ts_model *model;
  int dp;                              /* data-parallel ranks */
  int P, v;                            /* pipeline stages, model chunks per rank */
  ts_schedule_kind kind;               /* the schedule (its chunks' placement) */
  int first[TS_ENGINE_MAX_STAGES + 1]; /* pipeline split: P v virtual stages (ts_schedule_vstage) */
  ts_flat_layout *layouts;             /* [n_units] for dp ranks */
  int has_master;                      /* bf16/fp16 */
  size_t param_es;                     /* bytes per compute element */
} saver_layout;

/* Calls fn on each chunk of world rank R's file, in file order; stops at
 * the first error. */
static ts_status for_each_chunk(const saver_layout *L, int R,
                                ts_status (*fn)(void *ctx, const chunk *c), void *ctx) {
  int s = R / L->dp, d = R % L->dp;
  size_t offset = 0;
  for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++) {
    if (k == TS_CHECKPOINT_MASTER && !L->has_master) continue;
    size_t es = k == TS_CHECKPOINT_PARAM ? L->param_es : 4;
    for (int c = 0; c < L->v; c++) /* the rank's chunks, in model order */
      for (int u = L->first[ts_schedule_vstage(L->kind, L->P, s, c)];
           u < L->first[ts_schedule_vstage(L->kind, L->P, s, c) + 1]; u++) {
        const ts_flat_layout *l = &L->layouts[u];
        size_t b = (size_t)d * l->shard, e = b + l->shard;
        if (e > l->total) e = l->total;
        if (b > e) b = e;
        chunk c = {k, u, b, e, offset, es, l};
        TS_CHECK(fn(ctx, &c));
        offset += (e - b) * es;
      }
  }
  return TS_OK;
}

static void saver_layout_free(saver_layout *L) { free(L->layouts); }

/* Adds chunk c's bytes to *(size_t *)ctx. */
static ts_status count_chunk(void *ctx, const chunk *c) {
  *(size_t *)ctx += (c->end - c->begin) * c->es;
  return TS_OK;
}

static ts_status saver_layout_init(saver_layout *L, const ts_engine *e) {
  memset(L, 0, sizeof *L);
  L->model = e->model;
  L->dp = e->dp_size;
  L->has_master = e->opts.dtype != TS_FP32;
  L->param_es = e->es;
  L->P = e->pipe.stages;
  L->v = e->pipe.chunks;
  L->kind = e->pipe.sched.kind;
  TS_CHECK(ts_engine_pipeline_split(e->model, &e->opts, L->first));
  L->layouts = calloc((size_t)e->model->n_units, sizeof *L->layouts);
  if (!L->layouts) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: layouts");
  for (int u = 0; u < e->model->n_units; u++)
    TS_CHECK(ts_engine_unit_layout(e->model, u, (size_t)e->dp_size, &L->layouts[u]));
  return TS_OK;
}

/* ---- save -------------------------------------------------------------------- */

typedef struct writer {
  ts_engine *e;
  ts_atomic_file *f;
  ts_sha256 *h;
  size_t nbytes;
  void *host;         /* staging beside a device, the largest chunk */
  const char *staged; /* an asynchronous save: the rank's file bytes, else NULL */
} writer;

/* The held buffer of kind k of unit u and whether it is a shard. */
static const void *held(const ts_engine *e, int u, int k, int *sharded) {
  const unit_state *s = &e->units[u];
  *sharded = k == TS_CHECKPOINT_PARAM ? e->zero->shard_params : e->zero->shard_optim;
  switch (k) {
    case TS_CHECKPOINT_PARAM: return s->params;
    case TS_CHECKPOINT_MASTER: return s->master;
    case TS_CHECKPOINT_EXP_AVG: return s->m;
    default: return s->v;
  }
}

/* Where chunk c's bytes are held now (the engine's buffer of its kind). */
static const char *held_chunk(const ts_engine *e, const chunk *c) {
  int sharded;
  const char *buf = held(e, c->unit, c->kind, &sharded);
  return buf + ts_engine_held_offset(e, c->unit, sharded, c->begin) * c->es;
}

/* Whether chunk c's bytes are host memory where the engine holds them:
 * everything on the CPU, beside a device the optimizer state and the
 * parameter shards where offloaded (ts_engine_state_on_host,
 * ts_engine_params_on_host). */
static int chunk_on_host(const ts_engine *e, const chunk *c) {
  return e->device == TS_DEVICE_CPU ||
         (c->kind == TS_CHECKPOINT_PARAM ? ts_engine_params_on_host(e) : ts_engine_state_on_host(e));
}

/* Whether chunk c is optimizer state kept in an offload's file (its
 * pieces are acquired while their bytes are read: offload.h). */
static int offloaded(const ts_engine *e, const chunk *c) {
  return e->offload && c->kind != TS_CHECKPOINT_PARAM;
}

/* An offloaded chunk, a piece at a time (ts_offload_each): the writer or
 * the staging's bytes, which state array (0 master, 1 m, 2 v), and the
 * chunk's first element of it. */
typedef struct chunk_part {
  writer *w;
  char *dst;
  int array;
  size_t lo;
} chunk_part;

static ts_status each_part(ts_engine *e, const chunk *c, chunk_part *q,
                           ts_status (*fn)(void *, float *const[3], size_t, size_t)) {
  int sharded;
  (void)held(e, c->unit, c->kind, &sharded);
  q->array = c->kind == TS_CHECKPOINT_MASTER ? 0 : c->kind == TS_CHECKPOINT_EXP_AVG ? 1 : 2;
  q->lo = ts_engine_held_offset(e, c->unit, sharded, c->begin);
  return ts_offload_each(e, c->unit, q->lo, c->end - c->begin, 0, fn, q);
}

/* n bytes of host memory into the rank file and its digest, in pieces,
 * hashing one while the kernel writes back the last: the digest costs no
 * extra pass over the disk. */
static ts_status write_bytes(writer *w, const char *src, size_t n) {
  enum { PIECE = 4 << 20 };
  for (size_t k = 0; k < n; k += PIECE) {
    size_t m = n - k < PIECE ? n - k : PIECE;
    ts_sha256_update(w->h, src + k, m);
    TS_CHECK(ts_atomic_file_write(w->f, src + k, m));
  }
  w->nbytes += n;
  return TS_OK;
}

static ts_status write_part(void *arg, float *const at[3], size_t first, size_t count) {
  (void)first;
  const chunk_part *q = arg;
  return write_bytes(q->w, (const char *)at[q->array], count * 4);
}

static ts_status write_chunk(void *ctx, const chunk *c) {
  writer *w = ctx;
  ts_engine *e = w->e;
  size_t n = (c->end - c->begin) * c->es;
  if (n == 0) return TS_OK;
  if (!w->staged && offloaded(e, c)) {
    chunk_part q = {w, NULL, 0, 0};
    TS_CHECK(each_part(e, c, &q, write_part));
  } else {
    const char *src = w->staged ? w->staged + c->offset : held_chunk(e, c);
    if (!w->staged && !chunk_on_host(e, c)) {
      TS_CHECK(ts_k_to_host(&e->ctx, w->host, src, n));
      src = w->host;
    }
    TS_CHECK(write_bytes(w, src, n));
  }
  fault_point(); /* mid-file */
  return TS_OK;
}

/* Writes world rank R's file at path from the engine's buffers, or from
 * `staged` (an asynchronous save's copy; any thread), hashing as it goes. */
static ts_status write_rank_file(ts_engine *e, const saver_layout *L, const char *path, int R,
                                 const void *staged, char hex[TS_SHA256_HEX], size_t *nbytes) {
  writer w = {e, NULL, NULL, 0, NULL, staged};
  ts_status st = TS_OK;
  if (!staged && e->device != TS_DEVICE_CPU) {
    size_t most = 0;
    TS_ENGINE_FOR_UNITS(e, u)
      if (L->layouts[u].shard * 4 > most) most = L->layouts[u].shard * 4;
    w.host = malloc(most ? most : 1);
    if (!w.host) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: %zu bytes of staging", path, most);
  }
  TS_CHECK_GOTO(ts_sha256_new(&w.h), st, done);
  TS_CHECK_GOTO(ts_atomic_file_open(&w.f, path), st, done);
  st = for_each_chunk(L, R, write_chunk, &w);
  if (st != TS_OK) {
    ts_atomic_file_discard(w.f);
    goto done;
  }
  fault_point();
  st = ts_atomic_file_commit(w.f);
done:
  ts_sha256_final(w.h, hex);
  *nbytes = w.nbytes;
  free(w.host);
  return st;
}

/* Index entries: one per (tensor, kind), the slices in rank order. */
typedef struct index_builder {
  cJSON **kinds; /* [n tensors * kinds] arrays of slices, by (unit, tensor) */
  int *tensor0;  /* [n_units] index of the unit's first tensor */
  int file;      /* the rank file being walked */
} index_builder;

static ts_status index_chunk(void *ctx, const chunk *c) {
  index_builder *b = ctx;
  const ts_flat_layout *l = c->layout;
  for (size_t i = 0; i < l->n_tensors; i++) {
    size_t tb = l->offset[i], te = tb + l->numel[i];
    size_t lo = c->begin > tb ? c->begin : tb, hi = c->end < te ? c->end : te;
    if (lo >= hi) continue;
    double v[4] = {b->file, (double)(lo - tb), (double)(hi - tb),
                   (double)(c->offset + (lo - c->begin) * c->es)};
    cJSON *arr =
        b->kinds[(size_t)(b->tensor0[c->unit] + (int)i) * TS_CHECKPOINT_NUM_KINDS + c->kind];
    if (!cJSON_AddItemToArray(arr, cJSON_CreateDoubleArray(v, 4)))
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: index");
  }
  return TS_OK;
}

/* The engine's counters a save records, as they were at its step boundary
 * (an asynchronous save commits its index steps later). */
typedef struct saved_counters {
  int step, attempts;
  ts_loss_scaler scaler;
} saved_counters;

static saved_counters counters_of(const ts_engine *e) {
  saved_counters c = {e->optim.step, e->optim.attempts, e->optim.scaler};
  return c;
}

/* The index of the whole save (rank 0): the layout, the counters and the
 * data seed (the engine's seed: the trainer's data order), files[] then
 * tensors[] in model order, each (tensor, kind)'s slices in rank order,
 * at most one per rank file: what the reader holds an index to
 * (checkpoint_index.h). */
static ts_status build_index(const ts_engine *e, const saved_counters *sc, const saver_layout *L,
                             int world, const char (*hex)[TS_SHA256_HEX], const size_t *sizes,
                             const ts_checkpoint_extra *extra, const char (*xhex)[TS_SHA256_HEX],
                             size_t n_extra, char **out) {
  const ts_model *m = e->model;
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", FORMAT);
  cJSON_AddNumberToObject(root, "version", VERSION);
  cJSON_AddStringToObject(root, "model", m->name);
  cJSON_AddNumberToObject(root, "num_params", (double)m->num_params);
  cJSON_AddStringToObject(root, "dtype", ts_dtype_name(e->opts.dtype));
  cJSON_AddNumberToObject(root, "zero_stage", e->opts.zero_stage);
  cJSON_AddNumberToObject(root, "dp", e->dp_size);
  cJSON_AddNumberToObject(root, "pipeline", e->pipe.stages);
  if (L->v > 1) cJSON_AddNumberToObject(root, "virtual_stages", L->v);
  cJSON_AddItemToObject(root, "split", cJSON_CreateIntArray(L->first, L->P * L->v + 1));
  cJSON_AddNumberToObject(root, "world", world);
  cJSON *opt = cJSON_AddObjectToObject(root, "optimizer");
  cJSON_AddNumberToObject(opt, "step", sc->step);
  cJSON_AddNumberToObject(opt, "attempts", sc->attempts);
  char seed[24]; /* a string: a 64-bit seed does not fit a JSON number's double */
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)e->opts.seed);
  cJSON_AddStringToObject(root, "data_seed", seed);
  const ts_loss_scaler *scaler = &sc->scaler;
  cJSON *ls = cJSON_AddObjectToObject(root, "loss_scaler");
  cJSON_AddNumberToObject(ls, "scale", scaler->scale);
  cJSON_AddNumberToObject(ls, "clean_steps", (double)scaler->clean_steps);
  cJSON *hist = cJSON_AddArrayToObject(ls, "history");
  int nh = scaler->n_history < 8 ? scaler->n_history : 8;
  for (int k = 0; k < nh; k++) {
    int j = (scaler->n_history - nh + k) % 8;
    double v[2] = {scaler->history[j].step, scaler->history[j].scale};
    cJSON_AddItemToArray(hist, cJSON_CreateDoubleArray(v, 2));
  }
  cJSON *files = cJSON_AddArrayToObject(root, "files");
  for (int r = 0; r < world + (int)n_extra; r++) {
    char name[64];
    cJSON *f = cJSON_CreateObject();
    if (r < world) snprintf(name, sizeof name, "rank-%05d.bin", r);
    else snprintf(name, sizeof name, "%s", extra[r - world].name);
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddNumberToObject(f, "bytes", (double)(r < world ? sizes[r] : extra[r - world].nbytes));
    cJSON_AddStringToObject(f, "sha256", r < world ? hex[r] : xhex[r - world]);
    cJSON_AddItemToArray(files, f);
  }
  int n_tensors = 0;
  index_builder b = {NULL, calloc((size_t)m->n_units, sizeof(int)), 0};
  for (int u = 0; u < m->n_units && b.tensor0; u++) {
    b.tensor0[u] = n_tensors;
    n_tensors += m->units[u].n_tensors;
  }
  b.kinds = calloc((size_t)n_tensors * TS_CHECKPOINT_NUM_KINDS, sizeof *b.kinds);
  ts_status st = b.kinds && b.tensor0 ? TS_OK : ts_set_error(TS_ERR_OUT_OF_MEMORY, "index");
  cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
  for (int u = 0; u < m->n_units && st == TS_OK; u++)
    for (int i = 0; i < m->units[u].n_tensors; i++) {
      const ts_tensor_spec *t = &m->units[u].tensors[i];
      cJSON *jt = cJSON_CreateObject();
      cJSON_AddStringToObject(jt, "name", t->name);
      int shape[2] = {(int)t->shape[0], (int)t->shape[1]};
      cJSON_AddItemToObject(jt, "shape", cJSON_CreateIntArray(shape, t->ndim));
      for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++) {
        if (k == TS_CHECKPOINT_MASTER && !L->has_master) continue;
        cJSON *jk = cJSON_AddObjectToObject(jt, ts_checkpoint_kind_name((ts_checkpoint_kind)k));
        cJSON_AddStringToObject(jk, "dtype",
                                k == TS_CHECKPOINT_PARAM ? st_dtype(e->opts.dtype) : "F32");
        b.kinds[(size_t)(b.tensor0[u] + i) * TS_CHECKPOINT_NUM_KINDS + k] =
            cJSON_AddArrayToObject(jk, "slices");
      }
      cJSON_AddItemToArray(tensors, jt);
    }
  for (int r = 0; r < world && st == TS_OK; r++) {
    b.file = r;
    st = for_each_chunk(L, r, index_chunk, &b);
  }
  /* sealed last: the digest of everything above (checkpoint_index.h) */
  char digest[TS_SHA256_HEX];
  if (st == TS_OK) st = ts_checkpoint_index_digest(root, digest);
  if (st == TS_OK && !cJSON_AddStringToObject(root, "digest", digest))
    st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: index");
  *out = st == TS_OK ? cJSON_Print(root) : NULL;
  if (st == TS_OK && !*out) st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: index text");
  cJSON_Delete(root);
  free(b.kinds);
  free(b.tensor0);
  return st;
}

/* Rank 0's part of a save: the extra files, then index.json (the commit). */
static ts_status write_index(const ts_engine *e, const saved_counters *sc, const saver_layout *L,
                             const char *dir, int n, const float *packed,
                             char (*hex)[TS_SHA256_HEX], size_t *sizes,
                             const ts_checkpoint_extra *extra, size_t n_extra, char **text) {
  char path[4096];
  for (int r = 0; r < n; r++) {
    memcpy(hex[r], (const char *)packed + (size_t)r * 72, 64);
    hex[r][64] = '\0';
    memcpy(&sizes[r], (const char *)packed + (size_t)r * 72 + 64, 8);
  }
  for (size_t k = 0; k < n_extra; k++) {
    TS_CHECK(ts_sha256_bytes(extra[k].data, extra[k].nbytes, hex[n + k]));
    snprintf(path, sizeof path, "%s/%s", dir, extra[k].name);
    fault_point();
    TS_CHECK(ts_atomic_write(path, extra[k].data, extra[k].nbytes));
  }
  TS_CHECK(build_index(e, sc, L, n, (const char(*)[TS_SHA256_HEX])hex, sizes, extra,
                       (const char(*)[TS_SHA256_HEX])(hex + n), n_extra, text));
  ts_atomic_file *f;
  snprintf(path, sizeof path, "%s/" INDEX, dir);
  TS_CHECK(ts_atomic_file_open(&f, path));
  ts_status st = ts_atomic_file_write(f, *text, strlen(*text));
  if (st != TS_OK) {
    ts_atomic_file_discard(f);
    return st;
  }
  fault_point();
  return ts_atomic_file_commit(f);
}

/* The world rank whose error this thread's last save, asynchronous save or
 * finish agreed on (ts_checkpoint_failed_rank), else -1. */
static _Thread_local int failed_rank = -1;

int ts_checkpoint_failed_rank(void) { return failed_rank; }

static ts_status make_dir(const char *dir) {
  if (mkdir(dir, 0777) == 0 || errno == EEXIST) return TS_OK;
  return ts_set_error(TS_ERR_IO, "%s: cannot create the folder: %s", dir, strerror(errno));
}

/* A save from its start to its commit: what the world agreed on, the
 * layout, the counters at the save's step and, on rank 0, the extra files. */
typedef struct save_job {
  ts_engine *e;
  ts_comm *w, *own; /* the world (borrowed, or own: a one-rank group) */
  int R, n;         /* this world rank and the world's size */
  int F, files;     /* this rank's file (stage * S + shard rank; -1 for a hybrid replica
                       other than the first, which writes none) and the files, stages x S */
  char dir[4096], what[4200];
  saver_layout L;
  saved_counters counters;
  const ts_checkpoint_extra *extra; /* rank 0's (borrowed; an asynchronous save's own copy) */
  size_t n_extra;
} save_job;

static void save_job_free(save_job *j) {
  saver_layout_free(&j->L);
  ts_comm_free(j->own);
}

/* The start of every save, collective: a step boundary; rank 0 makes the
 * folder and removes an old index before anyone writes (from here until
 * the new index the folder is not a checkpoint); the layout. Agreed. */
static ts_status save_start(save_job *j, ts_engine *e, ts_comm *world, const char *dir,
                            const ts_checkpoint_extra *extra, size_t n_extra) {
  memset(j, 0, sizeof *j);
  failed_rank = -1;
  if (e->run.in_step)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "checkpoint: save inside a step: expected a step boundary");
  if (!world) TS_CHECK(ts_comm_self(&j->own));
  j->e = e;
  j->w = world ? world : j->own;
  j->R = ts_comm_rank(j->w);
  j->n = ts_comm_size(j->w);
  j->counters = counters_of(e);
  j->extra = extra;
  j->n_extra = n_extra;
  snprintf(j->dir, sizeof j->dir, "%s", dir);
  snprintf(j->what, sizeof j->what, "to save %s", dir);
  char path[4200];
  snprintf(path, sizeof path, "%s/" INDEX, dir);
  ts_status st = j->R == 0 ? make_dir(dir) : TS_OK;
  if (st == TS_OK && j->R == 0 && unlink(path) != 0 && errno != ENOENT)
    st = ts_set_error(TS_ERR_IO, "%s: cannot remove the old index: %s", path, strerror(errno));
  if (st == TS_OK) st = saver_layout_init(&j->L, e);
  /* Hybrid sharding: the first shard group's ranks write the files, as
   * plain ZeRO over S ranks would (the replicas hold the same bits). */
  j->files = j->L.dp * e->pipe.stages;
  j->F = e->rep_rank == 0 ? e->pipe.stage * j->L.dp + e->rank : -1;
  if (st == TS_OK && j->files * e->replicas != j->n)
    st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "checkpoint: the world has %d ranks, the engine's grid %d x %d x %d", j->n,
                      e->pipe.stages, e->replicas, j->L.dp);
  return ts_comm_agree(j->w, st, j->what, &failed_rank);
}

/* The end of every save, collective: this rank's file written (`local`,
 * its checksum and size), agreed; the checksums gathered; rank 0 writes
 * the extra files, then index.json (the commit); agreed. */
static ts_status save_commit(save_job *j, ts_status local, const char *hx, size_t nb) {
  int n = j->files;
  char(*hex)[TS_SHA256_HEX] = calloc((size_t)n + j->n_extra, TS_SHA256_HEX);
  float *packed = calloc((size_t)n * 18, sizeof(float)); /* per rank: 64 hex + 8-byte size */
  size_t *sizes = calloc((size_t)n, sizeof *sizes);
  char *text = NULL;
  if (local == TS_OK && !(hex && packed && sizes))
    local = ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: %d ranks", n);
  ts_status st = ts_comm_agree(j->w, local, j->what, &failed_rank);
  if (st == TS_OK) {
    /* Gathered as doubles by a sum (each 32-bit word once, zeros from the
     * other ranks: exact), since the group's data collectives may move a
     * device's memory (ts_comm_set_memory) and these bytes are the host's. */
    char mine[72];
    uint32_t w[18];
    memcpy(mine, hx, 64);
    memcpy(mine + 64, &nb, 8);
    memcpy(w, mine, sizeof w);
    double *all = calloc((size_t)n * 18, sizeof(double));
    if (!all) st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: %d ranks", n);
    for (int k = 0; all && j->F >= 0 && k < 18; k++)
      all[(size_t)j->F * 18 + (size_t)k] = (double)w[k];
    if (st == TS_OK) st = ts_comm_all_reduce_f64(j->w, all, (size_t)n * 18, TS_COMM_SUM);
    for (size_t i = 0; st == TS_OK && i < (size_t)n * 18; i++) {
      uint32_t v = (uint32_t)all[i];
      memcpy((char *)packed + 4 * i, &v, 4);
    }
    free(all);
  }
  if (st == TS_OK) {
    ts_status mine = TS_OK;
    if (j->R == 0)
      mine = write_index(j->e, &j->counters, &j->L, j->dir, n, packed, hex, sizes, j->extra,
                         j->n_extra, &text);
    st = ts_comm_agree(j->w, mine, j->what, &failed_rank);
  }
  free(text);
  free(hex);
  free(packed);
  free(sizes);
  return st;
}

ts_status ts_checkpoint_save(ts_engine *e, ts_comm *world, const char *dir,
                             const ts_checkpoint_extra *extra, size_t n_extra) {
  save_job j;
  ts_status st = save_start(&j, e, world, dir, extra, n_extra);
  if (st == TS_OK) { /* every rank writes its file from the engine's buffers */
    char hx[TS_SHA256_HEX] = "", path[4200];
    size_t nb = 0;
    snprintf(path, sizeof path, "%s/rank-%05d.bin", dir, j.F);
    ts_status local = j.F >= 0 ? write_rank_file(e, &j.L, path, j.F, NULL, hx, &nb) : TS_OK;
    st = save_commit(&j, local, hx, nb);
  }
  save_job_free(&j);
  return st;
}

/* ---- asynchronous save ------------------------------------------------------------ */

ts_status ts_checkpoint_staging_bytes(const ts_engine *e, size_t *bytes) {
  saver_layout L;
  *bytes = 0;
  ts_status st = saver_layout_init(&L, e);
  if (st == TS_OK) {
    /* dp rank 0's file: the largest of the stage (the others' last shards
     * may be shorter by the padding), so every rank charges what the plan
     * charges */
    st = for_each_chunk(&L, e->pipe.stage * L.dp, count_chunk, bytes);
  }
  saver_layout_free(&L);
  return st;
}

struct ts_checkpoint_pending {
  save_job job;
  ts_checkpoint_extra *extra; /* rank 0: the extra files' names and bytes, copied */
  pthread_t thread;
  atomic_int written;      /* 1 once the thread is done (either way) */
  ts_status status;        /* the thread's result */
  char error[1024];        /* its message (ts_last_error is per thread) */
  char hex[TS_SHA256_HEX]; /* the file's SHA-256 */
  size_t nbytes;           /* its size */
  pthread_mutex_t lock;    /* guards staged */
  pthread_cond_t cond;     /* signalled when staged turns 1 */
  int staged;              /* 1 once the staging holds the rank's state */
};

static ts_status stage_part(void *arg, float *const at[3], size_t first, size_t count) {
  const chunk_part *q = arg;
  memcpy(q->dst + (first - q->lo) * 4, at[q->array], count * 4);
  return TS_OK;
}

/* Copies chunk c from the engine's buffers into the staging at its file
 * offset: on the CPU in the writer thread (one memcpy per chunk), from a
 * device in the caller's thread through the engine's stream. */
static ts_status stage_chunk(void *ctx, const chunk *c) {
  ts_engine *e = ctx;
  const ts_engine_hooks *h = ts_engine_get_hooks();
  if (h && h->stage_point) h->stage_point(h->user);
  size_t n = (c->end - c->begin) * c->es;
  if (n == 0) return TS_OK;
  char *dst = (char *)e->ckpt.staging + c->offset;
  if (offloaded(e, c)) {
    chunk_part q = {NULL, dst, 0, 0};
    return each_part(e, c, &q, stage_part);
  }
  const char *src = held_chunk(e, c);
  if (!chunk_on_host(e, c)) return ts_k_to_host(&e->ctx, dst, src, n);
  memcpy(dst, src, n);
  return TS_OK;
}

static void mark_staged(ts_checkpoint_pending *p) {
  pthread_mutex_lock(&p->lock);
  p->staged = 1;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
}

static double monotonic_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ts_engine_wait_staging(ts_engine *e) {
  ts_checkpoint_pending *p = e->ckpt.pending;
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  int staged = p->staged;
  pthread_mutex_unlock(&p->lock);
  if (staged) return;
  double t0 = monotonic_s();
  const ts_engine_hooks *h = ts_engine_get_hooks(); /* the test seam, outside the lock */
  if (h && h->staging_wait) h->staging_wait(h->user);
  pthread_mutex_lock(&p->lock);
  while (!p->staged) pthread_cond_wait(&p->cond, &p->lock);
  pthread_mutex_unlock(&p->lock);
  e->ckpt.staging_wait += monotonic_s() - t0;
}

double ts_checkpoint_staging_wait_seconds(const ts_engine *e) { return e->ckpt.staging_wait; }

/* The background thread: on the CPU first copies the rank's state to the
 * staging (the state does not change until ts_engine_wait_staging lets the
 * optimizer step run); then hashes and writes the staged bytes, fsyncs and
 * renames the file into place (base/atomic_file.h). No MPI here. */
static void *write_staged(void *arg) {
  ts_checkpoint_pending *p = arg;
  int F = p->job.F; /* -1: a hybrid replica, which writes no file */
  if (!p->staged) { /* a CPU's copy cannot fail: memcpy */
    if (F >= 0) (void)for_each_chunk(&p->job.L, F, stage_chunk, p->job.e);
    mark_staged(p);
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/rank-%05d.bin", p->job.dir, F);
  p->status = F >= 0 ? write_rank_file(p->job.e, &p->job.L, path, F, p->job.e->ckpt.staging, p->hex,
                                       &p->nbytes)
                     : TS_OK;
  if (p->status != TS_OK) snprintf(p->error, sizeof p->error, "%s", ts_last_error());
  atomic_store(&p->written, 1);
  return NULL;
}

/* Frees p after its thread ended (or none started). */
static void pending_free(ts_checkpoint_pending *p) {
  for (size_t k = 0; p->extra && k < p->job.n_extra; k++) {
    free((char *)p->extra[k].name);
    free((void *)p->extra[k].data);
  }
  free(p->extra);
  if (p->job.e && p->job.e->ckpt.pending == p) p->job.e->ckpt.pending = NULL;
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->lock);
  save_job_free(&p->job);
  free(p);
}

/* Copies the extra files (rank 0 keeps them until the commit). */
static ts_status copy_extras(ts_checkpoint_pending *p, const ts_checkpoint_extra *extra,
                             size_t n_extra) {
  if (n_extra == 0) return TS_OK;
  p->extra = calloc(n_extra, sizeof *p->extra);
  if (!p->extra) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: extra files");
  p->job.extra = p->extra;
  p->job.n_extra = n_extra; /* (pending_free frees what was copied) */
  for (size_t k = 0; k < n_extra; k++) {
    char *name = strdup(extra[k].name), *data = malloc(extra[k].nbytes ? extra[k].nbytes : 1);
    p->extra[k].name = name;
    p->extra[k].data = data;
    p->extra[k].nbytes = extra[k].nbytes;
    if (!name || !data) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: extra files");
    memcpy(data, extra[k].data, extra[k].nbytes);
  }
  return TS_OK;
}

ts_status ts_checkpoint_save_async(ts_engine *e, ts_comm *world, const char *dir,
                                   const ts_checkpoint_extra *extra, size_t n_extra,
                                   ts_checkpoint_pending **out) {
  *out = NULL;
  failed_rank = -1;
  if (!e->ckpt.staging)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "checkpoint: an asynchronous save needs the engine's staging "
                        "(`async_save`)");
  if (e->ckpt.pending)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "checkpoint: an asynchronous save is in flight (%s): expected it "
                        "finished first (one staging per engine)",
                        e->ckpt.pending->job.dir);
  ts_checkpoint_pending *p = calloc(1, sizeof *p);
  if (!p) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: an asynchronous save");
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  ts_status st = save_start(&p->job, e, world, dir, NULL, 0);
  if (st == TS_OK) {
    /* The stall: from a device the copy to the staging is made here; on
     * the CPU the writer thread makes it while the next step's forward and
     * backward run, and the optimizer step waits for it. */
    ts_status local = p->job.R == 0 ? copy_extras(p, extra, n_extra) : TS_OK;
    if (local == TS_OK && e->device != TS_DEVICE_CPU) {
      local = for_each_chunk(&p->job.L, p->job.F, stage_chunk, e);
      if (local == TS_OK) local = ts_k_synchronize(&e->ctx);
      p->staged = 1;
    }
    int started = 0;
    if (local == TS_OK) {
      e->ckpt.pending = p;
      started = pthread_create(&p->thread, NULL, write_staged, p) == 0;
      if (!started)
        local = ts_set_error(TS_ERR_INTERNAL, "checkpoint: cannot start the writer thread");
    }
    st = ts_comm_agree(p->job.w, local, p->job.what, &failed_rank);
    if (started && st != TS_OK) { /* another rank failed: this one's write is moot */
      pthread_join(p->thread, NULL);
    } else if (started) {
      *out = p;
      return TS_OK;
    }
  }
  pending_free(p); /* (clears e->ckpt.pending) */
  return st;
}

int ts_checkpoint_written(const ts_checkpoint_pending *p) {
  return atomic_load(&((ts_checkpoint_pending *)p)->written);
}

ts_status ts_checkpoint_finish(ts_checkpoint_pending *p) {
  pthread_join(p->thread, NULL);
  ts_status local = p->status;
  if (local != TS_OK) ts_set_error(local, "%s", p->error);
  ts_status st = save_commit(&p->job, local, p->hex, p->nbytes);
  pending_free(p);
  return st;
}

void ts_checkpoint_abandon(ts_checkpoint_pending *p) {
  if (!p) return;
  pthread_join(p->thread, NULL);
  pending_free(p);
}
