#!/usr/bin/env bash
# cgroup_run.sh WHAT MODEL [ARGS...] — one run inside a fresh memory cgroup (v1) capped at CAP_MIB
# (default 2900), MODEL dropped from the page cache first; prints one line of results, the wall
# time and the cgroup's peak usage. Needs root. Alternate runs of each kind and quote medians.
#   WHAT = ferry  ferry generate MODEL --tokens PROMPT -n N --threads T --home disk --json ARGS...
#          llama  llama.cpp's default (mmap): REF_DIR/bin/llama_logits MODEL PROMPT N /dev/null T
#          dd     O_DIRECT read of MODEL's first 2 GiB (16 MiB requests)
#   env: FERRY (build/ferry), REF_DIR (~/.cache/ferry-ref), N (8 tokens), T (2 threads),
#        PROMPT (token ids, 1,2,3)
set -u
what=$1; model=$2; shift 2
cli=${FERRY:-build/ferry}; ref=${REF_DIR:-$HOME/.cache/ferry-ref}; n=${N:-8}; threads=${T:-2}; prompt=${PROMPT:-1,2,3}
cg=/sys/fs/cgroup/memory/ferry-run-$$
mkdir "$cg" && echo $(( ${CAP_MIB:-2900} * 1048576 )) > "$cg/memory.limit_in_bytes" || exit 1
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
python3 -c "
import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$model"
incg() { sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$cg" "$@"; }
t0=$(date +%s.%N)
case $what in
llama) out=$(incg "$ref/bin/llama_logits" "$model" "$prompt" "$n" /dev/null "$threads" 2>/dev/null)
       echo "llama rc=$? $out" | sed 's/tokens=[^ ]*//';;
ferry) out=$(incg "$cli" generate "$model" --tokens "$prompt" -n "$n" --threads "$threads" --home disk --json "$@")
       rc=$?
       echo "$out" | python3 -c "
import json,sys; j=json.load(sys.stdin)
keys=['decode_tok_s','bytes_read_per_token','wait_seconds_per_token','first_token_seconds',
      'prefetch_misses','guess_bytes','guess_unused_bytes','peak_rss_bytes']
print('ferry rc=$rc', ' '.join('%s=%s' % (k, round(j[k], 4) if isinstance(j[k], float) else j[k])
                               for k in keys if k in j), 'tokens=' + ','.join(map(str, j['tokens'])))";;
dd) dd if="$model" of=/dev/null bs=16M count=128 iflag=direct 2>&1 | tail -1;;
*) echo "cgroup_run.sh: WHAT is ferry, llama or dd" >&2; exit 2;;
esac
t1=$(date +%s.%N)
echo "  wall $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s, cgroup peak $(cat "$cg/memory.max_usage_in_bytes"), failcnt $(cat "$cg/memory.failcnt")"
