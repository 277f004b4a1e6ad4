"""Compiler and linker flags shared by every tessera target.

The language standard is not here: .bazelrc passes `--conlyopt=-std=c11` and
`--cxxopt=-std=c++17`, because Bazel 4 has no per-rule conlyopts and a
cc_library's copts reach both its .c and .cc files (g++ rejects -std=c11).
So TS_COPTS is language-neutral and TS_CXXOPTS equals it; both names exist so
BUILD files say which language a target is written in.

-O2 is explicit so the default `fastbuild` mode runs at a useful speed.
-ffp-contract=off forbids fusing a*b+c into an FMA: the determinism contract
(docs: bitwise-identical results across ZeRO stages) needs every rounding to
happen where the source says, whatever the compiler or -march.
-fno-trapping-math: tessera never reads floating-point exception flags nor
enables traps, so GCC may if-convert selects on float comparisons and
vectorise their loops (kernels/cpu: ts_cpu_exp's range checks). It permits
no reassociation and no change of rounding: every value keeps its bits.
No -march=native: binaries and test results must not depend on the build host.
Flags that depend on the file or the build rather than the language live
in .bazelrc, by design in one place: the tests' own sources at -O1, the
sanitizer builds' -O1 -g1 (and no UBSan in test sources), all through
--per_file_copt; the host configuration's standards (third_party/cuda.bzl
compiles there once what every build links). kernels/cuda/BUILD adds -O1
to the cuDNN shim's copts.
-D_DEFAULT_SOURCE: strict -std=c11 hides POSIX and BSD names (clock_gettime,
fsync, strdup, posix_memalign, M_PI, MAP_ANONYMOUS); glibc's _DEFAULT_SOURCE
brings back POSIX.1-2008 plus those. A file may still `#define
_POSIX_C_SOURCE 200809L` or `_GNU_SOURCE`; it must not `#define
_DEFAULT_SOURCE` again (redefinition warning) unless guarded by #ifndef.
"""

TS_COPTS = [
    "-O2",
    "-fopenmp",
    "-ffp-contract=off",
    "-fno-trapping-math",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-D_DEFAULT_SOURCE",
]

TS_CXXOPTS = TS_COPTS

TS_LINKOPTS = [
    "-fopenmp",
    "-lm",
]
