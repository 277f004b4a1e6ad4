#!/usr/bin/env bash
# gpu_info on the machine the tests run on, which has the CUDA toolkit at
# /usr/local/cuda: each library line names the file under
# /usr/local/cuda/lib64 (symbolic links followed) and the version its header
# there declares; without
# a GPU (CI) the gpu and driver lines say none and the exit status is 1; with
# one, 0 and the device's line.
set -uo pipefail
BIN="$1"
source "$(dirname "$0")/testing.sh"
fails=0
out="$("$BIN")"
rc=$?
echo "$out"
inc=/usr/local/cuda/include lib=/usr/local/cuda/lib64
def() { awk -v n="$2" '$1 == "#define" && $2 == n {print $3}' "$inc/$1"; }

cudnn="$(def cudnn_version.h CUDNN_MAJOR).$(def cudnn_version.h CUDNN_MINOR).$(def cudnn_version.h CUDNN_PATCHLEVEL)"
file() { readlink -f "$lib/$1"; }
check_eq cudnn "cudnn: $cudnn ($(file libcudnn.so.9); built against $cudnn)" "$(grep '^cudnn: ' <<<"$out")"
lt="$(def cublas_api.h CUBLAS_VER_MAJOR).$(def cublas_api.h CUBLAS_VER_MINOR).$(def cublas_api.h CUBLAS_VER_PATCH)"
check_eq cublasLt "cublasLt: $lt ($(file libcublasLt.so.13))" "$(grep '^cublasLt: ' <<<"$out")"
nccl="$(def nccl.h NCCL_MAJOR).$(def nccl.h NCCL_MINOR).$(def nccl.h NCCL_PATCH)"
check_eq nccl "nccl: $nccl ($(file libnccl.so.2))" "$(grep '^nccl: ' <<<"$out")"
cuda="$(def cuda.h CUDA_VERSION)"
cuda="$((cuda / 1000)).$((cuda % 1000 / 10))"
check_eq nvrtc "nvrtc: $cuda ($(file libnvrtc.so.13))" "$(grep '^nvrtc: ' <<<"$out")"
check_eq runtime "cuda runtime: $cuda (linked statically)" "$(grep '^cuda runtime: ' <<<"$out")"
if [[ -e /dev/nvidia0 ]]; then
  check_eq status 0 "$rc"
  check_eq gpu 1 "$(grep -c '^gpu: [0-9]* device' <<<"$out")"
else
  check_eq status 1 "$rc"
  check_eq gpu 1 "$(grep -c '^gpu: none (' <<<"$out")"
  check_eq driver "driver: none" "$(grep '^driver: ' <<<"$out")"
fi
check_eq lines 7 "$(lines "$out")"
echo "$fails failed"
exit $((fails > 0))
