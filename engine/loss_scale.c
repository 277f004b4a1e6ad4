/* loss_scale.c — the dynamic loss scaler (loss_scale.h). */
#include "engine/loss_scale.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { HISTORY = sizeof(((ts_loss_scaler *)0)->history) / sizeof(((ts_loss_scaler *)0)->history[0]) };

/* Records the current scale as set at `step` in the history ring. */
static void note_scale(ts_loss_scaler *s, int step) {
  int k = s->n_history++ % HISTORY;
  s->history[k].step = step;
  s->history[k].scale = s->scale;
}

/* The recent scale history, oldest first: "step 0: 65536, step 3: 32768". */
static void format_history(const ts_loss_scaler *s, char *buf, size_t cap) {
  int first = s->n_history > HISTORY ? s->n_history - HISTORY : 0;
  size_t len = 0;
  buf[0] = '\0';
  for (int k = first; k < s->n_history && len < cap; k++) {
    int w = snprintf(buf + len, cap - len, "%sstep %d: %g", k > first ? ", " : "",
                     s->history[k % HISTORY].step, (double)s->history[k % HISTORY].scale);
    if (w < 0) break;
    len += (size_t)w;
  }
}

ts_status ts_loss_scaler_init(ts_loss_scaler *s, ts_dtype dtype, float fixed_scale,
                              float init_scale, size_t window, float min_scale) {
  memset(s, 0, sizeof *s);
  s->scale = 1.0f;
  if (dtype != TS_FP16) return TS_OK;
  if (!(fixed_scale >= 0 && isfinite(fixed_scale)))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`loss_scale` %g: expected 0 (dynamic) or a finite scale > 0",
                        (double)fixed_scale);
  s->enabled = 1;
  s->dynamic = fixed_scale == 0;
  s->scale = s->dynamic ? init_scale : fixed_scale;
  s->min_scale = min_scale;
  s->window = window;
  if (s->dynamic &&
      !(min_scale > 0 && isfinite(init_scale) && init_scale >= min_scale && window >= 1))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "dynamic loss scale: initial %g, `min_loss_scale` %g, "
                        "`loss_scale_window` %zu: expected 0 < minimum <= initial and window >= 1",
                        (double)init_scale, (double)min_scale, window);
  note_scale(s, 0);
  return TS_OK;
}

ts_status ts_loss_scaler_overflow(ts_loss_scaler *s, int step, const char *tensor, int unit) {
  s->clean_steps = 0;
  if (!s->dynamic) return TS_OK;
  if (s->scale <= s->min_scale) {
    char hist[512];
    format_history(s, hist, sizeof hist);
    return ts_set_error(TS_ERR_NUMERIC,
                        "fp16 overflow at step %d with the loss scale at its minimum %g "
                        "(`min_loss_scale`): it began in %s (unit %d); recent "
                        "loss scales: %s",
                        step, (double)s->scale, tensor, unit, hist);
  }
  float half = s->scale * 0.5f;
  s->scale = half > s->min_scale ? half : s->min_scale;
  note_scale(s, step);
  return TS_OK;
}

void ts_loss_scaler_clean(ts_loss_scaler *s, int step) {
  if (!s->dynamic || ++s->clean_steps < s->window) return;
  s->clean_steps = 0;
  if (isfinite(s->scale * 2.0f)) {
    s->scale *= 2.0f;
    note_scale(s, step);
  }
}
