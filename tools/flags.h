/*
 * flags.h — the one flag parser of the `tessera` subcommands (train,
 * estimate, compare, prepare). A command declares a table of its flags and
 * calls ts_flags_parse once; the parser stores every value through the
 * table, prints --help, and reports bad usage in one format for every flag
 * of every command:
 *
 *   tessera SUB: FLAG VALUE: expected ...                      a bad value
 *   tessera SUB: FLAG needs a value (--help lists the flags)    the last word
 *   tessera SUB: FLAG takes no value (--help lists the flags)   a switch as --f=v
 *   tessera SUB: unknown flag FLAG (--help lists the flags)
 *   tessera SUB: unexpected argument "WORD": expected only flags and their values
 *     (--help lists the flags)                                 a word no flag takes
 *   tessera SUB: FLAG given twice: expected it once
 *
 * Checks between flags (one required, two exclusive) stay with the command,
 * after the table parse, and report through ts_flags_error in the same form.
 * Messages print on the lead rank only (ts_flags_is_lead), so a command run
 * on every rank of a launcher prints them once; every rank still parses and
 * returns the same result. Nothing here exits the process.
 *
 * Syntax: `--flag value` or `--flag=value` (long names), `-n value`
 * (aliases), a switch alone; argv[0] is the subcommand and every later word
 * is a flag or a flag's value (values may start with '-': `--lr -1`). A flag
 * given twice (by either name) is bad usage: "FLAG given twice: expected it
 * once". C, callable from C++.
 */
#ifndef TS_TOOLS_FLAGS_H
#define TS_TOOLS_FLAGS_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a flag's value is, and what its ts_flag.dest points to. */
typedef enum ts_flag_kind {
  TS_FLAG_KIND_SIZE = 0,   /* size_t: a decimal integer >= min, no sign */
  TS_FLAG_KIND_FLOAT = 1,  /* float: a finite number */
  TS_FLAG_KIND_STRING = 2, /* const char *: the value itself (points into argv) */
  TS_FLAG_KIND_SWITCH = 3, /* int: set to 1; the flag takes no value */
  TS_FLAG_KIND_CHOICE = 4, /* int: the index of the value in choices */
  TS_FLAG_KIND_CUSTOM = 5, /* whatever parse writes */
} ts_flag_kind;

/* A custom flag's parser: reads `value` into `dest` (the table's pointer).
 * Returns TS_OK, or an error status with ts_last_error() saying what was
 * expected; the parser prints "FLAG VALUE: " and that message from its word
 * "expected" on (the whole message when it has none), so library parsers
 * that name the value in their own terms ("dtype 'fp8': expected fp32, ...")
 * serve as they are. */
typedef ts_status (*ts_flag_parse_fn)(const char *value, void *dest);

/* One row of a command's flag table (plain descriptor, all pointers
 * borrowed). Write rows with the TS_FLAG_* macros below, which check the
 * type of dest. */
typedef struct ts_flag {
  const char *name;            /* long name, "--world-size" */
  const char *alias;           /* short name, "-n", or NULL */
  ts_flag_kind kind;           /* the value's kind; says what dest is */
  void *dest;                  /* where the value goes; untouched when absent */
  size_t min;                  /* SIZE: the smallest value accepted */
  const char *const *choices;  /* CHOICE: the accepted values, NULL-terminated */
  ts_flag_parse_fn parse;      /* CUSTOM: the value's parser */
  const char *value_name;      /* --help: the value ("N"); NULL: none (switch) or
                                  a CHOICE's values joined by '|' */
  const char *help;            /* --help: one line, defaults included */
  const char **given;          /* optional: set to `name` at each occurrence and
                                  left as is otherwise (start it at NULL); rows may
                                  share one to learn which of them came last */
} ts_flag;

/* Table rows, one macro per kind: NAME the long name, ALIAS a short one or
 * NULL, DEST a pointer of the kind's type (a mismatch does not compile in
 * C++ and warns in C), VALUE the value's name in --help, HELP its line,
 * GIVEN a const char ** or NULL (see ts_flag.given). */
#define TS_FLAG_CHECKED_(dest, type) ((void *)(1 ? (dest) : (type)0))
#define TS_FLAG_SIZE(name, alias, dest, min, value, help, given)                                \
  { name, alias, TS_FLAG_KIND_SIZE, TS_FLAG_CHECKED_(dest, size_t *), min, NULL, NULL, value,   \
    help, given }
#define TS_FLAG_FLOAT(name, alias, dest, value, help, given)                                    \
  { name, alias, TS_FLAG_KIND_FLOAT, TS_FLAG_CHECKED_(dest, float *), 0, NULL, NULL, value,     \
    help, given }
#define TS_FLAG_STRING(name, alias, dest, value, help, given)                                   \
  { name, alias, TS_FLAG_KIND_STRING, TS_FLAG_CHECKED_(dest, const char **), 0, NULL, NULL,     \
    value, help, given }
#define TS_FLAG_SWITCH(name, alias, dest, help)                                                  \
  { name, alias, TS_FLAG_KIND_SWITCH, TS_FLAG_CHECKED_(dest, int *), 0, NULL, NULL, NULL, help, \
    NULL }
#define TS_FLAG_CHOICE(name, alias, dest, choices, help, given)                                 \
  { name, alias, TS_FLAG_KIND_CHOICE, TS_FLAG_CHECKED_(dest, int *), 0, choices, NULL, NULL,    \
    help, given }
#define TS_FLAG_CUSTOM(name, alias, dest, parse, value, help, given)                            \
  { name, alias, TS_FLAG_KIND_CUSTOM, (void *)(dest), 0, NULL, parse, value, help, given }

/* What ts_flags_parse returns; TS_FLAGS_BAD_USAGE is also the process exit
 * status for bad usage. */
enum {
  TS_FLAGS_OK = 0,        /* parsed; run the command */
  TS_FLAGS_HELP = 1,      /* --help printed the usage; exit 0 */
  TS_FLAGS_BAD_USAGE = 2, /* one line printed on stderr; exit 2 */
};

/* The hint that ends the parser's "which flag" errors. */
#define TS_FLAGS_HINT "(--help lists the flags)"

/* Parses argv[1..argc) of subcommand `sub` ("train") against the nflags
 * rows of `flags`, storing each value given through its row's dest.
 * -h or --help (where a flag may stand) prints `usage`, then one line per
 * row (its names, value and help), on stdout of the lead rank and returns
 * TS_FLAGS_HELP. An unknown flag, a word that is no flag and no flag's
 * value (not starting with '-'), a missing value, a value for a switch, or
 * a bad value (a SIZE below min, signed, or not a decimal integer; a FLOAT
 * not finite; a CHOICE not in the list; a CUSTOM refused by its parser)
 * prints one line on stderr of the lead rank in the forms at the top of
 * this file, leaves the same line (less "tessera SUB: ") in ts_last_error()
 * and returns TS_FLAGS_BAD_USAGE; values stored before the error stay
 * stored. Returns TS_FLAGS_OK otherwise. */
int ts_flags_parse(const char *sub, const ts_flag *flags, size_t nflags, int argc, char **argv,
                   const char *usage);

/* Reports bad usage found after the table parse (a required flag missing,
 * two flags that exclude each other): prints "tessera SUB: MESSAGE" (printf
 * format, one line, no newline in fmt) on stderr of the lead rank, leaves
 * MESSAGE in ts_last_error() and returns TS_FLAGS_BAD_USAGE. */
int ts_flags_error(const char *sub, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Library code names its options as they are named in its structs, in
 * backquotes ("`zero_stage` 5: expected a ZeRO stage 0, 1, 2 or 3");
 * tools name the flags. ts_flags_terms copies msg into out (cap bytes,
 * NUL-terminated, cut to fit) with each backquoted option that a flag sets
 * replaced by the flag (`zero_stage` -> --zero, `micro_batch` ->
 * --micro-batch, ...; one table in flags.c), any other backquoted name
 * ([a-z0-9_]+) left without its backquotes, and everything else as it is. ts_flags_last_error is
 * ts_last_error() mapped so, in a buffer of this thread valid until its next call: what tools print
 * of a library error. ts_flags_error maps its message too. */
void ts_flags_terms(const char *msg, char *out, size_t cap);
const char *ts_flags_last_error(void);

/* Parses an integer >= min into *out: decimal digits (no sign, no
 * spaces), or a decimal with a fraction or exponent whose value is an
 * integer up to 2^53 ("1e9", "7.5e9", "2.5e3"; as --params takes). TS_OK;
 * TS_ERR_INVALID_ARGUMENT "expected an integer >= MIN (digits, or such as
 * 1e9 or 7.5e9)" for anything else, *out untouched. For custom parsers
 * built on it. */
ts_status ts_flags_size(const char *value, size_t min, size_t *out);

/* Parses a finite float (strtof syntax, all of value) into *out. TS_OK;
 * TS_ERR_INVALID_ARGUMENT "expected a finite number" otherwise (also for
 * values out of float's range), *out untouched. */
ts_status ts_flags_float(const char *value, float *out);

/* 1 in the process that prints usage errors and --help: a process not
 * started by a launcher, or rank 0 of one (OMPI_COMM_WORLD_RANK, PMIX_RANK,
 * PMI_RANK, read from the environment before MPI starts, so every rank
 * parses flags alike); 0 on the other ranks. */
int ts_flags_is_lead(void);

#ifdef __cplusplus
}
#endif

#endif /* TS_TOOLS_FLAGS_H */
