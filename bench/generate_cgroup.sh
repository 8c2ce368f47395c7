#!/usr/bin/env bash
# generate_cgroup.sh — decoding a model bigger than the memory it may use: `ferry generate` (home
# disk, host budget BUDGET) against llama.cpp's default (mmap; llama_logits of shared/reference),
# each inside a memory cgroup capped at CAP, the file dropped from the page cache before each run.
# Prints decode tok/s, time to first token and bytes read per token, beside the limits measured in
# the same run: the O_DIRECT read of the file (dd), 0.8 x direct / (M - B) and M / direct.
# Needs root (cgroup v1 memory controller or cgroup v2). Where llama.cpp's extra buffer types
# (AMX, CPU repack) copy the weights out of the mapping at load, as its default does on CPUs with
# AMX, llama.cpp does not fit the cgroup and is killed: compare its mmap path then, a llama_logits
# built with llama_model_params.use_extra_bufts = false, as REF_DIR/bin/llama_logits.
#
#   bench/generate_cgroup.sh FERRY_CLI MODEL [REF_DIR (~/.cache/ferry-ref)]
#   env: CAP (4GiB), BUDGET (3.75GiB), N (8 tokens), THREADS (online CPUs)
# A model of the stated shape: ferry gen -o m6.gguf --layers 14 --dim 4096 --ff 11008 --vocab 32000
#   --heads 32 --dtype f16   (6.2 GB)
set -euo pipefail
cli=$1; model=$2; ref=${3:-$HOME/.cache/ferry-ref}
cap=${CAP:-4GiB}; budget=${BUDGET:-3.75GiB}; n=${N:-8}; threads=${THREADS:-$(nproc)}
bytes() { /usr/bin/python3 -c "
import re,sys; s=sys.argv[1]; m=re.fullmatch(r'([0-9.]+)(GiB|MiB|)', s)
print(int(float(m[1]) * {'GiB': 1 << 30, 'MiB': 1 << 20, '': 1}[m[2]]))" "$1"; }
drop() { /usr/bin/python3 -c "
import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$model"; }
cg=
if [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/ferry-generate-$$; mkdir "$cg"; echo "$(bytes "$cap")" > "$cg/memory.limit_in_bytes"
else
  cg=/sys/fs/cgroup/ferry-generate-$$; mkdir "$cg"; echo "$(bytes "$cap")" > "$cg/memory.max"
fi
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
incg() { sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$cg" "$@"; }
M=$(stat -c %s "$model"); B=$(bytes "$budget")
drop
direct=$(dd if="$model" of=/dev/null bs=16M iflag=direct 2>&1 | sed -n 's/.* s, \([0-9.]*\) \([GM]\)B\/s/\1 \2/p' |
         awk '{print $2 == "G" ? $1 * 1e9 : $1 * 1e6}')
echo "date $(date -u '+%Y-%m-%d %H:%M UTC'); model $M bytes; cap $cap; budget $budget; $threads threads; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "direct read $(awk -v d="$direct" 'BEGIN {printf "%.2f GB/s", d / 1e9}'); bound 0.8 x direct / (M - B) = $(awk -v d="$direct" -v m="$M" -v b="$B" 'BEGIN {printf "%.3f tok/s", 0.8 * d / (m - b)}'); M / direct = $(awk -v d="$direct" -v m="$M" 'BEGIN {printf "%.2f s", m / d}')"
drop
t0=$(date +%s.%N)
out=$(incg "$ref/bin/llama_logits" "$model" 1,2,3 "$n" /dev/null "$threads" 2>/dev/null)
t1=$(date +%s.%N)
echo "llama.cpp (mmap)  $out  wall $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f s", b - a}')"
drop
incg "$cli" generate "$model" --tokens 1,2,3 -n "$n" --threads "$threads" --home disk \
  --budget host="$budget" --json | tr -d '\n' | sed 's/  */ /g'; echo
