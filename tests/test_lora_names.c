/*
 * test_lora_names.c — ferry_lora_gguf_name and ferry_lora_hf_name, the llama name table that
 * ferry_lora_add maps adapter names with: every entry both ways, ".weight" kept, names outside
 * the table, and a buffer too small (cut as snprintf cuts, the full length returned).
 */
#include <stdint.h>

#include "check.h"
#include "ferry.h"

static void check_pair(const char *hf, const char *gguf)
{
    char buf[128];
    CHECK_EQ_INT((int)ferry_lora_gguf_name(hf, buf, sizeof buf), (int)strlen(gguf));
    CHECK_STR(buf, gguf);
    CHECK_EQ_INT((int)ferry_lora_hf_name(gguf, buf, sizeof buf), (int)strlen(hf));
    CHECK_STR(buf, hf);
}

static void test_table(void)
{
    check_pair("model.layers.0.self_attn.q_proj", "blk.0.attn_q");
    check_pair("model.layers.1.self_attn.k_proj", "blk.1.attn_k");
    check_pair("model.layers.2.self_attn.v_proj", "blk.2.attn_v");
    check_pair("model.layers.31.self_attn.o_proj", "blk.31.attn_output");
    check_pair("model.layers.4.mlp.gate_proj", "blk.4.ffn_gate");
    check_pair("model.layers.5.mlp.up_proj", "blk.5.ffn_up");
    check_pair("model.layers.6.mlp.down_proj", "blk.6.ffn_down");
    check_pair("model.layers.7.input_layernorm", "blk.7.attn_norm");
    check_pair("model.layers.123456789.post_attention_layernorm", "blk.123456789.ffn_norm");
    check_pair("model.embed_tokens", "token_embd");
    check_pair("lm_head", "output");
    check_pair("model.norm", "output_norm");
    check_pair("model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight");
    check_pair("lm_head.weight", "output.weight");

    /* other HF spellings map to GGUF, and back to the "model." one */
    char buf[64];
    CHECK_EQ_INT((int)ferry_lora_gguf_name("layers.8.mlp.up_proj", buf, sizeof buf), 12);
    CHECK_STR(buf, "blk.8.ffn_up");
    CHECK_EQ_INT((int)ferry_lora_gguf_name("embed_tokens.weight", buf, sizeof buf), 17);
    CHECK_STR(buf, "token_embd.weight");
}

static void test_outside(void)
{
    static const char *const hf_no[] = {
        "", ".weight", "model.layers.x.self_attn.q_proj", "model.layers.1234567890.mlp.up_proj",
        "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn", "model.layers.0.",
        "model.layers.0", "text_model.encoder.layers.0.self_attn.q_proj", "blk.0.attn_q",
        "model.layers.0.mlp.fc1", "weight", "model.embed_tokens.weight.weight", "token_embd",
    };
    static const char *const gguf_no[] = {
        "", "blk.", "blk.0", "blk.0.", "blk.0.weight", "blk.a.attn_q", "blk.0.attn_qq",
        "blk.1234567890.attn_q", "model.layers.0.self_attn.q_proj", "lm_head", "blk.0.attn_q.bias",
    };
    char buf[64] = "untouched";
    for (size_t i = 0; i < sizeof hf_no / sizeof hf_no[0]; i++) {
        CHECK_EQ_INT((int)ferry_lora_gguf_name(hf_no[i], buf, sizeof buf), 0);
        if (ferry_lora_gguf_name(hf_no[i], buf, sizeof buf))
            fprintf(stderr, "  mapped: '%s' -> '%s'\n", hf_no[i], buf);
    }
    for (size_t i = 0; i < sizeof gguf_no / sizeof gguf_no[0]; i++) {
        CHECK_EQ_INT((int)ferry_lora_hf_name(gguf_no[i], buf, sizeof buf), 0);
        if (ferry_lora_hf_name(gguf_no[i], buf, sizeof buf))
            fprintf(stderr, "  mapped: '%s' -> '%s'\n", gguf_no[i], buf);
    }
    CHECK_EQ_INT((int)ferry_lora_gguf_name(NULL, buf, sizeof buf), 0);
    CHECK_EQ_INT((int)ferry_lora_hf_name(NULL, buf, sizeof buf), 0);
    CHECK_EQ_INT((int)ferry_lora_hf_name("blk.0.attn_q", NULL, 1), 0); /* no buffer, a size */
}

static void test_short_buffer(void)
{
    /* the length of the whole name, even when it is cut; NULL with 0 asks for the length */
    CHECK_EQ_INT((int)ferry_lora_hf_name("blk.0.attn_q", NULL, 0), 31);
    CHECK_EQ_INT((int)ferry_lora_hf_name("blk.0.attn_q.weight", NULL, 0), 38);
    char buf[8];
    memset(buf, 'x', sizeof buf);
    CHECK_EQ_INT((int)ferry_lora_hf_name("blk.0.attn_q", buf, sizeof buf), 31);
    CHECK_STR(buf, "model.l");
    char big[40];
    for (size_t cap = 1; cap <= sizeof big; cap++) {
        memset(big, 'x', sizeof big);
        CHECK_EQ_INT((int)ferry_lora_gguf_name("model.layers.3.self_attn.q_proj.weight", big,
                                               cap), 19);
        CHECK(memchr(big, 0, cap) != NULL); /* always terminated */
        CHECK(strncmp(big, "blk.3.attn_q.weight", cap - 1) == 0);
    }
}

int main(void)
{
    test_table();
    test_outside();
    test_short_buffer();
    return check_finish();
}
