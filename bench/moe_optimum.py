#!/usr/bin/env python3
"""moe_optimum.py TRACE PROMPT_TOKENS CACHE_EXPERTS EXPERT_BYTES

Bytes per decoded token that the offline optimum (Belady: evict the expert used furthest in the
future) reads for the routing TRACE (`ferry generate --trace-routing`), as `ferry generate` runs
it: the first PROMPT_TOKENS lines evaluated as one batch (each layer's experts of all of them
brought in at once), then one line per decoded token; a cache of CACHE_EXPERTS experts over all
layers, cold at the start; the experts of the layer being computed are held. Counts only the
decoded tokens' reads, as generate's bytes_read_per_token does. `ferry bench --moe --trace`
replays the same trace one line at a time and averages over every line, the cold start included.
"""
import sys


def parse(field):
    layer, experts = field[1:].split(":")
    return int(layer), [int(e) for e in experts.split(",")]


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    lines = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
    n_prompt, cap, expert_bytes = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    steps = []  # (decoded: bool, the experts of one layer's step as (layer, expert))
    for i in range(len(lines[0])):
        units = set()
        for t in range(n_prompt):
            layer, es = parse(lines[t][i])
            units |= {(layer, e) for e in es}
        steps.append((False, units))
    for t in range(n_prompt, len(lines)):
        for field in lines[t]:
            layer, es = parse(field)
            steps.append((True, {(layer, e) for e in es}))
    cache, misses = set(), 0
    for i, (decoded, units) in enumerate(steps):
        for u in units:
            if u in cache:
                continue
            misses += decoded
            if len(cache) >= cap:
                def next_use(v):
                    return next((j for j in range(i + 1, len(steps)) if v in steps[j][1]), 1 << 60)
                cache.discard(max((v for v in cache if v not in units), key=next_use))
            cache.add(u)
    n_dec = len(lines) - n_prompt
    print("decoded tokens %d, optimum reads %d experts, %.1f MB per decoded token"
          % (n_dec, misses, misses * expert_bytes / max(n_dec, 1) / 1e6))


if __name__ == "__main__":
    main()
