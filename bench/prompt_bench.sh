#!/usr/bin/env bash
# prompt_bench.sh BEFORE_CLI AFTER_CLI [ROUNDS (3)] — a 64-token prompt (ids 1..64, one token
# generated), the two builds alternating in each round:
#   - MOE (a mixture of experts, default /work/models/moe7.gguf) in a 2,900 MiB memory cgroup,
#     home disk, host budget 2600 MiB, the file dropped from the page cache first: first token, s;
#   - DENSE (default /work/models/m6.gguf) in a 4,096 MiB cgroup, budget 3840 MiB: the same;
#   - each of RESIDENT (default /tmp/ferry-bench-2GiB.gguf) resident: the time of the prompt's
#     passes, summed from the `prompt` events of `--trace`.
# A model that is missing is skipped. The cgroup runs need root (bench/cgroup_run.sh).
set -u
here=$(cd "$(dirname "$0")" && pwd)
before=$1; after=$2; rounds=${3:-3}
moe=${MOE:-/work/models/moe7.gguf}; dense=${DENSE:-/work/models/m6.gguf}
resident=${RESIDENT:-/tmp/ferry-bench-2GiB.gguf}
prompt=$(seq -s, 1 64)
trace=$(mktemp /tmp/prompt_bench.XXXXXX.json)
trap 'rm -f "$trace"' EXIT
first_token() { # CLI CAP_MIB MODEL BUDGET
  FERRY=$1 CAP_MIB=$2 N=1 PROMPT=$prompt bash "$here/cgroup_run.sh" ferry "$3" --budget "host=$4" |
    head -1 | grep -o 'first_token_seconds=[0-9.]*\|bytes_read_per_token=[0-9]*' | tr '\n' ' '
}
for r in $(seq 1 "$rounds"); do
  for which in before after; do
    cli=$before; [ $which = after ] && cli=$after
    [ -f "$moe" ] && echo "$(date -u +%H:%M:%S) round $r $which $(basename "$moe") cgroup 2900 MiB: $(first_token "$cli" 2900 "$moe" 2600MiB)"
    [ -f "$dense" ] && echo "$(date -u +%H:%M:%S) round $r $which $(basename "$dense") cgroup 4096 MiB: $(first_token "$cli" 4096 "$dense" 3840MiB)"
    for f in $resident; do
      [ -f "$f" ] || continue
      "$cli" generate "$f" --tokens "$prompt" -n 1 --threads "${T:-2}" --trace "$trace" >/dev/null || continue
      s=$(/usr/bin/python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['traceEvents']; print('%.3f' % (sum(x['dur'] for x in e if x.get('name') == 'prompt') / 1e6))" "$trace")
      echo "$(date -u +%H:%M:%S) round $r $which $(basename "$f") resident: prompt_seconds=$s"
    done
  done
done
