#!/bin/sh
# bench/run.sh — builds the benchmark programs and runs them in order: open_bench (parse +
# catalog targets), touch_probe (how fast fresh memory becomes usable), load_bench (cold and warm
# load targets) and `ferry bench` (loads and streams beside the limits) on a model of $SIZE
# generated with `ferry gen` (or load_bench --gen without it).
#
#   bench/run.sh                     1 GiB model, 3 runs, build dir build/
#   SIZE=2GiB RUNS=3 bench/run.sh    the size the load targets are stated for (>= 2 GiB)
#   BUILD=build-bench MODEL=/tmp/x.gguf ONLY=direct,ferry-direct bench/run.sh
#
# Variables: BUILD (build dir, default build), SIZE (default 1GiB), RUNS (default 3), MODEL
# (default /tmp/ferry-bench-$SIZE.gguf, generated when missing, kept afterwards), ONLY (a
# load_bench --only list), SKIP_OPEN=1 / SKIP_PROBE=1 / SKIP_FERRY_BENCH=1 to skip those parts.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SIZE=${SIZE:-1GiB}
RUNS=${RUNS:-3}
MODEL=${MODEL:-/tmp/ferry-bench-$SIZE.gguf}

cmake -S . -B "$BUILD" -DFERRY_TESTS=ON >/dev/null
cmake --build "$BUILD" -j2 --target open_bench load_bench touch_probe ferry_cli >/dev/null

if [ -z "${SKIP_OPEN:-}" ]; then
    echo "== open_bench"
    "$BUILD/bench/open_bench" || true
fi
if [ -z "${SKIP_PROBE:-}" ]; then
    echo "== touch_probe --size $SIZE"
    "$BUILD/bench/touch_probe" --size "$SIZE"
fi
if [ ! -e "$MODEL" ]; then
    echo "== generating $MODEL ($SIZE)"
    "$BUILD/ferry" gen -o "$MODEL" --size "$SIZE" --dtype f16 -q ||
        "$BUILD/bench/load_bench" --gen "$SIZE" --runs 1 --only first-touch "$MODEL" >/dev/null
fi
echo "== load_bench $MODEL"
if [ -n "${ONLY:-}" ]; then
    "$BUILD/bench/load_bench" --runs "$RUNS" --only "$ONLY" "$MODEL"
else
    "$BUILD/bench/load_bench" --runs "$RUNS" "$MODEL"
fi
if [ -z "${SKIP_FERRY_BENCH:-}" ]; then
    echo "== ferry bench $MODEL"
    "$BUILD/ferry" bench --runs "$RUNS" -q "$MODEL"
fi
