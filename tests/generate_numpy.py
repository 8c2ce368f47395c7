#!/usr/bin/env python3
"""generate_numpy.py — checks `ferry generate` against a plain numpy forward pass of the llama
architecture, written from the model's definition (float64 throughout).

It writes small llama GGUF files itself (random weights in every type the engine reads: f32, f16,
bf16, q8_0, q4_0, q4_K with q6_K, dense and grouped-query attention, tied and separate output
heads, and Mixtral-style mixtures of experts), runs `ferry generate --logits` on them under several placements (resident, home disk under
a host budget, everything lazy, direct reads, LoRA merged and at runtime), and for every evaluated
position compares ferry's logits with numpy's on the same token sequence:
    ||ferry - numpy||_2 / ||numpy||_2 <= 1e-3 (5e-3 where vectors are rounded coarsely, to bf16
    or to q8_0 / q8_K: one element rounded the other way at a boundary, float32 against float64,
    moves these small models' logits by about 1e-3; not rounding at all moves them by 1e-2),
and checks that each generated token is numpy's argmax (or within the tolerance of it); for a
mixture of experts also that every position went through numpy's experts (--trace-routing) and
that the next-layer predictions hit as often as numpy's (--json). The
products round their vector as llama.cpp's CPU back end does (act() below), and attention keeps
the KV cache in f16 as its flash attention does (Reference.attention).

    generate_numpy.py FERRY_CLI WORK_DIR
Exit status 0 pass, 1 fail, 77 skipped (no numpy).
"""
import json
import os
import struct
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("generate_numpy: SKIP: numpy is not installed for", sys.executable)
    sys.exit(77)

TOL = 1e-3
TOL_Q8 = 5e-3

# ---- GGUF (v3) writing and reading, from the format's specification ----------------------------

T_F32, T_F16, T_Q4_0, T_Q8_0, T_Q4_K, T_Q6_K, T_BF16 = 0, 1, 2, 8, 12, 14, 30
BLOCK = {T_F32: (1, 4), T_F16: (1, 2), T_BF16: (1, 2), T_Q8_0: (32, 34), T_Q4_0: (32, 18),
         T_Q4_K: (256, 144), T_Q6_K: (256, 210)}
V_U32, V_I32, V_F32, V_BOOL, V_STR, V_ARR, V_U64 = 4, 5, 6, 7, 8, 9, 10
ALIGN = 32


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, value):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == V_U32:
        out += struct.pack("<I", value)
    elif vtype == V_F32:
        out += struct.pack("<f", value)
    elif vtype == V_STR:
        out += gguf_str(value)
    elif vtype == V_ARR:  # value: (element type, items)
        et, items = value
        out += struct.pack("<IQ", et, len(items))
        for it in items:
            out += gguf_str(it) if et == V_STR else struct.pack({V_F32: "<f", V_I32: "<i"}[et], it)
    else:
        raise ValueError(vtype)
    return out


def write_gguf(path, meta, tensors):
    """meta: [(key, vtype, value)]; tensors: [(name, gguf_type, ne (innermost first), bytes)]."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, t, v in meta:
        head += gguf_kv(k, t, v)
    off = 0
    infos = b""
    for name, typ, ne, data in tensors:
        infos += gguf_str(name) + struct.pack("<I", len(ne))
        infos += b"".join(struct.pack("<Q", n) for n in ne)
        infos += struct.pack("<IQ", typ, off)
        off += (len(data) + ALIGN - 1) // ALIGN * ALIGN
    blob = head + infos
    blob += b"\0" * ((-len(blob)) % ALIGN)
    with open(path, "wb") as f:
        f.write(blob)
        for _, _, _, data in tensors:
            f.write(data)
            f.write(b"\0" * ((-len(data)) % ALIGN))


def read_gguf(path):
    """The metadata (scalars and strings) and each tensor as (type, ne, raw bytes)."""
    buf = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal pos
        n = take("Q")
        s = buf[pos:pos + n].decode()
        pos += n
        return s

    scal = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}

    def value(t):
        if t in scal:
            return take(scal[t])
        if t == V_STR:
            return string()
        if t == V_ARR:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        raise ValueError(t)

    assert buf[:4] == b"GGUF"
    pos = 4
    _, nt, nkv = take("I"), take("Q"), take("Q")
    meta = {}
    for _ in range(nkv):
        k = string()
        meta[k] = value(take("I"))
    align = meta.get("general.alignment", ALIGN)
    infos = []
    for _ in range(nt):
        name = string()
        nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        typ, off = take("I"), take("Q")
        infos.append((name, typ, ne, off))
    data0 = (pos + align - 1) // align * align
    tensors = {}
    for name, typ, ne, off in infos:
        n = int(np.prod(ne))
        be, bb = BLOCK[typ]
        nbytes = n // be * bb
        tensors[name] = (typ, ne, buf[data0 + off:data0 + off + nbytes])
    return meta, tensors


def f16_from_bytes(b):
    return np.frombuffer(b, dtype="<f2").astype(np.float64)


def dequant(typ, raw, n):
    """The values of N elements of GGUF type TYP stored in RAW, as float64 (ggml's layouts)."""
    if typ == T_F32:
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)
    if typ == T_F16:
        return f16_from_bytes(raw)
    if typ == T_BF16:
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64)
    if typ == T_Q8_0:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 34)
        d = f16_from_bytes(b[:, :2].tobytes())
        q = b[:, 2:].view(np.int8).astype(np.float64)
        return (d[:, None] * q).reshape(-1)
    if typ == T_Q4_0:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 18)
        d = f16_from_bytes(b[:, :2].tobytes())
        qs = b[:, 2:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float64) - 8
        return (d[:, None] * q).reshape(-1)
    if typ == T_Q4_K:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 144)
        d = f16_from_bytes(b[:, 0:2].tobytes())
        dmin = f16_from_bytes(b[:, 2:4].tobytes())
        s = b[:, 4:16].astype(np.int64)
        sc = np.zeros((len(b), 8))
        mn = np.zeros((len(b), 8))
        for j in range(8):
            if j < 4:
                sc[:, j] = s[:, j] & 63
                mn[:, j] = s[:, j + 4] & 63
            else:
                sc[:, j] = (s[:, j + 4] & 15) | ((s[:, j - 4] >> 6) << 4)
                mn[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
        qs = b[:, 16:].reshape(-1, 4, 32)
        y = np.zeros((len(b), 256))
        for c in range(4):
            lo = (qs[:, c] & 15).astype(np.float64)
            hi = (qs[:, c] >> 4).astype(np.float64)
            y[:, 64 * c:64 * c + 32] = (d * sc[:, 2 * c])[:, None] * lo - (dmin * mn[:, 2 * c])[:, None]
            y[:, 64 * c + 32:64 * c + 64] = ((d * sc[:, 2 * c + 1])[:, None] * hi
                                             - (dmin * mn[:, 2 * c + 1])[:, None])
        return y.reshape(-1)
    if typ == T_Q6_K:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 210)
        ql, qh = b[:, 0:128].astype(np.int64), b[:, 128:192].astype(np.int64)
        sc = b[:, 192:208].view(np.int8).astype(np.float64)
        d = f16_from_bytes(b[:, 208:210].tobytes())
        y = np.zeros((len(b), 256))
        for h in range(2):
            L, H, S = ql[:, 64 * h:64 * h + 64], qh[:, 32 * h:32 * h + 32], sc[:, 8 * h:8 * h + 8]
            for l in range(32):
                i = l // 16
                q1 = ((L[:, l] & 15) | (((H[:, l] >> 0) & 3) << 4)) - 32
                q2 = ((L[:, l + 32] & 15) | (((H[:, l] >> 2) & 3) << 4)) - 32
                q3 = ((L[:, l] >> 4) | (((H[:, l] >> 4) & 3) << 4)) - 32
                q4 = ((L[:, l + 32] >> 4) | (((H[:, l] >> 6) & 3) << 4)) - 32
                base = 128 * h
                y[:, base + l] = d * S[:, i] * q1
                y[:, base + l + 32] = d * S[:, i + 2] * q2
                y[:, base + l + 64] = d * S[:, i + 4] * q3
                y[:, base + l + 96] = d * S[:, i + 6] * q4
        return y.reshape(-1)
    raise ValueError(typ)


# ---- weights in each type ---------------------------------------------------------------------

def f16_bytes(x):
    return np.asarray(x, dtype="<f2").tobytes()


def encode(typ, x, rng):
    """Bytes of float array X (whole blocks) in type TYP. The k-quants are random blocks with
    weight-sized scales: what they hold is what dequant reads, so no quantizer is needed."""
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if typ == T_F32:
        return x.astype("<f4").tobytes()
    if typ == T_F16:
        return f16_bytes(x)
    if typ == T_BF16:
        u = x.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
        return u.tobytes()
    if typ == T_Q8_0:
        b = x.reshape(-1, 32).astype(np.float64)
        d = np.abs(b).max(axis=1) / 127
        q = np.where(d[:, None] > 0, np.round(b / np.where(d > 0, d, 1)[:, None]), 0)
        out = np.zeros((len(b), 34), dtype=np.uint8)
        out[:, :2] = np.frombuffer(f16_bytes(d), dtype=np.uint8).reshape(-1, 2)
        out[:, 2:] = q.astype(np.int8).view(np.uint8)
        return out.tobytes()
    if typ == T_Q4_0:
        b = x.reshape(-1, 32).astype(np.float64)
        idx = np.abs(b).argmax(axis=1)
        mx = b[np.arange(len(b)), idx]
        d = mx / -8
        inv = np.where(d != 0, 1 / np.where(d != 0, d, 1), 0)
        q = np.clip(np.trunc(b * inv[:, None] + 8.5), 0, 15).astype(np.uint8)
        out = np.zeros((len(b), 18), dtype=np.uint8)
        out[:, :2] = np.frombuffer(f16_bytes(d), dtype=np.uint8).reshape(-1, 2)
        out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
        return out.tobytes()
    nb = len(x) // 256
    if typ == T_Q4_K:
        out = rng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
        d = rng.uniform(0.5e-4, 1.5e-4, nb)
        out[:, 0:2] = np.frombuffer(f16_bytes(d), dtype=np.uint8).reshape(-1, 2)
        out[:, 2:4] = np.frombuffer(f16_bytes(d * 8), dtype=np.uint8).reshape(-1, 2)
        return out.tobytes()
    if typ == T_Q6_K:
        out = rng.integers(0, 256, size=(nb, 210), dtype=np.uint8)
        d = rng.uniform(0.5e-5, 1.5e-5, nb)
        out[:, 208:210] = np.frombuffer(f16_bytes(d), dtype=np.uint8).reshape(-1, 2)
        return out.tobytes()
    raise ValueError(typ)


def make_model(path, wtype, dim=256, ff=512, heads=4, kv_heads=4, layers=2, vocab=512,
               tied=False, rope_base=10000.0, eps=1e-5, seed=0, extra_meta=(), experts=None,
               arch="llama", head_dim=0):
    """EXPERTS: (n_expert, n_used) for a Mixtral-style feed-forward: the router ffn_gate_inp
    N(0, 1) in f32 (routing is then decisive), ffn_{gate,up,down}_exps stacked over the experts
    (n_expert the outermost dimension) in WTYPE. ARCH "qwen3moe" (with EXPERTS): heads of
    HEAD_DIM (default dim / heads), attn_q_norm / attn_k_norm, experts FF wide."""
    rng = np.random.default_rng(seed)
    hd = head_dim or dim // heads
    kv, qd = hd * kv_heads, hd * heads
    # Q4_K_M-like: attn_v, ffn_down and the output head in q6_K
    six = {"attn_v", "ffn_down", "output"} if wtype == T_Q4_K else set()

    def weight(name, rows, cols):
        typ = T_Q6_K if name.split(".")[-2] in six else wtype
        x = rng.normal(0, 0.02, size=(rows, cols))
        return (name, typ, [cols, rows], encode(typ, x, rng))

    def norm(name, n=dim):
        return (name, T_F32, [n], encode(T_F32, 1 + rng.normal(0, 0.1, n), rng))

    def stacked(name, rows, cols):
        ne = experts[0]
        x = rng.normal(0, 0.02, size=(ne, rows, cols))
        return (name, wtype, [cols, rows, ne], encode(wtype, x, rng))

    def ffn(p):
        if not experts:
            return [weight(p + "ffn_gate.weight", ff, dim), weight(p + "ffn_up.weight", ff, dim),
                    weight(p + "ffn_down.weight", dim, ff)]
        router = rng.normal(0, 1, size=(experts[0], dim))
        return [(p + "ffn_gate_inp.weight", T_F32, [dim, experts[0]], encode(T_F32, router, rng)),
                stacked(p + "ffn_gate_exps.weight", ff, dim),
                stacked(p + "ffn_up_exps.weight", ff, dim),
                stacked(p + "ffn_down_exps.weight", dim, ff)]

    ts = [weight("token_embd.weight", vocab, dim)]
    for l in range(layers):
        p = "blk.%d." % l
        ts += [norm(p + "attn_norm.weight"), weight(p + "attn_q.weight", qd, dim),
               weight(p + "attn_k.weight", kv, dim), weight(p + "attn_v.weight", kv, dim),
               weight(p + "attn_output.weight", dim, qd)]
        if arch == "qwen3moe":
            ts += [norm(p + "attn_q_norm.weight", hd), norm(p + "attn_k_norm.weight", hd)]
        ts += [norm(p + "ffn_norm.weight")] + ffn(p)
    ts.append(norm("output_norm.weight"))
    if not tied:
        ts.append(weight("output.weight", vocab, dim))
    a = arch + "."
    meta = [("general.architecture", V_STR, arch), ("general.alignment", V_U32, ALIGN),
            (a + "block_count", V_U32, layers), (a + "context_length", V_U32, 256),
            (a + "embedding_length", V_U32, dim), (a + "feed_forward_length", V_U32, ff),
            (a + "attention.head_count", V_U32, heads),
            (a + "attention.head_count_kv", V_U32, kv_heads),
            (a + "attention.key_length", V_U32, hd),
            (a + "rope.dimension_count", V_U32, hd),
            (a + "rope.freq_base", V_F32, rope_base),
            (a + "attention.layer_norm_rms_epsilon", V_F32, eps)] + list(extra_meta)
    if experts:
        meta += [(a + "expert_count", V_U32, experts[0]),
                 (a + "expert_used_count", V_U32, experts[1])]
    if arch == "qwen3moe":
        meta.append((a + "expert_feed_forward_length", V_U32, ff))
    write_gguf(path, meta, ts)


# ---- the vector as llama.cpp's CPU back end rounds it for each weight type --------------------

def act(x, typ):
    """X as the dot product with a weight of type TYP sees it: f16 / bf16 precision for f16 / bf16
    weights, q8_0 blocks (d = amax / 127, q = round-half-even(x * 127 / amax), d stored in f16)
    for q8_0 / q4_0, q8_K blocks (iscale = -127 / max, max the signed element of largest
    magnitude, q = round-half-even(iscale * x), d = 1 / iscale in f32) for q4_K / q6_K."""
    f = np.asarray(x, dtype=np.float32)
    if typ == T_F16:
        return f.astype(np.float16).astype(np.float64)
    if typ == T_BF16:
        u = f.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
        return u.astype(np.uint32).view(np.float32).astype(np.float64)
    if typ in (T_Q8_0, T_Q4_0):
        b = f.reshape(-1, 32)
        amax = np.abs(b).max(axis=1)
        d = (amax / np.float32(127)).astype(np.float32)
        with np.errstate(divide="ignore"):
            iv = np.where(amax != 0, np.float32(127) / amax, 0).astype(np.float32)
        q = np.rint(b * iv[:, None])
        return (d.astype(np.float16).astype(np.float64)[:, None] * q).reshape(-1)
    if typ in (T_Q4_K, T_Q6_K):
        b = f.reshape(-1, 256)
        idx = np.abs(b).argmax(axis=1)
        mx = b[np.arange(len(b)), idx]
        with np.errstate(divide="ignore"):
            isc = np.where(mx != 0, np.float32(-127) / mx, 0).astype(np.float32)
            d = np.where(mx != 0, np.float32(1) / isc, 0).astype(np.float32)
        q = np.minimum(127, np.rint(b * isc[:, None]))
        return (d.astype(np.float64)[:, None] * q).reshape(-1)
    return f.astype(np.float64) if typ == T_F32 else np.asarray(x, dtype=np.float64)


# ---- the reference forward pass ---------------------------------------------------------------

class Reference:
    """llama's forward pass for one position at a time over a KV cache, in float64."""

    def __init__(self, path, adapters=(), staged=None):
        meta, ts = read_gguf(path)
        # the type each product rounds its vector for: the file's, or the staged one
        self.types = {n: (staged if staged is not None else t[0]) for n, t in ts.items()}
        self.meta = meta
        arch = meta["general.architecture"]
        self.qwen3 = arch == "qwen3moe"  # RMSNorm on each head of q and k, NeoX RoPE
        g = lambda k, d=None: meta.get(arch + "." + k, d)
        self.n_layer = g("block_count")
        self.dim = g("embedding_length")
        self.n_head = g("attention.head_count")
        self.n_kv = g("attention.head_count_kv", self.n_head)
        self.hd = g("attention.key_length", self.dim // self.n_head)
        self.rope_dim = g("rope.dimension_count", self.hd)
        self.base = g("rope.freq_base", 10000.0)
        self.eps = g("attention.layer_norm_rms_epsilon")
        self.n_expert = g("expert_count", 0)
        self.n_used = g("expert_used_count", 0)
        self.routes = []  # per position: per layer the experts used, ascending
        self.pred_hits = self.preds = 0
        self.w = {}
        for name, (typ, ne, raw) in ts.items():
            v = dequant(typ, raw, int(np.prod(ne)))
            self.w[name] = v.reshape(list(reversed(ne))) if len(ne) > 1 else v
        for path_a, mult in adapters:
            am, at = read_gguf(path_a)
            alpha = am["adapter.lora.alpha"]
            for name in at:
                if not name.endswith(".lora_a"):
                    continue
                base = name[:-len(".lora_a")]
                ta, tb = at[name], at[base + ".lora_b"]
                a = dequant(ta[0], ta[2], int(np.prod(ta[1]))).reshape(list(reversed(ta[1])))
                b = dequant(tb[0], tb[2], int(np.prod(tb[1]))).reshape(list(reversed(tb[1])))
                rank = a.shape[0]
                self.w[base] = self.w[base] + mult * alpha / rank * (b @ a)
        self.out_name = "output.weight" if "output.weight" in self.w else "token_embd.weight"
        self.k = [[] for _ in range(self.n_layer)]
        self.v = [[] for _ in range(self.n_layer)]

    def mv(self, name, x):
        """W.x with x rounded as W's product takes it (the vector, not the weight: weights are
        exact in every type)."""
        return self.w[name] @ act(x, self.types[name])

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x) + self.eps) * w

    def rope(self, x, pos):
        """Pair j (elements 2j and 2j + 1; NeoX: j and j + rope_dim / 2) of each head turned by
        pos * base^(-2j / rope_dim)."""
        x = x.reshape(-1, self.hd).copy()
        j = np.arange(self.rope_dim // 2)
        theta = pos * self.base ** (-2 * j / self.rope_dim)
        c, s = np.cos(theta), np.sin(theta)
        i0, i1 = (j, j + self.rope_dim // 2) if self.qwen3 else (2 * j, 2 * j + 1)
        x0, x1 = x[:, i0].copy(), x[:, i1].copy()
        x[:, i0] = x0 * c - x1 * s
        x[:, i1] = x0 * s + x1 * c
        return x.reshape(-1)

    def head_norm(self, x, w):
        """RMSNorm over each head of x (qwen3moe's q and k norms)."""
        x = x.reshape(-1, self.hd)
        return (x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + self.eps) * w).reshape(-1)

    def attention(self, q, K, V):
        """softmax(q.K / sqrt(hd)) . V per head, as llama.cpp's CPU flash attention computes it:
        K, V and q in f16, one pass over the positions with a running maximum, the weighted sum
        of V kept in f16 (rounded after every step), float32 arithmetic."""
        f16 = lambda a: np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)
        group = self.n_head // self.n_kv
        kv = np.arange(self.n_head) // group
        q16 = f16(q)
        K16, V16 = f16(K)[:, kv], f16(V)[:, kv]  # (positions, n_head, hd)
        scale = np.float32(1 / np.sqrt(np.float32(self.hd)))
        M = np.full(self.n_head, -np.inf, dtype=np.float32)
        S = np.zeros(self.n_head, dtype=np.float32)
        acc = np.zeros((self.n_head, self.hd), dtype=np.float32)
        with np.errstate(over="ignore"):
            for t in range(len(K)):
                s = np.einsum("hd,hd->h", q16, K16[t]).astype(np.float32) * scale
                new = s > M
                ms = np.where(new, np.exp(M - s), np.float32(1)).astype(np.float32)
                vs = np.where(new, np.float32(1), np.exp(s - M)).astype(np.float32)
                M = np.maximum(M, s)
                acc = np.where(new[:, None], f16(acc * ms[:, None]), acc)
                acc = f16(acc + V16[t] * vs[:, None])
                S = (S * ms + vs).astype(np.float32)
        return (acc * (np.float32(1) / S)[:, None]).astype(np.float64)

    def forward(self, token, pos):
        w = self.w
        x = w["token_embd.weight"][token].copy()
        route, pred = [], []
        for l in range(self.n_layer):
            p = "blk.%d." % l
            h = self.rmsnorm(x, w[p + "attn_norm.weight"])
            q, k = self.mv(p + "attn_q.weight", h), self.mv(p + "attn_k.weight", h)
            if self.qwen3:
                q = self.head_norm(q, w[p + "attn_q_norm.weight"])
                k = self.head_norm(k, w[p + "attn_k_norm.weight"])
            q = self.rope(q, pos).reshape(self.n_head, self.hd)
            self.k[l].append(self.rope(k, pos).reshape(self.n_kv, self.hd))
            self.v[l].append(self.mv(p + "attn_v.weight", h).reshape(self.n_kv, self.hd))
            att = self.attention(q, np.stack(self.k[l]), np.stack(self.v[l]))
            x = x + self.mv(p + "attn_output.weight", att.reshape(-1))
            h = self.rmsnorm(x, w[p + "ffn_norm.weight"])
            if not self.n_expert:
                gte, up = self.mv(p + "ffn_gate.weight", h), self.mv(p + "ffn_up.weight", h)
                x = x + self.mv(p + "ffn_down.weight", gte / (1 + np.exp(-gte)) * up)
                continue
            sel, wts = self.experts(l, h)
            if l > 0:
                self.pred_hits += len(set(sel) & set(pred))
                self.preds += self.n_used
            route.append(sorted(sel))
            if l + 1 < self.n_layer:  # the next layer's router on x under its ffn_norm
                q = "blk.%d." % (l + 1)
                pred, _ = self.experts(l + 1, self.rmsnorm(x, w[q + "ffn_norm.weight"]))
            x = x + self.moe(p, h, sel, wts)
        if self.n_expert:
            self.routes.append(route)
        return self.mv(self.out_name, self.rmsnorm(x, w["output_norm.weight"]))

    def experts(self, l, h):
        """Mixtral's routing: softmax over the router's logits, the n_used most probable
        experts, their probabilities divided by their sum."""
        z = self.mv("blk.%d.ffn_gate_inp.weight" % l, h)
        prob = np.exp(z - z.max())
        prob /= prob.sum()
        sel = [int(e) for e in np.argsort(-prob, kind="stable")[:self.n_used]]
        return sel, prob[sel] / prob[sel].sum()

    def moe(self, p, h, sel, wts):
        """The weighted sum of each chosen expert's SwiGLU."""
        out = 0
        for e, we in zip(sel, wts):
            ex = lambda n, v: self.w[p + n][e] @ act(v, self.types[p + n])
            gte, up = ex("ffn_gate_exps.weight", h), ex("ffn_up_exps.weight", h)
            out = out + we * ex("ffn_down_exps.weight", gte / (1 + np.exp(-gte)) * up)
        return out


# ---- the checks -------------------------------------------------------------------------------

FAILED = []


def run_ferry(cli, model, prompt, n, logits, extra, trace=None):
    cmd = [cli, "generate", model, "--tokens", ",".join(map(str, prompt)), "-n", str(n),
           "--threads", "2", "--logits", logits, "--json"] + extra
    if trace:
        cmd += ["--trace-routing", trace]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr))
    return json.loads(p.stdout)


def check(cli, work, label, model, extra=(), adapters=(), prompt=(1, 17, 230, 5, 99), n=6,
          staged=None, moe=False):
    logits = os.path.join(work, "logits.f32")
    trace = os.path.join(work, "routing.txt") if moe else None
    try:
        out = run_ferry(cli, model, list(prompt), n, logits, list(extra), trace)
    except RuntimeError as e:
        FAILED.append(label)
        print("FAIL %s: %s" % (label, e))
        return
    got = np.fromfile(logits, dtype="<f4").astype(np.float64)
    nv = out["n_vocab"]
    seq = list(prompt) + out["tokens"][:-1]
    if len(got) != nv * len(seq) or len(out["tokens"]) != n:
        FAILED.append(label)
        print("FAIL %s: %d logits for %d rows of %d, %d tokens" % (label, len(got), len(seq),
                                                                     nv, len(out["tokens"])))
        return
    got = got.reshape(len(seq), nv)
    ref = Reference(model, adapters, staged)
    q8 = any(t in (T_BF16, T_Q8_0, T_Q4_0, T_Q4_K, T_Q6_K) for t in ref.types.values())
    tol = TOL_Q8 if q8 else TOL
    worst, bad_tok = 0.0, []
    for i, t in enumerate(seq):
        want = ref.forward(t, i)
        err = np.linalg.norm(got[i] - want) / np.linalg.norm(want)
        worst = max(worst, err)
        if i + 1 >= len(prompt):
            tok = out["tokens"][i + 1 - len(prompt)]
            # ferry's pick must be numpy's best, or tie with it within the tolerance
            if want[tok] < want.max() - tol * np.linalg.norm(want) / np.sqrt(nv):
                bad_tok.append((i, tok, int(want.argmax())))
    ok = worst <= tol and not bad_tok
    note = "" if not bad_tok else ", tokens differ at %s" % bad_tok
    if moe:
        want_lines = [" ".join("L%d:%s" % (l, ",".join(map(str, r))) for l, r in enumerate(rt))
                      for rt in ref.routes]
        got_lines = open(trace).read().splitlines()
        if got_lines != want_lines:
            ok = False
            bad = [i for i in range(max(len(got_lines), len(want_lines)))
                   if got_lines[i:i + 1] != want_lines[i:i + 1]]
            note += ", routing differs at rows %s" % bad[:5]
        counts = (out.get("routing_predicted_hits"), out.get("routing_predictions"))
        if counts != (ref.pred_hits, ref.preds):
            ok = False
            note += ", predicted hits %s, numpy %s" % (counts, (ref.pred_hits, ref.preds))
        else:
            note += ", predicted %d/%d" % counts
    print("%s %-40s max rel err %.2e over %d rows%s" % ("ok  " if ok else "FAIL", label, worst,
                                                        len(seq), note))
    if not ok:
        FAILED.append(label)


def check_tokenizer(cli, work):
    """--prompt on a small SentencePiece vocabulary whose encoding of "hello world!" is worked out
    by hand from the algorithm: the best-scoring pair merges first ("ll" -3, then "he" -3.5); the
    queued "_h" no longer fits its symbols and is skipped; "llo", "_he", "_hello", "_w" follow;
    the rest stay single characters, and "!" (no token) falls back to its byte <0x21>."""
    sp = "\u2581"
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(toks)
    for t, sc in [(sp, -1), ("h", -2), ("e", -2), ("l", -2), ("o", -2), ("w", -2), ("r", -2),
                  ("d", -2), ("ll", -3), (sp + "h", -4), ("he", -3.5), ("llo", -5),
                  (sp + "he", -6), (sp + "hello", -7), (sp + "w", -8)]:
        toks.append(t)
        types.append(1)
        scores.append(sc)
    ids = {t: i for i, t in enumerate(toks)}
    want = [1, ids[sp + "hello"], ids[sp + "w"], ids["o"], ids["r"], ids["l"], ids["d"], 3 + 0x21]
    path = os.path.join(work, "m_vocab.gguf")
    make_model(path, T_F16, vocab=len(toks), extra_meta=[
        ("tokenizer.ggml.model", V_STR, "llama"),
        ("tokenizer.ggml.tokens", V_ARR, (V_STR, toks)),
        ("tokenizer.ggml.scores", V_ARR, (V_F32, scores)),
        ("tokenizer.ggml.token_type", V_ARR, (V_I32, types))])
    p = subprocess.run([cli, "generate", path, "--prompt", "hello world!", "-n", "2", "--json"],
                       capture_output=True, text=True)
    got = json.loads(p.stdout)["prompt_tokens"] if p.returncode == 0 else p.stderr
    ok = got == want
    print("%s %-40s %s" % ("ok  " if ok else "FAIL", "--prompt SentencePiece encoding",
                           got if not ok else "%d tokens" % len(want)))
    if not ok:
        FAILED.append("tokenizer")
    else:
        check(cli, work, "f16 with a vocabulary, --prompt ids", path, prompt=tuple(want), n=3)


def main():
    cli, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    names = {T_F32: "f32", T_F16: "f16", T_BF16: "bf16", T_Q8_0: "q8_0", T_Q4_0: "q4_0",
             T_Q4_K: "q4_k+q6_k"}
    models = {}
    for typ, nm in names.items():
        path = os.path.join(work, "m_%s.gguf" % nm.replace("+", "_"))
        make_model(path, typ, kv_heads=2, seed=typ)  # grouped-query attention
        models[nm] = path
        check(cli, work, "%s gqa resident" % nm, path)
    # shapes: dense attention with a tied head; another rope base and epsilon
    dense = os.path.join(work, "m_dense_tied.gguf")
    make_model(dense, T_F16, kv_heads=4, tied=True, rope_base=500000.0, eps=1e-6, seed=7)
    check(cli, work, "f16 dense tied resident", dense)
    # placements: the same numbers wherever the weights live
    layer = 2 * 1024 * 1024  # about one f32 layer of these models, so a budget of 3 forces reads
    for nm in ("f32", "q8_0", "q4_k+q6_k"):
        check(cli, work, "%s home disk, host budget" % nm, models[nm],
              ["--home", "disk", "--budget", "host=%d" % (3 * layer)])
    check(cli, work, "q4_0 home disk, direct reads", models["q4_0"],
          ["--home", "disk", "--load", "direct"])
    check(cli, work, "bf16 everything lazy", models["bf16"], ["--lazy", "on"])
    check(cli, work, "f16 dense tied, home disk", dense, ["--home", "disk", "--budget",
                                                          "host=%d" % (3 * layer)])
    check(cli, work, "q8_0 staged as f32", models["q8_0"], ["--compute-dtype", "f32"],
          staged=T_F32)
    # LoRA: merged by ferry at staging, or applied by the engine at runtime
    adapter = os.path.join(work, "lora.gguf")
    p = subprocess.run([cli, "gen", "-q", "--lora", models["f32"], "-o", adapter, "--rank", "4",
                        "--seed", "3"], capture_output=True, text=True)
    if p.returncode != 0:
        FAILED.append("lora gen")
        print("FAIL ferry gen --lora: %s" % p.stderr)
    else:
        check(cli, work, "f32 + LoRA merged", models["f32"], ["-a", adapter + ":0.5"],
              adapters=[(adapter, 0.5)])
        check(cli, work, "f32 + LoRA runtime", models["f32"],
              ["-a", adapter + ":0.5", "--lora-mode", "runtime"], adapters=[(adapter, 0.5)])
        check(cli, work, "f32 + LoRA merged, home disk", models["f32"],
              ["-a", adapter, "--home", "disk", "--budget", "host=%d" % (4 * layer)],
              adapters=[(adapter, 1.0)])
    check_tokenizer(cli, work)
    # Mixtral-style mixtures of experts: 8 experts, 2 used, the router decisive
    # (the q8_0 seed is one where no element of a q8_0 vector lands on a rounding boundary
    # between float32 and float64: at this size one that does moves the logits by 1e-2)
    moe = {}
    for typ, nm, seed in ((T_F32, "f32", 20), (T_F16, "f16", 21), (T_Q8_0, "q8_0", 29)):
        path = os.path.join(work, "m_moe_%s.gguf" % nm)
        make_model(path, typ, dim=128, ff=128, kv_heads=2, layers=3, vocab=256, seed=seed,
                   experts=(8, 2))
        moe[nm] = path
        check(cli, work, "%s moe resident" % nm, path, prompt=(1, 17, 230, 5, 99, 3), moe=True)
    moe_layer = os.path.getsize(moe["f32"]) // 3  # about a layer of the f32 model
    for nm in ("f32", "q8_0"):
        check(cli, work, "%s moe home disk, host budget" % nm, moe[nm],
              ["--home", "disk", "--budget", "host=%d" % (2 * moe_layer), "--batch", "2"],
              moe=True)
    # Qwen3-MoE: heads narrower than dim / heads (q_dim 128 of dim 256), q and k normed per head,
    # NeoX RoPE
    for typ, nm, seed in ((T_F32, "f32", 30), (T_F16, "f16", 31)):
        path = os.path.join(work, "m_qwen3moe_%s.gguf" % nm)
        make_model(path, typ, dim=256, ff=128, heads=4, kv_heads=2, layers=3, vocab=256,
                   seed=seed, experts=(8, 2), arch="qwen3moe", head_dim=32)
        check(cli, work, "%s qwen3moe resident" % nm, path, prompt=(1, 17, 230, 5, 99, 3),
              moe=True)
        if nm == "f32":
            check(cli, work, "f32 qwen3moe home disk, host budget", path,
                  ["--home", "disk", "--budget", "host=%d" % (os.path.getsize(path) // 3),
                   "--batch", "2"], moe=True)
    if FAILED:
        print("generate_numpy: %d checks failed: %s" % (len(FAILED), ", ".join(FAILED)))
        return 1
    print("generate_numpy: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
