/* flags.c — the table-driven flag parser of the `tessera` subcommands (see
 * flags.h). Every message goes through one function (vreport), so the
 * format, ts_last_error() and the lead-rank rule hold for every flag of
 * every command; each value kind is parsed by one function that leaves
 * "expected ..." in ts_last_error() on failure, and ts_flags_parse alone
 * puts "FLAG VALUE: " in front of it. */
#include "tools/flags.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ts_flags_is_lead(void) {
  static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v) return strcmp(v, "0") == 0;
  }
  return 1;
}

/* The library's option names (the fields of ts_engine_opts and
 * ts_train_config, and prepare's mlm), which library messages write in
 * backquotes, and the flags that set them: the one table of the mapping. */
static const struct {
  const char *option, *flag;
} TERMS[] = {
    {"micro_batch", "--micro-batch"},
    {"seq", "--seq"},
    {"grad_accum", "--grad-accum"},
    {"global_batch", "--global-batch"},
    {"zero_stage", "--zero"},
    {"shard_group", "--shard-group"},
    {"pipeline_stages", "--pipeline"},
    {"pipeline_split", "--pipeline-split"},
    {"virtual_stages", "--virtual-stages"},
    {"loss_scale", "--loss-scale"},
    {"min_loss_scale", "--min-loss-scale"},
    {"loss_scale_window", "--loss-scale-window"},
    {"recompute_every", "--activation-checkpointing"},
    {"fp8", "--fp8"},
    {"keep_gathered", "--reshard-after-forward"},
    {"offload_dir", "--offload-dir"},
    {"offload_piece", "--offload-piece"},
    {"offload_optimizer", "--offload optimizer"},
    {"offload_params", "--offload params"},
    {"overlap", "--overlap"},
    {"comm_chunk_bytes", "--comm-chunk"},
    {"comm", "--comm"},
    {"device", "--device"},
    {"model", "--model"},
    {"data_dir", "--data"},
    {"steps", "--steps"},
    {"lr", "--lr"},
    {"grad_clip", "--grad-clip"},
    {"weight_decay", "--weight-decay"},
    {"warmup", "--warmup"},
    {"eval_batches", "--eval-batches"},
    {"max_bad_steps", "--max-bad-steps"},
    {"save_dir", "--save"},
    {"trace_path", "--trace"},
    {"metrics_path", "--metrics"},
    {"tensorboard_dir", "--tensorboard"},
    {"sample_every", "--sample-every"},
    {"resume", "--resume"},
    {"mlm", "--mlm"},
};

void ts_flags_terms(const char *msg, char *out, size_t cap) {
  size_t n = 0;
  if (cap == 0) return;
  for (const char *p = msg; *p && n + 1 < cap;) {
    const char *close = *p == '`' ? strchr(p + 1, '`') : NULL;
    size_t len = close ? (size_t)(close - p - 1) : 0;
    if (len == 0 || strspn(p + 1, "abcdefghijklmnopqrstuvwxyz0123456789_") != len) {
      out[n++] = *p++; /* not an option name: the character as it is */
      continue;
    }
    const char *word = NULL;
    for (size_t i = 0; i < sizeof TERMS / sizeof *TERMS && !word; i++)
      if (strlen(TERMS[i].option) == len && !strncmp(p + 1, TERMS[i].option, len))
        word = TERMS[i].flag;
    int w = word ? snprintf(out + n, cap - n, "%s", word)
                 : snprintf(out + n, cap - n, "%.*s", (int)len, p + 1);
    n += (size_t)w < cap - n ? (size_t)w : cap - n - 1;
    p = close + 1;
  }
  out[n] = '\0';
}

const char *ts_flags_last_error(void) {
  static _Thread_local char buf[1024];
  ts_flags_terms(ts_last_error(), buf, sizeof buf);
  return buf;
}

/* Records the message (library option names mapped to flags) as the last
 * error and prints it after "tessera SUB: " on the lead rank; returns
 * TS_FLAGS_BAD_USAGE. */
static int vreport(const char *sub, const char *fmt, va_list ap) {
  char raw[1024], msg[1024];
  vsnprintf(raw, sizeof raw, fmt, ap);
  ts_flags_terms(raw, msg, sizeof msg);
  ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s", msg);
  if (ts_flags_is_lead()) fprintf(stderr, "tessera %s: %s\n", sub, msg);
  return TS_FLAGS_BAD_USAGE;
}

int ts_flags_error(const char *sub, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vreport(sub, fmt, ap);
  va_end(ap);
  return r;
}

/* 1 if value is D[.D][eD] (D: one or more decimal digits): no sign,
 * spaces, hexadecimal, infinity or NaN, which strtod would take. */
static int is_plain_decimal(const char *value) {
  const char *p = value;
  size_t n = strspn(p, "0123456789");
  if (n == 0) return 0;
  p += n;
  if (*p == '.') {
    n = strspn(++p, "0123456789");
    if (n == 0) return 0;
    p += n;
  }
  if (*p == 'e' || *p == 'E') {
    n = strspn(++p, "0123456789");
    if (n == 0) return 0;
    p += n;
  }
  return *p == '\0';
}

ts_status ts_flags_size(const char *value, size_t min, size_t *out) {
  int ok = is_plain_decimal(value);
  unsigned long long v = 0;
  if (ok && strspn(value, "0123456789") == strlen(value)) { /* all digits: exact at any size */
    errno = 0;
    v = strtoull(value, NULL, 10);
    ok = errno == 0 && (size_t)v == v;
  } else if (ok) { /* 1e9, 7.5e9: an integer up to 2^53, where doubles are exact */
    double d = strtod(value, NULL);
    ok = d == floor(d) && d <= 9007199254740992.0;
    v = ok ? (unsigned long long)d : 0;
  }
  if (!ok || v < min)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "expected an integer >= %zu (digits, or such as 1e9 or 7.5e9)", min);
  *out = (size_t)v;
  return TS_OK;
}

ts_status ts_flags_float(const char *value, float *out) {
  char *end;
  errno = 0;
  float v = strtof(value, &end);
  if (errno || end == value || *end || !isfinite(v))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected a finite number");
  *out = v;
  return TS_OK;
}

/* Parses a CHOICE value into its index; the error lists the choices
 * ("expected GiB, GB, MiB, MB or bytes"). */
static ts_status parse_choice(const char *value, const char *const *choices, int *out) {
  char expected[512] = "expected ";
  size_t n = 0;
  for (; choices[n]; n++) {
    if (!strcmp(value, choices[n])) {
      *out = (int)n;
      return TS_OK;
    }
  }
  for (size_t k = 0; k < n; k++) {
    size_t len = strlen(expected);
    snprintf(expected + len, sizeof expected - len, "%s%s",
             k == 0 ? "" : k + 1 == n ? " or " : ", ", choices[k]);
  }
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s", expected);
}

/* Stores value through row f; on failure ts_last_error() says what was
 * expected (possibly after the parser's own words, see ts_flag_parse_fn). */
static ts_status store(const ts_flag *f, const char *value) {
  switch (f->kind) {
    case TS_FLAG_KIND_SIZE: return ts_flags_size(value, f->min, (size_t *)f->dest);
    case TS_FLAG_KIND_FLOAT: return ts_flags_float(value, (float *)f->dest);
    case TS_FLAG_KIND_STRING: *(const char **)f->dest = value; return TS_OK;
    case TS_FLAG_KIND_CHOICE: return parse_choice(value, f->choices, (int *)f->dest);
    case TS_FLAG_KIND_CUSTOM: return f->parse(value, f->dest);
    case TS_FLAG_KIND_SWITCH: break; /* has no value; ts_flags_parse sets it */
  }
  return ts_set_error(TS_ERR_INTERNAL, "flag %s: no value to store for its kind", f->name);
}

/* The row named `name` (long name or alias), or NULL. */
static const ts_flag *find(const ts_flag *flags, size_t nflags, const char *name) {
  for (size_t k = 0; k < nflags; k++)
    if (!strcmp(name, flags[k].name) || (flags[k].alias && !strcmp(name, flags[k].alias)))
      return &flags[k];
  return NULL;
}

/* Writes row f's names and value as --help shows them ("-n, --world-size N"). */
static void row_names(const ts_flag *f, char *buf, size_t cap) {
  int len = snprintf(buf, cap, "%s%s%s", f->alias ? f->alias : "", f->alias ? ", " : "", f->name);
  if (f->value_name) {
    snprintf(buf + len, cap - (size_t)len, " %s", f->value_name);
  } else if (f->kind == TS_FLAG_KIND_CHOICE) {
    for (size_t k = 0; f->choices[k] && (size_t)len < cap; k++)
      len += snprintf(buf + len, cap - (size_t)len, "%c%s", k ? '|' : ' ', f->choices[k]);
  }
}

/* --help: the command's usage, then a line per flag: its names, then its
 * help in a column (on a line of its own after names too long for it). */
static void print_help(const ts_flag *flags, size_t nflags, const char *usage) {
  enum { MAX_COLUMN = 28 }; /* the help column starts at most this far in */
  static const ts_flag help = TS_FLAG_SWITCH("--help", "-h", (int *)NULL, "print this help");
  char names[256];
  int width = 0;
  for (size_t k = 0; k <= nflags; k++) {
    row_names(k < nflags ? &flags[k] : &help, names, sizeof names);
    int len = (int)strlen(names);
    if (len > width && len <= MAX_COLUMN) width = len;
  }
  fputs(usage, stdout);
  fputs("flags:\n", stdout);
  for (size_t k = 0; k <= nflags; k++) {
    const ts_flag *f = k < nflags ? &flags[k] : &help;
    row_names(f, names, sizeof names);
    if ((int)strlen(names) > width) printf("  %s\n  %-*s  %s\n", names, width, "", f->help);
    else printf("  %-*s  %s\n", width, names, f->help);
  }
}

int ts_flags_parse(const char *sub, const ts_flag *flags, size_t nflags, int argc, char **argv,
                   const char *usage) {
  enum { MAX_FLAGS = 128 };
  TS_ASSERT(nflags <= MAX_FLAGS);
  unsigned char seen[MAX_FLAGS] = {0}; /* rows given so far */
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    /* "--name=value": the name before '=', the value after it. */
    char name[256];
    const char *eq = !strncmp(arg, "--", 2) ? strchr(arg, '=') : NULL;
    snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - arg) : (int)strlen(arg), arg);
    if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
      if (ts_flags_is_lead()) print_help(flags, nflags, usage);
      return TS_FLAGS_HELP;
    }
    const ts_flag *f = find(flags, nflags, name);
    if (!f && arg[0] != '-') /* a word where a flag should stand: no flag's value */
      return ts_flags_error(sub, "unexpected argument \"%s\": expected only flags and their "
                            "values " TS_FLAGS_HINT, arg);
    if (!f) return ts_flags_error(sub, "unknown flag %s " TS_FLAGS_HINT, name);
    if (seen[f - flags]++)
      return ts_flags_error(sub, "%s given twice: expected it once", f->name);
    if (f->kind == TS_FLAG_KIND_SWITCH) {
      if (eq) return ts_flags_error(sub, "%s takes no value " TS_FLAGS_HINT, name);
      *(int *)f->dest = 1;
      continue;
    }
    if (!eq && i + 1 >= argc) return ts_flags_error(sub, "%s needs a value " TS_FLAGS_HINT, name);
    const char *value = eq ? eq + 1 : argv[++i];
    if (store(f, value) != TS_OK) {
      /* The parser's words from "expected" on; copied, as ts_flags_error
       * overwrites the last error. */
      char why[512];
      const char *e = strstr(ts_last_error(), "expected");
      snprintf(why, sizeof why, "%s", e ? e : ts_last_error());
      return ts_flags_error(sub, "%s %s: %s", name, value, why);
    }
    if (f->given) *f->given = f->name;
  }
  return TS_FLAGS_OK;
}
