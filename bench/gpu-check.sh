#!/usr/bin/env bash
# gpu-check.sh — run on a machine with an NVIDIA GPU (about 8 minutes at most):
#   1. builds ferry (Release) with the CUDA runtime found at run time (dlopen; no CUDA headers needed);
#   2. runs the device conformance suite, which includes cuda:0 when it opens;
#   3. runs the manager's threaded conformance test (cpu and sim);
#   4. measures pinned host->device bandwidth and ferry's streamed throughput through a device
#      budget of a quarter of the model (bench/gpu_bench), on a generated 2 GiB f16 model.
# Usage: bench/gpu-check.sh [OUTDIR]   (results also written to OUTDIR/gpu-check.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/ferry-gpu-check}}
mkdir -p "$out"
log="$out/gpu-check.txt"
exec > >(tee "$log") 2>&1
echo "== ferry gpu-check $(date -u +%FT%TZ)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-gpu -j"$(nproc)" >/dev/null
echo "== ferry devices"
./build-gpu/ferry devices || true
echo "== device conformance (cpu, sim, cuda:0)"
timeout 300 ./build-gpu/tests/test_device_conform | tail -20
echo "== manager conformance, threaded"
timeout 120 ./build-gpu/tests/test_conform_threads | tail -3
echo "== streamed throughput"
model="$out/model-2g.gguf"
[ -f "$model" ] || ./build-gpu/ferry gen -q -o "$model" --size 2GiB --dtype f16
for ms in 0 2; do
  timeout 120 ./build-gpu/bench/gpu_bench --device cuda:0 --compute-ms "$ms" --passes 4 "$model"
done
echo "== run --verify on cuda:0 (home host, budget M/4) and split over cuda:0 + cpu"
timeout 120 ./build-gpu/ferry run "$model" --device cuda:0 --budget device=512MiB --passes 2 --verify --quiet
timeout 120 ./build-gpu/ferry run "$model" --split cuda:0,cpu --passes 2 --verify --quiet
echo "== done: $log"
