// mpi_test_main.cc — main() for GoogleTest binaries run on several MPI ranks
// (ts_mpi_test in comm/mpi_test.bzl).
//
// Every rank runs every test in the same order, so a test may call
// collectives. Rank 0 prints GoogleTest's usual output and writes the XML
// report; other ranks print only their failures, each line prefixed
// "[rank R]". The verdict is agreed across ranks: if any rank fails, every
// rank exits 1, and rank 0 names the failing ranks.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>

#include "comm/comm.h"
#include "gtest/gtest.h"

namespace {

// Prints failed assertions and failed tests only, prefixed "[rank R]".
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const testing::TestPartResult &result) override {
    if (!result.failed()) return;
    std::string text = result.message();
    std::string prefixed;
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      prefixed +=
          "[rank " + std::to_string(rank_) + "]   " + text.substr(start, end - start) + "\n";
      start = end + 1;
    }
    printf("[rank %d] %s:%d: Failure\n%s", rank_,
           result.file_name() ? result.file_name() : "unknown file", result.line_number(),
           prefixed.c_str());
    fflush(stdout);
  }

  void OnTestEnd(const testing::TestInfo &info) override {
    if (!info.result()->Failed()) return;
    printf("[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(), info.name());
    fflush(stdout);
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char **argv) {
  if (ts_comm_init(&argc, &argv) != TS_OK) {
    fprintf(stderr, "mpi_test_main: %s\n", ts_last_error());
    return 1;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    testing::TestEventListeners &listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    delete listeners.Release(listeners.default_xml_generator());  // rank 0 writes the report
    listeners.Append(new RankFailurePrinter(rank));
    unsetenv("TEST_PREMATURE_EXIT_FILE");  // one rank (0) owns Bazel's marker file
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;

  // One verdict: rank 0 learns which ranks failed; any failure fails all.
  int *all = rank == 0 ? static_cast<int *>(calloc(size, sizeof(int))) : nullptr;
  int any = failed;
  if (MPI_Gather(&failed, 1, MPI_INT, all, 1, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS ||
      MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS) {
    fprintf(stderr, "[rank %d] mpi_test_main: could not agree on the result across ranks\n", rank);
    any = 1;
  }
  if (rank == 0 && any && all) {
    printf("[rank 0] failing ranks:");
    for (int r = 0; r < size; r++) {
      if (all[r]) printf(" %d", r);
    }
    printf(" (of %d)\n", size);
    fflush(stdout);
  }
  free(all);
  if (ts_comm_finalize() != TS_OK) {
    fprintf(stderr, "[rank %d] mpi_test_main: %s\n", rank, ts_last_error());
    any = 1;
  }
  return any ? 1 : 0;
}
