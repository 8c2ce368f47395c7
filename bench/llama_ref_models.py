#!/usr/bin/env python3
"""llama_ref_models.py — writes llama GGUF models with llama.cpp's own writer (gguf-py), for
comparing `ferry generate` with llama.cpp on the same file (bench/llama_compare.sh).

Random N(0, 0.02) weights, RMSNorm weights of one, the SentencePiece vocabulary (and its tokenizer
metadata) copied from llama.cpp's models/ggml-vocab-llama-spm.gguf. f32 or f16 weights; the other
types come from llama-quantize. --experts N --experts-used K writes a Mixtral-style model: the
router ffn_gate_inp N(0, 1) in f32 (as llama.cpp's converter keeps it; routing is then
decisive), ffn_{gate,up,down}_exps N(0, 0.02) stacked over the experts. --arch qwen3moe writes
a Qwen3-MoE model (needs --experts): attn_q_norm / attn_k_norm N(1, 0.1) over each head of
--head-dim (default dim / heads), the experts --ff wide (expert_feed_forward_length).

    PYTHONPATH=LLAMA_CPP/gguf-py /usr/bin/python3 llama_ref_models.py VOCAB.gguf OUT.gguf \
        [--dim D] [--ff F] [--layers L] [--heads H] [--kv-heads K] [--tied] [--f32] [--seed S] \
        [--experts N --experts-used K] [--arch llama|qwen3moe] [--head-dim HD]
"""
import argparse

import numpy as np
import gguf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vocab")
    ap.add_argument("out")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--ff", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--f32", action="store_true")
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--experts", type=int, default=0)
    ap.add_argument("--experts-used", type=int, default=2)
    ap.add_argument("--arch", choices=("llama", "qwen3moe"), default="llama")
    ap.add_argument("--head-dim", type=int, default=0)
    a = ap.parse_args()
    if a.arch == "qwen3moe" and not a.experts:
        ap.error("--arch qwen3moe needs --experts")
    kvh = a.kv_heads or a.heads
    hd = a.head_dim or a.dim // a.heads
    rng = np.random.default_rng(a.seed)
    vt = np.float32 if a.f32 else np.float16

    r = gguf.GGUFReader(a.vocab)
    tokens = [r.fields["tokenizer.ggml.tokens"].parts[i].tobytes()
              for i in r.fields["tokenizer.ggml.tokens"].data]
    scores = list(r.fields["tokenizer.ggml.scores"].contents())
    types = list(r.fields["tokenizer.ggml.token_type"].contents())
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(a.out, a.arch)
    w.add_name("ferry-ref")
    w.add_block_count(a.layers)
    w.add_context_length(2048)
    w.add_embedding_length(a.dim)
    w.add_feed_forward_length(a.ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(kvh)
    w.add_rope_dimension_count(hd)
    if a.head_dim or a.arch == "qwen3moe":
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_freq_base(a.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    if a.experts:
        w.add_expert_count(a.experts)
        w.add_expert_used_count(a.experts_used)
        if a.arch == "qwen3moe":
            w.add_expert_feed_forward_length(a.ff)
    w.add_file_type(0 if a.f32 else 1)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(int(r.fields["tokenizer.ggml.bos_token_id"].contents()))
    w.add_eos_token_id(int(r.fields["tokenizer.ggml.eos_token_id"].contents()))
    w.add_unk_token_id(int(r.fields["tokenizer.ggml.unknown_token_id"].contents()))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def mat(name, rows, cols):
        w.add_tensor(name, rng.normal(0, 0.02, size=(rows, cols)).astype(vt))

    def norm(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    mat("token_embd.weight", n_vocab, a.dim)
    for l in range(a.layers):
        p = "blk.%d." % l
        norm(p + "attn_norm.weight", a.dim)
        mat(p + "attn_q.weight", a.heads * hd, a.dim)
        mat(p + "attn_k.weight", kvh * hd, a.dim)
        mat(p + "attn_v.weight", kvh * hd, a.dim)
        mat(p + "attn_output.weight", a.dim, a.heads * hd)
        if a.arch == "qwen3moe":
            for part in ("q", "k"):
                w.add_tensor(p + "attn_%s_norm.weight" % part,
                             rng.normal(1, 0.1, size=hd).astype(np.float32))
        norm(p + "ffn_norm.weight", a.dim)
        if a.experts:
            w.add_tensor(p + "ffn_gate_inp.weight",
                         rng.normal(0, 1, size=(a.experts, a.dim)).astype(np.float32))
            for part, rows, cols in (("gate", a.ff, a.dim), ("up", a.ff, a.dim),
                                     ("down", a.dim, a.ff)):
                w.add_tensor(p + "ffn_%s_exps.weight" % part,
                             rng.normal(0, 0.02, size=(a.experts, rows, cols)).astype(vt))
            continue
        mat(p + "ffn_gate.weight", a.ff, a.dim)
        mat(p + "ffn_up.weight", a.ff, a.dim)
        mat(p + "ffn_down.weight", a.dim, a.ff)
    norm("output_norm.weight", a.dim)
    if not a.tied:
        mat("output.weight", n_vocab, a.dim)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
