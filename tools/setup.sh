#!/usr/bin/env bash
# Installs the Debian packages tessera needs to build, test and run; quiet
# and fast when everything is already there (the usual case). Idempotent.
#
# Needs root only when something is missing. CUDA is not a Debian package
# here: it is expected preinstalled at /usr/local/cuda; without it only the
# CUDA targets fail to build, so its absence is a warning, not an error.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap       # Bazel 4.2.3 (/usr/bin/bazel); builds offline, see WORKSPACE
  build-essential       # gcc/g++ 12, make, libc headers
  libgtest-dev          # GoogleTest (@gtest)
  libopenmpi-dev        # Open MPI headers and libmpi (@mpi)
  openmpi-bin           # mpirun, for multi-rank runs and tests
  libopenblas-dev       # OpenBLAS headers and the default (pthread) library
  libopenblas-openmp-dev # OpenBLAS built with OpenMP, the one tessera links (@openblas)
  libcjson-dev          # cJSON, config.json parsing (@cjson)
  libsentencepiece-dev  # SentencePiece C++ API (@sentencepiece)
  sentencepiece         # spm_train / spm_encode command-line tools
  bible-kjv             # default corpus: `bible -l0 gen1:1-rev22:21`
  gnuplot-nox           # plots of loss and memory curves
  python3               # helper scripts
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} > 0)); then
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "tools/setup.sh: missing Debian packages (run as root to install): ${missing[*]}" >&2
    exit 1
  fi
  echo "tools/setup.sh: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "tools/setup.sh: warning: no CUDA toolkit at /usr/local/cuda; CUDA targets will not build" >&2
fi
