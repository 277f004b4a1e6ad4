/*
 * host_memory.h — private to engine/: the memory limit this process is
 * given beside the machine's RAM, for train's pre-flight (trainer.c).
 */
#ifndef TS_ENGINE_HOST_MEMORY_H
#define TS_ENGINE_HOST_MEMORY_H

#ifdef __cplusplus
extern "C" {
#endif

/* The memory limit of this process's cgroup in bytes, the smallest from
 * its own group up to the root: cgroup v2's memory.max (under
 * /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host) or v1's
 * memory.limit_in_bytes; -1 when none is set or readable. "max" and v1's
 * unlimited value (at least 2^60) are no limit. Reads /proc/self/cgroup. */
double ts_cgroup_memory_limit(void);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_HOST_MEMORY_H */
