/*
 * tokenizer.h — the vocabulary a GGUF file carries (tokenizer.ggml.*), with llama.cpp's
 * SentencePiece ("llama") tokenizer: text to token ids, and token ids to their text pieces.
 */
#ifndef FERRY_ENGINE_TOKENIZER_H
#define FERRY_ENGINE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include <ferry.h>

typedef struct tokenizer tokenizer;

/* The vocabulary of CAT's model; NULL (and the reason in ERR) when it carries none or one this
 * reads not (tokenizer.ggml.model other than "llama"). Valid while CAT is. */
tokenizer *tokenizer_create(const ferry_catalog *cat, char *err, size_t errlen);
void tokenizer_destroy(tokenizer *t);
uint32_t tokenizer_size(const tokenizer *t);
/* Tokens of TEXT into OUT (at most MAX; BOS first when the vocabulary asks for it); the number
 * written, or -1 when MAX is too small or memory runs out. */
long tokenizer_encode(const tokenizer *t, const char *text, uint32_t *out, size_t max);
/* The text of token ID as it appears in decoded output (U+2581 as a space, <0xNN> as that byte,
 * control tokens empty) into BUF; its length (not NUL-terminated past it: BUF gets a NUL when
 * room). */
size_t tokenizer_piece(const tokenizer *t, uint32_t id, char *buf, size_t cap);

#endif
