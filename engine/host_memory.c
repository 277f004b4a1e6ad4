/* host_memory.c — the memory limit a process is given, and whether a
 * plan fits this node (host_memory.h). */
#include "engine/host_memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "comm/comm.h"

/* The smallest memory limit in file `leaf` (memory.max, or v1's
 * memory.limit_in_bytes) of cgroup `group` under `root` and its parents
 * (those below the root), into *limit (-1: none yet). "max" and v1's
 * unlimited value (at least 2^60) are no limit. */
static void cgroup_limit_walk(const char *root, char *group, const char *leaf, double *limit) {
  char path[4400], v[64];
  for (;;) {
    snprintf(path, sizeof path, "%s%s/%s", root, strcmp(group, "/") ? group : "", leaf);
    FILE *m = fopen(path, "r");
    if (m && fgets(v, sizeof v, m) && strncmp(v, "max", 3) != 0) {
      double x = strtod(v, NULL);
      if (x > 0 && x < 1152921504606846976.0 && (*limit < 0 || x < *limit)) *limit = x;
    }
    if (m) fclose(m);
    char *slash = strrchr(group, '/');
    if (!slash || slash == group) break; /* the root group has no limit of its own */
    *slash = '\0';
  }
}

/* The memory limit of this process's cgroup, or -1 when none is set or
 * readable: cgroup v2 (the "0::" line; /sys/fs/cgroup, or /sys/fs/cgroup/
 * unified on a hybrid host) or v1's memory controller. */
double ts_cgroup_memory_limit(void) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  char line[4096];
  double limit = -1.0;
  if (!f) return limit;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    const char *controllers = c1 + 1;
    char group[4096];
    if (!*controllers) { /* v2 */
      snprintf(group, sizeof group, "%s", c2 + 1);
      cgroup_limit_walk("/sys/fs/cgroup", group, "memory.max", &limit);
      snprintf(group, sizeof group, "%s", c2 + 1);
      cgroup_limit_walk("/sys/fs/cgroup/unified", group, "memory.max", &limit);
    } else if (strstr(controllers, "memory")) { /* v1 */
      snprintf(group, sizeof group, "%s", c2 + 1);
      cgroup_limit_walk("/sys/fs/cgroup/memory", group, "memory.limit_in_bytes", &limit);
    }
  }
  fclose(f);
  return limit;
}

ts_status ts_check_node_fits(const ts_model *model, const ts_engine_opts *eo, size_t dp_size,
                             int stage) {
  ts_mem_account plan, host, disk;
  TS_CHECK(ts_engine_plan_stage_host(model, eo, dp_size, stage, &plan, &host, &disk));
  double ranks = ts_comm_local_size(); /* the world's ranks on this host */
  double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
  double cgroup = ts_cgroup_memory_limit();
  int limited = cgroup > 0 && (mem <= 0 || cgroup < mem);
  if (limited) mem = cgroup;
  const double GiB = 1024.0 * 1024.0 * 1024.0, MiB = 1024.0 * 1024.0;
  const char *plural = ranks > 1 ? "s" : "", *why = limited ? " (its cgroup's limit)" : "";
  int cpu = eo->device == TS_DEVICE_CPU;
  const ts_mem_account *here = cpu ? &plan : &host; /* what this host's memory holds */
  if (mem > 0 && (double)here->peak_total * ranks > mem) {
    if (cpu)
      return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                          "%s: the plan needs %.1f GiB per rank (tessera estimate) x %.0f rank%s "
                          "on this node, more than its %.1f GiB of memory%s: expected a smaller "
                          "`micro_batch` or `seq`, a higher `zero_stage`, `recompute_every`, "
                          "`offload_dir` or more nodes",
                          ts_model_origin(model), (double)plan.peak_total / GiB, ranks, plural,
                          mem / GiB, why);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                        "%s: the plan keeps %.1f GiB per rank in host memory (master %.1f, optim "
                        "%.1f; tessera estimate's host rows) x %.0f rank%s on this node, more "
                        "than its %.1f GiB%s: expected `offload_dir`, a higher `zero_stage` or "
                        "more nodes",
                        ts_model_origin(model), (double)host.peak_total / GiB,
                        (double)host.peak[TS_MEM_MASTER] / GiB, (double)host.peak[TS_MEM_OPTIM] / GiB,
                        ranks, plural, mem / GiB, why);
  }
  struct statvfs fs;
  if (eo->offload_dir && disk.current_total > 0 && statvfs(eo->offload_dir, &fs) == 0) {
    double free_bytes = (double)fs.f_bavail * (double)fs.f_frsize;
    if ((double)disk.current_total * ranks > free_bytes)
      return ts_set_error(TS_ERR_IO,
                          "`offload_dir` %s: the plan keeps %.1f MiB per rank there (master "
                          "%.1f, optim %.1f) x %.0f rank%s on this node, more than its %.1f MiB "
                          "free: expected a folder on a larger disk, or more nodes",
                          eo->offload_dir, (double)disk.current_total / MiB,
                          (double)disk.current[TS_MEM_MASTER] / MiB,
                          (double)disk.current[TS_MEM_OPTIM] / MiB, ranks, plural,
                          free_bytes / MiB);
  }
  return TS_OK;
}
