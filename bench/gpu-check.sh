#!/usr/bin/env bash
# gpu-check.sh — run on a machine with an NVIDIA GPU (about 8 minutes at most):
#   1. builds ferry (Release) with the CUDA runtime found at run time (dlopen; no CUDA headers needed);
#   2. runs the device conformance suite, which must open cuda:0 (and every GPU it finds);
#   3. runs the manager's threaded conformance test (cpu and sim);
#   4. measures pinned host->device bandwidth and ferry's streamed throughput through a device
#      budget of a quarter of the model (bench/gpu_bench), on a generated 2 GiB f16 model;
#   5. ferry run --verify on cuda:0 (home host, and home disk through pinned staging), split over
#      cuda:0 + cpu, and over cuda:0 + cuda:1 when there are two GPUs.
# Usage: bench/gpu-check.sh [OUTDIR]   (results also written to OUTDIR/gpu-check.txt)
#
# Dry run without a GPU, against the fake runtime the tests use (tests/fake_cudart.c), small:
#   FERRY_CUDART=$PWD/build/tests/libfake_cudart.so FERRY_GPU_CHECK_BUILD=build \
#   FERRY_GPU_CHECK_SIZE=48MiB FERRY_GPU_CHECK_BUDGET=12MiB bench/gpu-check.sh /tmp/gpu-dry
# Knobs: FERRY_GPU_CHECK_BUILD (build folder, default build-gpu; an existing one keeps its
# configuration), FERRY_GPU_CHECK_SIZE (model, default 2GiB), FERRY_GPU_CHECK_BUDGET (device
# budget of the verify run, default 512MiB); FERRY_CUDART picks the runtime library.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/ferry-gpu-check}}
build=${FERRY_GPU_CHECK_BUILD:-build-gpu}
size=${FERRY_GPU_CHECK_SIZE:-2GiB}
budget=${FERRY_GPU_CHECK_BUDGET:-512MiB}
mkdir -p "$out"
log="$out/gpu-check.txt"
exec > >(tee "$log") 2>&1
echo "== ferry gpu-check $(date -u +%FT%TZ)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
[ -n "${FERRY_CUDART:-}" ] && echo "== CUDA runtime: FERRY_CUDART=$FERRY_CUDART"
if [ -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" >/dev/null
else
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target ferry_cli test_device_conform test_conform_threads gpu_bench >/dev/null
echo "== ferry devices"
./"$build"/ferry devices || true
ngpu=$(./"$build"/ferry devices --json 2>/dev/null | grep -o '"name": "cuda:[0-9]*"' | wc -l || true)
echo "== device conformance (cpu, sim, and each of the $ngpu CUDA device(s); cuda:0 must open)"
FERRY_TEST_EXPECT_CUDA=$(( ngpu > 0 ? ngpu : 1 )) timeout 300 ./"$build"/tests/test_device_conform | tail -20
echo "== manager conformance, threaded"
timeout 120 ./"$build"/tests/test_conform_threads | tail -3
echo "== streamed throughput"
model="$out/model-$size.gguf"
[ -f "$model" ] || ./"$build"/ferry gen -q -o "$model" --size "$size" --dtype f16
for ms in 0 2; do
  timeout 120 ./"$build"/bench/gpu_bench --device cuda:0 --compute-ms "$ms" --passes 4 "$model"
done
echo "== run --verify on cuda:0 (home host, budget $budget; home disk, pinned staging) and split"
timeout 120 ./"$build"/ferry run "$model" --device cuda:0 --budget device="$budget" --passes 2 --verify --quiet
timeout 120 ./"$build"/ferry run "$model" --device cuda:0 --home disk --budget device="$budget" --passes 2 --verify --quiet
timeout 120 ./"$build"/ferry run "$model" --split cuda:0,cpu --passes 2 --verify --quiet
if [ "$ngpu" -ge 2 ]; then
  timeout 120 ./"$build"/ferry run "$model" --split cuda:0,cuda:1:3 --passes 2 --verify --quiet
fi
echo "== done: $log"
