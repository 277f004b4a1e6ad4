"""Offline stand-in for @rules_cc//cc:defs.bzl, for Bazel 4.2.3.

Bazel 4 still implements the C++ rules natively; the upstream rules_cc of that
era only wrapped them. This file does the same, so Bazel's embedded tool
packages (@bazel_tools//tools/cpp, ...) and tessera's BUILD files load without
fetching rules_cc from the network. Debian's bazel-rules-cc is written for a
newer Bazel and cannot be used here.
"""

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_import(**attrs):
    native.cc_import(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)

def fdo_profile(**attrs):
    native.fdo_profile(**attrs)

def fdo_prefetch_hints(**attrs):
    native.fdo_prefetch_hints(**attrs)

def objc_library(**attrs):
    native.objc_library(**attrs)

def objc_import(**attrs):
    native.objc_import(**attrs)
