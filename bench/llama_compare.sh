#!/usr/bin/env bash
# llama_compare.sh — `ferry generate` against llama.cpp on the same files: for dense,
# grouped-query, tied-output and 128-wide-head llama models written with llama.cpp's gguf-py
# (random N(0, 0.02) weights, the SentencePiece vocabulary of models/ggml-vocab-llama-spm.gguf), in f16, q8_0, q4_0
# and Q4_K_M (llama-quantize), for a `ferry gen` model, and for a Mixtral-style mixture of
# experts (8 experts, 2 used, router N(0, 1)) in f16 and q8_0, and for a Qwen3-MoE model (128-wide
# heads normed per head, NeoX RoPE) in f16, q8_0 and Q4_K_M: every evaluated position's logits
# (relative L2 error) and 16 greedy tokens. Needs the reference of shared/reference/build.sh.
#
#   bench/llama_compare.sh FERRY_CLI [REF_DIR (~/.cache/ferry-ref)] [WORK_DIR (/tmp/ferry-compare)]
set -euo pipefail
cli=$1
ref=${2:-$HOME/.cache/ferry-ref}
work=${3:-/tmp/ferry-compare}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
export PYTHONPATH=$ref/llama.cpp/gguf-py
vocab=$ref/llama.cpp/models/ggml-vocab-llama-spm.gguf
threads=${THREADS:-2}
n=16
prompt=1,15043,3186,29892,445,338
mkdir -p "$work"
[ -f "$work/gqa.f16.gguf" ] || $py "$here/llama_ref_models.py" "$vocab" "$work/gqa.f16.gguf" --kv-heads 2 --seed 1
[ -f "$work/dense.f16.gguf" ] || $py "$here/llama_ref_models.py" "$vocab" "$work/dense.f16.gguf" --seed 2
[ -f "$work/tied.f16.gguf" ] || $py "$here/llama_ref_models.py" "$vocab" "$work/tied.f16.gguf" --kv-heads 4 --tied --seed 3
[ -f "$work/hd128.f16.gguf" ] || $py "$here/llama_ref_models.py" "$vocab" "$work/hd128.f16.gguf" --dim 512 --heads 4 --seed 5
[ -f "$work/gen.f16.gguf" ] || "$cli" gen -q -o "$work/gen.f16.gguf" --layers 4 --dim 512 --ff 1536 --vocab 4096 --heads 8 --kv-heads 2
[ -f "$work/moe.f16.gguf" ] || $py "$here/llama_ref_models.py" "$vocab" "$work/moe.f16.gguf" --dim 256 --ff 512 --kv-heads 2 --experts 8 --experts-used 2 --seed 4
[ -f "$work/qwen3moe.f16.gguf" ] || $py "$here/llama_ref_models.py" "$vocab" "$work/qwen3moe.f16.gguf" --arch qwen3moe --dim 256 --ff 256 --heads 4 --kv-heads 2 --head-dim 128 --experts 8 --experts-used 2 --seed 6
status=0
for shape in gqa dense tied hd128 gen moe qwen3moe; do
  quants="f16 q8_0 q4_0 Q4_K_M"
  [ $shape = moe ] && quants="f16 q8_0"
  [ $shape = qwen3moe ] && quants="f16 q8_0 Q4_K_M"
  for q in $quants; do
    m=$work/$shape.$q.gguf
    [ -f "$m" ] || "$ref/bin/llama-quantize" "$work/$shape.f16.gguf" "$m" "$q" >/dev/null 2>&1
    ids=$prompt
    [ $shape = gen ] && ids=1,450,1000,7,99,3000
    lt=$("$ref/bin/llama_logits" "$m" "$ids" $n "$work/llama.f32" "$threads" | sed -n 's/^tokens=\([0-9,]*\) n_vocab=\([0-9]*\).*/\1 \2/p')
    ltok=${lt% *}; nv=${lt#* }
    ft=$("$cli" generate "$m" --tokens "$ids" -n $n --threads "$threads" --logits "$work/ferry.f32" --json |
         $py -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["tokens"])))')
    printf '%-6s %-7s ' $shape $q
    $py "$here/llama_compare.py" "$work/ferry.f32" "$work/llama.f32" "$nv" "$ft" "$ltok" || status=1
  done
done
exit $status
