// comm_test.cc — //comm:comm on 1, 2, 3 and 4 ranks (ts_mpi_test).
//
// Every rank can build every rank's contribution from a seed (Value), so each
// test computes its expected result independently of comm, in the rank order
// comm.h promises, and compares bit for bit: fp32 sums added in rank order,
// half dtypes widened, summed in fp32 and rounded once. Values carry 24-bit
// random mantissas over 17 binades, so a different summation order gives
// different bits (checked in AllReduce on 3+ ranks): the bitwise comparisons
// can fail. Counters are checked against the byte formulas of comm.h.
//
// Built three times: comm_thread_test defines TS_COMM_TEST_THREAD, and then
// every test's world group runs on a communication thread
// (ts_comm_set_thread) that sleeps a random 0-200 us before each call, so
// the same references check the thread's results, counters and errors;
// comm_staged_test defines TS_COMM_TEST_STAGED as well, and the world's
// buffers are then "device" memory lent to comm (host memory behind
// counting copies), moved by the host-staged transport in chunks of 1 KiB
// per rank under the thread. Both of these also set the watchdog's
// deadline (ts_comm_set_timeout, 120 s, never reached), so their waits poll
// their requests (the watched path) where comm_test's wait in MPI_Wait.
#include "comm/comm.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/floats.h"
#include "base/rng.h"
#include "comm/comm_testing.h"
#include "gtest/gtest.h"

namespace {

// ---- contributions and typed buffers ------------------------------------------

uint64_t Mix(uint64_t x) { return ts_splitmix64(&x); }  // the first output from state x

// Rank `rank`'s contribution at element i under `seed`: +-(1 + m) * 2^e with
// a random 24-bit m and e in [-8, 8] (finite in fp16 and bf16 as well).
float Value(uint32_t seed, int rank, size_t i) {
  uint64_t h = Mix(Mix(((uint64_t)seed << 32) | (uint32_t)rank) ^ i);
  float m = (float)(h & 0xffffffu) / 16777216.0f;
  float v = ldexpf(1.0f + m, (int)((h >> 24) % 17) - 8);
  return ((h >> 40) & 1u) ? -v : v;
}

size_t Size(ts_dtype dt) { return dt == TS_FP32 ? 4 : 2; }

// v stored in dt (rounded to nearest even) and widened back: what comm sees.
float Stored(ts_dtype dt, float v) {
  if (dt == TS_BF16) return ts_bf16_to_f32(ts_f32_to_bf16(v));
  if (dt == TS_FP16) return ts_f16_to_f32(ts_f32_to_f16(v));
  return v;
}

// n elements of dt in host memory.
struct Buf {
  Buf(ts_dtype dt, size_t n, uint8_t junk = 0x5a) : dt(dt), n(n), bytes(n * Size(dt) + 1, junk) {}
  void *data() { return bytes.data(); }
  uint8_t *at(size_t i) { return bytes.data() + i * Size(dt); }
  size_t nbytes() const { return n * Size(dt); }
  void Set(size_t i, float v) {
    if (dt == TS_FP32) {
      memcpy(at(i), &v, 4);
    } else {
      uint16_t h = dt == TS_BF16 ? ts_f32_to_bf16(v) : ts_f32_to_f16(v);
      memcpy(at(i), &h, 2);
    }
  }
  float Get(size_t i) {
    if (dt == TS_FP32) {
      float f;
      memcpy(&f, at(i), 4);
      return f;
    }
    uint16_t h;
    memcpy(&h, at(i), 2);
    return dt == TS_BF16 ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
  }
  // Elements [0, n) = rank's contributions at global elements off ...
  void Fill(uint32_t seed, int rank, size_t off = 0) {
    for (size_t i = 0; i < n; i++) Set(i, Value(seed, rank, off + i));
  }

  ts_dtype dt;
  size_t n;
  std::vector<uint8_t> bytes;  // one spare byte, so data() is never NULL
};

// Rank-order sum of the contributions of `ranks` (in that order) at global
// elements off ... off+n-1, in fp32, plus prev (if any) last, rounded once.
Buf RankOrderSum(ts_dtype dt, size_t n, uint32_t seed, const std::vector<int> &ranks, size_t off,
                 Buf *prev = nullptr) {
  Buf out(dt, n);
  for (size_t i = 0; i < n; i++) {
    float acc = Stored(dt, Value(seed, ranks[0], off + i));
    for (size_t k = 1; k < ranks.size(); k++) acc += Stored(dt, Value(seed, ranks[k], off + i));
    if (prev) acc += prev->Get(i);
    out.Set(i, acc);
  }
  return out;
}

std::vector<int> Range(int n) {
  std::vector<int> v;
  for (int j = 0; j < n; j++) v.push_back(j);
  return v;
}

// Bitwise comparison of the first n elements, naming the first difference.
void ExpectSameBits(Buf &got, Buf &want, const std::string &what) {
  ASSERT_EQ(got.dt, want.dt);
  for (size_t i = 0; i < want.n; i++) {
    if (memcmp(got.at(i), want.at(i), Size(want.dt)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << want.n << " is " << got.Get(i)
                    << ", want " << want.Get(i) << " (bitwise)";
      return;
    }
  }
}

// Exactly `calls` calls sending `bytes` of kind k and nothing else; a
// one-rank group counts nothing at all.
void ExpectCounters(const ts_comm *c, ts_comm_kind k, uint64_t bytes, uint64_t calls) {
  bool one = ts_comm_size(c) == 1;
  const ts_comm_counters *ct = ts_comm_get_counters(c);
  for (int j = 0; j < TS_COMM_NUM_KINDS; j++) {
    EXPECT_EQ(ct->bytes[j], j == k && !one ? bytes : 0) << ts_comm_kind_name((ts_comm_kind)j);
    EXPECT_EQ(ct->calls[j], j == k && !one ? calls : 0) << ts_comm_kind_name((ts_comm_kind)j);
  }
  EXPECT_EQ(ts_comm_bytes_sent(c), one ? 0 : bytes);
}

// Chunk j of count elements over n ranks, as comm.h defines it.
size_t ChunkLo(size_t count, int n, int j) { return (size_t)j * count / (size_t)n; }

// Restores the largest message size when a test ends.
struct MaxMessageGuard {
  explicit MaxMessageGuard(size_t nbytes) : old(ts_comm_testing_set_max_message_bytes(nbytes)) {}
  ~MaxMessageGuard() { ts_comm_testing_set_max_message_bytes(old); }
  size_t old;
};

// Microseconds since 1970 on CLOCK_REALTIME, comm's clock for call times.
static double RealtimeUs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e6 + (double)(ts.tv_nsec / 1000);
}

// Whether this build moves the world's calls through the staged transport.
static bool Staged() {
#ifdef TS_COMM_TEST_STAGED
  return true;
#else
  return false;
#endif
}

// ---- the staged transport's lender ---------------------------------------------

#ifdef TS_COMM_TEST_STAGED
// "Device" memory that is host memory behind the lender's operations, with
// a staging of 1 KiB per rank's piece (chunks of 256 fp32 elements in a
// reduce-scatter), and counts of the bytes each operation moved.
struct HostLender {
  static ts_status Copy(void *u, void *d, const void *s, size_t n) {
    memcpy(d, s, n);
    return TS_OK;
  }
  static ts_status Add(void *u, void *out, const void *a, const void *b, size_t count,
                       ts_dtype dt) {
    for (size_t i = 0; i < count; i++) {
      Buf x(dt, 1), y(dt, 1);
      memcpy(x.data(), (const uint8_t *)a + i * Size(dt), Size(dt));
      memcpy(y.data(), (const uint8_t *)b + i * Size(dt), Size(dt));
      x.Set(0, x.Get(0) + y.Get(0));
      memcpy((uint8_t *)out + i * Size(dt), x.data(), Size(dt));
    }
    return TS_OK;
  }
  static ts_status ToHost(void *u, void *h, const void *d, size_t n) {
    ((HostLender *)u)->to_host += n;
    memcpy(h, d, n);
    return TS_OK;
  }
  static ts_status ToDevice(void *u, void *d, const void *h, size_t n) {
    ((HostLender *)u)->to_device += n;
    memcpy(d, h, n);
    return TS_OK;
  }
  static ts_status Sync(void *u) { return TS_OK; }
  explicit HostLender(int n) : staging(ts_comm_staging_bytes(n, 1024)) {
    mem = {this, Copy, Add, ToHost, ToDevice, Sync, staging.data(), staging.size()};
  }
  std::vector<uint8_t> staging;
  ts_comm_memory mem;
  uint64_t to_host = 0, to_device = 0;
};
#endif

// ---- fixtures ------------------------------------------------------------------

class Comm : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(ts_comm_world(&c_), TS_OK) << ts_last_error();
    n_ = ts_comm_size(c_);
    r_ = ts_comm_rank(c_);
#ifdef TS_COMM_TEST_STAGED
    lender_ = new HostLender(n_);
    ASSERT_EQ(ts_comm_set_memory(c_, &lender_->mem), TS_OK) << ts_last_error();
    ASSERT_STREQ(ts_comm_transport(c_), n_ == 1 ? "self" : "staged");
#endif
#ifdef TS_COMM_TEST_THREAD
    ASSERT_EQ(ts_comm_set_timeout(120, NULL), TS_OK);
    ts_comm_testing_set_thread_delay(200, 7);
    if (n_ == 1) {
      ASSERT_EQ(ts_comm_set_thread(c_, 1), TS_ERR_UNSUPPORTED);
      EXPECT_NE(strstr(ts_last_error(), "1 rank(s) on the self transport"), nullptr)
          << ts_last_error();
    } else {
      ASSERT_EQ(ts_comm_set_thread(c_, 1), TS_OK) << ts_last_error();
      ASSERT_TRUE(ts_comm_thread_active(c_));
    }
#endif
  }
  void TearDown() override {
    ts_comm_free(c_);
#ifdef TS_COMM_TEST_STAGED
    delete lender_;
#endif
  }

#ifdef TS_COMM_TEST_STAGED
  HostLender *lender_ = nullptr;
#endif
  ts_comm *c_ = nullptr;
  int n_ = 0, r_ = 0;
};

class CommDtype : public Comm, public testing::WithParamInterface<ts_dtype> {};

std::string DtypeName(const testing::TestParamInfo<ts_dtype> &info) {
  return ts_dtype_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, CommDtype, testing::Values(TS_FP32, TS_BF16, TS_FP16),
                         DtypeName);

// Gathers every rank's bytes of b and expects them all equal to this rank's.
void ExpectSameBitsEverywhere(ts_comm *c, Buf &b, const std::string &what) {
  int n = ts_comm_size(c);
  size_t nb = b.nbytes();
  std::vector<uint8_t> all(nb * n + 1);
  // Gathered as bytes in fp16-sized units: nb is even for every dtype.
  ASSERT_EQ(ts_comm_all_gather(c, b.data(), all.data(), nb / 2, TS_FP16), TS_OK) << ts_last_error();
  for (int j = 0; j < n; j++) {
    EXPECT_EQ(memcmp(all.data() + j * nb, b.data(), nb), 0) << what << ": rank " << j << " differs";
  }
}

// ---- reduce-scatter --------------------------------------------------------------

TEST_P(CommDtype, ReduceScatter) {
  ts_dtype dt = GetParam();
  for (size_t count : {0, 1, 7, 1000, 2500}) {
    SCOPED_TRACE("count " + std::to_string(count));
    ts_comm_reset_counters(c_);
    Buf send(dt, n_ * count), recv(dt, count);
    send.Fill(11, r_);
    size_t need = ts_comm_reduce_scatter_scratch_bytes(c_, count, dt);
    EXPECT_EQ(need, (n_ - 1) * count * Size(dt));
    std::vector<uint8_t> scratch(need + 1);
    ASSERT_EQ(
        ts_comm_reduce_scatter(c_, send.data(), recv.data(), count, dt, 0, scratch.data(), need),
        TS_OK)
        << ts_last_error();
    Buf want = RankOrderSum(dt, count, 11, Range(n_), r_ * count);
    ExpectSameBits(recv, want, "reduce-scatter");
    ExpectCounters(c_, TS_COMM_REDUCE_SCATTER, (n_ - 1) * count * Size(dt), 1);
  }
}

TEST_P(CommDtype, ReduceScatterAccumulateAddsPreviousLast) {
  ts_dtype dt = GetParam();
  size_t count = 777;
  Buf send(dt, n_ * count), recv(dt, count), prev(dt, count);
  send.Fill(12, r_);
  prev.Fill(13, r_);
  recv.bytes = prev.bytes;
  std::vector<uint8_t> scratch(ts_comm_reduce_scatter_scratch_bytes(c_, count, dt) + 1);
  ASSERT_EQ(ts_comm_reduce_scatter(c_, send.data(), recv.data(), count, dt, 1, scratch.data(),
                                   scratch.size()),
            TS_OK)
      << ts_last_error();
  Buf want = RankOrderSum(dt, count, 12, Range(n_), r_ * count, &prev);
  ExpectSameBits(recv, want, "reduce-scatter with accumulate");
}

TEST_P(CommDtype, ReduceScatterInPlace) {
  ts_dtype dt = GetParam();
  size_t count = 1500;
  Buf send(dt, n_ * count);
  send.Fill(14, r_);
  std::vector<uint8_t> scratch(ts_comm_reduce_scatter_scratch_bytes(c_, count, dt) + 1);
  uint8_t *own = send.at(r_ * count);
  ASSERT_EQ(
      ts_comm_reduce_scatter(c_, send.data(), own, count, dt, 0, scratch.data(), scratch.size()),
      TS_OK)
      << ts_last_error();
  Buf got(dt, count);
  memcpy(got.data(), own, got.nbytes());
  Buf want = RankOrderSum(dt, count, 14, Range(n_), r_ * count);
  ExpectSameBits(got, want, "in-place reduce-scatter");
}

// Two reduce-scatters and user messages with the tags the library uses
// internally, all in flight at once, completed in reverse order.
TEST_P(CommDtype, IReduceScatterOverlapsUserMessages) {
  ts_dtype dt = GetParam();
  size_t c1 = 1000, c2 = 33, cu = 17;
  Buf s1(dt, n_ * c1), r1(dt, c1), s2(dt, n_ * c2), r2(dt, c2), prev2(dt, c2);
  s1.Fill(21, r_);
  s2.Fill(22, r_);
  prev2.Fill(23, r_);
  r2.bytes = prev2.bytes;
  std::vector<uint8_t> k1(ts_comm_reduce_scatter_scratch_bytes(c_, c1, dt) + 1);
  std::vector<uint8_t> k2(ts_comm_reduce_scatter_scratch_bytes(c_, c2, dt) + 1);
  Buf out(dt, cu), in(dt, cu);
  out.Fill(24, r_);
  ts_comm_request *q1 = nullptr, *q2 = nullptr, *qs = nullptr, *qr = nullptr;
  int next = (r_ + 1) % n_, prevr = (r_ + n_ - 1) % n_;
  if (n_ > 1) {
    ASSERT_EQ(ts_comm_irecv(c_, in.data(), cu, dt, prevr, 1, &qr), TS_OK) << ts_last_error();
  }
  ASSERT_EQ(ts_comm_ireduce_scatter(c_, s1.data(), r1.data(), c1, dt, 0, k1.data(), k1.size(), &q1),
            TS_OK)
      << ts_last_error();
  if (n_ > 1) {
    ASSERT_EQ(ts_comm_isend(c_, out.data(), cu, dt, next, 1, &qs), TS_OK) << ts_last_error();
  }
  ASSERT_EQ(ts_comm_ireduce_scatter(c_, s2.data(), r2.data(), c2, dt, 1, k2.data(), k2.size(), &q2),
            TS_OK)
      << ts_last_error();
  EXPECT_EQ(ts_comm_wait(q2), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_comm_wait(qs), TS_OK) << ts_last_error();  // NULL on one rank: a no-op
  EXPECT_EQ(ts_comm_wait(q1), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_comm_wait(qr), TS_OK) << ts_last_error();
  Buf w1 = RankOrderSum(dt, c1, 21, Range(n_), r_ * c1);
  Buf w2 = RankOrderSum(dt, c2, 22, Range(n_), r_ * c2, &prev2);
  ExpectSameBits(r1, w1, "first ireduce_scatter");
  ExpectSameBits(r2, w2, "second ireduce_scatter (accumulate)");
  if (n_ > 1) {
    Buf wu(dt, cu);
    wu.Fill(24, prevr);
    ExpectSameBits(in, wu, "user message beside the collectives");
    const ts_comm_counters *ct = ts_comm_get_counters(c_);
    EXPECT_EQ(ct->bytes[TS_COMM_REDUCE_SCATTER], (n_ - 1) * (c1 + c2) * Size(dt));
    EXPECT_EQ(ct->calls[TS_COMM_REDUCE_SCATTER], 2u);
    EXPECT_EQ(ct->bytes[TS_COMM_SEND], cu * Size(dt));
    EXPECT_EQ(ct->calls[TS_COMM_SEND], 1u);
  }
}

// ---- all-gather ---------------------------------------------------------------------

void ExpectGathered(Buf &recv, int n, size_t count, uint32_t seed, const std::string &what) {
  for (int j = 0; j < n; j++) {
    Buf want(recv.dt, count), got(recv.dt, count);
    want.Fill(seed, j);
    memcpy(got.data(), recv.at(j * count), got.nbytes());
    ExpectSameBits(got, want, what + ", rank " + std::to_string(j) + "'s chunk");
  }
}

TEST_P(CommDtype, AllGather) {
  ts_dtype dt = GetParam();
  for (size_t count : {0, 1, 5, 1000}) {
    SCOPED_TRACE("count " + std::to_string(count));
    ts_comm_reset_counters(c_);
    Buf send(dt, count), recv(dt, n_ * count);
    send.Fill(31, r_);
    ASSERT_EQ(ts_comm_all_gather(c_, send.data(), recv.data(), count, dt), TS_OK)
        << ts_last_error();
    ExpectGathered(recv, n_, count, 31, "all-gather");
    ExpectCounters(c_, TS_COMM_ALL_GATHER, (n_ - 1) * count * Size(dt), 1);
  }
}

TEST_P(CommDtype, AllGatherInPlace) {
  ts_dtype dt = GetParam();
  size_t count = 333;
  Buf recv(dt, n_ * count), mine(dt, count);
  mine.Fill(32, r_);
  memcpy(recv.at(r_ * count), mine.data(), mine.nbytes());
  ASSERT_EQ(ts_comm_all_gather(c_, recv.at(r_ * count), recv.data(), count, dt), TS_OK)
      << ts_last_error();
  ExpectGathered(recv, n_, count, 32, "in-place all-gather");
}

TEST_P(CommDtype, IAllGather) {
  ts_dtype dt = GetParam();
  size_t c1 = 100, c2 = 9;
  Buf s1(dt, c1), r1(dt, n_ * c1), r2(dt, n_ * c2), mine2(dt, c2);
  s1.Fill(33, r_);
  mine2.Fill(34, r_);
  memcpy(r2.at(r_ * c2), mine2.data(), mine2.nbytes());
  ts_comm_request *q1 = nullptr, *q2 = nullptr;
  ASSERT_EQ(ts_comm_iall_gather(c_, s1.data(), r1.data(), c1, dt, &q1), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_comm_iall_gather(c_, r2.at(r_ * c2), r2.data(), c2, dt, &q2), TS_OK)
      << ts_last_error();
  EXPECT_EQ(ts_comm_wait(q2), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_comm_wait(q1), TS_OK) << ts_last_error();
  ExpectGathered(r1, n_, c1, 33, "iall_gather");
  ExpectGathered(r2, n_, c2, 34, "in-place iall_gather");
  ExpectCounters(c_, TS_COMM_ALL_GATHER, (n_ - 1) * (c1 + c2) * Size(dt), 2);
}

// ---- all-reduce ---------------------------------------------------------------------

TEST_P(CommDtype, AllReduceUnevenChunks) {
  ts_dtype dt = GetParam();
  size_t n = (size_t)n_;
  for (size_t count : {(size_t)0, (size_t)1, n - 1, n + 1, 2 * n + 3, (size_t)1001, (size_t)3000}) {
    SCOPED_TRACE("count " + std::to_string(count));
    ts_comm_reset_counters(c_);
    Buf buf(dt, count);
    buf.Fill(41, r_);
    size_t need = ts_comm_all_reduce_scratch_bytes(c_, count, dt);
    EXPECT_EQ(need, (n - 1) * ((count + n - 1) / n) * Size(dt));
    std::vector<uint8_t> scratch(need + 1);
    ASSERT_EQ(ts_comm_all_reduce(c_, buf.data(), count, dt, scratch.data(), need), TS_OK)
        << ts_last_error();
    Buf want = RankOrderSum(dt, count, 41, Range(n_), 0);
    ExpectSameBits(buf, want, "all-reduce");
    size_t own = ChunkLo(count, n_, r_ + 1) - ChunkLo(count, n_, r_);
    // Reduce-scatter sends every chunk but the own one, all-gather the own
    // chunk to N-1 ranks: unequal chunks make the two halves differ.
    ExpectCounters(c_, TS_COMM_ALL_REDUCE, ((count - own) + (n - 1) * own) * Size(dt), 1);
    ExpectSameBitsEverywhere(c_, buf, "all-reduce");
  }
}

// Above 2^16 elements the summation runs on OpenMP threads (two here, even
// though mpirun_test.sh sets OMP_NUM_THREADS=1): the bits must not change.
TEST_P(CommDtype, AllReduceLargeOnThreads) {
  ts_dtype dt = GetParam();
  int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  size_t count = 3 * 70001;
  Buf buf(dt, count);
  buf.Fill(42, r_);
  std::vector<uint8_t> scratch(ts_comm_all_reduce_scratch_bytes(c_, count, dt) + 1);
  ts_status st = ts_comm_all_reduce(c_, buf.data(), count, dt, scratch.data(), scratch.size());
  omp_set_num_threads(threads);
  ASSERT_EQ(st, TS_OK) << ts_last_error();
  Buf want = RankOrderSum(dt, count, 42, Range(n_), 0);
  ExpectSameBits(buf, want, "large all-reduce");
}

// The data make the bitwise checks meaningful: on 3+ ranks, summing in
// reverse rank order gives other bits somewhere (fp32 addition is not
// associative), so comm summing in another order would fail AllReduce.
TEST_F(Comm, TestDataIsOrderSensitive) {
  if (n_ < 3) GTEST_SKIP() << "two values add commutatively";
  std::vector<int> reverse = Range(n_);
  std::reverse(reverse.begin(), reverse.end());
  Buf fwd = RankOrderSum(TS_FP32, 1001, 41, Range(n_), 0);
  Buf rev = RankOrderSum(TS_FP32, 1001, 41, reverse, 0);
  EXPECT_NE(memcmp(fwd.data(), rev.data(), fwd.nbytes()), 0);
}

TEST_F(Comm, AllReduceF64) {
  size_t count = 6;
  for (ts_comm_op op : {TS_COMM_SUM, TS_COMM_MAX, TS_COMM_MIN}) {
    SCOPED_TRACE("op " + std::to_string((int)op));
    ts_comm_reset_counters(c_);
    std::vector<double> buf(count), want(count);
    for (size_t i = 0; i < count; i++) {
      for (int j = 0; j < n_; j++) {
        double v = (double)Value(51, j, i) * 1e3 + (double)Value(52, j, i) * 1e-9;
        if (j == r_) buf[i] = v;
        if (j == 0)
          want[i] = v;
        else if (op == TS_COMM_SUM)
          want[i] += v;
        else if (op == TS_COMM_MAX)
          want[i] = v > want[i] ? v : want[i];
        else
          want[i] = v < want[i] ? v : want[i];
      }
    }
    ASSERT_EQ(ts_comm_all_reduce_f64(c_, buf.data(), count, op), TS_OK) << ts_last_error();
    EXPECT_EQ(memcmp(buf.data(), want.data(), count * 8), 0) << "not bitwise the rank-order result";
    ExpectCounters(c_, TS_COMM_ALL_REDUCE, (n_ - 1) * count * 8, 1);
  }
  // NaN on the last rank propagates through max and min everywhere.
  for (ts_comm_op op : {TS_COMM_MAX, TS_COMM_MIN}) {
    double v[2] = {r_ == n_ - 1 ? NAN : 1.0, (double)r_};
    ASSERT_EQ(ts_comm_all_reduce_f64(c_, v, 2, op), TS_OK) << ts_last_error();
    EXPECT_TRUE(isnan(v[0]));
    EXPECT_EQ(v[1], op == TS_COMM_MAX ? n_ - 1 : 0);
  }
  double x = 1;
  EXPECT_EQ(ts_comm_all_reduce_f64(c_, &x, 1, (ts_comm_op)7), TS_ERR_INVALID_ARGUMENT);
}

// The lowest failing rank keeps its status and message; the others get its
// status and a line naming it; nobody failing is TS_OK everywhere.
TEST_F(Comm, AgreeNamesTheLowestFailingRank) {
  int first = 7;
  EXPECT_EQ(ts_comm_agree(c_, TS_OK, "here", &first), TS_OK);
  EXPECT_EQ(first, -1);
  // the last two ranks fail (one rank: rank 0 alone), with different statuses
  int lowest = n_ > 1 ? n_ - 2 : 0;
  ts_status mine = r_ == lowest ? TS_ERR_FORMAT : r_ == n_ - 1 ? TS_ERR_IO : TS_OK;
  if (mine != TS_OK) ts_set_error(mine, "rank %d's own message", r_);
  ts_status got = ts_comm_agree(c_, mine, "during the test", &first);
  EXPECT_EQ(first, lowest);
  EXPECT_EQ(got, TS_ERR_FORMAT);
  std::string want = r_ == lowest ? "rank " + std::to_string(r_) + "'s own message"
                                  : "rank " + std::to_string(lowest) + " of " +
                                        std::to_string(n_) + " failed during the test";
  EXPECT_EQ(std::string(ts_last_error()), want);
}

// ---- broadcast -----------------------------------------------------------------------

TEST_P(CommDtype, BroadcastFromEachRoot) {
  ts_dtype dt = GetParam();
  size_t count = 513;
  for (int root = 0; root < n_; root++) {
    SCOPED_TRACE("root " + std::to_string(root));
    ts_comm_reset_counters(c_);
    Buf buf(dt, count), want(dt, count);
    want.Fill(61, root);
    if (r_ == root) buf.bytes = want.bytes;
    ASSERT_EQ(ts_comm_broadcast(c_, buf.data(), count, dt, root), TS_OK) << ts_last_error();
    ExpectSameBits(buf, want, "broadcast");
    ExpectCounters(c_, TS_COMM_BROADCAST, r_ == root ? (n_ - 1) * count * Size(dt) : 0, 1);
  }
  // Non-blocking, one from every root in flight at once.
  std::vector<Buf> bufs;
  std::vector<ts_comm_request *> reqs(n_, nullptr);
  for (int root = 0; root < n_; root++) {
    bufs.emplace_back(dt, count);
    if (r_ == root) bufs.back().Fill(62, root);
  }
  for (int root = 0; root < n_; root++) {
    ASSERT_EQ(ts_comm_ibroadcast(c_, bufs[root].data(), count, dt, root, &reqs[root]), TS_OK)
        << ts_last_error();
  }
  for (int root = n_ - 1; root >= 0; root--) EXPECT_EQ(ts_comm_wait(reqs[root]), TS_OK);
  for (int root = 0; root < n_; root++) {
    Buf want(dt, count);
    want.Fill(62, root);
    ExpectSameBits(bufs[root], want, "ibroadcast from root " + std::to_string(root));
  }
}

// ---- point-to-point --------------------------------------------------------------------

TEST_P(CommDtype, SendRecvRing) {
  ts_dtype dt = GetParam();
  size_t count = 2000;
  Buf out(dt, count), in(dt, count), want(dt, count);
  if (n_ == 1) {
    EXPECT_EQ(ts_comm_send(c_, out.data(), count, dt, 0, 0), TS_ERR_INVALID_ARGUMENT);
    return;
  }
  int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
  out.Fill(71, r_);
  want.Fill(71, prev);
  ts_comm_request *q = nullptr;
  ASSERT_EQ(ts_comm_isend(c_, out.data(), count, dt, next, 7, &q), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_comm_recv(c_, in.data(), count, dt, prev, 7), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_comm_wait(q), TS_OK) << ts_last_error();
  ExpectSameBits(in, want, "isend + recv");

  Buf in2(dt, count);
  ASSERT_EQ(ts_comm_irecv(c_, in2.data(), count, dt, prev, 8, &q), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_comm_send(c_, out.data(), count, dt, next, 8), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_comm_wait(q), TS_OK) << ts_last_error();
  ExpectSameBits(in2, want, "irecv + send");
  ExpectCounters(c_, TS_COMM_SEND, 2 * count * Size(dt), 2);
}

// ---- sub-groups ------------------------------------------------------------------------

// Even and odd ranks, ordered by world rank (key = rank) and reversed
// (key = -rank): each group sums in its own rank order and counts its own bytes.
TEST_F(Comm, SplitEvenOdd) {
  int parity = r_ % 2;
  std::vector<int> members;  // world ranks in the group, ascending
  for (int j = parity; j < n_; j += 2) members.push_back(j);
  int m = (int)members.size();
  for (int reversed = 0; reversed <= 1; reversed++) {
    SCOPED_TRACE(reversed ? "key = -rank" : "key = rank");
    ts_comm_reset_counters(c_);
    ts_comm *sub = nullptr;
    ASSERT_EQ(ts_comm_split(c_, parity, reversed ? -r_ : r_, "parity", &sub), TS_OK)
        << ts_last_error();
    EXPECT_STREQ(ts_comm_name(sub), "parity");
    EXPECT_EQ(ts_comm_size(sub), m);
    int want_rank = reversed ? m - 1 - r_ / 2 : r_ / 2;
    EXPECT_EQ(ts_comm_rank(sub), want_rank);
    std::vector<int> order = members;  // world ranks in sub-group rank order
    if (reversed) std::reverse(order.begin(), order.end());

    size_t count = 37;
    Buf buf(TS_FP32, count);
    buf.Fill(81, r_);
    std::vector<uint8_t> scratch(ts_comm_all_reduce_scratch_bytes(sub, count, TS_FP32) + 1);
    ASSERT_EQ(ts_comm_all_reduce(sub, buf.data(), count, TS_FP32, scratch.data(), scratch.size()),
              TS_OK)
        << ts_last_error();
    Buf want = RankOrderSum(TS_FP32, count, 81, order, 0);
    ExpectSameBits(buf, want, "all-reduce in the sub-group");
    int sr = ts_comm_rank(sub);
    size_t own = ChunkLo(count, m, sr + 1) - ChunkLo(count, m, sr);
    ExpectCounters(sub, TS_COMM_ALL_REDUCE, ((count - own) + (size_t)(m - 1) * own) * 4, 1);
    ExpectCounters(c_, TS_COMM_ALL_REDUCE, 0, 0);  // the world sent nothing
    ts_comm_free(sub);
  }
  ts_comm *bad = nullptr;
  EXPECT_EQ(ts_comm_split(c_, -1, 0, "bad", &bad), TS_ERR_INVALID_ARGUMENT);
}

// ---- counters --------------------------------------------------------------------------

TEST_F(Comm, CountersSumKindsAndReset) {
  EXPECT_STREQ(ts_comm_kind_name(TS_COMM_ALL_REDUCE), "all_reduce");
  EXPECT_STREQ(ts_comm_kind_name(TS_COMM_REDUCE_SCATTER), "reduce_scatter");
  EXPECT_STREQ(ts_comm_kind_name(TS_COMM_ALL_GATHER), "all_gather");
  EXPECT_STREQ(ts_comm_kind_name(TS_COMM_BROADCAST), "broadcast");
  EXPECT_STREQ(ts_comm_kind_name(TS_COMM_SEND), "send");
  EXPECT_STREQ(ts_comm_name(c_), "world");
  ExpectCounters(c_, TS_COMM_SEND, 0, 0);  // fresh group
  Buf s(TS_BF16, 10), r(TS_BF16, 10 * n_);
  ASSERT_EQ(ts_comm_all_gather(c_, s.data(), r.data(), 10, TS_BF16), TS_OK);
  ASSERT_EQ(ts_comm_broadcast(c_, s.data(), 10, TS_BF16, 0), TS_OK);
  const ts_comm_counters *ct = ts_comm_get_counters(c_);
  uint64_t ag = n_ > 1 ? (n_ - 1) * 20u : 0, bc = n_ > 1 && r_ == 0 ? (n_ - 1) * 20u : 0;
  EXPECT_EQ(ct->bytes[TS_COMM_ALL_GATHER], ag);
  EXPECT_EQ(ct->bytes[TS_COMM_BROADCAST], bc);
  EXPECT_EQ(ct->calls[TS_COMM_BROADCAST], n_ > 1 ? 1u : 0u);
  EXPECT_EQ(ts_comm_bytes_sent(c_), ag + bc);
  ts_comm_reset_counters(c_);
  ExpectCounters(c_, TS_COMM_SEND, 0, 0);
}

TEST_F(Comm, RemoteCountersFollowTheNodes) {
  // On one host every member shares this rank's node: nothing is remote.
  Buf s(TS_FP32, 10), r(TS_FP32, 10 * n_);
  ASSERT_EQ(ts_comm_all_gather(c_, s.data(), r.data(), 10, TS_FP32), TS_OK);
  EXPECT_EQ(ts_comm_bytes_remote(c_), 0u);
  // Pretend nodes of two ranks: rank j on node j / 2. Per kind the remote
  // bytes are the formula's bytes to the members of the other nodes.
  std::vector<int> node;
  for (int j = 0; j < n_; j++) node.push_back(j / 2);
  ASSERT_EQ(ts_comm_set_nodes(c_, node.data()), TS_OK);
  ts_comm_reset_counters(c_);
  uint64_t others = 0;  // members on another node
  for (int j = 0; j < n_; j++) others += node[j] != node[r_];
  ASSERT_EQ(ts_comm_all_gather(c_, s.data(), r.data(), 10, TS_FP32), TS_OK);
  const size_t count = 1001;  // uneven chunks: each remote member's own size
  Buf buf(TS_FP32, count);
  buf.Fill(5, r_);
  std::vector<uint8_t> scratch(ts_comm_all_reduce_scratch_bytes(c_, count, TS_FP32));
  ASSERT_EQ(ts_comm_all_reduce(c_, buf.data(), count, TS_FP32, scratch.data(), scratch.size()),
            TS_OK);
  int peer = (r_ + 2) % n_;  // a member two ahead: another node when n >= 3
  Buf one(TS_FP32, 7), got(TS_FP32, 7);
  if (n_ >= 3) {
    ts_comm_request *req = nullptr;
    ASSERT_EQ(ts_comm_isend(c_, one.data(), 7, TS_FP32, peer, 3, &req), TS_OK);
    ASSERT_EQ(ts_comm_recv(c_, got.data(), 7, TS_FP32, (r_ + n_ - 2) % n_, 3), TS_OK);
    ASSERT_EQ(ts_comm_wait(req), TS_OK);
  }
  const ts_comm_counters *ct = ts_comm_get_counters(c_);
  EXPECT_EQ(ct->remote[TS_COMM_ALL_GATHER], others * 40);
  uint64_t own = ChunkLo(count, n_, r_ + 1) - ChunkLo(count, n_, r_), rs = 0;
  for (int j = 0; j < n_; j++)
    if (node[j] != node[r_]) rs += ChunkLo(count, n_, j + 1) - ChunkLo(count, n_, j);
  EXPECT_EQ(ct->remote[TS_COMM_ALL_REDUCE], (rs + others * own) * 4);
  bool send_remote = n_ >= 3 && node[peer] != node[r_];
  EXPECT_EQ(ct->remote[TS_COMM_SEND], send_remote ? 28u : 0u);
  EXPECT_EQ(
      ts_comm_bytes_remote(c_),
      ct->remote[TS_COMM_ALL_GATHER] + ct->remote[TS_COMM_ALL_REDUCE] + ct->remote[TS_COMM_SEND]);
  // Never more than was sent; the bytes themselves unchanged by the nodes.
  EXPECT_LE(ts_comm_bytes_remote(c_), ts_comm_bytes_sent(c_));
  EXPECT_EQ(ct->bytes[TS_COMM_ALL_GATHER], n_ > 1 ? (uint64_t)(n_ - 1) * 40 : 0u);
  ASSERT_EQ(ts_comm_set_nodes(c_, nullptr), TS_OK);  // back to one node
  ts_comm_reset_counters(c_);
  ASSERT_EQ(ts_comm_all_gather(c_, s.data(), r.data(), 10, TS_FP32), TS_OK);
  EXPECT_EQ(ts_comm_bytes_remote(c_), 0u);
}

// ---- errors ------------------------------------------------------------------------------

bool Contains(const char *s, const std::string &part) { return strstr(s, part.c_str()) != nullptr; }

TEST_F(Comm, ScratchTooSmallNamesBothSizes) {
  if (n_ == 1) GTEST_SKIP() << "one rank needs no scratch";
  size_t count = 100;
  Buf send(TS_FP32, n_ * count), recv(TS_FP32, count);
  size_t need = ts_comm_reduce_scatter_scratch_bytes(c_, count, TS_FP32);
  std::vector<uint8_t> scratch(need);
  EXPECT_EQ(ts_comm_reduce_scatter(c_, send.data(), recv.data(), count, TS_FP32, 0, scratch.data(),
                                   need - 1),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(ts_last_error(), std::to_string(need))) << ts_last_error();
  EXPECT_TRUE(Contains(ts_last_error(), std::to_string(need - 1))) << ts_last_error();
  ts_comm_request *q = nullptr;
  EXPECT_EQ(ts_comm_ireduce_scatter(c_, send.data(), recv.data(), count, TS_FP32, 0, scratch.data(),
                                    need - 1, &q),
            TS_ERR_INVALID_ARGUMENT);
  size_t need_ar = ts_comm_all_reduce_scratch_bytes(c_, count, TS_FP32);
  EXPECT_EQ(ts_comm_all_reduce(c_, send.data(), count, TS_FP32, scratch.data(), need_ar - 1),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(ts_last_error(), std::to_string(need_ar))) << ts_last_error();
  ExpectCounters(c_, TS_COMM_SEND, 0, 0);  // rejected calls count nothing
}

// Lent memory: one rank needs copy and add; more ranks also the staging
// operations and a staging of at least ts_comm_staging_bytes(N, 64), each
// refused in one line naming what is missing.
#ifndef TS_COMM_TEST_STAGED
TEST_F(Comm, LentMemoryStagesOnMoreRanks) {
  ts_comm_memory mem = {
      nullptr,
      [](void *, void *, const void *, size_t) { return TS_OK; },
      [](void *, void *, const void *, const void *, size_t, ts_dtype) { return TS_OK; },
      nullptr,
      nullptr,
      nullptr,
      nullptr,
      0};
#ifdef TS_COMM_TEST_THREAD
  if (n_ > 1) {
    EXPECT_EQ(ts_comm_set_memory(c_, &mem), TS_ERR_INVALID_USAGE);
    EXPECT_TRUE(Contains(ts_last_error(), "before ts_comm_set_thread")) << ts_last_error();
    return;
  }
#endif
  if (n_ == 1) {
    EXPECT_EQ(ts_comm_set_memory(c_, &mem), TS_OK) << ts_last_error();
    EXPECT_STREQ(ts_comm_transport(c_), "self");
  } else {
    EXPECT_EQ(ts_comm_set_memory(c_, &mem), TS_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(Contains(ts_last_error(), "lent memory needs to_host, to_device and sync"))
        << ts_last_error();
    mem.to_host = [](void *, void *, const void *, size_t) { return TS_OK; };
    mem.to_device = [](void *, void *, const void *, size_t) { return TS_OK; };
    mem.sync = [](void *) { return TS_OK; };
    std::vector<uint8_t> staging(ts_comm_staging_bytes(n_, TS_COMM_STAGING_MIN_PIECE));
    mem.staging = staging.data();
    mem.staging_bytes = staging.size() - 1;
    EXPECT_EQ(ts_comm_set_memory(c_, &mem), TS_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(Contains(ts_last_error(), "expected at least " + std::to_string(staging.size())))
        << ts_last_error();
    EXPECT_STREQ(ts_comm_transport(c_), "mpi");
    mem.staging_bytes = staging.size();
    EXPECT_EQ(ts_comm_set_memory(c_, &mem), TS_OK) << ts_last_error();
    EXPECT_STREQ(ts_comm_transport(c_), "staged");
  }
  EXPECT_EQ(ts_comm_set_memory(c_, nullptr), TS_OK);
  EXPECT_STREQ(ts_comm_transport(c_), n_ == 1 ? "self" : "mpi");
}
#else
// Every byte of a staged reduce-scatter and all-gather crosses the lender's
// copies: the N parts sent (and the previous recv when accumulating) to
// the host, the result back; on one rank nothing is staged.
TEST_F(Comm, StagedCopiesEveryByte) {
  size_t count = 1000;  // 4 chunks of 256 fp32 elements in a reduce-scatter
  Buf s(TS_FP32, n_ * count), r(TS_FP32, count), g(TS_FP32, n_ * count);
  s.Fill(5, r_);
  r.Fill(6, r_);
  Buf prev = r;
  std::vector<uint8_t> k(ts_comm_reduce_scatter_scratch_bytes(c_, count, TS_FP32) + 1);
  lender_->to_host = lender_->to_device = 0;
  ASSERT_EQ(ts_comm_reduce_scatter(c_, s.data(), r.data(), count, TS_FP32, 1, k.data(), k.size()),
            TS_OK)
      << ts_last_error();
  Buf want = RankOrderSum(TS_FP32, count, 5, Range(n_), r_ * count, &prev);
  ExpectSameBits(r, want, "staged reduce_scatter with accumulate");
  uint64_t nb = count * 4;
  EXPECT_EQ(lender_->to_host, n_ == 1 ? 0 : (uint64_t)(n_ + 1) * nb);
  EXPECT_EQ(lender_->to_device, n_ == 1 ? 0 : nb);
  lender_->to_host = lender_->to_device = 0;
  ASSERT_EQ(ts_comm_all_gather(c_, r.data(), g.data(), count, TS_FP32), TS_OK) << ts_last_error();
  EXPECT_EQ(lender_->to_host, n_ == 1 ? 0 : nb);
  EXPECT_EQ(lender_->to_device, n_ == 1 ? 0 : (uint64_t)n_ * nb);
}
#endif

TEST_F(Comm, BadArguments) {
  Buf a(TS_FP32, 4 * n_), b(TS_FP32, 4 * n_);
  std::vector<uint8_t> scratch(4096);
  ts_dtype bad = (ts_dtype)9;
  ts_comm_request *q = nullptr;
  EXPECT_EQ(ts_comm_reduce_scatter(c_, a.data(), b.data(), 4, bad, 0, scratch.data(), 4096),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_all_gather(c_, a.data(), b.data(), 1, bad), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_all_reduce(c_, a.data(), 4, bad, scratch.data(), 4096),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_broadcast(c_, a.data(), 4, bad, 0), TS_ERR_INVALID_ARGUMENT);
  // recv overlapping send without being the own chunk.
  EXPECT_EQ(ts_comm_reduce_scatter(c_, a.data(), a.at(1), 4, TS_FP32, 0, scratch.data(), 4096),
            TS_ERR_INVALID_ARGUMENT);
  // accumulate in place: the own chunk has no previous recv to add.
  EXPECT_EQ(ts_comm_reduce_scatter(c_, a.data(), a.at(4 * r_), 4, TS_FP32, 1, scratch.data(), 4096),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(ts_last_error(), "accumulate in place")) << ts_last_error();
  // send overlapping recv without being the own chunk.
  EXPECT_EQ(ts_comm_all_gather(c_, a.at(1), a.data(), 4, TS_FP32), TS_ERR_INVALID_ARGUMENT);
  for (int root : {-1, n_}) {
    EXPECT_EQ(ts_comm_broadcast(c_, a.data(), 4, TS_FP32, root), TS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ts_comm_ibroadcast(c_, a.data(), 4, TS_FP32, root, &q), TS_ERR_INVALID_ARGUMENT);
  }
  for (int peer : {-1, n_, r_}) {
    EXPECT_EQ(ts_comm_send(c_, a.data(), 4, TS_FP32, peer, 0), TS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ts_comm_recv(c_, a.data(), 4, TS_FP32, peer, 0), TS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ts_comm_isend(c_, a.data(), 4, TS_FP32, peer, 0, &q), TS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ts_comm_irecv(c_, a.data(), 4, TS_FP32, peer, 0, &q), TS_ERR_INVALID_ARGUMENT);
  }
  if (n_ > 1) {
    EXPECT_EQ(ts_comm_send(c_, a.data(), 4, TS_FP32, (r_ + 1) % n_, -1), TS_ERR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(ts_comm_wait(nullptr), TS_OK);
  ExpectCounters(c_, TS_COMM_SEND, 0, 0);
}

// Rank 0 sends 5, 7, then 6 elements; rank 1 expects 7, 5 and 6: the first two
// fail with both sizes named and consume the message, the third succeeds.
TEST_F(Comm, RecvCountMismatch) {
  if (n_ == 1) GTEST_SKIP() << "needs a peer";
  Buf out(TS_FP32, 8), in(TS_FP32, 8);
  out.Fill(91, r_);
  if (r_ == 0) {
    for (size_t count : {5, 7, 6, 5, 7}) {
      ASSERT_EQ(ts_comm_send(c_, out.data(), count, TS_FP32, 1, 3), TS_OK) << ts_last_error();
    }
  } else if (r_ == 1) {
    EXPECT_EQ(ts_comm_recv(c_, in.data(), 7, TS_FP32, 0, 3), TS_ERR_MPI);
    EXPECT_TRUE(Contains(ts_last_error(), "7 elements")) << ts_last_error();
    EXPECT_TRUE(Contains(ts_last_error(), "20 bytes")) << ts_last_error();
    EXPECT_EQ(ts_comm_recv(c_, in.data(), 5, TS_FP32, 0, 3), TS_ERR_MPI);
    EXPECT_TRUE(Contains(ts_last_error(), "5 elements")) << ts_last_error();
    EXPECT_TRUE(Contains(ts_last_error(), "28 bytes")) << ts_last_error();
    ASSERT_EQ(ts_comm_recv(c_, in.data(), 6, TS_FP32, 0, 3), TS_OK) << ts_last_error();
    Buf want(TS_FP32, 6), got(TS_FP32, 6);
    want.Fill(91, 0);
    memcpy(got.data(), in.data(), 24);
    ExpectSameBits(got, want, "recv after the mismatches");
    // Non-blocking: too short, then too long (MPI's truncation error).
    ts_comm_request *q = nullptr;
    ASSERT_EQ(ts_comm_irecv(c_, in.data(), 7, TS_FP32, 0, 3, &q), TS_OK);
    EXPECT_EQ(ts_comm_wait(q), TS_ERR_MPI);
    EXPECT_TRUE(Contains(ts_last_error(), "20 bytes")) << ts_last_error();
    ASSERT_EQ(ts_comm_irecv(c_, in.data(), 5, TS_FP32, 0, 3, &q), TS_OK);
    EXPECT_EQ(ts_comm_wait(q), TS_ERR_MPI);
    EXPECT_TRUE(Contains(ts_last_error(), "longer")) << ts_last_error();
  }
  EXPECT_EQ(ts_comm_barrier(c_), TS_OK) << ts_last_error();
}

// ---- large counts ----------------------------------------------------------------------------

// With messages capped at 24 bytes every transfer is split into pieces and
// the all-gathers take the point-to-point path used beyond MPI's int counts;
// results and counters must not change.
TEST_P(CommDtype, SplitMessagesAsForLargeCounts) {
  MaxMessageGuard guard(24);
  ts_dtype dt = GetParam();
  size_t es = Size(dt);
  size_t count = 50;
  {  // reduce-scatter, blocking and non-blocking
    ts_comm_reset_counters(c_);
    Buf send(dt, n_ * count), recv(dt, count), recv2(dt, count);
    send.Fill(101, r_);
    std::vector<uint8_t> scratch(ts_comm_reduce_scatter_scratch_bytes(c_, count, dt) + 1);
    std::vector<uint8_t> scratch2(scratch.size());
    ts_comm_request *q = nullptr;
    ASSERT_EQ(ts_comm_ireduce_scatter(c_, send.data(), recv2.data(), count, dt, 0, scratch2.data(),
                                      scratch2.size(), &q),
              TS_OK);
    ASSERT_EQ(ts_comm_reduce_scatter(c_, send.data(), recv.data(), count, dt, 0, scratch.data(),
                                     scratch.size()),
              TS_OK)
        << ts_last_error();
    ASSERT_EQ(ts_comm_wait(q), TS_OK) << ts_last_error();
    Buf want = RankOrderSum(dt, count, 101, Range(n_), r_ * count);
    ExpectSameBits(recv, want, "split reduce-scatter");
    ExpectSameBits(recv2, want, "split ireduce_scatter");
    ExpectCounters(c_, TS_COMM_REDUCE_SCATTER, 2 * (n_ - 1) * count * es, 2);
  }
  {  // all-gather: plain, in place, non-blocking
    ts_comm_reset_counters(c_);
    Buf send(dt, count), recv(dt, n_ * count), recv2(dt, n_ * count), recv3(dt, n_ * count);
    send.Fill(102, r_);
    memcpy(recv2.at(r_ * count), send.data(), send.nbytes());
    ASSERT_EQ(ts_comm_all_gather(c_, send.data(), recv.data(), count, dt), TS_OK)
        << ts_last_error();
    ASSERT_EQ(ts_comm_all_gather(c_, recv2.at(r_ * count), recv2.data(), count, dt), TS_OK)
        << ts_last_error();
    ts_comm_request *q = nullptr;
    ASSERT_EQ(ts_comm_iall_gather(c_, send.data(), recv3.data(), count, dt, &q), TS_OK);
    ASSERT_EQ(ts_comm_wait(q), TS_OK) << ts_last_error();
    ExpectGathered(recv, n_, count, 102, "split all-gather");
    ExpectGathered(recv2, n_, count, 102, "split in-place all-gather");
    ExpectGathered(recv3, n_, count, 102, "split iall_gather");
    ExpectCounters(c_, TS_COMM_ALL_GATHER, 3 * (n_ - 1) * count * es, 3);
  }
  {  // all-reduce over uneven chunks
    ts_comm_reset_counters(c_);
    size_t ac = 101;
    Buf buf(dt, ac);
    buf.Fill(103, r_);
    std::vector<uint8_t> scratch(ts_comm_all_reduce_scratch_bytes(c_, ac, dt) + 1);
    ASSERT_EQ(ts_comm_all_reduce(c_, buf.data(), ac, dt, scratch.data(), scratch.size()), TS_OK)
        << ts_last_error();
    Buf want = RankOrderSum(dt, ac, 103, Range(n_), 0);
    ExpectSameBits(buf, want, "split all-reduce");
    size_t own = ChunkLo(ac, n_, r_ + 1) - ChunkLo(ac, n_, r_);
    ExpectCounters(c_, TS_COMM_ALL_REDUCE, ((ac - own) + (size_t)(n_ - 1) * own) * es, 1);
  }
  {  // broadcast, blocking and non-blocking
    Buf buf(dt, count), buf2(dt, count), want(dt, count);
    want.Fill(104, n_ - 1);
    if (r_ == n_ - 1) buf.bytes = buf2.bytes = want.bytes;
    ts_comm_request *q = nullptr;
    ASSERT_EQ(ts_comm_ibroadcast(c_, buf2.data(), count, dt, n_ - 1, &q), TS_OK);
    ASSERT_EQ(ts_comm_broadcast(c_, buf.data(), count, dt, n_ - 1), TS_OK) << ts_last_error();
    ASSERT_EQ(ts_comm_wait(q), TS_OK) << ts_last_error();
    ExpectSameBits(buf, want, "split broadcast");
    ExpectSameBits(buf2, want, "split ibroadcast");
  }
  {  // all_reduce_f64 (its all-gather is split too)
    std::vector<double> v(9), want(9, 0.0);
    for (size_t i = 0; i < v.size(); i++) {
      v[i] = Value(105, r_, i);
      for (int j = 0; j < n_; j++)
        want[i] = j == 0 ? (double)Value(105, 0, i) : want[i] + Value(105, j, i);
    }
    ASSERT_EQ(ts_comm_all_reduce_f64(c_, v.data(), v.size(), TS_COMM_SUM), TS_OK)
        << ts_last_error();
    EXPECT_EQ(memcmp(v.data(), want.data(), v.size() * 8), 0);
  }
  if (n_ > 1) {  // a ring of split messages
    int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
    Buf out(dt, count), in(dt, count), in2(dt, count), want(dt, count);
    out.Fill(106, r_);
    want.Fill(106, prev);
    ts_comm_request *qs = nullptr, *qr = nullptr;
    ASSERT_EQ(ts_comm_irecv(c_, in2.data(), count, dt, prev, 5, &qr), TS_OK);
    ASSERT_EQ(ts_comm_isend(c_, out.data(), count, dt, next, 4, &qs), TS_OK);
    ASSERT_EQ(ts_comm_recv(c_, in.data(), count, dt, prev, 4), TS_OK) << ts_last_error();
    ASSERT_EQ(ts_comm_send(c_, out.data(), count, dt, next, 5), TS_OK) << ts_last_error();
    ASSERT_EQ(ts_comm_wait(qs), TS_OK) << ts_last_error();
    ASSERT_EQ(ts_comm_wait(qr), TS_OK) << ts_last_error();
    ExpectSameBits(in, want, "split isend + recv");
    ExpectSameBits(in2, want, "split send + irecv");
  }
}

// ---- the communication thread ----------------------------------------------------

#ifdef TS_COMM_TEST_THREAD
// The thread reports when it ran a call; the last set_thread(0) refuses
// while a request is unwaited, and then returns the group to MPI, whose
// results are the same.
TEST_F(Comm, ThreadTimesAndStop) {
  if (n_ == 1) GTEST_SKIP() << "one rank has no thread";
  size_t count = 4000;
  Buf s(TS_FP32, n_ * count), r(TS_FP32, count);
  s.Fill(111, r_);
  std::vector<uint8_t> k(ts_comm_reduce_scatter_scratch_bytes(c_, count, TS_FP32) + 1);
  ts_comm_request *q = nullptr;
  ASSERT_EQ(ts_comm_set_thread(c_, 1), TS_OK);  // nested: one more off needed
  ASSERT_EQ(
      ts_comm_ireduce_scatter(c_, s.data(), r.data(), count, TS_FP32, 0, k.data(), k.size(), &q),
      TS_OK);
  EXPECT_EQ(ts_comm_set_thread(c_, 0), TS_OK);  // undoes the nested on only
  EXPECT_TRUE(ts_comm_thread_active(c_));
  EXPECT_EQ(ts_comm_set_thread(c_, 0), TS_ERR_INVALID_USAGE);
  EXPECT_TRUE(Contains(ts_last_error(), "1 requests not yet waited")) << ts_last_error();
  double times[4] = {0, 0, 0, 0};
  ASSERT_EQ(ts_comm_wait_timed(q, times), TS_OK) << ts_last_error();
  EXPECT_GT(times[0], 1e15);  // microseconds since 1970: after 2001
  EXPECT_LE(times[0], times[1]);
  EXPECT_EQ(times[2], -1.0);  // the start only queued it
  Buf want = RankOrderSum(TS_FP32, count, 111, Range(n_), r_ * count);
  ExpectSameBits(r, want, "ireduce_scatter on the thread");
  ASSERT_EQ(ts_comm_set_thread(c_, 0), TS_OK) << ts_last_error();
  EXPECT_FALSE(ts_comm_thread_active(c_));
  Buf r2(TS_FP32, count);
  double before = RealtimeUs();
  ASSERT_EQ(
      ts_comm_ireduce_scatter(c_, s.data(), r2.data(), count, TS_FP32, 0, k.data(), k.size(), &q),
      TS_OK);
  double after = RealtimeUs();
  ASSERT_EQ(ts_comm_wait_timed(q, times), TS_OK) << ts_last_error();
  EXPECT_EQ(times[0], -1.0);  // no thread: no times
  if (Staged()) {             // the staged transport ran it to its end in its start
    EXPECT_GE(times[2], before);
    EXPECT_LE(times[2], times[3]);
    EXPECT_LE(times[3], after);
  } else {  // MPI's start only starts it (a group of one: the local copy)
    EXPECT_EQ(times[2], -1.0);
  }
  ExpectSameBits(r2, want, "ireduce_scatter after the thread stopped");
}

// A receive started first does not hold up the send after it (each rank
// receives from its left before sending right): the thread starts calls in
// order and completes them in any order.
TEST_F(Comm, ThreadReceiveBeforeSendDoesNotDeadlock) {
  if (n_ == 1) GTEST_SKIP() << "needs a peer";
  int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
  Buf out(TS_FP32, 300), in(TS_FP32, 300), want(TS_FP32, 300);
  out.Fill(112, r_);
  want.Fill(112, prev);
  ts_comm_request *qr = nullptr, *qs = nullptr;
  ASSERT_EQ(ts_comm_irecv(c_, in.data(), 300, TS_FP32, prev, 9, &qr), TS_OK);
  ASSERT_EQ(ts_comm_isend(c_, out.data(), 300, TS_FP32, next, 9, &qs), TS_OK);
  EXPECT_EQ(ts_comm_wait(qr), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_comm_wait(qs), TS_OK) << ts_last_error();
  ExpectSameBits(in, want, "ring through the thread");
}
#endif

}  // namespace
