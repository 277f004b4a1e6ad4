// flags_test.cc — tools/flags.h: every kind of flag parses into its
// destination; sizes keep their minimum and refuse signs, floats refuse
// non-finite values; an unknown flag, a missing value, a bad value and a
// value for a switch each print exactly one line in the shared format and
// return 2; --help prints the usage and the flag lines to stdout and
// returns its own code; only the lead rank prints.
#include "tools/flags.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <string.h>

#include <list>
#include <string>
#include <vector>

namespace {

const char kUsage[] = "usage: tessera demo [flags]\n";

// The destinations of the demo table, with their defaults.
struct Values {
  size_t steps = 7;
  float lr = 0.5f;
  const char *model = nullptr;
  int json = 0;
  int unit = 0;
  int stage = 9;
  const char *steps_given = nullptr;
};

const char *const kUnits[] = {"GiB", "MiB", "bytes", nullptr};

// A custom parser in a library's own words, as ts_dtype_parse writes them.
ts_status ParseStage(const char *v, void *dest) {
  if (strlen(v) == 1 && v[0] >= '0' && v[0] <= '3') {
    *(int *)dest = v[0] - '0';
    return TS_OK;
  }
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "stage '%s': expected 0, 1, 2 or 3", v);
}

// Runs ts_flags_parse("demo", ...) on args (argv[0] = "demo" added) into
// *v; *out and *err get what it printed. The arguments are kept for the
// test's life: string flags point into them, as into a real argv.
int Parse(std::vector<std::string> given, Values *v, std::string *out = nullptr,
          std::string *err = nullptr) {
  static std::list<std::vector<std::string>> kept;
  kept.push_back(std::move(given));
  std::vector<std::string> &args = kept.back();
  const ts_flag flags[] = {
      TS_FLAG_SIZE("--steps", "-s", &v->steps, 1, "N", "steps (default 7)", &v->steps_given),
      TS_FLAG_FLOAT("--lr", nullptr, &v->lr, "LR", "learning rate", nullptr),
      TS_FLAG_STRING("--model", nullptr, &v->model, "CONFIG", "the model", nullptr),
      TS_FLAG_SWITCH("--json", nullptr, &v->json, "print JSON"),
      TS_FLAG_CHOICE("--units", nullptr, &v->unit, kUnits, "the unit", nullptr),
      TS_FLAG_CUSTOM("--zero", nullptr, &v->stage, ParseStage, "0|1|2|3", "ZeRO stage", nullptr),
  };
  args.insert(args.begin(), "demo");
  std::vector<char *> argv;
  for (auto &a : args) argv.push_back(&a[0]);
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  int r = ts_flags_parse("demo", flags, sizeof flags / sizeof *flags, (int)argv.size(),
                         argv.data(), kUsage);
  std::string o = testing::internal::GetCapturedStdout();
  std::string e = testing::internal::GetCapturedStderr();
  if (out) *out = o;
  if (err) *err = e;
  return r;
}

// Expects bad usage: status 2, exactly `line` on stderr, nothing on stdout.
void ExpectBad(const std::vector<std::string> &args, const std::string &line) {
  Values v;
  std::string out, err;
  EXPECT_EQ(Parse(args, &v, &out, &err), TS_FLAGS_BAD_USAGE) << line;
  EXPECT_EQ(err, line + "\n");
  EXPECT_EQ(out, "");
  // ts_last_error holds the message without the "tessera demo: " prefix.
  EXPECT_EQ(std::string("tessera demo: ") + ts_last_error(), line);
}

TEST(Flags, EachKindParses) {
  Values v;
  ASSERT_EQ(Parse({"--steps", "12", "--lr", "-2.5e-3", "--model", "llama-tiny", "--json",
                   "--units", "MiB", "--zero", "3"},
                  &v),
            TS_FLAGS_OK);
  EXPECT_EQ(v.steps, 12u);
  EXPECT_EQ(v.lr, -2.5e-3f);
  EXPECT_STREQ(v.model, "llama-tiny");
  EXPECT_EQ(v.json, 1);
  EXPECT_EQ(v.unit, 1);
  EXPECT_EQ(v.stage, 3);
  EXPECT_STREQ(v.steps_given, "--steps");
}

TEST(Flags, AbsentFlagsKeepTheirDefaults) {
  Values v;
  ASSERT_EQ(Parse({}, &v), TS_FLAGS_OK);
  EXPECT_EQ(v.steps, 7u);
  EXPECT_EQ(v.lr, 0.5f);
  EXPECT_EQ(v.model, nullptr);
  EXPECT_EQ(v.json, 0);
  EXPECT_EQ(v.unit, 0);
  EXPECT_EQ(v.stage, 9);
  EXPECT_EQ(v.steps_given, nullptr);
}

TEST(Flags, AliasAndEqualsForm) {
  Values w;
  ASSERT_EQ(Parse({"--model=a=b", "-s", "4", "--units=bytes"}, &w), TS_FLAGS_OK);
  EXPECT_STREQ(w.model, "a=b");  // only the first '=' splits
  EXPECT_EQ(w.steps, 4u);
  EXPECT_EQ(w.unit, 2);
  EXPECT_STREQ(w.steps_given, "--steps");  // the long name, whichever was typed
}

// A flag given twice, by either of its names or forms, is refused: which
// value was meant is not the parser's guess.
TEST(Flags, AFlagGivenTwiceIsOneLine) {
  ExpectBad({"-s", "3", "--steps=5"}, "tessera demo: --steps given twice: expected it once");
  ExpectBad({"--model", "a", "--json", "--model", "c"},
            "tessera demo: --model given twice: expected it once");
  ExpectBad({"--json", "--json"}, "tessera demo: --json given twice: expected it once");
}

TEST(Flags, SizeKeepsItsMinimum) {
  Values v;
  ASSERT_EQ(Parse({"--steps", "1"}, &v), TS_FLAGS_OK);
  EXPECT_EQ(v.steps, 1u);
  ExpectBad({"--steps", "0"},
            "tessera demo: --steps 0: expected an integer >= 1 (digits, or such as 1e9 or 7.5e9)");
  size_t n = 5;
  EXPECT_EQ(ts_flags_size("0", 0, &n), TS_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(ts_flags_size("18446744073709551615", 0, &n), TS_OK);
  EXPECT_EQ(n, (size_t)18446744073709551615ull);
  EXPECT_EQ(ts_flags_size("18446744073709551616", 0, &n), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(n, (size_t)18446744073709551615ull);  // untouched on failure
}

TEST(Flags, SizeRefusesSignsSpacesAndJunk) {
  // strtoull alone would take "-1" as 2^64 - 1, and "+2" and " 2" as 2.
  for (const char *bad :
       {"-1", "-0",   "+2",   " 2",   "2 ",   "",      "x",     "2x",   "0x10", "1.5", "1e",
        "e3", "1.e3", ".5e3", "1e-3", "1e+3", "1e400", "2.5e0", "1e16", "inf",  "nan"}) {
    ExpectBad({"--steps", bad}, std::string("tessera demo: --steps ") + bad +
                                    ": expected an integer >= 1 (digits, or such as 1e9 or 7.5e9)");
    size_t n = 5;
    EXPECT_EQ(ts_flags_size(bad, 0, &n), TS_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(n, 5u) << bad;
  }
}

// Sizes as --params takes them: 1e9 and 7.5e9 are integers (exact up to
// 2^53, where every integer is a double).
TEST(Flags, SizeTakesIntegerValuedScientificNotation) {
  const struct {
    const char *text;
    size_t value;
  } good[] = {{"1e9", 1000000000},
              {"7.5e9", 7500000000},
              {"2.5e3", 2500},
              {"1.0", 1},
              {"10E2", 1000},
              {"9007199254740992.0", 9007199254740992ull},
              {"1e15", 1000000000000000}};
  for (const auto &g : good) {
    size_t n = 0;
    EXPECT_EQ(ts_flags_size(g.text, 1, &n), TS_OK) << g.text;
    EXPECT_EQ(n, g.value) << g.text;
  }
  Values v;
  ASSERT_EQ(Parse({"--steps", "2e3"}, &v), TS_FLAGS_OK);
  EXPECT_EQ(v.steps, 2000u);
}

TEST(Flags, FloatRefusesNonFiniteValues) {
  for (const char *bad : {"inf", "-inf", "nan", "NaN", "1e39", "-1e39", "", "x", "1.5x"}) {
    ExpectBad({"--lr", bad}, std::string("tessera demo: --lr ") + bad +
                                 ": expected a finite number");
  }
  Values v;
  ASSERT_EQ(Parse({"--lr", "3.4e38"}, &v), TS_FLAGS_OK);
  EXPECT_EQ(v.lr, 3.4e38f);
}

TEST(Flags, UnknownFlagIsOneLine) {
  ExpectBad({"--stpes", "3"}, "tessera demo: unknown flag --stpes (--help lists the flags)");
  ExpectBad({"--bogus=3"}, "tessera demo: unknown flag --bogus (--help lists the flags)");
  ExpectBad({"-x"}, "tessera demo: unknown flag -x (--help lists the flags)");
}

TEST(Flags, StrayWordIsOneLine) {
  ExpectBad({"positional"}, "tessera demo: unexpected argument \"positional\": expected only "
                            "flags and their values (--help lists the flags)");
  // Values are not flags: "--steps 3 3" has an extra word.
  ExpectBad({"--steps", "3", "3"}, "tessera demo: unexpected argument \"3\": expected only "
                                   "flags and their values (--help lists the flags)");
}

TEST(Flags, MissingValueIsOneLine) {
  ExpectBad({"--json", "--model"}, "tessera demo: --model needs a value (--help lists the flags)");
  ExpectBad({"-s"}, "tessera demo: -s needs a value (--help lists the flags)");
}

TEST(Flags, SwitchTakesNoValue) {
  ExpectBad({"--json=1"}, "tessera demo: --json takes no value (--help lists the flags)");
}

TEST(Flags, BadChoiceListsTheChoices) {
  ExpectBad({"--units", "parsecs"}, "tessera demo: --units parsecs: expected GiB, MiB or bytes");
  ExpectBad({"--units", "gib"}, "tessera demo: --units gib: expected GiB, MiB or bytes");
}

TEST(Flags, CustomErrorKeepsItsExpectedPart) {
  ExpectBad({"--zero", "4"}, "tessera demo: --zero 4: expected 0, 1, 2 or 3");
  ExpectBad({"--zero=all"}, "tessera demo: --zero all: expected 0, 1, 2 or 3");
}

TEST(Flags, ValuesMayStartWithADash) {
  Values v;
  ASSERT_EQ(Parse({"--model", "--json", "--lr", "-1"}, &v), TS_FLAGS_OK);
  EXPECT_STREQ(v.model, "--json");
  EXPECT_EQ(v.json, 0);
  EXPECT_EQ(v.lr, -1.0f);
}

TEST(Flags, HelpPrintsUsageAndFlagsToStdout) {
  for (const char *help : {"-h", "--help"}) {
    Values v;
    std::string out, err;
    // --help wins over a bad flag after it, and stops parsing.
    EXPECT_EQ(Parse({"--steps", "2", help, "--steps", "0"}, &v, &out, &err), TS_FLAGS_HELP);
    EXPECT_EQ(err, "");
    EXPECT_EQ(v.steps, 2u);
    EXPECT_EQ(out,
              "usage: tessera demo [flags]\n"
              "flags:\n"
              "  -s, --steps N          steps (default 7)\n"
              "  --lr LR                learning rate\n"
              "  --model CONFIG         the model\n"
              "  --json                 print JSON\n"
              "  --units GiB|MiB|bytes  the unit\n"
              "  --zero 0|1|2|3         ZeRO stage\n"
              "  -h, --help             print this help\n");
  }
  EXPECT_NE(TS_FLAGS_HELP, TS_FLAGS_OK);
  EXPECT_NE(TS_FLAGS_HELP, TS_FLAGS_BAD_USAGE);
}

TEST(Flags, HelpPutsALongNameOnItsOwnLine) {
  size_t n = 0;
  const ts_flag flags[] = {
      TS_FLAG_SIZE("--n", nullptr, &n, 0, "N", "short", nullptr),
      TS_FLAG_SIZE("--a-name-longer-than-the-column", nullptr, &n, 0, "N", "long", nullptr),
  };
  char demo[] = "demo", help[] = "--help";
  char *argv[] = {demo, help};
  testing::internal::CaptureStdout();
  EXPECT_EQ(ts_flags_parse("demo", flags, 2, 2, argv, kUsage), TS_FLAGS_HELP);
  EXPECT_EQ(testing::internal::GetCapturedStdout(),
            "usage: tessera demo [flags]\n"
            "flags:\n"
            "  --n N       short\n"
            "  --a-name-longer-than-the-column N\n"
            "              long\n"
            "  -h, --help  print this help\n");
}

TEST(Flags, ErrorFormatsOneLine) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(ts_flags_error("demo", "--model and --data are required %s", TS_FLAGS_HINT),
            TS_FLAGS_BAD_USAGE);
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "tessera demo: --model and --data are required (--help lists the flags)\n");
  EXPECT_STREQ(ts_last_error(), "--model and --data are required (--help lists the flags)");
}

// Library errors name options as the library names them, in backquotes;
// tools print the flags that set them (one table, flags.c), and words no
// flag sets just lose their backquotes.
TEST(Flags, LibraryTermsBecomeFlags) {
  char out[256];
  ts_flags_terms("`zero_stage` 5: expected 0-3; lower `micro_batch` or set `recompute_every`", out,
                 sizeof out);
  EXPECT_STREQ(out,
               "--zero 5: expected 0-3; lower --micro-batch or set --activation-checkpointing");
  ts_flags_terms("`loss_scale_init` 0 and `loss_scale` 0 of `seq`", out, sizeof out);
  EXPECT_STREQ(out, "loss_scale_init 0 and --loss-scale 0 of --seq");
  ts_flags_terms("a lone ` stays, `model` maps", out, sizeof out);
  EXPECT_STREQ(out, "a lone ` stays, --model maps");         // " stays, " is no name
  ts_flags_terms("`data_dir` x and `grad_accum`", out, 12);  // cut to fit, NUL-terminated
  EXPECT_STREQ(out, "--data x an");
  // ts_flags_error maps its message; ts_flags_last_error maps the last error.
  testing::internal::CaptureStderr();
  ts_flags_error("demo", "%s", "`pipeline_stages` 9: expected 1 to 4 stages");
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "tessera demo: --pipeline 9: expected 1 to 4 stages\n");
  ts_set_error(TS_ERR_INVALID_ARGUMENT, "`resume` auto: needs `save_dir` to look in");
  EXPECT_STREQ(ts_flags_last_error(), "--resume auto: needs --save to look in");
}

// Sets one launcher rank variable for the life of the object.
class RankEnv {
 public:
  RankEnv(const char *var, const char *rank) : var_(var) { setenv(var, rank, 1); }
  ~RankEnv() { unsetenv(var_); }

 private:
  const char *var_;
};

TEST(Flags, OnlyTheLeadRankPrints) {
  EXPECT_EQ(ts_flags_is_lead(), 1);  // no launcher
  for (const char *var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    {
      RankEnv env(var, "1");
      EXPECT_EQ(ts_flags_is_lead(), 0) << var;
      Values v;
      std::string out, err;
      EXPECT_EQ(Parse({"--steps", "0"}, &v, &out, &err), TS_FLAGS_BAD_USAGE) << var;
      EXPECT_EQ(err, "") << var;
      EXPECT_STREQ(
          ts_last_error(),
          "--steps 0: expected an integer >= 1 (digits, or such as 1e9 or 7.5e9)");  // still
                                                                                     // recorded
      EXPECT_EQ(Parse({"--help"}, &v, &out, &err), TS_FLAGS_HELP) << var;
      EXPECT_EQ(out, "") << var;
    }
    RankEnv env(var, "0");
    EXPECT_EQ(ts_flags_is_lead(), 1) << var;
    Values v;
    std::string err;
    EXPECT_EQ(Parse({"--steps", "0"}, &v, nullptr, &err), TS_FLAGS_BAD_USAGE) << var;
    EXPECT_EQ(
        err,
        "tessera demo: --steps 0: expected an integer >= 1 (digits, or such as 1e9 or 7.5e9)\n")
        << var;
  }
}

}  // namespace
