/*
 * xorshift.h — the tests' pseudo-random numbers: Marsaglia's xorshift64 (shifts 13, 7, 17), a
 * state per caller, so that a test's numbers depend only on its seed.
 */
#ifndef FERRY_TEST_XORSHIFT_H
#define FERRY_TEST_XORSHIFT_H

#include <stdint.h>

/* Advances *S (never 0) and returns its new value. */
static inline uint64_t xorshift_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* 32 bits of the next value (its bits 11..42). */
static inline uint32_t xorshift_u32(uint64_t *s)
{
    return (uint32_t)(xorshift_next(s) >> 11);
}

/* A float in [-1, 1] in steps of 1/10000. */
static inline float xorshift_unit(uint64_t *s)
{
    return (float)(xorshift_u32(s) % 20001) / 10000.0f - 1.0f;
}

#endif
