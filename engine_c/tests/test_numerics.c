/* test_numerics.c - the numerics variants' building blocks (numerics.c): f16/bf16 rounding to
 * nearest even, ULP noise bounded and deterministic, the reductions on exactly known sums, the
 * vector loops of every path (numerics_x86.c) bit for bit against the reference loops, and config
 * checks. */
#include "harness.h"
#include "kernels.h"
#include "kernels_internal.h"
#include "numerics.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint32_t bits_of(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static float round_with(uint32_t activation, float v)
{
    col_numerics nx = {0};
    nx.activation = activation;
    col_numerics_round(&nx, NULL, &v, 1);
    return v;
}

static void test_rounding(void)
{
    /* bf16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1) */
    CHECK(round_with(COL_ACTIVATION_BF16, 1.0f + 0x1p-8f) == 1.0f);
    CHECK(round_with(COL_ACTIVATION_BF16, 1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
    CHECK((bits_of(round_with(COL_ACTIVATION_BF16, 3.14159f)) & 0xFFFFu) == 0);
    CHECK(isnan(round_with(COL_ACTIVATION_BF16, NAN)));
    /* f16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even */
    CHECK(round_with(COL_ACTIVATION_F16, 1.0f + 0x1p-11f) == 1.0f);
    CHECK(round_with(COL_ACTIVATION_F16, 1.0f + 0x1p-10f + 0x1p-11f) == 1.0f + 0x1p-9f);
    CHECK(round_with(COL_ACTIVATION_F16, 65504.0f) == 65504.0f);
    CHECK(isinf(round_with(COL_ACTIVATION_F16, 65520.0f)));        /* halfway to 2^16: to Inf */
    CHECK(round_with(COL_ACTIVATION_F16, 65519.0f) == 65504.0f);
    CHECK(round_with(COL_ACTIVATION_F16, 0x1p-24f) == 0x1p-24f);  /* smallest subnormal half */
    CHECK(round_with(COL_ACTIVATION_F16, 0x1p-26f) == 0.0f);
    CHECK(round_with(COL_ACTIVATION_F16, -0x1.8p-24f) == -0x1p-23f); /* 1.5 units: to even (2) */
    CHECK(round_with(COL_ACTIVATION_F32, 1.0f + 0x1p-20f) == 1.0f + 0x1p-20f);
}

static void test_noise(void)
{
    col_numerics nx = {0};
    nx.noise_ulps = 3;
    nx.noise_seed = 42;
    int seen_nonzero = 0;
    for (uint32_t p = 0; p < 50; p++) {
        float v[8], w[8];
        for (int j = 0; j < 8; j++) v[j] = w[j] = (float)j - 3.5f;
        col_numerics_perturb(&nx, v, 8, p, 1);
        for (int j = 0; j < 8; j++) {
            int32_t k = col_numerics_noise_ulps(42, 3, p, 1, (uint32_t)j);
            CHECK(k >= -3 && k <= 3);
            float expect = w[j];
            for (int32_t s = 0; s < (k < 0 ? -k : k); s++) expect = nextafterf(expect, k < 0 ? -INFINITY : INFINITY);
            CHECK(bits_of(v[j]) == bits_of(expect));
            seen_nonzero |= k != 0;
        }
    }
    CHECK(seen_nonzero);
    /* N = 0 is a no-op, bit for bit */
    nx.noise_ulps = 0;
    float z = 0.0f;
    col_numerics_perturb(&nx, &z, 1, 0, 0);
    CHECK(bits_of(z) == 0);
}

static void test_reductions(void)
{
    /* x = 1, w = [1e8, 1, -1e8, 1] (exact sum 2): each order gives its own rounding */
    float w[4] = {1e8f, 1.0f, -1e8f, 1.0f}, x[4] = {1, 1, 1, 1}, y = -1;
    col_weight cw = {w, COL_DTYPE_F32, 1, 4, 0};
    col_matvec_job job = {cw, x, &y, 1, NULL};
    col_numerics nx = {0};
    nx.reduction = COL_REDUCTION_SEQUENTIAL;
    col_numerics_matmul(&nx, NULL, &job, 1);
    CHECK(y == ((1e8f + 1.0f) + -1e8f) + 1.0f);
    nx.reduction = COL_REDUCTION_BLOCKED;
    nx.lanes = 2; /* lanes: (1e8 - 1e8), (1 + 1) -> 0 + 2 */
    col_numerics_matmul(&nx, NULL, &job, 1);
    CHECK(y == 2.0f);
    nx.reduction = COL_REDUCTION_SEQUENTIAL;
    nx.lanes = 0;
    nx.split = 2; /* parts [1e8, 1] and [-1e8, 1], combined last first: (-1e8 + 1) + (1e8 + 1) */
    col_numerics_matmul(&nx, NULL, &job, 1);
    CHECK(y == (-1e8f + 1.0f) + (1e8f + 1.0f));
}

/* rows longer than the 16384-element buffer take the 32-at-a-time reader: same bits */
static void test_long_rows(void)
{
    enum { N = 16384 + 96 };
    static uint16_t w[N];
    static float x[N];
    for (int i = 0; i < N; i++) {
        w[i] = (uint16_t)(0x3C00u + (uint32_t)(i * 37) % 1024u); /* f16 values in [1, 2) */
        x[i] = (float)((i * 7919) % 101 - 50) / 64.0f;
    }
    float y = 0.0f, expect = 0.0f;
    for (int i = 0; i < N; i++) expect = fmaf(col_f16_to_f32(w[i]), x[i], expect);
    col_weight cw = {w, COL_DTYPE_F16, 1, N, 0};
    col_matvec_job job = {cw, x, &y, 1, NULL};
    col_numerics nx = {0};
    nx.reduction = COL_REDUCTION_SEQUENTIAL;
    nx.fma = 1;
    col_numerics_matmul(&nx, NULL, &job, 1);
    CHECK(bits_of(y) == bits_of(expect));
}

/* ---- the vector loops against the reference ------------------------------------------- */

static uint32_t rng_state = 777u;
static uint32_t next_u32(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state;
}

/* A value in [-1, 1) scaled by 2^-6 .. 2^6, so sums cancel and round differently in each order. */
static float spread_value(void)
{
    float v = (float)((next_u32() >> 8) & 0xFFFFFF) / (float)0x800000 - 1.0f;
    return ldexpf(v, (int)(next_u32() % 13) - 6);
}

/* `rows` x `cols` random weights of `dtype` in the format's layout: rows, or 8-row panels (each
 * panel's scales first, block by block, then its payload: random bytes either way). */
static uint8_t *random_weights(uint32_t dtype, uint64_t rows, uint64_t cols)
{
    const uint64_t rb = col_dtype_row_bytes(dtype, cols), nb = cols / 32;
    uint8_t *w = malloc(rows * rb + 64);
    if (dtype == COL_DTYPE_Q8_0X8 || dtype == COL_DTYPE_Q4_0X8) {
        for (uint64_t p = 0; p < rows / 8; p++) {
            uint8_t *panel = w + p * 8 * rb;
            for (uint64_t k = 0; k < 8 * nb; k++) { /* f16 2^-8 .. 2^-4, some negative, some subnormal */
                uint16_t d = (uint16_t)(k % 11 == 4 ? 1u + next_u32() % 0x3FFu : 0x1C00u + next_u32() % 0x1000u);
                if (k % 7 == 2) d |= 0x8000u;
                memcpy(panel + 2 * k, &d, 2);
            }
            for (uint64_t i = 16 * nb; i < 8 * rb; i++) panel[i] = (uint8_t)(next_u32() >> 13);
        }
        return w;
    }
    for (uint64_t r = 0; r < rows; r++) {
        uint8_t *row = w + r * rb;
        if (dtype == COL_DTYPE_F32) {
            for (uint64_t i = 0; i < cols; i++) {
                float v = spread_value();
                memcpy(row + 4 * i, &v, 4);
            }
        } else if (dtype == COL_DTYPE_F16 || dtype == COL_DTYPE_BF16) {
            for (uint64_t i = 0; i < cols; i++) { /* normal values of either sign, 2^-12 .. 2^3 */
                uint16_t v = dtype == COL_DTYPE_F16 ? (uint16_t)(0x0C00u + next_u32() % 0x3C00u)
                                                    : (uint16_t)(0x3980u + next_u32() % 0x0800u);
                v |= (uint16_t)(next_u32() & 0x8000u);
                memcpy(row + 2 * i, &v, 2);
            }
        } else {
            for (uint64_t b = 0; b < nb; b++) {
                uint16_t d = (uint16_t)(0x1C00u + next_u32() % 0x1000u); /* f16 2^-8 .. 2^-4 */
                memcpy(row + 2 * b, &d, 2);
            }
            for (uint64_t i = 2 * nb; i < rb; i++) row[i] = (uint8_t)(next_u32() >> 13);
        }
    }
    return w;
}

typedef struct pool_run {
    col_pool *pool;
    void *scratch;
} pool_run;

/* A pool of `threads` on path `isa` (NULL pool when this CPU lacks it). */
static pool_run pool_on(const char *isa, uint32_t threads, uint32_t max_tokens, uint64_t max_cols)
{
    pool_run r = {NULL, NULL};
    setenv("COLIBRI_KERNELS", isa, 1);
    const col_isa chosen = col_choose_isa(COL_ISA_AMX);
    unsetenv("COLIBRI_KERNELS");
    if (strcmp(col_isa_name(chosen), isa) != 0) return r;
    col_allocator alloc;
    col_allocator_or_default(NULL, &alloc);
    col_pool_limits limits = {1, max_tokens * max_cols, max_tokens, max_cols};
    uint64_t bytes = col_pool_scratch_size(chosen, threads, &limits);
    if (posix_memalign(&r.scratch, 64, bytes) != 0) r.scratch = NULL;
    r.pool = col_pool_create(chosen, threads, r.scratch, bytes, &limits, &alloc);
    return r;
}

static void pool_end(pool_run *r)
{
    col_pool_free(r->pool);
    free(r->scratch);
}

typedef struct variant {
    const char *name;
    uint32_t reduction, lanes, fma, split;
} variant;

static const variant variants[] = {
    {"seq", COL_REDUCTION_SEQUENTIAL, 0, 0, 0},
    {"seq+fma", COL_REDUCTION_SEQUENTIAL, 0, 1, 0},
    {"pairwise", COL_REDUCTION_PAIRWISE, 0, 0, 0},
    {"pairwise+fma", COL_REDUCTION_PAIRWISE, 0, 1, 0},
    {"blocked1", COL_REDUCTION_BLOCKED, 1, 0, 0},
    {"blocked3", COL_REDUCTION_BLOCKED, 3, 0, 0},
    {"blocked4", COL_REDUCTION_BLOCKED, 4, 0, 0},
    {"blocked8+fma", COL_REDUCTION_BLOCKED, 8, 1, 0},
    {"blocked16", COL_REDUCTION_BLOCKED, 16, 0, 0},
    {"blocked32+fma", COL_REDUCTION_BLOCKED, 32, 1, 0},
    {"blocked100", COL_REDUCTION_BLOCKED, 100, 0, 0},
    {"blocked256+fma", COL_REDUCTION_BLOCKED, 256, 1, 0},
    {"seq+split2", COL_REDUCTION_SEQUENTIAL, 0, 0, 2},
    {"seq+split4", COL_REDUCTION_SEQUENTIAL, 0, 0, 4},
    {"pairwise+split3", COL_REDUCTION_PAIRWISE, 0, 0, 3},
    {"blocked8+fma+split4", COL_REDUCTION_BLOCKED, 8, 1, 4},
    {"blocked16+split7", COL_REDUCTION_BLOCKED, 16, 0, 7},
    {"seq+split256", COL_REDUCTION_SEQUENTIAL, 0, 0, 256},
};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

static col_numerics numerics_of(const variant *v)
{
    col_numerics nx = {0};
    nx.reduction = v->reduction;
    nx.lanes = v->lanes;
    nx.fma = v->fma;
    nx.split = v->split;
    return nx;
}

static int same_bits(const float *a, const float *b, uint64_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Every variant, dtype and shape: the AVX2 and AVX-512 loops on 1 and 3 threads give the reference
 * loops' bits (the reference: a NULL pool), and a batch of tokens gives each token's bits alone
 * (prefill equals stepping). Weights and activations are spread over 13 binades so that the
 * orders round differently, which the check that the variants disagree with each other confirms. */
static void test_vector_loops_match_the_reference(void)
{
    enum { MAX_T = 9, MAX_C = 1056, MAX_R = 40 };
    static const uint32_t dtypes[] = {COL_DTYPE_F32,  COL_DTYPE_F16,    COL_DTYPE_BF16,
                                      COL_DTYPE_Q8_0, COL_DTYPE_Q4_0, COL_DTYPE_Q8_0X8, COL_DTYPE_Q4_0X8};
    static const uint64_t cols_list[] = {17, 32, 100, 1056};
    static const uint64_t rows_list[] = {1, 7, 16, 37, 40}; /* panels: 16 and 40 */
    static const uint32_t tokens_list[] = {1, 5, 9};
    static const char *paths[] = {"avx2", "avx512"};
    pool_run pools[2][2];
    for (int p = 0; p < 2; p++) {
        pools[p][0] = pool_on(paths[p], 1, MAX_T, MAX_C);
        pools[p][1] = pool_on(paths[p], 3, MAX_T, MAX_C);
        if (!pools[p][0].pool) fprintf(stderr, "numerics %s: not on this CPU, not checked\n", paths[p]);
    }
    static float x[MAX_T * MAX_C], ref[MAX_T * MAX_R], got[MAX_T * MAX_R], one[MAX_R], first[N_VARIANTS][MAX_T * MAX_R];
    int bad = 0, checked = 0, orders_differ = 0;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (size_t c = 0; c < sizeof cols_list / sizeof cols_list[0]; c++) {
            const uint64_t cols = cols_list[c];
            if (dtypes[d] >= COL_DTYPE_Q8_0 && cols % 32) continue;
            for (size_t rr = 0; rr < sizeof rows_list / sizeof rows_list[0]; rr++) {
                const uint64_t rows = rows_list[rr];
                if ((dtypes[d] == COL_DTYPE_Q8_0X8 || dtypes[d] == COL_DTYPE_Q4_0X8) && rows % 8) continue;
                uint8_t *w = random_weights(dtypes[d], rows, cols);
                for (uint64_t i = 0; i < MAX_T * cols; i++) x[i] = spread_value();
                col_weight cw = {w, dtypes[d], rows, cols, 0};
                for (size_t t = 0; t < sizeof tokens_list / sizeof tokens_list[0]; t++) {
                    const uint32_t nt = tokens_list[t];
                    for (size_t v = 0; v < N_VARIANTS; v++) {
                        const col_numerics nx = numerics_of(&variants[v]);
                        col_matvec_job job = {cw, x, ref, nt, NULL};
                        col_numerics_matmul(&nx, NULL, &job, 1);
                        if (t == 0) memcpy(first[v], ref, rows * sizeof(float));
                        else if (v > 0 && !same_bits(first[v], first[0], rows)) orders_differ = 1;
                        for (int p = 0; p < 2; p++)
                            for (int k = 0; k < 2; k++) {
                                if (!pools[p][k].pool) continue;
                                memset(got, 0xFF, sizeof got);
                                job.y = got;
                                col_numerics_matmul(&nx, pools[p][k].pool, &job, 1);
                                checked++;
                                if (!same_bits(got, ref, (uint64_t)nt * rows)) {
                                    if (bad++ < 5)
                                        fprintf(stderr, "numerics %s, %s on %d thread(s): dtype %u, %llu x %llu, %u tokens differ\n",
                                                variants[v].name, paths[p], k ? 3 : 1, dtypes[d], (unsigned long long)rows,
                                                (unsigned long long)cols, nt);
                                }
                                for (uint32_t s = 0; s < nt && k == 1; s++) { /* each token alone */
                                    col_matvec_job step = {cw, x + (uint64_t)s * cols, one, 1, NULL};
                                    col_numerics_matmul(&nx, pools[p][k].pool, &step, 1);
                                    if (!same_bits(one, ref + (uint64_t)s * rows, rows)) bad++;
                                }
                            }
                    }
                }
                free(w);
            }
        }
    CHECK(bad == 0);
    CHECK(checked > 0 || !pools[0][0].pool);
    CHECK(orders_differ); /* the data tells the orders apart, so a wrong order would be caught */
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 2; k++) pool_end(&pools[p][k]);
}

/* bf16 dot products: every path (AVX512-BF16's vdpbf16ps where the CPU has it, its arithmetic in
 * AVX2) gives the bits of the portable definition (a NULL pool), on 1 and 3 threads and a batch as
 * its tokens alone, with widths of whole and partial blocks of 32, and values that reach every rule
 * of the definition: bf16 subnormal weights and activations (read as zero), products and sums below
 * the f32 normal range (flushed), signed zeros, and large values. Against the f32 default the
 * results differ (the activations are rounded) but stay close. */
static void test_bf16_dot_products(void)
{
    enum { MAX_T = 9, MAX_C = 1056, MAX_R = 37 };
    static const uint64_t cols_list[] = {7, 32, 45, 100, 1056};
    static const uint64_t rows_list[] = {1, 7, 37};
    static const uint32_t tokens_list[] = {1, 5, 9};
    static const char *paths[] = {"avx2", "avx512f", "avx512"};
    pool_run pools[3][2];
    for (int p = 0; p < 3; p++) {
        pools[p][0] = pool_on(paths[p], 1, MAX_T, MAX_C);
        pools[p][1] = pool_on(paths[p], 3, MAX_T, MAX_C);
    }
    static uint16_t w[MAX_R * MAX_C];
    static float x[MAX_T * MAX_C], ref[MAX_T * MAX_R], got[MAX_T * MAX_R], one[MAX_R], exact[MAX_T * MAX_R];
    col_numerics nx = {0};
    nx.reduction = COL_REDUCTION_BF16_DOT;
    int bad = 0, checked = 0, far = 0;
    for (size_t c = 0; c < sizeof cols_list / sizeof cols_list[0]; c++)
        for (size_t rr = 0; rr < sizeof rows_list / sizeof rows_list[0]; rr++)
            for (size_t tt = 0; tt < sizeof tokens_list / sizeof tokens_list[0]; tt++) {
                const uint64_t cols = cols_list[c], rows = rows_list[rr];
                const uint32_t nt = tokens_list[tt];
                for (uint64_t i = 0; i < rows * cols; i++) {
                    const uint32_t u = next_u32();
                    switch (u % 16) {
                    case 0: w[i] = (uint16_t)((u >> 8) & 0x807Fu); break;           /* subnormal or zero */
                    case 1: w[i] = (uint16_t)(0x0080u | ((u >> 8) & 0x8000u)); break; /* the smallest normal */
                    case 2: w[i] = (uint16_t)(0x1F00u | ((u >> 8) & 0x80FFu)); break; /* ~1e-20 */
                    default: w[i] = (uint16_t)(0x3980u + (u >> 8) % 0x0800u) | (uint16_t)((u >> 4) & 0x8000u);
                    }
                }
                for (uint64_t i = 0; i < nt * cols; i++) {
                    const uint32_t u = next_u32();
                    x[i] = u % 16 == 0 ? ldexpf(spread_value(), -130) /* rounds to a bf16 subnormal or zero */
                         : u % 16 == 1 ? ldexpf(spread_value(), -66)  /* ~1e-20: products near 1e-40 */
                         : u % 16 == 2 ? (u & 256 ? -0.0f : 0.0f)
                                       : spread_value();
                }
                col_weight cw = {w, COL_DTYPE_BF16, rows, cols, 0};
                col_matvec_job job = {cw, x, ref, nt, NULL};
                col_numerics_matmul(&nx, NULL, &job, 1);
                col_numerics plain = {0};
                plain.reduction = COL_REDUCTION_SEQUENTIAL;
                job.y = exact;
                col_numerics_matmul(&plain, NULL, &job, 1);
                for (uint32_t t = 0; t < nt; t++) /* bf16 activations: each term off by at most 2^-8 of it */
                    for (uint64_t r = 0; r < rows; r++) {
                        double mass = 0.0;
                        for (uint64_t i = 0; i < cols; i++)
                            mass += fabs((double)col_bf16_to_f32(w[r * cols + i]) * x[t * cols + i]);
                        far += fabs((double)ref[t * rows + r] - exact[t * rows + r]) > 0x1p-7 * mass + 1e-30;
                    }
                for (int p = 0; p < 3; p++)
                    for (int k = 0; k < 2; k++) {
                        if (!pools[p][k].pool) continue;
                        memset(got, 0xFF, sizeof got);
                        job.y = got;
                        col_numerics_matmul(&nx, pools[p][k].pool, &job, 1);
                        checked++;
                        if (!same_bits(got, ref, (uint64_t)nt * rows) && bad++ < 5)
                            fprintf(stderr, "bf16 dot, %s on %d thread(s): %llu x %llu, %u tokens differ\n", paths[p],
                                    k ? 3 : 1, (unsigned long long)rows, (unsigned long long)cols, nt);
                        for (uint32_t s = 0; s < nt && k == 1; s++) {
                            col_matvec_job step = {cw, x + (uint64_t)s * cols, one, 1, NULL};
                            col_numerics_matmul(&nx, pools[p][k].pool, &step, 1);
                            bad += !same_bits(one, ref + (uint64_t)s * rows, rows);
                        }
                    }
            }
    CHECK(bad == 0);
    CHECK(checked > 0 || !pools[0][0].pool);
    CHECK(far == 0);
    for (int p = 0; p < 3; p++)
        for (int k = 0; k < 2; k++) pool_end(&pools[p][k]);
}

/* The definition's rules one by one, on a single pair in lane 0 (the odd element first). */
static void test_bf16_dot_definition(void)
{
    uint16_t w[32] = {0};
    float x[32] = {0};
    /* a bf16 subnormal weight reads as zero */
    w[0] = 0x0001;
    x[0] = 1e30f;
    CHECK(col_dot_bf16_portable(w, x, 32) == 0.0f);
    /* an activation that rounds to a bf16 subnormal reads as zero */
    w[0] = 0x3F80; /* 1 */
    x[0] = 1e-39f;
    CHECK(col_dot_bf16_portable(w, x, 32) == 0.0f);
    /* a product below the normal range is flushed: 2^-70 * 2^-70 */
    w[0] = 0x1C80; /* 2^-70 */
    x[0] = 0x1p-70f;
    CHECK(col_dot_bf16_portable(w, x, 32) == 0.0f);
    /* the odd element is added first: 1 + (2^24 - 2^24) versus (1 + 2^24) - 2^24 */
    w[0] = 0x3F80, w[1] = 0x3F80;
    x[0] = 1.0f, x[1] = 16777216.0f; /* lane 0: acc = 2^24 (odd), then 2^24 + 1 rounds to 2^24 */
    CHECK(col_dot_bf16_portable(w, x, 32) == 16777216.0f);
    /* activations round to nearest even bf16: 1 + 2^-8 -> 1 */
    w[0] = 0x3F80, w[1] = 0;
    x[0] = 1.0f + 0x1p-8f, x[1] = 0.0f;
    CHECK(col_dot_bf16_portable(w, x, 32) == 1.0f);
}

/* Each rule of the definition decides one output, on every path: rows of 64 columns whose only
 * nonzero pairs sit in lane 3 (elements 38, 39 of the last block of 32, where no later step can
 * hide a wrong sum; the order case also 6 of the first), so that the output is that lane's sum,
 * and that sum changes if a path breaks the rule. */
static void test_bf16_dot_rules_on_every_path(void)
{
    enum { COLS = 64, CASES = 7 };
    static uint16_t w[CASES * COLS];
    static float x[CASES * COLS], want[CASES], got[CASES];
    const float big = 16777216.0f;
    static const float expect[CASES] = {0.0f, 0.0f, 0x1p-126f, 0.0f, -0.0f, 0.0f, -0.0f};
    struct { uint16_t w6, w38, w39; float x6, x38, x39; } cases[CASES] = {
        /* odd before even: the first block leaves 1, then (1 + 2^24) - 2^24 = 0 (even first: 1) */
        {0x3F80, 0x3F80, 0x3F80, 1.0f, -big, big},
        /* the sum flushed after the even step: 2^-126 - (1 - 2^-7) 2^-126 = 2^-133 -> 0 */
        {0, 0x9FFE, 0x2000, 0, 0x1p-63f, 0x1p-63f},
        /* the sum flushed after the odd step: 2^-130 -> 0, then + 2^-126 (unflushed: 2^-126 + 2^-130) */
        {0, 0x2000, 0x1F00, 0, 0x1p-63f, 0x1p-65f},
        /* subnormal weights read as zero: 2^-133 * 2^100, odd and even */
        {0, 0, 0x0001, 0, 0, 0x1p100f},
        {0, 0x8001, 0, 0, 0x1p100f, 0},
        /* activations that are bf16 subnormals read as zero: 2^100 * 2^-130, odd and even */
        {0, 0, 0x7180, 0, 0, 0x1p-130f},
        {0, 0x7180, 0, 0, -0x1p-130f, 0},
    };
    for (int c = 0; c < CASES; c++) {
        uint16_t *row = w + c * COLS;
        float *xr = x + c * COLS;
        memset(row, 0, COLS * sizeof *row);
        memset(xr, 0, COLS * sizeof *xr);
        row[6] = cases[c].w6, row[38] = cases[c].w38, row[39] = cases[c].w39;
        xr[6] = cases[c].x6, xr[38] = cases[c].x38, xr[39] = cases[c].x39;
    }
    col_numerics nx = {0};
    nx.reduction = COL_REDUCTION_BF16_DOT;
    for (int c = 0; c < CASES; c++) {
        col_matvec_job job = {{w + c * COLS, COL_DTYPE_BF16, 1, COLS, 0}, x + c * COLS, &want[c], 1, NULL};
        col_numerics_matmul(&nx, NULL, &job, 1);
        CHECK(want[c] == expect[c]);
    }
    static const char *paths[] = {"avx2", "avx512f", "avx512"};
    for (int p = 0; p < 3; p++) {
        pool_run r = pool_on(paths[p], 1, 1, COLS);
        if (!r.pool) continue;
        for (int c = 0; c < CASES; c++) {
            col_matvec_job job = {{w + c * COLS, COL_DTYPE_BF16, 1, COLS, 0}, x + c * COLS, &got[c], 1, NULL};
            col_numerics_matmul(&nx, r.pool, &job, 1);
            if (!same_bits(&got[c], &want[c], 1)) {
                fprintf(stderr, "bf16 dot rule %d on %s: %a, the definition %a\n", c, paths[p], got[c], want[c]);
                CHECK(0);
            }
        }
        pool_end(&r);
    }
}

/* Rows longer than the reference's 16384-element row buffer, under every reduction. */
static void test_vector_loops_on_long_rows(void)
{
    enum { COLS = 16384 + 96, ROWS = 19 };
    pool_run pools[2] = {pool_on("avx2", 2, 1, COLS), pool_on("avx512", 2, 1, COLS)};
    uint8_t *w = random_weights(COL_DTYPE_BF16, ROWS, COLS);
    static float x[COLS], ref[ROWS], got[ROWS];
    for (uint64_t i = 0; i < COLS; i++) x[i] = spread_value();
    col_weight cw = {w, COL_DTYPE_BF16, ROWS, COLS, 0};
    int bad = 0;
    for (size_t v = 0; v < N_VARIANTS; v++) {
        const col_numerics nx = numerics_of(&variants[v]);
        col_matvec_job job = {cw, x, ref, 1, NULL};
        col_numerics_matmul(&nx, NULL, &job, 1);
        for (int p = 0; p < 2; p++) {
            if (!pools[p].pool) continue;
            job.y = got;
            col_numerics_matmul(&nx, pools[p].pool, &job, 1);
            bad += !same_bits(got, ref, ROWS);
        }
    }
    CHECK(bad == 0);
    free(w);
    pool_end(&pools[0]);
    pool_end(&pools[1]);
}

static void test_config_checks(void)
{
    col_session_config c;
    memset(&c, 0, sizeof c);
    CHECK(col_numerics_check(&c, NULL, 0) == COL_OK);
    c.reduction = COL_REDUCTION_BLOCKED;
    CHECK(col_numerics_check(&c, NULL, 0) == COL_ERR_INVALID_ARG); /* lanes 0 */
    c.lanes = 8;
    CHECK(col_numerics_check(&c, NULL, 0) == COL_OK);
    c.activation = 9;
    CHECK(col_numerics_check(&c, NULL, 0) == COL_ERR_INVALID_ARG);
    memset(&c, 0, sizeof c);
    c.reduction = COL_REDUCTION_BF16_DOT;
    CHECK(col_numerics_check(&c, NULL, 0) == COL_OK);
    c.fma = 1; /* the dot products fix their own operations */
    CHECK(col_numerics_check(&c, NULL, 0) == COL_ERR_INVALID_ARG);
    c.fma = 0, c.split = 2;
    CHECK(col_numerics_check(&c, NULL, 0) == COL_ERR_INVALID_ARG);
    c.split = 0, c.reduction = COL_REDUCTION_BF16_DOT + 1;
    CHECK(col_numerics_check(&c, NULL, 0) == COL_ERR_INVALID_ARG);
    memset(&c, 0, sizeof c);
    c.fma = 1;
    col_numerics nx = col_numerics_of(&c);
    CHECK(nx.reduction == COL_REDUCTION_SEQUENTIAL && col_numerics_hooks_products(&nx));
    memset(&c, 0, sizeof c);
    c.router_noise_ulps = 2;
    nx = col_numerics_of(&c);
    CHECK(!col_numerics_hooks_products(&nx)); /* noise alone keeps the default kernels */
}

int main(void)
{
    test_rounding();
    test_noise();
    test_reductions();
    test_long_rows();
    test_vector_loops_match_the_reference();
    test_vector_loops_on_long_rows();
    test_bf16_dot_products();
    test_bf16_dot_definition();
    test_bf16_dot_rules_on_every_path();
    test_config_checks();
    return TEST_REPORT();
}
