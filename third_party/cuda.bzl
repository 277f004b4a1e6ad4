"""ts_cuda_library: CUDA sources compiled by nvcc, wrapped as a cc_library.

Bazel 4 has no CUDA support of its own, so .cu files go through a small rule
(_ts_nvcc_objects) that runs /usr/local/cuda/bin/nvcc once per source and
hands the objects to a cc_library. The C/C++ side then links them like any
other object, together with @cuda//:cudart and the library's deps.

What nvcc sees:
  - include paths, defines and headers of every dep (taken from their CcInfo,
    so `#include "base/base.h"` works when //base is a dep, and
    generated headers under bazel-out are found too), plus `hdrs` and
    `cu_hdrs` of the library itself;
  - -O2 -std=c++17 -Xcompiler -fPIC, and machine code for sm_80 (A100) and
    sm_90 (H100/H200) plus compute_90 PTX, which newer GPUs JIT-compile.
    Relocatable device code is off: each .cu is self-contained (no device
    functions called across files), so no device-link step is needed.
Compiling needs only the toolkit, not a GPU.

Usage:
    load("//third_party:cuda.bzl", "ts_cuda_library")
    ts_cuda_library(
        name = "kernels_cuda",
        srcs = ["cuda/rmsnorm.cu"],
        hdrs = ["cuda/kernels_cuda.h"],     # public C API, .h only
        cu_hdrs = ["cuda/common.cuh"],      # private, seen by nvcc only
        deps = [":base"],
    )
"""

NVCC = "/usr/local/cuda/bin/nvcc"

TS_NVCC_ARCHS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

TS_NVCC_OPTS = [
    "-O2",
    "-std=c++17",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wall",
    "-D_DEFAULT_SOURCE",
]

def _ts_nvcc_objects_impl(ctx):
    headers = []
    includes = []
    system_includes = []
    defines = []
    for dep in ctx.attr.deps:
        cc = dep[CcInfo].compilation_context
        headers.append(cc.headers)
        includes.append(cc.includes)
        includes.append(cc.quote_includes)
        system_includes.append(cc.system_includes)
        defines.append(cc.defines)
    headers = depset(ctx.files.hdrs, transitive = headers)
    roots = [".", ctx.bin_dir.path, ctx.genfiles_dir.path]
    inc_flags = []
    seen = {}
    for d in roots + depset(transitive = includes).to_list():
        if d not in seen:
            seen[d] = True
            inc_flags.append("-I" + d)
    for d in depset(transitive = system_includes).to_list():
        if d not in seen:
            seen[d] = True
            inc_flags.append("-isystem=" + d)
    def_flags = ["-D" + d for d in depset(transitive = defines).to_list()]

    outs = []
    for src in ctx.files.srcs:
        stem = src.basename[:-len(src.extension) - 1]
        prefix = "_nvcc/%s/%s" % (ctx.label.name, src.dirname.replace("/", "_"))
        # A plain .o, compiled with -fPIC: Bazel 4 links precompiled .o files
        # into both shared objects and binaries (a .pic.o beside it would be
        # linked twice), so one position-independent object serves both.
        obj = ctx.actions.declare_file("%s/%s.o" % (prefix, stem))
        args = ctx.actions.args()
        args.add_all(TS_NVCC_ARCHS)
        args.add_all(TS_NVCC_OPTS)
        args.add_all(inc_flags)
        args.add_all(def_flags)
        args.add_all(ctx.attr.copts)
        args.add("-c", src)
        args.add("-o", obj)
        # nvcc names its temporary files tmpxft_<pid>_<counter> in $TMPDIR
        # (/tmp). In linux-sandbox every action is pid 2 of its own pid
        # namespace while /tmp is shared, so two nvcc running at once
        # overwrite each other's files ("cannot open source file
        # /tmp/tmpxft_00000002_..."). Each run gets a folder of its own.
        ctx.actions.run_shell(
            command = 'nvcc="$1"; shift; tmp="$(mktemp -d)" || exit 1; TMPDIR="$tmp" "$nvcc" "$@"; rc=$?; rm -rf "$tmp"; exit $rc',
            arguments = [ctx.attr.nvcc, args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "Compiling CUDA %s" % src.short_path,
            use_default_shell_env = True,
        )
        outs.append(obj)
    return [DefaultInfo(files = depset(outs))]

_ts_nvcc_objects = rule(
    implementation = _ts_nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"], mandatory = True),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        # A string, not a label: nvcc must run from the toolkit directory it
        # lives in (it finds cicc, ptxas and its headers relative to itself).
        "nvcc": attr.string(default = NVCC),
    },
)

def _ts_host_compiled_impl(ctx):
    files = []
    for dep in ctx.attr.srcs:
        if CcInfo not in dep:
            files.append(dep[DefaultInfo].files)
            continue
        # a cc_library: its own archive only (never its deps', which the
        # target configuration compiles and links itself)
        own = []
        for li in dep[CcInfo].linking_context.linker_inputs.to_list():
            if li.owner == dep.label:
                for lib in li.libraries:
                    a = lib.pic_static_library or lib.static_library
                    if a:
                        own.append(a)
        if not own:
            fail("%s: no archive of its own to take" % dep.label)
        files.append(depset(own))
    return [DefaultInfo(files = depset(transitive = files))]

# The objects (or a cc_library's own archive) of srcs, built in the host
# configuration: the same files for every target configuration, so the
# sanitizer build (.bazelrc --config=asan: other --copt, another output
# folder) links what the plain build compiled instead of compiling it again.
# For code that needs none of the target's flags: CUDA objects (nvcc never
# sees --copt) and the cuDNN shim (host C++ that runs only with a GPU).
# .bazelrc gives the host configuration the target's language standards
# and compilation mode; it takes no --copt or --per_file_copt (the plain
# build has none that reach these files) and compiles without debug
# information (-g0).
_ts_host_compiled = rule(
    implementation = _ts_host_compiled_impl,
    attrs = {"srcs": attr.label_list(cfg = "host", mandatory = True)},
)

def ts_host_compiled_cc_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None,
                                testonly = False):
    """A cc_library whose sources are compiled once, in the host configuration.

    Makes `name + "_compiled"` (a cc_library of srcs, tagged manual so that
    //... never builds it in the target configuration) and `name`, a
    linkstatic cc_library of that library's archive, built in the host
    configuration, with hdrs and deps (compiled and linked as every other
    dep is). For sources whose objects do not depend on the target
    configuration's flags (see _ts_host_compiled above). Only the arguments
    below: anything else a compile needs goes in copts, which reach the
    compile (defines as -D).
    """
    native.cc_library(
        name = name + "_compiled",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        linkstatic = True,
        tags = ["manual"],
        visibility = ["//visibility:private"],
        testonly = testonly,
    )
    _ts_host_compiled(
        name = name + "_host",
        srcs = [":" + name + "_compiled"],
        tags = ["manual"],
        visibility = ["//visibility:private"],
        testonly = testonly,
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_host"],
        hdrs = hdrs,
        deps = deps,
        linkstatic = True,
        visibility = visibility,
        testonly = testonly,
    )

def ts_cuda_library(name, srcs, hdrs = [], cu_hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc.

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: public headers (.h) of the library; C callers include them.
      cu_hdrs: private headers (.cuh, .h) that only the .cu files include.
      deps: cc_library deps; their headers and include paths reach nvcc, and
        they are linked. @cuda//:cudart is always added.
      copts: extra nvcc flags (e.g. "-lineinfo", "--use_fast_math").
      **kwargs: passed to the cc_library (visibility, tags, testonly, ...).
    """
    all_deps = deps + ["@cuda//:cudart"]
    # nvcc's objects are built in the host configuration (_ts_host_compiled):
    # once, whatever the target configuration's --copt.
    _ts_nvcc_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs + cu_hdrs,
        deps = all_deps,
        copts = copts,
        tags = ["manual"],
        testonly = kwargs.get("testonly", False),
        visibility = ["//visibility:private"],
    )
    _ts_host_compiled(
        name = name + "_host",
        srcs = [":" + name + "_nvcc"],
        tags = ["manual"],
        testonly = kwargs.get("testonly", False),
        visibility = ["//visibility:private"],
    )
    # linkstatic: never a shared object of its own, even in a test's dynamic
    # link, because the static CUDA runtime's symbols are hidden (visibility
    # "hidden") and can only be reached from objects linked beside it.
    native.cc_library(
        name = name,
        srcs = [":" + name + "_host"],
        hdrs = hdrs,
        deps = all_deps,
        linkstatic = True,
        **kwargs
    )
