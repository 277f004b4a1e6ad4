// timeline_test.cc — the measured bubble of a hand-written trace: the step
// window, each rank's compute time in it, spans of other steps left out,
// and bad traces and steps refused.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tools/timeline.h"

namespace {

std::string Write(const std::string &name, const std::string &text) {
  const char *dir = getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string Span(const char *name, int tid, double ts, double dur, int mb = -1) {
  char buf[200];
  snprintf(buf, sizeof buf,
           "{\"name\":\"%s\",\"ph\":\"X\",\"ts\":%g,\"dur\":%g,\"pid\":0,\"tid\":%d,"
           "\"args\":{\"mb\":%d}},",
           name, ts, dur, tid, mb);
  return buf;
}

// Two ranks, two steps. Step 2: rank 0 computes 100..140 and 160..200
// (80 us), rank 1 computes 120..180 after waiting 100..120 (60 us); the
// window is 100..200, so the idle fractions are 0.2 and 0.4: mean 0.3,
// the busiest rank's 0.2.
std::string TwoSteps() {
  std::string s = "{\"traceEvents\":[";
  s += Span("forward", 0, 0, 10, 0) + Span("optimizer_step", 0, 50, 10);
  s += Span("forward", 1, 10, 20, 0) + Span("optimizer_step", 1, 50, 10);
  s += Span("forward", 0, 100, 20, 0) + Span("forward", 0, 120, 20, 1);  // one stage's units
  s += Span("recv", 0, 140, 20, 0) + Span("backward", 0, 160, 40, 0);
  s += Span("optimizer_step", 0, 210, 5);
  s += Span("recv", 1, 100, 20, 0) + Span("forward", 1, 120, 30, 0);
  s += Span("backward", 1, 150, 30, 0) + Span("all_gather", 1, 185, 5);
  s += Span("optimizer_step", 1, 210, 5);
  s.back() = ']';
  return s + "}";
}

TEST(Timeline, MeasuredBubbleOfAStep) {
  std::string path = Write("two_steps.json", TwoSteps());
  ts_timeline t;
  ASSERT_EQ(ts_timeline_load(path.c_str(), 2, &t), TS_OK) << ts_last_error();
  EXPECT_EQ(t.ranks, 2);
  EXPECT_DOUBLE_EQ(t.begin, 100);
  EXPECT_DOUBLE_EQ(t.end, 200);
  EXPECT_DOUBLE_EQ(t.busy[0], 80);
  EXPECT_DOUBLE_EQ(t.busy[1], 60);
  EXPECT_DOUBLE_EQ(t.bubble, 0.3);
  EXPECT_DOUBLE_EQ(t.bubble_busiest, 0.2);
  EXPECT_DOUBLE_EQ(t.comm[0], 0);
  EXPECT_DOUBLE_EQ(t.comm[1], 5);     // the all-gather at 185
  EXPECT_DOUBLE_EQ(t.exposed[1], 5);  // on the step's thread: waited for
  ts_timeline_free(&t);
  // step 1: rank 0 computes 0..10, rank 1 10..30: window 0..30
  ASSERT_EQ(ts_timeline_load(path.c_str(), 1, &t), TS_OK) << ts_last_error();
  EXPECT_DOUBLE_EQ(t.end - t.begin, 30);
  EXPECT_DOUBLE_EQ(t.bubble, (20.0 + 10.0) / 60.0);
  ts_timeline_free(&t);
}

// A zero-bubble schedule's W spans ("weight") are compute, drawn apart
// with their own letter: rank 1's idle 20 us of step 2 filled by a W
// makes it busy 80 us of the 100.
TEST(Timeline, WeightSpansAreComputeWithTheirOwnLetter) {
  std::string s = TwoSteps();
  s.insert(s.find('[') + 1, Span("weight", 1, 100, 20, 0));
  std::string path = Write("weight.json", s);
  ts_timeline t;
  ASSERT_EQ(ts_timeline_load(path.c_str(), 2, &t), TS_OK) << ts_last_error();
  EXPECT_DOUBLE_EQ(t.busy[1], 80);
  EXPECT_DOUBLE_EQ(t.bubble_busiest, 0.2);
  int w = 0;
  for (size_t i = 0; i < t.n; i++) w += t.spans[i].letter == 'W';
  EXPECT_EQ(w, 1);
  ts_timeline_free(&t);
}

// Format 2 (engine/trace.h): the rank is the pid, tid 0 computes and tid 1
// communicates. Rank 0 waits 4 us in an all-gather; rank 1 has a 6 us
// reduce-scatter marked async (beside the step) and waits 3 us in an
// all-gather: collectives 4 and 9 us, exposed 4 and 3.
TEST(Timeline, CollectivesAndTheirExposedPartPerRank) {
  auto span = [](const char *name, int pid, int tid, double ts, double dur, bool async = false) {
    char buf[200];
    snprintf(buf, sizeof buf,
             "{\"name\":\"%s\",\"ph\":\"X\",\"ts\":%g,\"dur\":%g,\"pid\":%d,\"tid\":%d,"
             "\"args\":{%s}},",
             name, ts, dur, pid, tid, async ? "\"async\":1" : "");
    return std::string(buf);
  };
  std::string s = "{\"traceEvents\":[";
  s += span("forward", 0, 0, 0, 10) + span("all_gather", 0, 1, 10, 4) +
       span("optimizer_step", 0, 0, 20, 5);
  s += span("forward", 1, 0, 0, 10) + span("reduce_scatter", 1, 1, 2, 6, true) +
       span("all_gather", 1, 1, 10, 3) + span("optimizer_step", 1, 0, 20, 5);
  s.back() = ']';
  s += ",\"otherData\":{\"trace_format\":2}}";
  std::string path = Write("format2.json", s);
  ts_timeline t;
  ASSERT_EQ(ts_timeline_load(path.c_str(), 1, &t), TS_OK) << ts_last_error();
  EXPECT_EQ(t.ranks, 2);  // pids 0 and 1, not the tids
  EXPECT_DOUBLE_EQ(t.busy[0], 10);
  EXPECT_DOUBLE_EQ(t.busy[1], 10);
  EXPECT_DOUBLE_EQ(t.comm[0], 4);
  EXPECT_DOUBLE_EQ(t.exposed[0], 4);
  EXPECT_DOUBLE_EQ(t.comm[1], 9);
  EXPECT_DOUBLE_EQ(t.exposed[1], 3);
  ts_timeline_free(&t);
}

TEST(Timeline, BadTracesAndStepsAreRefused) {
  ts_timeline t;
  EXPECT_EQ(ts_timeline_load("/no/such/trace.json", 1, &t), TS_ERR_IO);
  std::string path = Write("not_a_trace.json", "{\"steps\": []}");
  EXPECT_EQ(ts_timeline_load(path.c_str(), 1, &t), TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("traceEvents"), std::string::npos);
  path = Write("two_steps.json", TwoSteps());
  EXPECT_EQ(ts_timeline_load(path.c_str(), 3, &t), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("--step 3: expected 1 to 2"), std::string::npos)
      << ts_last_error();
  EXPECT_EQ(ts_timeline_load(path.c_str(), 0, &t), TS_ERR_INVALID_ARGUMENT);
  // a span's rank outside [0, 2^20): refused, not indexed
  for (const char *tid : {"-1", "1e9"}) {
    std::string bad = TwoSteps();
    bad.insert(bad.find('[') + 1, std::string("{\"name\":\"forward\",\"ph\":\"X\",\"ts\":0,"
                                              "\"dur\":1,\"pid\":0,\"tid\":") +
                                      tid + "},");
    path = Write("bad_rank.json", bad);
    EXPECT_EQ(ts_timeline_load(path.c_str(), 1, &t), TS_ERR_FORMAT) << tid;
    EXPECT_NE(std::string(ts_last_error()).find("expected a rank in [0, 1048576)"),
              std::string::npos)
        << ts_last_error();
  }
}

}  // namespace
