/* host_memory.c — the memory limit a process is given (host_memory.h). */
#include "engine/host_memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
