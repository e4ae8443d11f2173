/* int8_cases.h - what the int8 kernel tests (test_int8_avx2.c, test_int8_amx.c) check against,
 * written out here from docs/format.md's layouts independently of the engine: the block-order
 * definition of a q8_0/q4_0 product (per token, the activations quantised per block of 32:
 * d_x = max|x| / 127, q = x / d_x rounded half to even, clamped to +-127, a NaN product to -127;
 * then per output over the blocks in order acc = fmaf((float)isum, d_w * d_x, acc)), random and
 * extreme weights and activations, and rows rearranged as stored 8-row panels. Each test file has
 * its own copy of the generator's state. */
#ifndef COLIBRI_TESTS_INT8_CASES_H
#define COLIBRI_TESTS_INT8_CASES_H

#include "kernels_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rng_state = 2024u;
static inline uint32_t rnd(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}
static inline float frand(void) /* uniform in [-1, 1) */
{
    return (float)(rnd() & 0xFFFFFF) / (float)0x800000 - 1.0f;
}

/* ---- the definition ------------------------------------------------------------------------ */

static inline int32_t stored_q(const uint8_t *row, uint32_t dtype, uint64_t nb, uint64_t i)
{
    const uint8_t *payload = row + 2 * nb;
    if (dtype == COL_DTYPE_Q8_0) return (int8_t)payload[i];
    const uint8_t byte = payload[i / 32 * 16 + i % 16];
    return (int32_t)(i % 32 < 16 ? byte & 0x0F : byte >> 4) - 8;
}

static inline float definition(const uint8_t *row, uint32_t dtype, const float *x, uint64_t cols)
{
    const uint64_t nb = cols / 32;
    float acc = 0.0f;
    for (uint64_t b = 0; b < nb; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[32 * b + j]) > amax) amax = fabsf(x[32 * b + j]);
        const float dx = amax / 127.0f, id = dx > 0.0f ? 1.0f / dx : 0.0f;
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) {
            const float v = x[32 * b + j] * id;
            const int32_t q = v != v ? -127 : v >= 127.0f ? 127 : v <= -127.0f ? -127 : (int32_t)nearbyintf(v);
            isum += stored_q(row, dtype, nb, 32 * b + (uint64_t)j) * q;
        }
        uint16_t h;
        memcpy(&h, row + 2 * b, 2);
        acc = fmaf((float)isum, col_f16_to_f32(h) * dx, acc);
    }
    return acc;
}

/* ---- inputs ---------------------------------------------------------------------------------- */

/* f16 scales: normal ones of 2^-10 .. 2^-4, and with `extreme` also the special values. */
static inline uint16_t scale_bits(bool extreme)
{
    static const uint16_t special[] = {0x0001, 0x03FF, 0x7BFF, 0xFBFF, 0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01};
    if (extreme && rnd() % 3 == 0) return special[rnd() % (sizeof special / sizeof *special)];
    return (uint16_t)(0x1400 + rnd() % 0x1400) | (uint16_t)(rnd() % 2 ? 0x8000 : 0);
}

static inline uint8_t *weights(uint64_t rows, uint64_t cols, uint32_t dtype, bool extreme)
{
    const uint64_t nb = cols / 32, rb = col_dtype_row_bytes(dtype, cols), pb = dtype == COL_DTYPE_Q8_0 ? 32 : 16;
    uint8_t *out = malloc(rows * rb);
    for (uint64_t r = 0; r < rows; r++) {
        uint8_t *row = out + r * rb;
        for (uint64_t b = 0; b < nb; b++) {
            const uint16_t h = scale_bits(extreme);
            memcpy(row + 2 * b, &h, 2);
            uint8_t *payload = row + 2 * nb + pb * b;
            /* extreme blocks: q8_0 all -128 or all 127, q4_0 all 0 (-8) or all 15 (7), or zero */
            const uint32_t kind = extreme ? rnd() % 4 : 3;
            for (uint64_t i = 0; i < pb; i++)
                payload[i] = kind == 0 ? (dtype == COL_DTYPE_Q8_0 ? 0x80 : 0x00)
                           : kind == 1 ? (dtype == COL_DTYPE_Q8_0 ? 0x7F : 0xFF)
                           : kind == 2 ? (dtype == COL_DTYPE_Q8_0 ? 0x00 : 0x88)
                                       : (uint8_t)rnd();
        }
    }
    return out;
}

static inline float *activations(uint32_t nt, uint64_t cols, bool extreme)
{
    float *x = malloc(nt * cols * sizeof *x);
    for (uint64_t b = 0; b < nt * cols / 32; b++) {
        /* extreme blocks: all +max or all -max (q = +-127), zero, huge, or one Inf among random */
        const uint32_t kind = extreme ? rnd() % 6 : 5;
        for (int j = 0; j < 32; j++) {
            float v = frand();
            if (kind == 0) v = 3.0e38f;
            if (kind == 1) v = -3.0e38f;
            if (kind == 2) v = 0.0f;
            if (kind == 3) v *= 1.0e37f;
            if (kind == 4 && j == 7) v = rnd() % 2 ? INFINITY : -INFINITY;
            x[32 * b + (uint64_t)j] = v;
        }
    }
    return x;
}

/* ---- weights stored in 8-row panels ----------------------------------------------------------- */

/* The rows of w as panels, from the layout kernels_internal.h states: per 8 rows, the blocks' 8
 * scales each, then per block 4-byte group g of row r at 32g + 4r. */
static inline uint8_t *as_panels(const uint8_t *w, uint64_t rows, uint64_t cols, uint32_t dtype)
{
    const uint64_t nb = cols / 32, rb = col_dtype_row_bytes(dtype, cols), pb = dtype == COL_DTYPE_Q8_0 ? 32 : 16;
    uint8_t *out = malloc(rows * rb);
    for (uint64_t p = 0; p < rows / 8; p++) {
        uint8_t *panel = out + 8 * p * rb, *payload = panel + 16 * nb;
        for (uint64_t r = 0; r < 8; r++) {
            const uint8_t *row = w + (8 * p + r) * rb;
            for (uint64_t b = 0; b < nb; b++) {
                memcpy(panel + 16 * b + 2 * r, row + 2 * b, 2);
                for (uint64_t g = 0; g < pb / 4; g++) memcpy(payload + 8 * pb * b + 32 * g + 4 * r, row + 2 * nb + pb * b + 4 * g, 4);
            }
        }
    }
    return out;
}

/* A pool and its scratch, made on one kernel path. */
typedef struct run {
    col_pool *pool;
    void *scratch;
} run;

/* A pool on path `kernels` (COLIBRI_KERNELS; NULL: the best this CPU has) for products within
 * (max_jobs, max_tokens, max_cols). */
static inline run pool_on(const char *kernels, uint32_t threads, uint32_t max_jobs, uint32_t max_tokens, uint64_t max_cols)
{
    run r = {NULL, NULL};
    if (kernels) setenv("COLIBRI_KERNELS", kernels, 1);
    col_allocator alloc;
    col_allocator_or_default(NULL, &alloc);
    col_pool_limits limits = {max_jobs, (uint64_t)max_jobs * max_tokens * max_cols, max_tokens, max_cols};
    const col_isa isa = col_choose_isa(COL_ISA_AMX);
    const uint64_t bytes = col_pool_scratch_size(isa, threads, &limits);
    if (posix_memalign(&r.scratch, 64, bytes) != 0) r.scratch = NULL;
    r.pool = col_pool_create(isa, threads, r.scratch, bytes, &limits, &alloc);
    unsetenv("COLIBRI_KERNELS");
    return r;
}

static inline void pool_done(run *r)
{
    col_pool_free(r->pool);
    free(r->scratch);
}

/* Equal bits, or both NaN. */
static inline bool same(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b);
}

#endif
