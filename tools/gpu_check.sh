#!/usr/bin/env bash
# Builds and runs the CUDA/NCCL collective tests on a machine with a GPU, in
# one go: the checks the build machines (no driver) can only skip.
#
#   tools/gpu_check.sh              # build in build-gpu/, run, summarize
#   BUILD=dir JOBS=n tools/gpu_check.sh
#
# Needs the Debian packages of tools/install_deps.sh and CUDA + NCCL under
# /usr/local/cuda (or CUDAToolkit_ROOT). Exits non-zero when a test fails, when
# the build has no NCCL, or when a case that needs only one GPU was skipped.
# With one GPU the two-rank NCCL case skips (NCCL wants a GPU per rank); that
# is reported, not failed.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}

echo "== GPUs"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not found)"

echo "== configure ($BUILD)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo | grep -E "ringlane:" || true
if ! grep -q "^RINGLANE_NCCL_LIBRARY:FILEPATH=/" "$BUILD/CMakeCache.txt"; then
  echo "gpu_check: this build has no NCCL (is /usr/local/cuda/bin/nvcc there?)" >&2
  exit 1
fi

echo "== build"
cmake --build "$BUILD" -j"$JOBS" --target nccl_communicator_test gloo_transport_test communicator_test

status=0
log=$(mktemp)
for t in nccl_communicator_test gloo_transport_test communicator_test; do
  echo "== $t"
  NCCL_DEBUG=${NCCL_DEBUG:-WARN} "$BUILD/worker/$t" >"$log" 2>&1 || status=1
  cat "$log"
  if [ "$t" = nccl_communicator_test ] &&
     grep -E "^\[  SKIPPED \] (RankOrderSum|NcclCommunicator\.OneRank)" "$log"; then
    echo "gpu_check: a one-GPU case skipped: the GPU is not usable from this process" >&2
    status=1
  fi
done
rm -f "$log"
echo "== gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
