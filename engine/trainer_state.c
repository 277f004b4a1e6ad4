/*
 * trainer_state.c — trainer.json (trainer_state.h): written for a save,
 * read as untrusted input at a resume through a table of its fields with
 * their types and ranges, then the consistency with the index. Messages
 * name DIR/trainer.json, the field and what was expected, in one line.
 */
#include "engine/trainer_state.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/checkpoint_index.h"

static const double MAX_COUNT = 4503599627370496.0; /* 2^52: exact in a double */

/* What a field holds. */
typedef enum kind {
  INT,    /* an integral number in [lo, hi] */
  REAL,   /* a finite number in [lo, hi] */
  LOSS,   /* a finite number, or null (cJSON writes a NaN loss as null) */
  STRING, /* a string */
  SEED,   /* a string of 1-20 decimal digits, at most 2^64 - 1 */
} kind;

typedef struct field {
  const char *name;
  kind k;
  int required;
  double lo, hi;
} field;

static const field FIELDS[] = {
    {"step", INT, 1, 0, MAX_COUNT},
    {"steps", INT, 1, 1, MAX_COUNT},
    {"data_seed", SEED, 1, 0, 0},
    {"next_sample", INT, 1, 0, MAX_COUNT},
    {"global_batch", INT, 1, 1, MAX_COUNT},
    {"micro_batch", INT, 0, 1, MAX_COUNT},
    {"grad_accum", INT, 0, 1, MAX_COUNT},
    {"seq", INT, 0, 1, MAX_COUNT},
    {"lr", REAL, 0, 0, HUGE_VAL},
    {"min_lr_ratio", REAL, 0, 0, 1},
    {"warmup", INT, 0, 0, MAX_COUNT},
    {"lr_at_step", REAL, 0, 0, HUGE_VAL},
    {"last_loss", LOSS, 0, 0, 0},
    {"loss_scale", REAL, 0, 0x1p-126, HUGE_VAL},
    {"model", STRING, 0, 0, 0},
    {"data", STRING, 0, 0, 0},
    {"data_tokens", INT, 0, 1, MAX_COUNT},
    {"zero_stage", INT, 0, 0, 3},
    {"dtype", STRING, 0, 0, 0},
    {"activation_checkpointing", STRING, 0, 0, 0},
    {"pipeline", INT, 0, 1, MAX_COUNT},
    {"schedule", STRING, 0, 0, 0},
    {"virtual_stages", INT, 0, 1, TS_ENGINE_MAX_CHUNKS},
    {"world_size", INT, 0, 1, MAX_COUNT},
    {"weight_decay", REAL, 0, 0, HUGE_VAL},
    {"grad_clip", REAL, 0, 0, HUGE_VAL},
};
enum { N_FIELDS = sizeof FIELDS / sizeof FIELDS[0] };

/* TS_ERR_FORMAT: "DIR/trainer.json: " and the message. */
static ts_status bad(const char *dir, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ts_set_error(TS_ERR_FORMAT, "%s/trainer.json: %s", dir, msg);
}

/* Checks one field's type and range; its number into *num (NAN if absent),
 * a seed into *seed. */
static ts_status check_field(const char *dir, const cJSON *root, const field *f, double *num,
                             uint64_t *seed) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, f->name);
  *num = NAN;
  if (!v) return f->required ? bad(dir, "field \"%s\" missing", f->name) : TS_OK;
  switch (f->k) {
    case INT:
    case REAL: {
      double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
      int ok = x >= f->lo && x <= f->hi && isfinite(x) && (f->k == REAL || x == floor(x));
      if (!ok) {
        if (f->k == INT)
          return bad(dir, "field \"%s\": expected an integer %.0f..%.0f", f->name, f->lo, f->hi);
        return bad(dir, "field \"%s\": expected a finite number %s%s", f->name,
                   f->lo > 0 ? "> 0" : ">= 0", f->hi < HUGE_VAL ? " and <= 1" : "");
      }
      *num = x;
      return TS_OK;
    }
    case LOSS:
      if (cJSON_IsNull(v) || (cJSON_IsNumber(v) && isfinite(v->valuedouble))) return TS_OK;
      return bad(dir, "field \"%s\": expected a number or null", f->name);
    case STRING:
      return cJSON_IsString(v) ? TS_OK : bad(dir, "field \"%s\": expected a string", f->name);
    case SEED:
      if (cJSON_IsString(v) && ts_checkpoint_seed_parse(v->valuestring, seed)) return TS_OK;
      return bad(dir, "field \"%s\": expected a decimal string of a 64-bit seed", f->name);
  }
  return TS_OK;
}

/* The number field `name` had (NAN: absent). */
static double value(const double *nums, const char *name) {
  for (int i = 0; i < N_FIELDS; i++)
    if (!strcmp(FIELDS[i].name, name)) return nums[i];
  return NAN;
}

ts_status ts_trainer_state_parse(const char *text, size_t len, const char *dir,
                                 const ts_checkpoint_info *info, ts_trainer_state *out) {
  memset(out, 0, sizeof *out);
  cJSON *root = cJSON_ParseWithLength(text, len);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return bad(dir, "not a JSON object: expected the trainer state tessera train writes");
  }
  double nums[N_FIELDS];
  uint64_t seed = 0;
  ts_status st = TS_OK;
  for (int i = 0; i < N_FIELDS && st == TS_OK; i++)
    st = check_field(dir, root, &FIELDS[i], &nums[i], &seed);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(root, "dtype");
  int dtype_differs = cJSON_IsString(dtype) && strcmp(dtype->valuestring, info->dtype) != 0;
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
  if (cJSON_IsString(data)) snprintf(out->data, sizeof out->data, "%s", data->valuestring);
  cJSON_Delete(root);
  TS_CHECK(st);
  double step = value(nums, "step"), gb = value(nums, "global_batch");
  if (step != (double)info->attempts)
    return bad(dir, "field \"step\" = %.0f: expected the index's optimizer.attempts %d", step,
               info->attempts);
  if (value(nums, "steps") < step)
    return bad(dir, "field \"steps\" = %.0f: expected at least its step %.0f", value(nums, "steps"),
               step);
  if (value(nums, "next_sample") != step * gb)
    return bad(dir, "field \"next_sample\" = %.0f: expected step x global_batch = %.0f",
               value(nums, "next_sample"), step * gb);
  static const char *const SAME[] = {"zero_stage", "pipeline", "world_size"};
  const int index_has[] = {info->zero_stage, info->pipeline, info->world};
  for (int i = 0; i < 3; i++) {
    double x = value(nums, SAME[i]);
    if (!isnan(x) && x != index_has[i])
      return bad(dir, "field \"%s\" = %.0f: expected the index's %d", SAME[i], x, index_has[i]);
  }
  if (dtype_differs) return bad(dir, "field \"dtype\": expected the index's \"%s\"", info->dtype);
  if (seed != info->data_seed)
    return bad(dir, "field \"data_seed\" = %llu: expected the index's %llu",
               (unsigned long long)seed, (unsigned long long)info->data_seed);
  out->step = (size_t)step;
  out->steps = (size_t)value(nums, "steps");
  out->data_seed = seed;
  out->global_batch = (size_t)gb;
  double lr = value(nums, "lr"), floor_ratio = value(nums, "min_lr_ratio");
  double warmup = value(nums, "warmup");
  out->has_schedule = !isnan(lr) && !isnan(floor_ratio) && !isnan(warmup);
  out->lr = lr;
  out->min_lr_ratio = floor_ratio;
  out->warmup = out->has_schedule ? (size_t)warmup : 0;
  double seq = value(nums, "seq"), tokens = value(nums, "data_tokens");
  out->seq = isnan(seq) ? 0 : (size_t)seq;
  out->data_tokens = isnan(tokens) ? 0 : (size_t)tokens;
  return TS_OK;
}

char *ts_trainer_state_json(const ts_train_config *cfg, const ts_engine_opts *eo, size_t step,
                            size_t global_batch, int world_size, double last_loss,
                            float loss_scale, size_t data_tokens) {
  char recompute[32];
  ts_train_recompute_name(eo->recompute_every, recompute, sizeof recompute);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "step", (double)step);
  cJSON_AddNumberToObject(o, "steps", (double)cfg->steps);
  char seed[32]; /* a string: a 64-bit seed does not fit a JSON number's double */
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)eo->seed);
  cJSON_AddStringToObject(o, "data_seed", seed);
  cJSON_AddNumberToObject(o, "next_sample", (double)(step * global_batch));
  cJSON_AddNumberToObject(o, "global_batch", (double)global_batch);
  cJSON_AddNumberToObject(o, "micro_batch", (double)eo->micro_batch);
  cJSON_AddNumberToObject(o, "grad_accum", (double)eo->grad_accum);
  cJSON_AddNumberToObject(o, "seq", (double)eo->seq);
  cJSON_AddNumberToObject(o, "lr", cfg->lr);
  cJSON_AddNumberToObject(o, "min_lr_ratio", cfg->min_lr_ratio);
  cJSON_AddNumberToObject(o, "warmup", (double)cfg->warmup);
  cJSON_AddNumberToObject(o, "lr_at_step",
                          ts_train_lr(step, cfg->steps, cfg->warmup, cfg->lr, cfg->min_lr_ratio));
  cJSON_AddNumberToObject(o, "last_loss", last_loss);
  cJSON_AddNumberToObject(o, "loss_scale", loss_scale);
  cJSON_AddStringToObject(o, "model", cfg->model);
  cJSON_AddStringToObject(o, "data", cfg->data_dir);
  cJSON_AddNumberToObject(o, "data_tokens", (double)data_tokens);
  cJSON_AddNumberToObject(o, "zero_stage", eo->zero_stage);
  cJSON_AddStringToObject(o, "dtype", ts_dtype_name(eo->dtype));
  cJSON_AddStringToObject(o, "activation_checkpointing", recompute);
  cJSON_AddNumberToObject(o, "pipeline", eo->pipeline_stages);
  cJSON_AddStringToObject(o, "schedule", ts_schedule_kind_name(eo->schedule));
  if (ts_engine_opts_chunks(eo) > 1)
    cJSON_AddNumberToObject(o, "virtual_stages", ts_engine_opts_chunks(eo));
  cJSON_AddNumberToObject(o, "world_size", world_size);
  cJSON_AddNumberToObject(o, "weight_decay", eo->weight_decay);
  cJSON_AddNumberToObject(o, "grad_clip", eo->grad_clip);
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  return text;
}
