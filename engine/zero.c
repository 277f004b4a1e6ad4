/* zero.c — the four ZeRO stages as data (zero.h; Rajbhandari et al. 2020,
 * §5: P_os (stage 1), P_os+g (stage 2), P_os+g+p (stage 3)). */
#include "engine/zero.h"

#include <stddef.h>

static const ts_zero_policy STAGES[4] = {
    /* stage 0: DDP, everything replicated; gradients all-reduced */
    {.stage = 0, .reduce_after_step = 1, .gather_grads = 1},
    /* stage 1: optimizer states sharded */
    {.stage = 1, .shard_optim = 1, .reduce_after_step = 1, .gather_after_update = 1},
    /* stage 2: gradients too, reduced per unit */
    {.stage = 2, .shard_grads = 1, .shard_optim = 1, .gather_after_update = 1},
    /* stage 3: parameters too, gathered per use */
    {.stage = 3, .shard_params = 1, .shard_grads = 1, .shard_optim = 1},
};

const ts_zero_policy *ts_zero_policy_of(int stage) {
  return stage >= 0 && stage <= 3 ? &STAGES[stage] : NULL;
}
