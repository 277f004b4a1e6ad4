/*
 * zero.h — private to engine/: the ZeRO stage as a policy table
 * (DESIGN.md "Flat parameters and shards"): what each data-parallel rank
 * keeps whole or as its 1/N shard, when parameters are gathered and when
 * gradients are reduced. The engine reads these fields; it never compares
 * stage numbers.
 *
 *   stage | compute params      | gradients            | fp32 master, Adam m, v
 *   0     | P                   | P                    | P
 *   1     | P                   | P                    | S
 *   2     | P                   | S (+ P per unit in backward) | S
 *   3     | S (+ P while in use)| S (+ P per unit in backward) | S
 *
 * Gradient reduction is one primitive in every stage, a reduce-scatter in
 * rank order over the same layout (the determinism contract): per unit as
 * its backward ends (stages 2-3), or after the last micro-batch (stages
 * 0-1, stage 0 then all-gathering the reduced gradients back: all-reduce).
 */
#ifndef TS_ENGINE_ZERO_H
#define TS_ENGINE_ZERO_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_zero_policy {
  int stage;               /* 0 (DDP), 1, 2, 3 */
  int shard_params;        /* compute params are this rank's shard (gathered per use) */
  int shard_grads;         /* the gradient buffer is the shard; each unit's full gradient
                              lives only from its backward to its reduce-scatter */
  int shard_optim;         /* fp32 master weights and Adam moments are the shard */
  int reduce_after_step;   /* reduce-scatter the full gradients after the last micro-batch */
  int gather_grads;        /* then all-gather the reduced gradients (all-reduce) */
  int gather_after_update; /* all-gather updated parameters into the full replica */
} ts_zero_policy;

/* The policy of ZeRO stage `stage`, or NULL outside 0-3. */
const ts_zero_policy *ts_zero_policy_of(int stage);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_ZERO_H */
