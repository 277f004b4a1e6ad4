/* trainer_resume.c — which checkpoint a training run goes on from, and
 * whether it fits: the model and config.json it was trained as, the
 * global batch and step, the corpus and sequence length, and its files
 * intact on every rank; `resume` auto skips damaged ones for the next
 * older (trainer_run.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/trainer_run.h"

/* The checkpoint's config.json must describe the model this run trains:
 * the same family and every hyper-parameter equal (ts_model_config_diff),
 * or the load is refused naming the first field that differs. */
static ts_status check_saved_config(ts_train_run_state *r, const char *dir) {
  char *text;
  TS_CHECK(ts_checkpoint_read_extra(r->ck, "config.json", &text, NULL));
  char source[4200];
  snprintf(source, sizeof source, "%s/config.json", dir);
  ts_model saved;
  ts_status st = ts_model_parse(text, source, &saved);
  free(text);
  TS_CHECK(st);
  const char *field;
  char here[32], there[32];
  if (ts_model_config_diff(&r->model, &saved, &field, here, there))
    st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "`model` %s: field \"%s\" = %s, the checkpoint's %s has %s: expected the "
                      "model the checkpoint was trained as",
                      ts_model_origin(&r->model), field, here, source, there);
  ts_model_free(&saved);
  return st;
}

/* Resuming with another learning-rate schedule (`steps`, `lr`,
 * `min_lr_ratio`, `warmup`) than the saving run's is allowed (a run is
 * often extended), but said: one line into r->notes with the rate of
 * the next step, before and after. */
static void note_schedule(ts_train_run_state *r, const ts_trainer_state *s) {
  const ts_train_config *c = r->cfg;
  if (!s->has_schedule) return;
  float was = ts_train_lr(s->step + 1, s->steps, s->warmup, (float)s->lr, (float)s->min_lr_ratio);
  float now = ts_train_lr(s->step + 1, c->steps, c->warmup, c->lr, c->min_lr_ratio);
  if (s->steps == c->steps && (float)s->lr == c->lr && (float)s->min_lr_ratio == c->min_lr_ratio &&
      s->warmup == c->warmup)
    return;
  ts_train_note(r,
                "note: resuming with another learning-rate schedule than the checkpoint's "
                "(`steps` %zu, `lr` %g, `warmup` %zu, `min_lr_ratio` %g here; %zu, %g, %zu, %g "
                "there): step %zu's rate is %.6g where the saved run's schedule had %.6g",
                c->steps, (double)c->lr, c->warmup, (double)c->min_lr_ratio, s->steps, s->lr,
                s->warmup, s->min_lr_ratio, s->step + 1, (double)now, (double)was);
}

/* Opens checkpoint folder dir for the resume (held against pruning,
 * checked against the model: its tensors and its config.json), reads and
 * checks its trainer state (trainer_state.h): the step to go on from and
 * the data seed (a batch is a pure function of (seed, step, sample index)).
 * The global batch must be the saved one, or the steps would mean other
 * samples. TS_ERR_IO when a prune removed it meanwhile. */
static ts_status open_checkpoint(ts_train_run_state *r, const char *dir) {
  const ts_train_config *cfg = r->cfg;
  int fd = ts_checkpoint_hold(dir);
  if (fd < 0) return ts_set_error(TS_ERR_IO, "%s: not a complete checkpoint (no index.json)", dir);
  r->ck_hold = fd + 1;
  TS_CHECK(ts_checkpoint_open(&r->ck, dir, &r->model));
  TS_CHECK(check_saved_config(r, dir));
  ts_checkpoint_info info;
  ts_checkpoint_get_info(r->ck, &info);
  char *text;
  size_t len;
  TS_CHECK(ts_checkpoint_read_extra(r->ck, "trainer.json", &text, &len));
  ts_trainer_state s;
  ts_status st = ts_trainer_state_parse(text, len, dir, &info, &s);
  free(text);
  TS_CHECK(st);
  if (s.global_batch != r->global_batch)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`global_batch` %zu: the checkpoint %s was trained with %zu sequences per "
                        "step; resume with the same global batch",
                        r->global_batch, dir, s.global_batch);
  if (s.step >= cfg->steps)
    return ts_set_error(
        TS_ERR_INVALID_ARGUMENT,
        "`steps` %zu: the checkpoint %s is at step %zu already; expected more steps", cfg->steps,
        dir, s.step);
  note_schedule(r, &s);
  r->saved = s;
  r->start = s.step;
  r->eo.seed = s.data_seed; /* the data order of the run that saved it */
  return TS_OK;
}

/* The last step a run saving into save_dir finished (its progress.json,
 * write_progress), else 0. */
static size_t read_progress(const char *save_dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/" TS_TRAIN_PROGRESS, save_dir);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  unsigned long long step = 0;
  if (fscanf(f, "{\"step\": %llu}", &step) != 1) step = 0;
  fclose(f);
  return (size_t)step;
}

/* `resume` auto after a run that got further than its newest checkpoint
 * (a failure, not a stop: a stop saves its last step): one line of
 * r->notes with the steps done again. */
void ts_train_note_redone(ts_train_run_state *r) {
  size_t last = read_progress(r->cfg->save_dir);
  if (last > r->start)
    ts_train_note(r,
                  "note: resuming from step %zu: the last run reached step %zu, %zu steps are "
                  "redone",
                  r->start, last, last - r->start);
}

/* Whether st (an open's or a check's) says the checkpoint itself is
 * damaged (its files: missing, cut short, changed, unreadable), not that
 * it does not fit this run's flags. */
static int damaged(ts_status st) { return st == TS_ERR_FORMAT || st == TS_ERR_IO; }

/* cfg->resume: finds and opens the checkpoint (open_checkpoint). With
 * `resume` auto the newest complete step-N under save_dir older than
 * `below` ((size_t)-1: any); one that is damaged is skipped for the next
 * older, said in one line of r->notes; none at all is a fresh start, every
 * one damaged the newest's error. */
ts_status ts_train_open_resume(ts_train_run_state *r, size_t below) {
  const ts_train_config *cfg = r->cfg;
  if (!cfg->resume) return TS_OK;
  int is_auto = strcmp(cfg->resume, "auto") == 0;
  if (is_auto && !cfg->save_dir)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`resume` auto: needs `save_dir` to look in");
  char dir[4096];
  if (!is_auto) {
    if (!ts_checkpoint_latest(cfg->resume, dir, sizeof dir, NULL))
      return ts_set_error(
          TS_ERR_IO,
          "`resume` %s: no complete checkpoint there (a folder with " TS_CHECKPOINT_INDEX
          ", or step-N folders holding one)",
          cfg->resume);
    return open_checkpoint(r, dir);
  }
  char skipped[4096] = "";
  ts_status first = TS_OK;
  char first_error[1024] = "";
  while (ts_checkpoint_latest_below(cfg->save_dir, below, dir, sizeof dir, &r->ck_step)) {
    ts_status st = open_checkpoint(r, dir);
    if (st == TS_OK || !damaged(st)) {
      if (st == TS_OK && skipped[0])
        ts_train_note(r, "note: `resume` auto: %s is damaged (%s); resuming from %s", skipped,
             first_error, dir);
      return st;
    }
    ts_train_release_checkpoint(r);
    if (first == TS_OK) {
      first = st;
      snprintf(first_error, sizeof first_error, "%s", ts_last_error());
      snprintf(skipped, sizeof skipped, "%s", dir);
    }
    below = r->ck_step;
  }
  if (first != TS_OK) /* every one is damaged: the newest's error */
    return ts_set_error(first, "%s (and no older checkpoint in %s is intact)", first_error,
                        cfg->save_dir);
  return TS_OK; /* nothing saved yet: a fresh start */
}

/* A resume against the corpus and sequence length the checkpoint was
 * trained with (its trainer.json): another corpus (train.bin's token
 * count differs) is refused, since a step's samples are drawn from it and
 * the loss would jump; the same count under another path is said in one
 * line of r->notes (a corpus moved); another `seq` is allowed (a longer
 * context is a real use) and said. Checkpoints that recorded neither pass. */
ts_status ts_train_check_resume_data(ts_train_run_state *r) {
  const ts_trainer_state *s = &r->saved;
  if (!r->ck) return TS_OK;
  const char *dir = ts_checkpoint_dir(r->ck), *data = r->cfg->data_dir;
  size_t tokens = ts_token_file_num_tokens(r->train);
  if (s->data_tokens && s->data_tokens != tokens)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`data_dir` %s: its train.bin has %zu tokens; the checkpoint %s was trained on "
                        "%s, %zu tokens: expected the same corpus (each step's samples are drawn "
                        "from it)",
                        data, tokens, dir, s->data, s->data_tokens);
  if (s->data_tokens && s->data[0] && strcmp(s->data, data) != 0)
    ts_train_note(r,
                  "note: `data_dir` %s: the checkpoint %s was trained on %s, whose train.bin "
                  "had the same %zu tokens: taken as the same corpus",
                  data, dir, s->data, tokens);
  if (s->seq && s->seq != r->eo.seq)
    ts_train_note(r,
                  "note: `seq` %zu: the checkpoint %s was trained with `seq` %zu; the run goes "
                  "on with %zu-token sequences (other windows of the corpus)",
                  r->eo.seq, dir, s->seq, r->eo.seq);
  return TS_OK;
}

/* Every rank checks its share of r->ck's files (ts_checkpoint_verify),
 * agreed over the world. With `resume` auto a damaged checkpoint gives way
 * to the next older one that opens and checks (ts_train_open_resume), said in one
 * line of r->notes. */
ts_status ts_train_verify_resume(ts_train_run_state *r) {
  for (;;) {
    ts_status st = ts_comm_agree(r->world, ts_checkpoint_verify(r->ck, r->wrank, r->world_size),
                                 "checking the checkpoint's files", NULL);
    if (st == TS_OK || !damaged(st) || strcmp(r->cfg->resume, "auto") != 0) return st;
    char bad_dir[4096], why[1024];
    snprintf(bad_dir, sizeof bad_dir, "%s", ts_checkpoint_dir(r->ck));
    snprintf(why, sizeof why, "%s", ts_last_error());
    ts_train_release_checkpoint(r);
    size_t below = r->ck_step;
    uint64_t seed = r->eo.seed; /* the data loader's already */
    r->start = 0;
    TS_CHECK(ts_train_open_resume(r, below));
    if (!r->ck)
      return ts_set_error(st, "%s (and no older checkpoint in %s is intact)", why,
                          r->cfg->save_dir);
    if (r->eo.seed != seed)
      return ts_set_error(st,
                          "%s; the next older checkpoint %s has another data seed: resume it by "
                          "name (`resume` DIR)",
                          why, ts_checkpoint_dir(r->ck));
    ts_train_note(r, "note: `resume` auto: %s is damaged (%s); resuming from %s", bad_dir, why,
         ts_checkpoint_dir(r->ck));
  }
}
