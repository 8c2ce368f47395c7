#!/bin/sh
# example_check.sh — runs examples/engine.c the way its comments promise, on small llama models
# that `ferry gen` writes, and checks what it reports:
#   - the same logits (checksum) whatever the placement: blocks streamed from disk or kept in host
#     RAM (zero-copy), under a tight host budget or none; and again when staged converted to f32;
#   - with a host budget that holds the model (the default one included), tokens after the first
#     read only their embedding
#     row (the blocks stay cached), and zero-copy blocks read nothing at all;
#   - GGUF and safetensors, the cpu and the sim device (with a budget that forces evictions);
#   - ferry_validate reports every mismatching tensor, and bad input fails with exit 1;
#   - the engine commands of docs/guide.md, with the guide's model and budgets.
#
#   example_check.sh FERRY_CLI ENGINE WORK_DIR
set -eu

cli=$1
engine=$2
work=$3

fail() {
    echo "example_check: FAIL: $*" >&2
    exit 1
}

rm -rf "$work"
mkdir -p "$work"
"$cli" gen -q -o "$work/m.gguf" --layers 2 --dim 64 --ff 128 --vocab 100 ||
    fail "ferry gen (gguf)"
"$cli" gen -q -o "$work/m.safetensors" --layers 2 --dim 64 --ff 128 --vocab 100 ||
    fail "ferry gen (safetensors)"

# Runs the engine; its stdout goes to $work/out, stderr to $work/err; fails on a nonzero exit.
ok() {
    echo "+ engine $*"
    status=0
    "$engine" "$@" >"$work/out" 2>"$work/err" || status=$?
    if [ "$status" -ne 0 ]; then
        cat "$work/out" "$work/err" >&2
        fail "engine $* exited with status $status"
    fi
    cat "$work/out"
}

checksum() { sed -n 's/^checksum //p' "$work/out"; }
# Bytes read during token N.
token_read() { sed -n "s/^token $1: .* read=\([0-9]*\) B.*/\1/p" "$work/out"; }
# A counter from the closing "stats:" lines.
stat_value() { sed -n "/^stats:/s/.*$1[ =]\([0-9]*\).*/\1/p" "$work/out" | head -n 1; }

# ---- cpu: the logits do not depend on where the weights live -------------------------------
ok "$work/m.gguf"
ref=$(checksum)
[ -n "$ref" ] || fail "no checksum printed"
[ "$(grep -c '^token ' "$work/out")" -eq 4 ] || fail "expected 4 tokens"

for opts in "--home host" "--host-budget 1MiB" "--host-budget 150KiB"; do
    # shellcheck disable=SC2086
    ok "$work/m.gguf" $opts
    [ "$(checksum)" = "$ref" ] || fail "checksum with $opts: $(checksum), expected $ref"
done

# Under 150 KiB of host budget (the blocks' buffers take more) cached blocks must be evicted,
# and the peak stays within the budget.
[ "$(stat_value evictions)" -gt 0 ] || fail "no evictions under a 150 KiB host budget"

# Staged as f32 the products run in another kernel (other summation order), so f32 runs are
# compared with each other.
ok "$work/m.gguf" --f32
ref32=$(checksum)
[ -n "$ref32" ] || fail "no checksum printed with --f32"
for opts in "--f32 --home host" "--f32 --host-budget 1MiB"; do
    # shellcheck disable=SC2086
    ok "$work/m.gguf" $opts
    [ "$(checksum)" = "$ref32" ] || fail "checksum with $opts: $(checksum), expected $ref32"
done

# ---- caching: a budget that holds the model reads each block once ----------------------------
ok "$work/m.gguf" --host-budget 1MiB --tokens 3
[ "$(token_read 0)" -gt 100000 ] || fail "token 0 read $(token_read 0) bytes, expected the blocks"
for t in 1 2; do
    # One f16 embedding row of 64 elements: 128 bytes.
    [ "$(token_read $t)" -eq 128 ] || fail "token $t read $(token_read $t) bytes, expected 128"
done
[ "$(stat_value misses)" -eq 9 ] || fail "expected 9 prefetch misses (layer 0 of token 0 only)"
# The same under the default host budget (none given): what the host can give holds the model.
ok "$work/m.gguf" --tokens 3
[ "$(token_read 0)" -gt 100000 ] || fail "token 0 read $(token_read 0) bytes, expected the blocks"
for t in 1 2; do
    [ "$(token_read $t)" -eq 128 ] || fail "default budget: token $t read $(token_read $t) bytes, expected 128"
done

# Zero-copy (home host on the cpu, no conversion): only the embedding rows are ever read.
ok "$work/m.gguf" --home host --tokens 3
[ "$(stat_value bytes_read)" -eq 384 ] || fail "zero-copy run read $(stat_value bytes_read) bytes"

# ---- safetensors -----------------------------------------------------------------------------
ok "$work/m.safetensors"
st=$(checksum)
[ -n "$st" ] || fail "no checksum for safetensors"
ok "$work/m.safetensors" --home host --host-budget 1MiB
[ "$(checksum)" = "$st" ] || fail "safetensors checksum changed with --home host"
ok "$work/m.safetensors" --f32

# ---- the sim device: weights are staged, not computed -----------------------------------------
ok "$work/m.gguf" --device "sim:1GiB@20GB/s"
grep -q '^no host compute on sim' "$work/out" || fail "sim run claims host compute"
[ "$(stat_value bytes_copied)" -gt 0 ] || fail "nothing was copied to the sim device"
# f32 doubles the f16 layer to about 161 KiB: 200 KiB holds one layer and the head, not two layers.
ok "$work/m.safetensors" --device "sim:1GiB@20GB/s" --budget 200KiB --home host --f32
[ "$(stat_value evictions)" -gt 0 ] || fail "no evictions under a 200 KiB sim budget"
ok "$work/m.gguf" --device "sim:4MiB" --home device --tokens 2

# ---- failures --------------------------------------------------------------------------------
# A width the model does not have: validate names every tensor that depends on it (2 matrices,
# the output norm, and 9 tensors per layer) in one report, and the engine stops. (One layer and a
# short path: the report is held in a fixed-size message buffer.)
"$cli" gen -q -o "$work/m1.gguf" --layers 1 --dim 64 --ff 128 --vocab 100 ||
    fail "ferry gen (1 layer)"
if (cd "$work" && "$engine" m1.gguf --dim 65 >out 2>err); then
    fail "--dim 65 succeeded"
fi
n=$(grep -c "expected shape" "$work/err" || true)
[ "$n" -eq 12 ] || { cat "$work/err" >&2; fail "validate reported $n shape problems, expected 12"; }
grep -q "^m1.gguf: tensor 'blk.0.ffn_down.weight': expected shape \[128, 65\], found \[128, 64\]" \
    "$work/err" || fail "validate's message does not name file, tensor, expected and found"

if "$engine" "$work/m.gguf" --device "sim:8XB" >"$work/out" 2>"$work/err"; then
    fail "a bad device spec succeeded"
fi
grep -q "bad capacity" "$work/err" || fail "bad device spec: message '$(cat "$work/err")'"

if "$engine" "$work/missing.gguf" >"$work/out" 2>"$work/err"; then
    fail "a missing model succeeded"
fi
grep -q "missing.gguf" "$work/err" || fail "missing model: message '$(cat "$work/err")'"

set +e
"$engine" --no-such-option >/dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "a usage error exited with $rc, expected 2"

# ---- docs/guide.md's commands, as written there ---------------------------------------------
"$cli" gen -q -o "$work/guide.gguf" --layers 4 --dim 256 --ff 512 --vocab 1000 ||
    fail "ferry gen (the guide's model)"
ok "$work/guide.gguf" --host-budget 16MiB
ok "$work/guide.gguf" --device sim:1GiB@20GB/s --budget 4MiB
"$cli" plan "$work/guide.gguf" --home disk --group 'embd=token_embd.*:lazy=on' \
    --group 'head=output*:home=host,load=read' >"$work/out" || fail "the guide's ferry plan --group"
grep -q '^embd (1 tensors) .* yes ' "$work/out" || fail "the guide's plan: no lazy embd group"

echo "example_check: all checks passed"
