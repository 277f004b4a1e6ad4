/*
 * loss_scale.h — private to engine/: fp16 dynamic loss scaling as one
 * self-contained object (PyTorch's GradScaler, DeepSpeed's
 * DynamicLossScaler; Micikevicius et al. 2018, "Mixed Precision Training",
 * §3.2).
 *
 * Dynamic: start at `init`; a step whose gradients hold inf or NaN is
 * skipped and halves the scale (not below `min`); `window` clean steps in a
 * row double it (while the double stays finite); an overflow with the scale
 * already at `min` stops training. Fixed (scale > 0 given): that scale
 * forever, overflowing steps still skipped. bf16 and fp32 need no scaling:
 * the scale is 1 and never changes. Scales are powers of two in practice,
 * so scaling and unscaling gradients is exact.
 */
#ifndef TS_ENGINE_LOSS_SCALE_H
#define TS_ENGINE_LOSS_SCALE_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_loss_scaler {
  int enabled;        /* 1: fp16, gradients carry `scale` */
  int dynamic;        /* 1: the scale adapts */
  float scale;        /* the scale the next gradients carry (1 when disabled) */
  float min_scale;    /* dynamic: floor */
  size_t window;      /* dynamic: clean steps before doubling */
  size_t clean_steps; /* consecutive steps without overflow */
  struct {
    int step;    /* optimizer step (skipped ones counted) at which the scale became `scale` */
    float scale;
  } history[8];       /* ring of the recent scale changes */
  int n_history;      /* changes recorded so far */
} ts_loss_scaler;

/* Sets up s for dtype: disabled unless fp16; with fp16, fixed_scale > 0
 * fixes the scale, 0 makes it dynamic from init_scale with window and
 * min_scale. TS_ERR_INVALID_ARGUMENT naming the flag: a fixed scale that is
 * negative or not finite ("`loss_scale` ..."), or dynamic settings with
 * minimum > initial, a minimum <= 0 or a window of 0. */
ts_status ts_loss_scaler_init(ts_loss_scaler *s, ts_dtype dtype, float fixed_scale,
                              float init_scale, size_t window, float min_scale);

/* An overflowing step, the `step`-th (1-based, skipped ones counted): the
 * clean-step count resets; a dynamic scale halves (not below the minimum)
 * and the change is recorded at `step`. At the minimum already:
 * TS_ERR_NUMERIC with the message "fp16 overflow at step N with the loss
 * scale at its minimum M (`min_loss_scale`): it began in TENSOR (unit U);
 * recent loss scales: step 0: 65536, ...", the scale unchanged. */
ts_status ts_loss_scaler_overflow(ts_loss_scaler *s, int step, const char *tensor, int unit);

/* A clean step, the `step`-th: after `window` in a row a dynamic scale
 * doubles (recorded at `step`) while the double stays finite. */
void ts_loss_scaler_clean(ts_loss_scaler *s, int step);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_LOSS_SCALE_H */
