"""ts_mpi_test: a GoogleTest binary run under mpirun on several rank counts.

    load("//comm:mpi_test.bzl", "ts_mpi_test")

    ts_mpi_test(
        name = "zero_test",
        srcs = ["zero_test.cc"],
        deps = ["//engine"],
        np = [1, 2, 4],
    )

makes
  - `zero_test_bin`: a testonly cc_binary of srcs + deps with main() from
    //comm:mpi_test_main (ts_comm_init, GoogleTest, one verdict for all
    ranks), GoogleTest and //comm;
  - `zero_test_np1`, `zero_test_np2`, `zero_test_np4`: sh_tests running
    `comm/mpirun_test.sh N zero_test_bin ARGS` (tagged "mpi"; the 2-rank one
    also "asan": run again under the sanitizers by the suite);
  - `zero_test`: a test_suite of those.
Each rank runs every TEST in the same order, so tests may call collectives
freely; rank 0 prints GoogleTest's usual output, other ranks only their
failures, prefixed "[rank R]".
"""

load("@rules_cc//cc:defs.bzl", "cc_binary")
load("//third_party:copts.bzl", "TS_CXXOPTS", "TS_LINKOPTS")

_HARNESS = [
    "//comm:mpi_test_main",
    "@gtest//:gtest",
    "//comm:comm",
]

def _canonical(label):
    """'//a/b' -> '//a/b:b', ':x' -> '//<this package>:x'; others as they are."""
    if label.startswith(":"):
        return "//" + native.package_name() + label
    if label.startswith("//") and ":" not in label:
        return label + ":" + label.split("/")[-1]
    return label

def ts_mpi_test(
        name,
        srcs,
        deps = [],
        np = [1, 2, 4],
        size = "small",
        data = [],
        tags = [],
        args = [],
        local_defines = [],
        asan_np = 2):
    """A GoogleTest binary and one sh_test per rank count in np (see above).

    Args:
      name: the test_suite; the binary is name + "_bin", the tests name + "_np<N>".
      srcs: the test's sources (no main(): the harness provides it).
      deps: libraries under test; the harness, GoogleTest and //comm are added
        unless already listed.
      np: rank counts, one sh_test each.
      size: Bazel test size of each sh_test.
      data: runtime files, for the binary and the tests.
      tags: tags of each sh_test (plus "mpi") and of the binary.
      args: extra arguments for the binary (e.g. "--gtest_filter=...").
      local_defines: preprocessor definitions for srcs (one source, two binaries).
      asan_np: the rank count whose sh_test is also tagged "asan": the suite's
        sanitizer pass (tools/test_suite.sh) runs it under --config=asan, so
        that every multi-rank test binary runs on several ranks under
        AddressSanitizer and UndefinedBehaviorSanitizer; 0: none.
    """
    have = [_canonical(d) for d in deps]
    cc_binary(
        name = name + "_bin",
        testonly = True,
        srcs = srcs,
        copts = TS_CXXOPTS,
        local_defines = local_defines,
        linkopts = TS_LINKOPTS,
        data = data,
        tags = tags,
        deps = deps + [d for d in _HARNESS if _canonical(d) not in have],
    )
    tests = []
    for n in np:
        test = "%s_np%d" % (name, n)
        native.sh_test(
            name = test,
            size = size,
            srcs = ["//comm:mpirun_test.sh"],
            args = [str(n), "$(rootpath :%s_bin)" % name] + args,
            data = [":%s_bin" % name] + data,
            tags = tags + ["mpi"] + (["asan"] if n == asan_np else []),
        )
        tests.append(":" + test)
    native.test_suite(
        name = name,
        tests = tests,
        tags = [t for t in tags if t == "manual"],
    )
