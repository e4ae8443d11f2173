/* test_int8_amx.c - q8_0 and q4_0 batches on AMX-INT8 tiles (kernels_amx.c) give the bits of the
 * block-order definition: the definition written out in int8_cases.h (as test_int8_avx2.c uses it),
 * the portable reference and the AVX-512 path (COLIBRI_KERNELS=avx512) agree with the AMX pools on 1, 2
 * and 3 threads and with the kernel called directly over shares of rows, for weights in rows and
 * in stored 8-row panels: rows not a multiple of 16 (a last panel of 8; rows of any count), token
 * counts around the 16 of a tile (a last group of 1..15 tokens), one block, an odd block count, a
 * partial last q4_0 group, long rows; extreme scales and activations; several experts' products of
 * different token counts in one batch; and each token of a batch stepped alone. Skips where the
 * CPU or the OS gives no AMX-INT8. */
#include "harness.h"
#include "int8_cases.h"
#include "kernels_amx.h"
#include "kernels_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the AMX path ----------------------------------------------------------------------------- */

typedef struct tally {
    int checked, off_definition, off_portable, off_avx512, off_amx, off_kernel, off_step, nonfinite;
} tally;

enum { N_POOLS = 5, MAX_T = 70, MAX_C = 4160, MAX_JOBS = 4 };
static run pools[N_POOLS]; /* portable, AVX-512, AMX on 1, 2 and 3 threads */

/* The product of `wt` and nt tokens x through every pool and through the AMX kernel called directly
 * (the whole matrix, then in two shares of a multiple of 16 rows), each against want; the AMX pool
 * of 2 threads also steps every token alone. */
static void check_product(col_weight wt, const float *x, uint32_t nt, const float *want, tally *t)
{
    const uint64_t rows = wt.rows, cols = wt.cols, qb = col_qrow_bytes(cols);
    float *y = malloc(nt * rows * sizeof *y), *ystep = malloc(rows * sizeof *ystep);
    for (int p = 0; p < N_POOLS; p++) {
        memset(y, 0xFF, nt * rows * sizeof *y);
        col_matvec_job job = {wt, x, y, nt, NULL};
        col_matmul_many(pools[p].pool, &job, 1);
        int *off = p == 0 ? &t->off_portable : p == 1 ? &t->off_avx512 : &t->off_amx;
        for (uint64_t i = 0; i < nt * rows; i++) *off += !same(y[i], want[i]);
        t->checked += (int)(nt * rows);
    }
    for (uint32_t k = 0; k < nt; k++) { /* each token stepped alone */
        col_matvec_job step = {wt, x + k * cols, ystep, 1, NULL};
        col_matmul_many(pools[3].pool, &step, 1);
        for (uint64_t r = 0; r < rows; r++) t->off_step += !same(ystep[r], want[k * rows + r]);
    }
    uint8_t *qx = malloc(nt * qb), *stage = aligned_alloc(64, (col_amx_int8_stage_bytes(cols) + 63) / 64 * 64);
    for (uint32_t k = 0; k < nt; k++) col_quantize_row(x + k * cols, cols, wt.dtype, COL_ISA_AVX512, qx + k * qb);
    const col_matvec_job job = {wt, x, y, nt, NULL};
    for (int split = 0; split < 2; split++) {
        memset(y, 0xFF, nt * rows * sizeof *y);
        const uint64_t mid = split ? rows / 32 * 16 : rows;
        col_amx_int8_rows(&job, qx, stage, 0, mid);
        if (mid < rows) col_amx_int8_rows(&job, qx, stage, mid, rows);
        for (uint64_t i = 0; i < nt * rows; i++) t->off_kernel += !same(y[i], want[i]);
    }
    free(y), free(ystep), free(qx), free(stage);
}

/* One shape, weights in rows (q8_0, q4_0) or panels (q8_0x8, q4_0x8), against the definition of
 * its rows (checked against the portable reference first). */
static void check_shape(uint32_t dtype, bool stored, uint64_t rows, uint64_t cols, uint32_t nt, bool extreme, tally *t)
{
    uint8_t *w = weights(rows, cols, dtype, extreme), *wp = stored ? as_panels(w, rows, cols, dtype) : NULL;
    const uint32_t kind = stored ? (dtype == COL_DTYPE_Q8_0 ? COL_DTYPE_Q8_0X8 : COL_DTYPE_Q4_0X8) : dtype;
    float *x = activations(nt, cols, extreme), *want = malloc(nt * rows * sizeof *want);
    const uint64_t rb = col_dtype_row_bytes(dtype, cols);
    uint8_t *qx = malloc(col_qrow_bytes(cols));
    for (uint32_t k = 0; k < nt; k++) {
        col_quantize_row(x + k * cols, cols, kind, COL_ISA_PORTABLE, qx);
        for (uint64_t r = 0; r < rows; r++) {
            const float def = definition(w + r * rb, dtype, x + k * cols, cols);
            want[k * rows + r] = def;
            t->off_definition += !same(col_dotq_stored(stored ? wp : w, kind, r, qx, cols), def);
            t->nonfinite += !isfinite(def);
        }
    }
    const col_weight wt = {stored ? wp : w, kind, rows, cols, 0};
    check_product(wt, x, nt, want, t);
    free(w), free(wp), free(x), free(want), free(qx);
}

static void report(const char *what, const tally *t)
{
    fprintf(stderr,
            "%s: %d outputs (%d not finite); off the definition: portable %d %d, avx512 %d, amx pools %d, amx kernel %d; "
            "step != batch %d\n",
            what, t->checked, t->nonfinite, t->off_definition, t->off_portable, t->off_avx512, t->off_amx, t->off_kernel,
            t->off_step);
    CHECK(t->checked > 0);
    CHECK(t->off_definition == 0);
    CHECK(t->off_portable == 0);
    CHECK(t->off_avx512 == 0);
    CHECK(t->off_amx == 0);
    CHECK(t->off_kernel == 0);
    CHECK(t->off_step == 0);
}

static const uint32_t dtypes[] = {COL_DTYPE_Q8_0, COL_DTYPE_Q4_0};
#define COUNT(a) (sizeof(a) / sizeof *(a))

/* Rows in panels and around the 16 of a tile, columns of one block to long rows, with partial
 * q4_0 groups; token counts around the tile's 16 and the smallest batch the tiles take. */
static void test_shapes(bool stored)
{
    static const uint64_t cols_list[] = {32, 96, 224, 1056, 4160};
    static const uint64_t panel_rows[] = {8, 16, 24, 40, 72};
    static const uint64_t row_rows[] = {1, 5, 16, 17, 35};
    static const uint32_t tokens_list[] = {COL_AMX_INT8_MIN_TOKENS_Q8, COL_AMX_INT8_MIN_TOKENS_Q4, COL_AMX_INT8_MIN_TOKENS_Q8_ROWS, 15, 16, 17, 33, 70};
    for (size_t d = 0; d < 2; d++) {
        tally t = {0};
        for (size_t c = 0; c < COUNT(cols_list); c++)
            for (size_t r = 0; r < COUNT(panel_rows); r++)
                for (size_t k = 0; k < COUNT(tokens_list); k++) {
                    if (cols_list[c] > 1056 && tokens_list[k] != 33) continue; /* long rows: one count */
                    check_shape(dtypes[d], stored, stored ? panel_rows[r] : row_rows[r], cols_list[c], tokens_list[k], false, &t);
                }
        for (uint32_t nt = 1; nt <= 40; nt++) check_shape(dtypes[d], stored, 24, 544, nt, false, &t); /* every count */
        report(stored ? (d ? "q4_0x8 shapes" : "q8_0x8 shapes") : (d ? "q4_0 shapes" : "q8_0 shapes"), &t);
    }
}

/* Extreme blocks and scales (q8_0 -128 and 127 against +-127, q4_0 nibbles 0 and 15, Inf and NaN
 * scales, huge and infinite activations): the special values reach the outputs, with the same bits. */
static void test_extremes(bool stored)
{
    for (size_t d = 0; d < 2; d++) {
        tally t = {0};
        for (int rep = 0; rep < 4; rep++)
            for (uint32_t nt = 16; nt <= 21; nt += 5) check_shape(dtypes[d], stored, 40, 544, nt, true, &t);
        report(stored ? (d ? "q4_0x8 extremes" : "q8_0x8 extremes") : (d ? "q4_0 extremes" : "q8_0 extremes"), &t);
        CHECK(t.nonfinite > 0);
    }
}

/* Experts stacked in one tensor, several products of different token counts in one batch (a
 * prefill block's experts: some on the tiles, some on the AVX-512 kernels): every output the bits
 * of the same product computed alone on the portable path. */
static void test_experts_batch(void)
{
    enum { E = MAX_JOBS, ROWS = 40, COLS = 1056 };
    static const uint32_t tokens[E] = {3, 16, 21, 40};
    for (size_t d = 0; d < 2; d++) {
        const uint64_t rb = col_dtype_row_bytes(dtypes[d], COLS);
        uint8_t *w = weights(E * ROWS, COLS, dtypes[d], false), *wp = as_panels(w, E * ROWS, COLS, dtypes[d]);
        const uint32_t kind = dtypes[d] == COL_DTYPE_Q8_0 ? COL_DTYPE_Q8_0X8 : COL_DTYPE_Q4_0X8;
        float *x = activations(40 + E, COLS, false), *y[E], *want[E]; /* job e: tokens e .. */
        col_matvec_job jobs[E], ref[E];
        for (int e = 0; e < E; e++) {
            const col_weight we = {wp + e * ROWS * rb, kind, ROWS, COLS, 0};
            y[e] = malloc(tokens[e] * ROWS * sizeof(float)), want[e] = malloc(tokens[e] * ROWS * sizeof(float));
            jobs[e] = (col_matvec_job){we, x + e * COLS, y[e], tokens[e], NULL};
            ref[e] = (col_matvec_job){we, x + e * COLS, want[e], tokens[e], NULL};
            col_matmul_many(pools[0].pool, &ref[e], 1);
        }
        int bad = 0;
        for (int p = 2; p < N_POOLS; p++) {
            col_matmul_many(pools[p].pool, jobs, E);
            for (int e = 0; e < E; e++) bad += memcmp(y[e], want[e], tokens[e] * ROWS * sizeof(float)) != 0;
        }
        CHECK(bad == 0);
        for (int e = 0; e < E; e++) free(y[e]), free(want[e]);
        free(w), free(wp), free(x);
    }
}

int main(void)
{
    pools[0] = pool_on("portable", 2, MAX_JOBS, MAX_T, MAX_C);
    pools[1] = pool_on("avx512", 2, MAX_JOBS, MAX_T, MAX_C);
    for (uint32_t n = 1; n <= 3; n++) pools[1 + n] = pool_on("amx", n, MAX_JOBS, MAX_T, MAX_C);
    for (int p = 0; p < N_POOLS; p++) CHECK(pools[p].pool != NULL);
    uint8_t probe[64] = {0};
    const col_matvec_job any = {{probe, COL_DTYPE_Q8_0X8, 8, 32, 0}, NULL, NULL, COL_AMX_INT8_MIN_TOKENS_Q8, NULL};
    if (pools[2].pool && col_pool_isa(pools[2].pool) == COL_ISA_AMX && col_pool_isa(pools[1].pool) == COL_ISA_AVX512 &&
        col_amx_int8_runs(&any, col_amx_int8_stage_bytes(32))) {
        test_shapes(true);
        test_shapes(false);
        test_extremes(true);
        test_extremes(false);
        test_experts_batch();
    } else {
        fprintf(stderr, "no AMX-INT8 here: nothing to test\n");
    }
    for (int p = 0; p < N_POOLS; p++) pool_done(&pools[p]);
    return TEST_REPORT();
}
