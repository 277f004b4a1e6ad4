/*
 * host_memory.h — private to engine/: whether a run's plan fits this node
 * (its memory, the process's cgroup limit, an offload folder's disk), for
 * train's pre-flight (trainer.c).
 */
#ifndef TS_ENGINE_HOST_MEMORY_H
#define TS_ENGINE_HOST_MEMORY_H

#include <stddef.h>

#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The memory limit of this process's cgroup in bytes, the smallest from
 * its own group up to the root: cgroup v2's memory.max (under
 * /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host) or v1's
 * memory.limit_in_bytes; -1 when none is set or readable. "max" and v1's
 * unlimited value (at least 2^60) are no limit. Reads /proc/self/cgroup. */
double ts_cgroup_memory_limit(void);

/* Refuses, before anything is allocated, a plan this node cannot hold
 * (pipeline stage `stage` of dp_size data-parallel ranks; ts_engine_plan_
 * stage_host, what `tessera estimate` prints) times the world's ranks on
 * this node (ts_comm_local_size): on the CPU the rank's whole peak, beside
 * a GPU its host part (the card's own is checked at create), against the
 * node's physical memory or the process's cgroup limit where smaller; with
 * eo->offload_dir, the plan's disk bytes against the folder's free space.
 * TS_ERR_OUT_OF_MEMORY or TS_ERR_IO, one line naming what does not fit and
 * what to change; errors of the plan. */
ts_status ts_check_node_fits(const ts_model *model, const ts_engine_opts *eo, size_t dp_size,
                             int stage);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_HOST_MEMORY_H */
