#!/usr/bin/env python3
"""llama_compare.py — compares two --logits files (ferry generate's and llama.cpp's llama_logits',
the same layout: n_vocab f32 per evaluated position) row by row, and the greedy tokens.

    llama_compare.py FERRY.f32 LLAMA.f32 N_VOCAB FERRY_TOKENS LLAMA_TOKENS
Prints the largest ||ferry - llama||_2 / ||llama||_2 over the rows, and how many of the tokens
agree (from the first; a differing token makes every later row a different sequence).
Exit status 0 when every row is within 1e-2 and all tokens agree.
"""
import sys

import numpy as np

a = np.fromfile(sys.argv[1], dtype="<f4").astype(np.float64)
b = np.fromfile(sys.argv[2], dtype="<f4").astype(np.float64)
nv = int(sys.argv[3])
ta = [int(t) for t in sys.argv[4].split(",") if t]
tb = [int(t) for t in sys.argv[5].split(",") if t]
if len(a) != len(b) or len(a) % nv:
    print("rows differ: %d vs %d floats" % (len(a), len(b)))
    sys.exit(1)
a, b = a.reshape(-1, nv), b.reshape(-1, nv)
agree = 0
while agree < min(len(ta), len(tb)) and ta[agree] == tb[agree]:
    agree += 1
# rows after the first differing token evaluate different sequences: compare up to it
n_prompt = len(a) - len(tb) + 1
rows = min(len(a), n_prompt + agree)
err = [np.linalg.norm(a[i] - b[i]) / np.linalg.norm(b[i]) for i in range(rows)]
ok = max(err) <= 1e-2 and agree == len(tb) == len(ta)
print("rows %d  max_rel_err %.3e  mean_rel_err %.3e  tokens_agree %d/%d  %s" %
      (rows, max(err), float(np.mean(err)), agree, len(tb), "ok" if ok else "FAIL"))
sys.exit(0 if ok else 1)
