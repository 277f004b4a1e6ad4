#!/usr/bin/env bash
# Installs the Debian packages tessera needs to build, test and run; quiet
# and fast when everything is already there (the usual case). Idempotent.
#
# Needs root only when something is missing. CUDA is not a Debian package
# here: it is expected preinstalled at /usr/local/cuda; without it only the
# CUDA targets fail to build, so its absence is a warning, not an error.
# Nor is NVIDIA's cudnn-frontend (header-only C++ over cuDNN): its headers
# come from the pinned PyPI wheel, unpacked once under /opt (see below).
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
  libdnnl-dev           # oneDNN 2.6: bf16/fp16 matrix products on the CPU (@dnnl)
  libssl-dev            # OpenSSL libcrypto: SHA-256 of checkpoint files (@openssl)
  libsentencepiece-dev  # SentencePiece C++ API (@sentencepiece)
  sentencepiece         # spm_train / spm_encode command-line tools
  libprotobuf-c-dev     # protobuf-c runtime: TensorBoard's Event records (@protobuf_c)
  protobuf-c-compiler   # protoc-c: engine/tensorboard.proto to C at build time
  libisal-dev           # ISA-L's CRC-32C of TensorBoard's records (@isal)
  bible-kjv             # default corpus: `bible -l0 gen1:1-rev22:21`
  gnuplot-nox           # plots of loss and memory curves
  python3               # helper scripts
  python3-pip           # `pip download` of the cudnn-frontend wheel (below)
  python3-venv          # the venv of tokenizers and pyarrow (below)
  clang                 # the libFuzzer builds of //fuzz (tools/fuzz.sh)
  libclang-rt-dev       # clang's libFuzzer and sanitizer runtimes
  libomp-dev            # clang's OpenMP runtime (tessera's -fopenmp code in the fuzz build)
  slurmctld             # SLURM 22.05's controller, for tools/slurm/testbed.sh (tools/slurm_test.sh)
  slurmd                # its node daemon (with slurm-wlm-basic-plugins: mpi/pmix, proctrack/linuxproc)
  slurm-client          # sbatch, salloc, srun, sinfo, squeue, scancel (tools/launch.sh in an allocation)
  munge                 # SLURM's authentication (the testbed runs its own munged, key and socket)
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

# cudnn-frontend (@cudnn_frontend, third_party/cudnn_frontend.BUILD): the
# include/ tree of the PyPI wheel nvidia-cudnn-frontend, version and file
# pinned (the wheel's include/ is the same for every Python; the pin picks
# one file so its sha256 can be checked), unpacked to
# /opt/cudnn-frontend/<version>/include. Only include/ is taken: the wheel's
# Python module and its compiled extension are not used. The tree appears
# by one rename, so an interrupted run leaves nothing half-written behind.
CUDNN_FE_VERSION=1.16.0
CUDNN_FE_WHEEL=nvidia_cudnn_frontend-1.16.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
CUDNN_FE_SHA256=5c4a8fc573d85a86e08b15d9bf37f729e2487298781867a492a59cde6ac295e2
CUDNN_FE_DIR="/opt/cudnn-frontend/$CUDNN_FE_VERSION"

if [[ ! -f "$CUDNN_FE_DIR/include/cudnn_frontend.h" ]]; then
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "tools/setup.sh: missing $CUDNN_FE_DIR/include (run as root to install cudnn-frontend $CUDNN_FE_VERSION)" >&2
    exit 1
  fi
  echo "tools/setup.sh: installing cudnn-frontend $CUDNN_FE_VERSION headers to $CUDNN_FE_DIR/include" >&2
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  if ! /usr/bin/python3 -m pip download --quiet --no-deps --only-binary=:all: \
      --python-version 3.11 --platform manylinux_2_28_x86_64 \
      "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" -d "$tmp"; then
    echo "tools/setup.sh: cannot download nvidia-cudnn-frontend==$CUDNN_FE_VERSION from PyPI" >&2
    exit 1
  fi
  if ! echo "$CUDNN_FE_SHA256  $tmp/$CUDNN_FE_WHEEL" | sha256sum --check --quiet --strict -; then
    echo "tools/setup.sh: $CUDNN_FE_WHEEL: sha256 is not $CUDNN_FE_SHA256" >&2
    exit 1
  fi
  # Extracts include/ only, refusing absolute paths and "..".
  /usr/bin/python3 - "$tmp/$CUDNN_FE_WHEEL" "$tmp/include" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
n = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith("include/") or name.endswith("/"):
            continue
        parts = name.split("/")[1:]
        if os.path.isabs(name) or ".." in parts:
            sys.exit("tools/setup.sh: %s: unsafe path %r" % (wheel, name))
        out = os.path.join(dest, *parts)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, "wb") as dst:
            dst.write(src.read())
        n += 1
if not os.path.isfile(os.path.join(dest, "cudnn_frontend.h")):
    sys.exit("tools/setup.sh: %s has no include/cudnn_frontend.h" % wheel)
print("tools/setup.sh: %d headers" % n, file=sys.stderr)
PY
  chmod -R a+rX "$tmp/include"
  mkdir -p "$CUDNN_FE_DIR"
  rm -rf "$CUDNN_FE_DIR/include"
  mv "$tmp/include" "$CUDNN_FE_DIR/include"
fi

if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "tools/setup.sh: warning: no CUDA toolkit at /usr/local/cuda; CUDA targets will not build" >&2
fi

# Hugging Face's tokenizers (tokenizer.json: byte-level BPE, WordPiece) and
# Apache Arrow's pyarrow (Parquet), which Debian packages neither of (nor
# Arrow's C++ library): pinned PyPI wheels, checked by sha256, in a venv of
# their own at /opt/tessera-py/<versions>, which `tessera prepare` runs
# (tools/py_helper.h; TESSERA_PYTHON overrides it). --no-deps: neither
# needs another package for what prepare uses (tokenizers' hub download and
# pyarrow's pandas/numpy interop are not used). The venv appears by one
# rename.
TS_PY_DIR=/opt/tessera-py/tokenizers-0.23.3-pyarrow-26.0.1
if ! "$TS_PY_DIR/bin/python" -c 'import tokenizers, pyarrow.parquet' 2>/dev/null; then
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "tools/setup.sh: missing $TS_PY_DIR (run as root to install tokenizers and pyarrow)" >&2
    exit 1
  fi
  echo "tools/setup.sh: installing tokenizers 0.23.3 and pyarrow 26.0.1 into $TS_PY_DIR" >&2
  rm -rf "$TS_PY_DIR.tmp"
  mkdir -p "$(dirname "$TS_PY_DIR")"
  /usr/bin/python3 -m venv "$TS_PY_DIR.tmp"
  req="$(mktemp)"
  cat >"$req" <<'REQ'
tokenizers==0.23.3 --hash=sha256:376851d22bcf9d650a5c3090bb83e6cf9e895fbf0595369fa4cd43c1f69b5f87
pyarrow==26.0.1 --hash=sha256:39cb0f2418282c24bea6ceda77b03e5a8f0a5766b63a8bf194d4e2a2c423548c
REQ
  if ! "$TS_PY_DIR.tmp/bin/python" -m pip install --quiet --no-deps --only-binary=:all: \
      --require-hashes -r "$req"; then
    rm -f "$req"
    echo "tools/setup.sh: cannot install tokenizers and pyarrow from PyPI" >&2
    exit 1
  fi
  rm -f "$req"
  # the venv's scripts name their folder: made in .tmp, they must name the final one
  sed -i "s#$TS_PY_DIR.tmp#$TS_PY_DIR#g" "$TS_PY_DIR.tmp"/bin/activate* "$TS_PY_DIR.tmp"/bin/pip* 2>/dev/null || true
  mv "$TS_PY_DIR.tmp" "$TS_PY_DIR"
  "$TS_PY_DIR/bin/python" -c 'import tokenizers, pyarrow.parquet' ||
    { echo "tools/setup.sh: $TS_PY_DIR does not import tokenizers and pyarrow" >&2; exit 1; }
fi
