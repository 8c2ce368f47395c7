#!/usr/bin/env bash
# generate_bench.sh — resident decode speed of `ferry generate` against llama.cpp (llama_logits of
# shared/reference) on the same files and thread count: a llama model written with llama.cpp's
# gguf-py (bench/llama_ref_models.py; default 8 layers, 2048 / 5632, 32000 vocab, about 1.1 GB in
# f16), in f16, q8_0 and Q4_K_M (llama-quantize), the page cache warmed first; each tool decodes 16
# tokens after a 3-token prompt, three times, alternating; the medians of decode tok/s are printed
# with their ratio and the date.
#
#   bench/generate_bench.sh FERRY_CLI [REF_DIR (~/.cache/ferry-ref)] [WORK_DIR (/tmp/ferry-gbench)]
#   env: THREADS (default: online CPUs), LAYERS, DIM, FF, TYPES ("f16 q8_0 Q4_K_M"), RUNS (3)
set -euo pipefail
cli=$1
ref=${2:-$HOME/.cache/ferry-ref}
work=${3:-/tmp/ferry-gbench}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
threads=${THREADS:-$(nproc)}
layers=${LAYERS:-8}; dim=${DIM:-2048}; ff=${FF:-5632}
types=${TYPES:-f16 q8_0 Q4_K_M}
runs=${RUNS:-3}
mkdir -p "$work"
base=$work/bench-$layers-$dim-$ff.f16.gguf
if [ ! -f "$base" ]; then
  PYTHONPATH=$ref/llama.cpp/gguf-py $py "$here/llama_ref_models.py" \
    "$ref/llama.cpp/models/ggml-vocab-llama-spm.gguf" "$base" --layers "$layers" --dim "$dim" \
    --ff "$ff" --heads $((dim / 128)) --kv-heads $((dim / 512)) --seed 5
fi
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "date $(date -u '+%Y-%m-%d %H:%M UTC'), $threads threads, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %10s %14s %14s %7s\n' type size ferry_tok_s llama_tok_s ratio
for q in $types; do
  m=${base%.f16.gguf}.$q.gguf
  [ $q = f16 ] && m=$base
  [ -f "$m" ] || "$ref/bin/llama-quantize" "$base" "$m" "$q" >/dev/null 2>&1
  cat "$m" >/dev/null # resident: the file in the page cache
  f=(); l=()
  for r in $(seq "$runs"); do
    f+=("$("$cli" generate "$m" --tokens 1,2,3 -n 16 --threads "$threads" --json |
           sed -n 's/.*"decode_tok_s": \([0-9.e+-]*\).*/\1/p')")
    l+=("$("$ref/bin/llama_logits" "$m" 1,2,3 16 "$work/l.f32" "$threads" 2>/dev/null |
           sed -n 's/.*decode_tok_s=\([0-9.]*\).*/\1/p')")
  done
  fm=$(median "${f[@]}"); lm=$(median "${l[@]}")
  printf '%-8s %10s %14.2f %14.2f %7.2f   (ferry %s; llama %s)\n' "$q" "$(du -h "$m" | cut -f1)" \
    "$fm" "$lm" "$(awk -v a="$fm" -v b="$lm" 'BEGIN {print (b > 0 ? a / b : 0)}')" "${f[*]}" "${l[*]}"
done
