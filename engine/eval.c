/* eval.c — evaluation (engine.h): the loss of a batch without touching
 * gradients, on one stage or over a pipeline's, and a masked LM's accuracy
 * from the last unit's logits. */
#include <stdlib.h>

#include "base/floats.h"
#include "engine/engine_internal.h"

/* Element i of a row of dtype dt, widened. */
static float load_f32(const void *row, size_t i, ts_dtype dt) {
  if (dt == TS_FP32) return ((const float *)row)[i];
  uint16_t h = ((const uint16_t *)row)[i];
  return dt == TS_BF16 ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
}

ts_status ts_engine_count_correct(ts_engine *e, const int32_t *targets, double *correct) {
  int u = e->model->n_units - 1;
  size_t B = e->opts.micro_batch, T = e->opts.seq, N = B * T, V = e->model->vocab_size;
  ts_dtype dt = e->opts.dtype;
  const act_slot *sl = &e->slots[e->pipe.slot0[e->pipe.chunks - 1]]; /* the head's chunk */
  const void *logits = ts_unit_logits(e->model, u, sl->saved[u], B, T, dt);
  if (!logits) return ts_set_error(TS_ERR_INVALID_USAGE, "accuracy: the last unit has no logits");
  size_t row_bytes = V * ts_dtype_size(dt);
  void *host = e->device == TS_DEVICE_CPU ? NULL : malloc(row_bytes);
  if (e->device != TS_DEVICE_CPU && !host)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "accuracy: %zu bytes for a row of logits",
                        row_bytes);
  ts_status st = TS_OK;
  *correct = 0;
  for (size_t n = 0; n < N && st == TS_OK; n++) {
    if (targets[n] == TS_IGNORE_INDEX) continue;
    const void *row = (const char *)logits + n * row_bytes;
    if (host) st = ts_k_to_host(&e->ctx, host, row, row_bytes);
    const void *r = host ? host : row;
    size_t best = 0;
    for (size_t v = 1; v < V; v++)
      if (load_f32(r, v, dt) > load_f32(r, best, dt)) best = v;
    *correct += best == (size_t)targets[n];
  }
  free(host);
  return st;
}

/* The pipeline's evaluation forward (its batch loaded in each chunk's
 * first slot), chunk by chunk: virtual stage j receives from j - 1 and
 * sends to j + 1 (on this rank itself: a copy); then the head stage's (loss sum, rows, and with
 * want_correct the rows predicted right, ts_engine_count_correct of the
 * host targets) on every stage. */
static ts_status eval_pipeline(ts_engine *e, double sums[3], const int32_t *targets,
                               int want_correct) {
  int s = e->pipe.stage, P = e->pipe.stages, V = P * e->pipe.chunks;
  ts_schedule_kind kind = e->pipe.sched.kind;
  size_t n = ts_engine_btc(e);
  for (int c = 0; c < e->pipe.chunks; c++) { /* in model order on this rank */
    act_slot *sl = &e->slots[e->pipe.slot0[c]];
    int j = ts_engine_vstage(e, c);
    if (j > 0) {
      int from = ts_schedule_rank_of(kind, P, j - 1), fc = ts_engine_chunk_of_vstage(e, j - 1);
      if (from == s) /* ZB-V's turn: the previous chunk's output, here */
        TS_CHECK(ts_k_copy(&e->ctx, sl->acts[e->pipe.c_begin[c]],
                           e->slots[e->pipe.slot0[fc]].acts[e->pipe.c_end[fc]], n * e->es));
      else
        TS_CHECK(ts_engine_recv(e, sl->acts[e->pipe.c_begin[c]], n, from,
                                ts_engine_chunk_tag(e, TS_TAG_EVAL, 0, fc)));
    }
    TS_CHECK(ts_engine_forward_slot(e, sl, e->sc.eval_loss, 0));
    int to = j < V - 1 ? ts_schedule_rank_of(kind, P, j + 1) : s;
    if (to != s) {
      ts_engine_comm_note(e, -1);
      TS_CHECK(ts_comm_send(e->pipe.pp, sl->acts[e->pipe.c_end[c]], n, e->opts.dtype, to,
                            ts_engine_chunk_tag(e, TS_TAG_EVAL, 0, c)));
    }
  }
  sums[0] = sums[1] = sums[2] = 0.0;
  if (ts_engine_owns(e, e->model->n_units - 1)) { /* the head's stage */
    TS_CHECK(ts_k_to_host(&e->ctx, sums, e->sc.eval_loss, 2 * sizeof(double)));
    if (want_correct) TS_CHECK(ts_engine_count_correct(e, targets, &sums[2]));
  }
  /* the last stage's sums on every stage (the others add zeros: exact) */
  return ts_comm_all_reduce_f64(e->pipe.pp, sums, 3, TS_COMM_SUM);
}

ts_status ts_engine_eval_accuracy(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                                  double *loss_sum, size_t *count, size_t *correct) {
  size_t rows;
  for (int c = 0; c < e->pipe.chunks; c++)
    TS_CHECK(ts_engine_load_batch(e, &e->slots[e->pipe.slot0[c]], inputs, targets, &rows));
  double sums[3] = {0.0, 0.0, 0.0}; /* loss sum, rows, rows predicted right */
  if (e->pipe.stages > 1) {
    TS_CHECK(eval_pipeline(e, sums, targets, correct != NULL));
  } else {
    TS_CHECK(ts_engine_forward_slot(e, &e->slots[0], e->sc.eval_loss, 0));
    TS_CHECK(ts_k_to_host(&e->ctx, sums, e->sc.eval_loss, 2 * sizeof(double)));
    if (correct) TS_CHECK(ts_engine_count_correct(e, targets, &sums[2]));
  }
  *loss_sum = sums[0];
  *count = (size_t)sums[1];
  if (correct) *correct = (size_t)sums[2];
  return TS_OK;
}

ts_status ts_engine_eval(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                         double *loss_sum, size_t *count) {
  return ts_engine_eval_accuracy(e, inputs, targets, loss_sum, count, NULL);
}
