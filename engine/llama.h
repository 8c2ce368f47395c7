/*
 * llama.h — a llama decoder on ferry: the reference engine behind `ferry generate`, and the
 * template an engine author copies. It sees only <ferry.h>: weights are found, checked, prepared,
 * prefetched and released through the public API, the token embedding is read row by row from a
 * lazy tensor, and the matrix-vector products are ferry_matvec split over a small thread pool.
 *
 * The forward pass is llama.cpp's for general.architecture = "llama": token embedding; per layer
 * RMSNorm, Q/K/V, RoPE (normal mode: adjacent pairs), grouped-query attention over a KV cache,
 * the output projection and residual, RMSNorm, the SwiGLU feed-forward and residual; the output
 * norm and the output head (token_embd.weight when output.weight is absent). With
 * llama.expert_count (Mixtral) the feed-forward is a mixture of experts: softmax over the
 * router's logits, the top llama.expert_used_count experts, their weights renormalised to sum
 * to one, and the weighted sum of each chosen expert's SwiGLU. general.architecture = "qwen3moe"
 * (Qwen3-MoE, qwen3moe.* keys) is the same pass with heads of attention.key_length (Q and K
 * wider or narrower than dim), an RMSNorm over each head of Q and K (attn_q_norm, attn_k_norm)
 * before RoPE in NeoX mode (pairs j and j + rope_dim / 2), and experts of
 * expert_feed_forward_length.
 */
#ifndef FERRY_ENGINE_LLAMA_H
#define FERRY_ENGINE_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include <ferry.h>

/* The architectures the engine runs (general.architecture). */
typedef enum llama_arch {
    LLAMA_ARCH_LLAMA,    /* "llama", Mixtral-style experts when expert_count is set */
    LLAMA_ARCH_QWEN3MOE, /* "qwen3moe": RMSNorm on each head of Q and K, NeoX RoPE, experts */
} llama_arch;

/* The hyperparameters, from the file's metadata (ARCH.*, ARCH llama or qwen3moe) and the
 * embedding's shape. */
typedef struct llama_config {
    llama_arch arch;      /* general.architecture */
    int qk_norm;          /* attn_q_norm / attn_k_norm: RMSNorm over each head of Q and K */
    int rope_neox;        /* RoPE pairs i and i + rope_dim / 2 (NeoX), not adjacent pairs */
    uint32_t n_layer;     /* llama.block_count */
    uint32_t dim;         /* llama.embedding_length */
    uint32_t n_head;      /* llama.attention.head_count */
    uint32_t n_head_kv;   /* llama.attention.head_count_kv (default n_head) */
    uint32_t head_dim;    /* llama.attention.key_length (default dim / n_head) */
    uint32_t kv_dim;      /* n_head_kv * head_dim */
    uint32_t q_dim;       /* n_head * head_dim */
    uint32_t ff;          /* llama.feed_forward_length; an expert's for qwen3moe
                             (expert_feed_forward_length) */
    uint32_t vocab;       /* rows of token_embd.weight */
    uint32_t rope_dim;    /* llama.rope.dimension_count (default head_dim) */
    float rope_base;      /* llama.rope.freq_base (default 10000) */
    float eps;            /* llama.attention.layer_norm_rms_epsilon */
    uint32_t ctx_train;   /* llama.context_length (0: unknown) */
    int tied_output;      /* no output.weight: the head is token_embd.weight */
    uint32_t n_expert;    /* llama.expert_count (0: a dense feed-forward) */
    uint32_t n_expert_used; /* llama.expert_used_count: experts per token (0 when dense) */
} llama_config;

/* The most experts a layer may have (llama.cpp's LLAMA_MAX_EXPERTS). */
#define LLAMA_MAX_EXPERTS 512
/* The most layers ahead look-ahead predicts (llama_set_lookahead_depth). */
#define LLAMA_LOOKAHEAD_MAX 4

typedef struct llama llama;

/* Reads the configuration of the model F has open. 0, or a FERRY_E... code with the reason in
 * ERR. */
int llama_read_config(ferry *f, llama_config *c, char *err, size_t errlen);

/* Bytes the engine itself holds for a context of N_CTX positions, batches of up to N_BATCH tokens
 * (llama_forward_batch; 0 counts as 1) and N_THREADS threads: the KV cache, the activations, a
 * batch's vectors between its products and the threads' scratch. What it reserves against the
 * host budget. */
uint64_t llama_memory_bytes(const llama_config *c, uint32_t n_ctx, uint32_t n_batch,
                            int n_threads);

/* An engine over F's open model: finds every tensor, states what it expects of each
 * (ferry_expect) and validates, allocates the KV cache for N_CTX positions and starts N_THREADS
 * compute threads (the calling thread is one of them). F must outlive it. 0 and *OUT, or a code
 * with the reason in ERR. */
int llama_create(ferry *f, uint32_t n_ctx, int n_threads, llama **out, char *err, size_t errlen);
/* Stops the threads and frees everything the engine allocated. NULL is a no-op. */
void llama_destroy(llama *m);
/* Runtime LoRA (ferry_lora_set_mode(f, FERRY_LORA_RUNTIME)): nonzero makes every product add the
 * adapter terms ferry_lora_factors gives for its weight. Off by default (merge mode: ferry merged
 * them into the staged copies already). */
void llama_set_lora_runtime(llama *m, int on);
/* Mixture of experts: nonzero guesses (ferry_prefetch_guess) the experts predicted for the next
 * layer while a layer computes, so that a wrong guess costs its read and never an expert the
 * policy would have kept; 0 (the default) brings each layer's experts in only once they are routed
 * to. Off by default: with the disk as the bound the stalls it saves are a few percent
 * (bench/README.md, MoE look-ahead). */
void llama_set_lookahead(llama *m, int on);
/* Look-ahead: only the predictions of router probability at least P (0, the default: all) are
 * fetched. */
void llama_set_lookahead_min(llama *m, float p);
/* Look-ahead: after layer L's attention, predict and guess the experts of layers L + 1 .. L +
 * DEPTH (1 to LLAMA_LOOKAHEAD_MAX; default 1), each with its own router applied to the same
 * residual stream, nearest first: a read started D layers ahead has D layers of compute to hide
 * behind. Returns 0, or FERRY_EINVAL for a depth out of range. */
int llama_set_lookahead_depth(llama *m, uint32_t depth);
/* Mixture of experts: each expert is a slice of its own (ferry_slice), prepared alone as the
 * router chooses it, unless this is called: then each layer's three whole expert tensors are
 * prepared and an expert's rows are read in place. For when the whole tensors are resident (a
 * prepare of them is then free), where each slice would be read into a second copy of its rows.
 * For good: the slices are not made again. */
void llama_drop_expert_slices(llama *m);
/* The configuration read at create. */
const llama_config *llama_get_config(const llama *m);

/* Evaluates TOKEN at position POS (0, 1, 2, ... in order; POS < n_ctx): the KV cache gets its
 * keys and values, and *LOGITS points at vocab floats, valid until the next call. 0, or a code
 * with the reason in ERR. */
int llama_forward(llama *m, uint32_t token, uint32_t pos, const float **logits, char *err,
                  size_t errlen);

/* Evaluates the N tokens TOKENS at positions POS0, POS0 + 1, ... layer by layer: each layer's
 * attention block and feed-forward block are prepared once for the whole batch (a prompt reads
 * the model once, not once per token), and each token goes through them in order with the same
 * arithmetic as llama_forward, so the results are the same bits. (One token takes a dense layer
 * in four prepared steps: Q/K/V, Wo, gate/up, down.) LOGITS receives N rows of vocab floats. 0, or a code with the reason in ERR. */
int llama_forward_batch(llama *m, const uint32_t *tokens, uint32_t n, uint32_t pos0,
                        float *logits, char *err, size_t errlen);

/* Mixture of experts: the experts token T (0 .. n-1) of the last llama_forward_batch (or
 * llama_forward: T = 0) went through, n_layer rows of n_expert_used ids, each row ascending.
 * Valid until the next forward call; NULL for a dense model or T outside the last batch. */
const uint32_t *llama_routing(const llama *m, uint32_t t);

/* Mixture of experts: after each layer's attention the engine predicts the next layer's experts
 * (that layer's router applied to the residual stream normalised by its ffn_norm). *HITS: how
 * many predicted experts were then chosen, *PREDICTIONS: how many were predicted, since create
 * (both 0 for a dense model). */
void llama_routing_stats(const llama *m, uint64_t *hits, uint64_t *predictions);
/* As llama_routing_stats, for the predictions made D + 1 layers ahead (D < the look-ahead depth;
 * D = 0 is llama_routing_stats). */
void llama_routing_stats_depth(const llama *m, uint32_t d, uint64_t *hits, uint64_t *predictions);

#endif
