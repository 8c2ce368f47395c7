/*
 * gen_lora.h — synthetic LoRA adapters for `ferry gen --lora BASE`: factors for every attention
 * and feed-forward weight (and every conv kernel) of a base model, in the PEFT, kohya or GGUF
 * naming scheme, deterministic from a seed. Uses only the public header ferry.h; part of
 * ferry_tools.
 */
#ifndef FERRY_GEN_LORA_H
#define FERRY_GEN_LORA_H

#include <stdint.h>

#include "ferry.h"

/* Writes OUT_PATH atomically: a LoRA adapter of RANK (1 .. 65536) for the model at BASE_PATH
 * (anything ferry_catalog_add opens), in SCHEME "peft" (safetensors, HF module names under
 * "base_model.model.", metadata "lora_alpha"), "kohya" (safetensors, "lora_unet_" + the base
 * name with '.' -> '_', ".lora_down.weight" / ".lora_up.weight" / ".alpha") or "gguf" (GGUF,
 * "<base name>.lora_a" / ".lora_b", "adapter.lora.alpha"); NULL means "peft". Covered: llama
 * attention and feed-forward weights (attn_q/k/v/output, ffn_gate/up/down, or their HF names),
 * diffusers attention and feed-forward weights (to_q/k/v, to_out.0, ff.net.*), and every 4-D
 * conv kernel (conv LoRA: down [rank, in, kh, kw], up [out, rank, 1, 1]). Factors are f16,
 * A ~ N(0, 1/in), B ~ N(0, 0.01^2) (never all zero, so merges are visible), alpha = 2 * rank;
 * the same base, rank, scheme and seed give the same bytes. After writing, the adapter is opened
 * against the base through ferry_lora_add and must map every pair (a self-check).
 * Prints one summary line on stdout unless QUIET; errors go to stderr as "ferry gen: ...".
 * Returns 0, 1 on failure, 2 for a bad argument (as the CLI's exit statuses). */
int ferry_gen_lora(const char *base_path, const char *out_path, unsigned rank, const char *scheme,
                   uint64_t seed, int quiet);
/* Whether ferry_gen_lora gives base tensor T factors (the coverage listed above). */
int ferry_gen_lora_is_target(const ferry_tensor_info *t);

#endif
