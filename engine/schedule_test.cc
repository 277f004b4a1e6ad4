// schedule_test.cc — the pipeline schedules checked by their simulator, no
// compute (issue "Pipeline-parallel stages"): for P in 1..8 and m in 1..16,
// GPipe, 1F1B and ZB-H1: every stage runs each micro-batch's forward and backward
// once, backwards in micro-batch order, every send meets its receive in
// order, nothing deadlocks, and the activations held at once equal what
// ts_schedule_in_flight (the plan's charge) says. Then the simulator's own
// checks are shown to fire on broken lists, and the stage splits.
#include "engine/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

TEST(Schedule, EveryScheduleRunsToTheEndAndHoldsWhatThePlanCharges) {
  for (ts_schedule_kind kind : {TS_SCHEDULE_GPIPE, TS_SCHEDULE_1F1B, TS_SCHEDULE_ZB_H1})
    for (int P = 1; P <= 8; P++)
      for (int m = 1; m <= 16; m++) {
        SCOPED_TRACE(std::string(ts_schedule_kind_name(kind)) + " P=" + std::to_string(P) +
                     " m=" + std::to_string(m));
        ts_schedule s;
        ASSERT_EQ(ts_schedule_build(kind, P, m, &s), TS_OK) << ts_last_error();
        ts_schedule_report r;
        EXPECT_EQ(ts_schedule_simulate(&s, &r), TS_OK) << r.msg;
        EXPECT_EQ(r.deadlocked, 0);
        for (int st = 0; st < P; st++) {
          int fwd = 0, bwd = 0;
          for (size_t i = 0; i < s.stage[st].n; i++) {
            fwd += s.stage[st].actions[i].kind == TS_ACT_FORWARD;
            bwd += s.stage[st].actions[i].kind == TS_ACT_BACKWARD;
          }
          EXPECT_EQ(fwd, m) << "stage " << st;
          EXPECT_EQ(bwd, m) << "stage " << st;
          int charged = ts_schedule_in_flight(kind, P, m, st);
          EXPECT_EQ(r.max_in_flight[st], charged) << "stage " << st;
          EXPECT_EQ(ts_schedule_in_flight_chunk(&s, st, 0), charged) << "stage " << st;
          EXPECT_LE(charged, kind == TS_SCHEDULE_GPIPE ? m : kind == TS_SCHEDULE_ZB_H1 ? P : P - st)
              << "stage " << st;
          int weights = 0;  // ZB-H1: a W of every micro-batch, none elsewhere
          for (size_t i = 0; i < s.stage[st].n; i++)
            weights += s.stage[st].actions[i].kind == TS_ACT_WEIGHT;
          EXPECT_EQ(weights, kind == TS_SCHEDULE_ZB_H1 ? m : 0) << "stage " << st;
        }
        ts_schedule_free(&s);
      }
}

// The schedules' known shapes: 1F1B's last stage alternates forward and
// backward from the start; its first stage warms up with P - 1 forwards.
TEST(Schedule, OneFOneBHasItsWarmUpAndSteadyState) {
  ts_schedule s;
  ASSERT_EQ(ts_schedule_build(TS_SCHEDULE_1F1B, 4, 8, &s), TS_OK);
  std::vector<ts_action_kind> computed;
  for (size_t i = 0; i < s.stage[3].n; i++)
    if (s.stage[3].actions[i].kind == TS_ACT_FORWARD ||
        s.stage[3].actions[i].kind == TS_ACT_BACKWARD)
      computed.push_back(s.stage[3].actions[i].kind);
  for (size_t i = 0; i < computed.size(); i++)
    EXPECT_EQ(computed[i], i % 2 == 0 ? TS_ACT_FORWARD : TS_ACT_BACKWARD) << i;
  int leading = 0;
  for (size_t i = 0; i < s.stage[0].n && s.stage[0].actions[i].kind != TS_ACT_BACKWARD; i++)
    leading += s.stage[0].actions[i].kind == TS_ACT_FORWARD;
  EXPECT_EQ(leading, 4);  // 3 warm-up forwards, then the steady state's first
  ts_schedule_free(&s);
}

// ZB-V: two chunks per rank in a V (virtual stages s and 2P - 1 - s), B
// and W split. For P 1..6 and m 1..3P every chunk runs each micro-batch's
// F, B and W once, in order, every send (rank P - 1's to itself too)
// meets its receive, nothing deadlocks, a rank holds at most 2 P chunk
// micro-batches from forward to W (1F1B's stage 0), the head's last W
// comes before the embedding's on rank 0 (the tied fold needs it), and
// with F = B = W its own timing idles (P - 1) / (6 m + P - 1) of the step
// on every rank at m = P and 2 P, and never more than ZB-H1 for m >= P
// (the greedy list is not the best one for every m: P = 5, m = 11 idles
// 7.0 % where the formula says 5.7 %).
TEST(Schedule, ZbvRunsInAVWithinOneFOneBsMemoryAndItsBubble) {
  for (int P = 1; P <= 6; P++)
    for (int m = 1; m <= 3 * P; m++) {
      SCOPED_TRACE("zbv P=" + std::to_string(P) + " m=" + std::to_string(m));
      ts_schedule s;
      ASSERT_EQ(ts_schedule_build(TS_SCHEDULE_ZBV, P, m, &s), TS_OK) << ts_last_error();
      EXPECT_EQ(s.virtual_stages, 2);
      EXPECT_EQ(s.split_backward, 1);
      ts_schedule_report r;
      ASSERT_EQ(ts_schedule_simulate(&s, &r), TS_OK) << r.msg;
      for (int st = 0; st < P; st++) {
        int f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};
        size_t last_w[2] = {0, 0};
        for (size_t i = 0; i < s.stage[st].n; i++) {
          const ts_action &a = s.stage[st].actions[i];
          f[a.chunk] += a.kind == TS_ACT_FORWARD;
          b[a.chunk] += a.kind == TS_ACT_BACKWARD;
          if (a.kind == TS_ACT_WEIGHT) w[a.chunk]++, last_w[a.chunk] = i;
        }
        for (int c = 0; c < 2; c++) {
          EXPECT_EQ(f[c], m);
          EXPECT_EQ(b[c], m);
          EXPECT_EQ(w[c], m);
        }
        if (st == 0) EXPECT_LT(last_w[1], last_w[0]) << "the head's last W first";
        EXPECT_LE(r.max_in_flight[st], 2 * P) << "stage " << st;
        EXPECT_LE(r.max_in_flight[st], ts_schedule_in_flight(TS_SCHEDULE_ZBV, P, m, st));
        EXPECT_EQ(ts_schedule_in_flight_chunk(&s, st, 0) + ts_schedule_in_flight_chunk(&s, st, 1) >=
                      r.max_in_flight[st],
                  true);
      }
      if (m >= P) {
        double step = 0, bubble[8];
        ASSERT_EQ(ts_schedule_time(&s, 1.0, 2.0, &step, bubble), TS_OK) << ts_last_error();
        for (int st = 0; st < P; st++) {
          if (m == P || m == 2 * P)
            EXPECT_NEAR(bubble[st], (P - 1.0) / (6.0 * m + P - 1.0), 1e-12) << "stage " << st;
          EXPECT_LE(bubble[st], (P - 1.0) / (3.0 * m + P - 1.0) + 1e-12) << "ZB-H1's, stage " << st;
        }
        if (m == P || m == 2 * P)
          EXPECT_NEAR(bubble[0], ts_schedule_bubble_theory(TS_SCHEDULE_ZBV, P, 2, m), 1e-12);
      }
      ts_schedule_free(&s);
    }
  ts_schedule s;
  EXPECT_EQ(ts_schedule_make(TS_SCHEDULE_ZBV, 4, 3, 8, &s), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(),
               "schedule zbv with 3 virtual stages: expected 2 (two model chunks per rank in a V)");
}

// ZB-H1's lists break as the others do: a W moved before its B, two W
// swapped, a W dropped, a W in a schedule whose backward is whole.
TEST(Schedule, TheSimulatorCatchesBrokenWeightPasses) {
  auto weights = [](ts_stage_schedule *l) {
    std::vector<size_t> at;
    for (size_t i = 0; i < l->n; i++)
      if (l->actions[i].kind == TS_ACT_WEIGHT) at.push_back(i);
    return at;
  };
  struct Breakage {
    const char *what, *expect;
    std::function<void(ts_schedule *)> apply;
  } cases[] = {
      {"W before its B", "W before its B",
       [&](ts_schedule *s) {  // the last stage's first W moved to the front
         ts_stage_schedule *l = &s->stage[s->stages - 1];
         size_t i = weights(l)[0];
         ts_action w = l->actions[i];
         for (size_t j = i; j > 0; j--) l->actions[j] = l->actions[j - 1];
         l->actions[0] = w;
       }},
      {"W swapped", "W out of micro-batch order",
       [&](ts_schedule *s) {  // the last stage's, each after a later B
         ts_stage_schedule *l = &s->stage[s->stages - 1];
         std::vector<size_t> at = weights(l);
         std::swap(l->actions[at[0]].mb, l->actions[at[1]].mb);
       }},
      {"W dropped", "reduce before every backward",
       [&](ts_schedule *s) {
         ts_stage_schedule *l = &s->stage[1];
         size_t i = weights(l).back();
         for (size_t j = i; j + 1 < l->n; j++) l->actions[j] = l->actions[j + 1];
         l->n--;
       }},
      {"W in 1F1B", "whole",
       [&](ts_schedule *s) { s->split_backward = 0; }},
  };
  for (const Breakage &b : cases) {
    ts_schedule s;
    ASSERT_EQ(ts_schedule_build(TS_SCHEDULE_ZB_H1, 3, 6, &s), TS_OK);
    ts_schedule_report r;
    ASSERT_EQ(ts_schedule_simulate(&s, &r), TS_OK) << r.msg;
    b.apply(&s);
    EXPECT_EQ(ts_schedule_simulate(&s, &r), TS_ERR_INTERNAL) << b.what;
    EXPECT_NE(std::string(r.msg).find(b.expect), std::string::npos) << b.what << ": " << r.msg;
    ts_schedule_free(&s);
  }
}

// The simulator fails broken lists: it is a check that can fail.
TEST(Schedule, TheSimulatorCatchesBrokenLists) {
  struct Breakage {
    const char *what, *expect;
    void (*apply)(ts_schedule *);
  };
  const Breakage cases[] = {
      {"receives swapped", "order",
       [](ts_schedule *s) {  // stage 1's first two receives of activations
         ts_stage_schedule *l = &s->stage[1];
         int seen = 0;
         size_t first = 0;
         for (size_t i = 0; i < l->n; i++)
           if (l->actions[i].kind == TS_ACT_RECV_ACT) {
             if (seen++ == 0) first = i;
             else {
               std::swap(l->actions[first].mb, l->actions[i].mb);
               break;
             }
           }
       }},
      {"a send dropped", "deadlock",
       [](ts_schedule *s) {  // stage 0 never sends the last micro-batch's activation
         ts_stage_schedule *l = &s->stage[0];
         for (size_t i = l->n; i-- > 0;)
           if (l->actions[i].kind == TS_ACT_SEND_ACT) {  // removed from the list
             for (size_t j = i; j + 1 < l->n; j++) l->actions[j] = l->actions[j + 1];
             l->n--;
             break;
           }
       }},
      {"backwards reordered", "micro-batch order",
       [](ts_schedule *s) {  // the last stage's first two backwards swapped
         ts_stage_schedule *l = &s->stage[s->stages - 1];
         std::vector<size_t> at;
         for (size_t i = 0; i < l->n; i++)
           if (l->actions[i].kind == TS_ACT_BACKWARD) at.push_back(i);
         std::swap(l->actions[at[0]].mb, l->actions[at[1]].mb);
       }},
  };
  const Breakage more[] = {
      {"optimizer dropped", "not second to last",
       [](ts_schedule *s) { s->stage[1].n--; }},
      {"reduce moved up", "not second to last",
       [](ts_schedule *s) {  // stage 1 ends ..., SEND_GRAD 3, REDUCE, OPTIMIZER: swap the first two
         ts_stage_schedule *l = &s->stage[1];
         std::swap(l->actions[l->n - 2], l->actions[l->n - 3]);
       }},
      {"a send repeated", "second send",
       [](ts_schedule *s) {  // stage 0's second send names micro-batch 0 again
         ts_stage_schedule *l = &s->stage[0];
         int seen = 0;
         for (size_t i = 0; i < l->n; i++)
           if (l->actions[i].kind == TS_ACT_SEND_ACT && seen++ == 1) l->actions[i].mb = 0;
       }},
  };
  std::vector<Breakage> all(std::begin(cases), std::end(cases));
  all.insert(all.end(), std::begin(more), std::end(more));
  for (const Breakage &b : all) {
    ts_schedule s;
    ASSERT_EQ(ts_schedule_build(TS_SCHEDULE_GPIPE, 3, 4, &s), TS_OK);
    b.apply(&s);
    ts_schedule_report r;
    EXPECT_EQ(ts_schedule_simulate(&s, &r), TS_ERR_INTERNAL) << b.what;
    EXPECT_NE(std::string(r.msg).find(b.expect), std::string::npos) << b.what << ": " << r.msg;
    ts_schedule_free(&s);
  }
}

TEST(Schedule, BadArgumentsAreRefused) {
  ts_schedule s;
  EXPECT_EQ(ts_schedule_build(TS_SCHEDULE_GPIPE, 0, 4, &s), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_schedule_build(TS_SCHEDULE_1F1B, 2, 0, &s), TS_ERR_INVALID_ARGUMENT);
  ts_schedule_kind k;
  EXPECT_EQ(ts_schedule_kind_parse("1f1b", &k), TS_OK);
  EXPECT_EQ(k, TS_SCHEDULE_1F1B);
  EXPECT_EQ(ts_schedule_kind_parse("zb", &k), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(), "schedule zb: expected gpipe, 1f1b, interleaved, zb-h1 or zbv");
}

TEST(PipelineSplit, BalancedSplitMinimisesTheLargestStage) {
  // embedding, 6 equal blocks, a heavy head
  const double cost[] = {1, 4, 4, 4, 4, 4, 4, 9};
  int first[3];
  ASSERT_EQ(ts_pipeline_split_balanced(cost, 8, 3, first), TS_OK);
  // The best largest stage, by brute force over both boundaries:
  double best = 1e30;
  for (int a = 1; a < 8; a++)
    for (int b = a + 1; b < 8; b++) {
      double s0 = 0, s1 = 0, s2 = 0;
      for (int i = 0; i < 8; i++) (i < a ? s0 : i < b ? s1 : s2) += cost[i];
      double mx = std::max(s0, std::max(s1, s2));
      if (mx < best) best = mx;
    }
  double got = 0, s = 0;
  for (int st = 0; st < 3; st++) {
    int lo = first[st], hi = st + 1 < 3 ? first[st + 1] : 8;
    EXPECT_LT(lo, hi) << "every stage holds a unit";
    s = 0;
    for (int i = lo; i < hi; i++) s += cost[i];
    got = std::max(got, s);
  }
  EXPECT_EQ(first[0], 0);
  EXPECT_EQ(got, best);
  EXPECT_EQ(ts_pipeline_split_balanced(cost, 8, 9, first), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("the model has 8 units"), std::string::npos);
}

// ZB-V's split balances a stage's two pieces (s and 2P - 1 - s): on
// random costs (one heavy unit at the end, as an LM head), every piece
// gets a unit, the pieces cover the units in order, the busiest stage's
// sum lies within two units' cost of the mean, and never above that of
// the 2P pieces of least largest cost, which it beats on many draws.
TEST(PipelineSplit, VSplitBalancesEachStagesTwoPieces) {
  std::mt19937 g(5);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  int better = 0;
  for (int trial = 0; trial < 200; trial++) {
    int P = 2 + trial % 7, n = 2 * P + (int)(g() % 40);
    std::vector<double> cost(n);
    for (double &c : cost) c = u(g);
    cost[0] = 0.05;      // an embedding
    cost[n - 1] = 2.5;   // a head
    double total = 0, most = 0;
    for (double c : cost) total += c, most = std::max(most, c);
    std::vector<int> v(2 * P + 1), b(2 * P + 1);
    ASSERT_EQ(ts_pipeline_split_v(cost.data(), n, P, v.data()), TS_OK) << ts_last_error();
    ASSERT_EQ(ts_pipeline_split_balanced(cost.data(), n, 2 * P, b.data()), TS_OK);
    b[2 * P] = n;
    EXPECT_EQ(v[0], 0);
    EXPECT_EQ(v[2 * P], n);
    auto load = [&](const std::vector<int> &f, int s) {
      double l = 0;
      for (int j : {s, 2 * P - 1 - s})
        for (int i = f[j]; i < f[j + 1]; i++) l += cost[i];
      return l;
    };
    double vmax = 0, bmax = 0;
    for (int j = 0; j < 2 * P; j++) EXPECT_LT(v[j], v[j + 1]) << "piece " << j;
    for (int s = 0; s < P; s++) {
      vmax = std::max(vmax, load(v, s));
      bmax = std::max(bmax, load(b, s));
    }
    EXPECT_LE(vmax, total / P + 2 * most) << "P=" << P << " n=" << n;
    EXPECT_LE(vmax, bmax + 1e-9) << "P=" << P << " n=" << n;
    better += vmax < bmax - 1e-9;
  }
  EXPECT_GE(better, 50);  // strictly better on 75 of these 200 draws
  std::vector<int> f(8);
  double c[5] = {1, 1, 1, 1, 1};
  EXPECT_EQ(ts_pipeline_split_v(c, 5, 3, f.data()), TS_ERR_INVALID_ARGUMENT);  // 6 pieces, 5 units
}

TEST(PipelineSplit, ExplicitSplitMustCoverTheUnitsExactly) {
  int first[3];
  ASSERT_EQ(ts_pipeline_split_parse("2,4,3", 9, 3, first), TS_OK) << ts_last_error();
  EXPECT_EQ(first[0], 0);
  EXPECT_EQ(first[1], 2);
  EXPECT_EQ(first[2], 6);
  EXPECT_EQ(ts_pipeline_split_parse("2,4,2", 9, 3, first), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("covers 8 units: expected the model's 9"),
            std::string::npos);
  EXPECT_EQ(ts_pipeline_split_parse("2,0,7", 9, 3, first), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_pipeline_split_parse("2,7", 9, 3, first), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_pipeline_split_parse("2,4,3,0", 9, 3, first), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_pipeline_split_parse("x", 9, 1, first), TS_ERR_INVALID_ARGUMENT);
}

}  // namespace

// The interleaved schedule: for P in 1..6, v in 2..4 and m = P, 2P, 3P, every rank runs each
// chunk's forward and backward of every micro-batch once, each chunk's
// backwards in micro-batch order, every send meets its receive (the last
// rank's chunk c feeding rank 0's chunk c + 1), nothing deadlocks, and the
// (chunk, micro-batch) activations a rank holds at once equal
// ts_schedule_in_flight_interleaved: 1F1B's memory per chunk, spread over
// v chunks.
TEST(Schedule, InterleavedRunsToTheEndAndHoldsWhatItsBoundSays) {
  for (int P = 1; P <= 6; P++)
    for (int v = 2; v <= 4; v++)
      for (int k = 1; k <= 3; k++) {
        int m = k * P;
        SCOPED_TRACE("P=" + std::to_string(P) + " v=" + std::to_string(v) +
                     " m=" + std::to_string(m));
        ts_schedule s;
        ASSERT_EQ(ts_schedule_build_interleaved(P, v, m, &s), TS_OK) << ts_last_error();
        EXPECT_EQ(s.kind, TS_SCHEDULE_INTERLEAVED);
        EXPECT_EQ(s.virtual_stages, v);
        ts_schedule_report r;
        EXPECT_EQ(ts_schedule_simulate(&s, &r), TS_OK) << r.msg;
        for (int st = 0; st < P; st++) {
          std::vector<int> fwd(v), bwd(v);
          for (size_t i = 0; i < s.stage[st].n; i++) {
            const ts_action &a = s.stage[st].actions[i];
            if (a.kind == TS_ACT_FORWARD) fwd[a.chunk]++;
            if (a.kind == TS_ACT_BACKWARD) bwd[a.chunk]++;
          }
          for (int c = 0; c < v; c++) {
            EXPECT_EQ(fwd[c], m) << "stage " << st << " chunk " << c;
            EXPECT_EQ(bwd[c], m) << "stage " << st << " chunk " << c;
          }
          EXPECT_EQ(r.max_in_flight[st], ts_schedule_in_flight_interleaved(P, v, m, st))
              << "stage " << st;
          // the executor's slots: each chunk's own count, no more than m,
          // together at least the rank's (chunk, micro-batch) pairs in flight
          int slots = 0;
          for (int c = 0; c < v; c++) {
            int n = ts_schedule_in_flight_chunk(&s, st, c);
            EXPECT_GE(n, 1);
            EXPECT_LE(n, m);
            slots += n;
          }
          EXPECT_GE(slots, r.max_in_flight[st]) << "stage " << st;
        }
        ts_schedule_free(&s);
      }
}

// Its shape: rank 0 of 4 with 2 chunks and 8 micro-batches warms up with
// (P - 1) 2 + (v - 1) P = 10 forwards, micro-batches 0-3 of chunk 0 then
// 0-3 of chunk 1 then 4-5 of chunk 0; its first backward is chunk 1's
// micro-batch 0, and the last rank's first send of chunk 0 goes to rank 0.
TEST(Schedule, InterleavedFollowsMegatronsOrder) {
  ts_schedule s;
  ASSERT_EQ(ts_schedule_build_interleaved(4, 2, 8, &s), TS_OK) << ts_last_error();
  std::vector<std::pair<int, int>> fwd;  // (chunk, mb) before the first backward
  const ts_stage_schedule &r0 = s.stage[0];
  size_t i = 0;
  for (; i < r0.n && r0.actions[i].kind != TS_ACT_BACKWARD; i++)
    if (r0.actions[i].kind == TS_ACT_FORWARD)
      fwd.push_back({r0.actions[i].chunk, r0.actions[i].mb});
  std::vector<std::pair<int, int>> want = {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1},
                                           {1, 2}, {1, 3}, {0, 4}, {0, 5}, {0, 6}};
  EXPECT_EQ(fwd, want);  // 10 warm-up forwards and the steady state's first
  ASSERT_LT(i, r0.n);
  EXPECT_EQ(r0.actions[i].chunk, 1);
  EXPECT_EQ(r0.actions[i].mb, 0);
  const ts_stage_schedule &r3 = s.stage[3];
  for (size_t k = 0; k < r3.n; k++)
    if (r3.actions[k].kind == TS_ACT_SEND_ACT) {
      EXPECT_EQ(r3.actions[k].chunk, 0);
      EXPECT_EQ(r3.actions[k].peer, 0);
      break;
    }
  ts_schedule_free(&s);
}

// Its refusals, one line each naming the values; and the simulator fails a
// broken interleaved list (a chunk's two backwards swapped).
TEST(Schedule, InterleavedRefusesBadValuesAndItsBreakageIsCaught) {
  ts_schedule s;
  EXPECT_EQ(ts_schedule_build_interleaved(4, 1, 8, &s), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(),
               "schedule interleaved: 1 virtual stages: expected at least 2 model chunks per rank "
               "(1 is 1f1b)");
  EXPECT_EQ(ts_schedule_build_interleaved(4, 2, 6, &s), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(),
               "schedule interleaved: 6 micro-batches on 4 stages: expected a multiple of 4");
  EXPECT_EQ(ts_schedule_build(TS_SCHEDULE_INTERLEAVED, 4, 8, &s), TS_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(ts_schedule_build_interleaved(2, 2, 4, &s), TS_OK);
  ts_stage_schedule &l = s.stage[1];
  std::vector<size_t> b;  // chunk 0's backwards on rank 1
  for (size_t i = 0; i < l.n; i++)
    if (l.actions[i].kind == TS_ACT_BACKWARD && l.actions[i].chunk == 0) b.push_back(i);
  ASSERT_GE(b.size(), 2u);
  std::swap(l.actions[b[0]].mb, l.actions[b[1]].mb);
  ts_schedule_report r;
  EXPECT_EQ(ts_schedule_simulate(&s, &r), TS_ERR_INTERNAL);
  EXPECT_NE(std::string(r.msg).find("chunk 0"), std::string::npos) << r.msg;
  ts_schedule_free(&s);
}

// The schedules' own timing (forward 1, backward 2 per stage, a chunk's
// share of them with v chunks; communication free): GPipe and 1F1B leave
// every rank idle (P - 1) / (m + P - 1) of the step, the interleaved
// schedule (P - 1) / (v m + P - 1) (Narayanan et al. 2021, §2.2) — the
// bubble divided by about v.
TEST(Schedule, TheirTimingHasTheBubbleOfTheirFormulas) {
  for (int P = 1; P <= 6; P++)
    for (int k = 1; k <= 3; k++) {
      int m = k * P;
      for (ts_schedule_kind kind : {TS_SCHEDULE_GPIPE, TS_SCHEDULE_1F1B}) {
        SCOPED_TRACE(std::string(ts_schedule_kind_name(kind)) + " P=" + std::to_string(P) +
                     " m=" + std::to_string(m));
        ts_schedule s;
        ASSERT_EQ(ts_schedule_build(kind, P, m, &s), TS_OK);
        double step = 0, bubble[8];
        ASSERT_EQ(ts_schedule_time(&s, 1.0, 2.0, &step, bubble), TS_OK) << ts_last_error();
        EXPECT_DOUBLE_EQ(step, 3.0 * (m + P - 1));
        for (int r = 0; r < P; r++)
          EXPECT_NEAR(bubble[r], (P - 1.0) / (m + P - 1.0), 1e-12) << "rank " << r;
        ts_schedule_free(&s);
      }
      for (int v = 2; v <= 4; v++) {
        SCOPED_TRACE("interleaved P=" + std::to_string(P) + " v=" + std::to_string(v) +
                     " m=" + std::to_string(m));
        ts_schedule s;
        ASSERT_EQ(ts_schedule_build_interleaved(P, v, m, &s), TS_OK);
        double step = 0, bubble[8];
        ASSERT_EQ(ts_schedule_time(&s, 1.0, 2.0, &step, bubble), TS_OK) << ts_last_error();
        for (int r = 0; r < P; r++)
          EXPECT_NEAR(bubble[r], (P - 1.0) / (v * m + P - 1.0), 1e-12) << "rank " << r;
        ts_schedule_free(&s);
      }
    }
  // ZB-H1 with t_F = t_B = t_W (backward 2, split in halves): the step is
  // 3 m + P - 1 and every rank idles (P - 1) / (3 m + P - 1) of it (Qi et
  // al. 2024, §2.1: (P - 1)(t_F + t_B - t_W)), m = P .. 3P and P + 1
  for (int P = 1; P <= 6; P++)
    for (int m : {P, 2 * P, 3 * P, P + 1}) {
      SCOPED_TRACE("zb-h1 P=" + std::to_string(P) + " m=" + std::to_string(m));
      ts_schedule s;
      ASSERT_EQ(ts_schedule_build(TS_SCHEDULE_ZB_H1, P, m, &s), TS_OK);
      EXPECT_EQ(s.split_backward, 1);
      double step = 0, bubble[8];
      ASSERT_EQ(ts_schedule_time(&s, 1.0, 2.0, &step, bubble), TS_OK) << ts_last_error();
      EXPECT_DOUBLE_EQ(step, 3.0 * m + P - 1);
      for (int r = 0; r < P; r++)
        EXPECT_NEAR(bubble[r], (P - 1.0) / (3.0 * m + P - 1.0), 1e-12) << "rank " << r;
      ts_schedule_free(&s);
    }
  ts_schedule s;
  ASSERT_EQ(ts_schedule_build(TS_SCHEDULE_1F1B, 2, 2, &s), TS_OK);
  double step;
  EXPECT_EQ(ts_schedule_time(&s, 0.0, 1.0, &step, nullptr), TS_ERR_INVALID_ARGUMENT);
  ts_schedule_free(&s);
}
