/* test_int8_avx2.c - q8_0 and q4_0 products on the AVX2 path (kernels_int8_avx2.c) give the bits
 * of the block-order definition, forced with COLIBRI_KERNELS=avx2 so they run on any AVX2 CPU,
 * AVX-512 ones included.
 *
 * The definition is written out in int8_cases.h from docs/format.md's layouts, independently of the
 * engine: per token, the activations quantised per block of 32 (d_x = max|x| / 127, q = x / d_x
 * rounded half to even, clamped to +-127, a NaN product to -127), then per output over the blocks
 * in order acc = fmaf((float)isum, d_w * d_x, acc), isum the block's exact integer sum. The
 * portable reference (col_dotq_blocks) must give the same bits, and the AVX2 path every one of
 * them: decode (1 token) and batches of 2..40 tokens, row counts around the 8 lanes of a vector,
 * one block and several k-blocks of columns, on 1, 2 and 3 threads, so a prefill equals its tokens
 * stepped. Extreme blocks too: q8_0 weights of -128 and 127 against x of +-127 (vpmaddubsw's
 * limits), q4_0 nibbles 0 and 15, zero blocks, huge and infinite activations, subnormal, huge,
 * zero, Inf and NaN f16 scales: an Inf or NaN reaches the same outputs (a NaN's payload is not
 * compared). */
#include "harness.h"
#include "int8_cases.h"
#include "kernels_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the AVX2 path ------------------------------------------------------------------------ */

/* AVX2 on 1, 2 and 3 threads, portable on 2, the CPU's best path on 2, and avx512f on 3 (AVX-512
 * without VNNI: batches two panels a zmm, chunks on pairs of panels; AVX2 where the CPU lacks it) */
#define N_STORED_POOLS 6

static run avx2_pool(uint32_t threads, uint32_t max_tokens, uint64_t max_cols)
{
    return pool_on("avx2", threads, 1, max_tokens, max_cols);
}

typedef struct tally {
    int checked, off_definition, off_portable, off_avx2, off_step, nonfinite;
} tally;

/* The product of weights wt and nt tokens x through pools[0 .. n_pools) against want, and on
 * pools[1] each token of a batch stepped alone against its output in the batch. */
static void check_pools(run *pools, int n_pools, col_weight wt, const float *x, uint32_t nt, const float *want, tally *t)
{
    const uint64_t rows = wt.rows, cols = wt.cols;
    float *y = malloc(nt * rows * sizeof *y), *ystep = malloc(rows * sizeof *ystep);
    for (int p = 0; p < n_pools; p++) {
        memset(y, 0xFF, nt * rows * sizeof *y);
        col_matvec_job job = {wt, x, y, nt, NULL};
        col_matmul_many(pools[p].pool, &job, 1);
        for (uint64_t i = 0; i < nt * rows; i++) t->off_avx2 += !same(y[i], want[i]);
        t->checked += (int)(nt * rows);
        if (p != 1 || nt == 1) continue;
        for (uint32_t k = 0; k < nt; k++) { /* the tokens stepped, on 2 threads */
            col_matvec_job step = {wt, x + k * cols, ystep, 1, NULL};
            col_matmul_many(pools[p].pool, &step, 1);
            for (uint64_t r = 0; r < rows; r++) t->off_step += !same(ystep[r], y[k * rows + r]);
        }
    }
    free(y), free(ystep);
}

/* The AVX2 kernel itself (kernel: col_rows_int8_avx2 or col_rows_int8_panels_avx2) on the whole
 * matrix and in two shares as a pool would cut them, in every col_int8_form the CPU has
 * (vpmaddubsw; vpdpbusd where it has AVX-VNNI; two panels a zmm where it has AVX-512 F/BW/VL):
 * every output against want. */
#if defined(__x86_64__)
typedef void (*avx2_kernel)(const col_matvec_job *, const uint8_t *, uint64_t, uint64_t, uint32_t, int);
static void check_kernel(avx2_kernel kernel, const col_matvec_job *job, const uint8_t *qx, const float *want, tally *t)
{
    const uint64_t rows = job->w.rows, n = job->n_tokens * rows;
    const int has[] = {1, col_has_avx_vnni(),
                       __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl")};
    for (int form = COL_INT8_MADDUBS; form <= COL_INT8_MADDUBS_512; form++)
        for (int split = 0; split < 2 && has[form]; split++) {
            memset(job->y, 0xFF, n * sizeof *job->y);
            const uint64_t mid = split ? rows / 16 * 8 : rows;
            kernel(job, qx, 0, mid, 256, form);
            if (mid < rows) kernel(job, qx, mid, rows, 256, form);
            for (uint64_t i = 0; i < n; i++) t->off_avx2 += !same(job->y[i], want[i]);
            t->checked += (int)n;
        }
}
#endif

/* One shape on pools of 1, 2 and 3 threads and through the kernel itself: every output against
 * the definition and the portable reference, and each token of the batch against that token alone. */
static void check_shape(run *pools, uint32_t dtype, uint64_t rows, uint64_t cols, uint32_t nt, bool extreme, tally *t)
{
    uint8_t *w = weights(rows, cols, dtype, extreme);
    float *x = activations(nt, cols, extreme);
    float *want = malloc(nt * rows * sizeof *want), *y = malloc(nt * rows * sizeof *y);
    const uint64_t qb = col_qrow_bytes(cols), rb = col_dtype_row_bytes(dtype, cols);
    uint8_t *qx = malloc(nt * qb);
    for (uint32_t k = 0; k < nt; k++) {
        col_quantize_row(x + k * cols, cols, dtype, COL_ISA_PORTABLE, qx + k * qb);
        for (uint64_t r = 0; r < rows; r++) {
            const float def = definition(w + r * rb, dtype, x + k * cols, cols);
            want[k * rows + r] = def;
            t->off_definition += !same(col_dotq_blocks(w + r * rb, dtype, qx + k * qb, cols), def);
            t->nonfinite += !isfinite(def);
        }
    }
    const col_weight wt = {w, dtype, rows, cols, 0};
    const col_matvec_job job = {wt, x, y, nt, NULL};
#if defined(__x86_64__)
    check_kernel(col_rows_int8_avx2, &job, qx, want, t);
#endif
    check_pools(pools, 3, wt, x, nt, want, t);
    free(w), free(x), free(want), free(y), free(qx);
}

static void report(const char *what, const tally *t)
{
    fprintf(stderr, "%s: %d outputs (%d not finite); off the definition: portable %d, avx2 %d; step != batch %d\n",
            what, t->checked, t->nonfinite, t->off_definition, t->off_avx2, t->off_step);
    CHECK(t->checked > 0);
    CHECK(t->off_definition == 0);
    CHECK(t->off_avx2 == 0);
    CHECK(t->off_step == 0);
}

static const uint32_t dtypes[] = {COL_DTYPE_Q8_0, COL_DTYPE_Q4_0};

typedef void (*shape_check)(run *pools, uint32_t dtype, uint64_t rows, uint64_t cols, uint32_t nt, bool extreme, tally *t);

/* Check every combination of the lists' columns, rows and token counts, for one dtype. */
static void over_shapes(run *pools, uint32_t dtype, const uint64_t *cols, size_t n_cols, const uint64_t *rows,
                        size_t n_rows, const uint32_t *tokens, size_t n_tokens, shape_check check, tally *t)
{
    for (size_t c = 0; c < n_cols; c++)
        for (size_t r = 0; r < n_rows; r++)
            for (size_t k = 0; k < n_tokens; k++) check(pools, dtype, rows[r], cols[c], tokens[k], false, t);
}
#define COUNT(a) (sizeof(a) / sizeof *(a))

/* Rows around the 8 lanes and the threads' shares, columns of one block to several k-blocks
 * (16 blocks each) with partial groups of four (q4_0) and of eight scales, a few token counts. */
static void test_shapes(run *pools)
{
    static const uint64_t cols_list[] = {32, 64, 96, 224, 544, 1056};
    static const uint64_t rows_list[] = {1, 3, 7, 8, 9, 17, 37};
    static const uint32_t tokens_list[] = {1, 2, 3, 4, 5, 6, 7, 9, 13};
    for (size_t d = 0; d < 2; d++) {
        tally t = {0};
        over_shapes(pools, dtypes[d], cols_list, COUNT(cols_list), rows_list, COUNT(rows_list), tokens_list,
                    COUNT(tokens_list), check_shape, &t);
        report(dtypes[d] == COL_DTYPE_Q8_0 ? "q8_0 shapes" : "q4_0 shapes", &t);
    }
}

/* Every batch size from 1 to 40 tokens on one shape (rows not a multiple of 8, three k-blocks). */
static void test_token_counts(run *pools)
{
    for (size_t d = 0; d < 2; d++) {
        tally t = {0};
        for (uint32_t nt = 1; nt <= 40; nt++) check_shape(pools, dtypes[d], 21, 1568, nt, false, &t);
        report(dtypes[d] == COL_DTYPE_Q8_0 ? "q8_0 1..40 tokens" : "q4_0 1..40 tokens", &t);
    }
}

static void test_extremes(run *pools)
{
    static const uint64_t cols_list[] = {32, 96, 544};
    static const uint32_t tokens_list[] = {1, 4, 7};
    for (size_t d = 0; d < 2; d++) {
        tally t = {0};
        for (int rep = 0; rep < 4; rep++)
            for (size_t c = 0; c < 3; c++)
                for (size_t k = 0; k < 3; k++) check_shape(pools, dtypes[d], 19, cols_list[c], tokens_list[k], true, &t);
        report(dtypes[d] == COL_DTYPE_Q8_0 ? "q8_0 extremes" : "q4_0 extremes", &t);
        CHECK(t.nonfinite > 0); /* the special scales did reach outputs */
    }
}

/* ---- weights stored in 8-row panels (col_rows_int8_panels_avx2) ------------------------------ */
#if defined(__x86_64__)

/* One shape from panels (dtype q8_0x8 / q4_0x8) against the definition of its rows: the portable
 * reference row by row, the AVX2 kernel on the whole matrix at once and in two shares, and the
 * product through every pool, each token of a batch also stepped alone. Rows of more than 128
 * blocks take two k-blocks (the outputs carried between them). */
static void check_stored(run *pools, uint32_t dtype, uint64_t rows, uint64_t cols, uint32_t nt, bool extreme, tally *t)
{
    const uint32_t panels = dtype == COL_DTYPE_Q8_0 ? COL_DTYPE_Q8_0X8 : COL_DTYPE_Q4_0X8;
    uint8_t *w = weights(rows, cols, dtype, extreme), *wp = as_panels(w, rows, cols, dtype);
    float *x = activations(nt, cols, extreme);
    float *want = malloc(nt * rows * sizeof *want), *y = malloc(nt * rows * sizeof *y);
    const uint64_t qb = col_qrow_bytes(cols), rb = col_dtype_row_bytes(dtype, cols);
    uint8_t *qx = malloc(nt * qb);
    for (uint32_t k = 0; k < nt; k++) {
        col_quantize_row(x + k * cols, cols, panels, COL_ISA_AVX2, qx + k * qb);
        for (uint64_t r = 0; r < rows; r++) {
            const float def = definition(w + r * rb, dtype, x + k * cols, cols);
            want[k * rows + r] = def;
            t->off_definition += !same(col_dotq_stored(wp, panels, r, qx + k * qb, cols), def);
            t->nonfinite += !isfinite(def);
        }
    }
    const col_weight wt = {wp, panels, rows, cols, 0};
    const col_matvec_job job = {wt, x, y, nt, NULL};
    check_kernel(col_rows_int8_panels_avx2, &job, qx, want, t);
    if (pools) check_pools(pools, N_STORED_POOLS, wt, x, nt, want, t);
    free(w), free(wp), free(x), free(want), free(y), free(qx);
}

static void test_stored_panels(run *pools)
{
    static const uint64_t cols_list[] = {32, 64, 96, 224, 1056, 2080};
    static const uint64_t rows_list[] = {8, 16, 24, 40, 72};
    static const uint32_t tokens_list[] = {1, 2, 3, 4, 5, 6, 7, 9, 13};
    for (size_t d = 0; d < 2; d++) {
        tally t = {0};
        over_shapes(pools, dtypes[d], cols_list, COUNT(cols_list), rows_list, COUNT(rows_list), tokens_list,
                    COUNT(tokens_list), check_stored, &t);
        for (uint32_t nt = 1; nt <= 40; nt++) check_stored(pools, dtypes[d], 24, 1568, nt, false, &t);
        for (uint32_t nt = 1; nt <= 9; nt += 4) check_stored(NULL, dtypes[d], 16, 4384, nt, false, &t); /* two k-blocks */
        for (uint32_t nt = 5; nt <= 13; nt += 4) /* 128 blocks: one whole k-block; 129: one block past it */
            check_stored(NULL, dtypes[d], 8, 4096, nt, false, &t), check_stored(NULL, dtypes[d], 8, 4128, nt, false, &t);
        int nonfinite = t.nonfinite;
        for (int rep = 0; rep < 4; rep++)
            for (uint32_t nt = 1; nt <= 7; nt += 3) check_stored(pools, dtypes[d], 40, 544, nt, true, &t);
        report(dtypes[d] == COL_DTYPE_Q8_0 ? "q8_0 stored panels" : "q4_0 stored panels", &t);
        CHECK(t.nonfinite > nonfinite); /* the special scales did reach outputs */
    }
}
#endif

/* The AVX2 activation quantisation, and the AVX-512 one where the CPU has AVX-512 F, write the
 * portable one's bytes: values in the dtype's order, scales and block corrections; random,
 * extreme, infinite and NaN blocks. */
static void test_quantized_rows(void)
{
    static const uint64_t cols_list[] = {32, 96, 128, 160, 544, 1568};
    const int has_avx512 = __builtin_cpu_supports("avx512f");
    size_t checked = 0, differ = 0, differ512 = 0;
    for (size_t d = 0; d < 2; d++)
        for (size_t c = 0; c < 6; c++)
            for (int rep = 0; rep < 5; rep++) {
                const uint64_t cols = cols_list[c], bytes = col_qrow_bytes(cols);
                float *x = activations(1, cols, rep > 0);
                if (rep == 3) x[rnd() % cols] = NAN;
                if (rep == 4) x[rnd() % cols] = rnd() % 2 ? INFINITY : -INFINITY;
                uint8_t *portable = malloc(bytes), *avx2 = malloc(bytes), *avx512 = malloc(bytes);
                col_quantize_row(x, cols, dtypes[d], COL_ISA_PORTABLE, portable);
                col_quantize_row(x, cols, dtypes[d], COL_ISA_AVX2, avx2);
                checked++;
                differ += memcmp(portable, avx2, bytes) != 0;
                if (has_avx512) {
                    col_quantize_row(x, cols, dtypes[d], COL_ISA_AVX512, avx512);
                    differ512 += memcmp(portable, avx512, bytes) != 0;
                }
                free(portable), free(avx2), free(avx512), free(x);
            }
    fprintf(stderr, "quantised rows: %zu, AVX2 bytes off the portable ones: %zu, AVX-512's: %zu%s\n", checked, differ,
            differ512, has_avx512 ? "" : " (no AVX-512 here)");
    CHECK(checked == 60);
    CHECK(differ == 0);
    CHECK(differ512 == 0);
}

int main(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) { /* col_detect_isa's test */
        fprintf(stderr, "no AVX2 here: nothing to test\n");
        return TEST_REPORT();
    }
    run pools[N_STORED_POOLS] = {avx2_pool(1, 40, 1568), avx2_pool(2, 40, 1568), avx2_pool(3, 40, 1568),
                                 pool_on("portable", 2, 1, 40, 1568), pool_on(NULL, 2, 1, 40, 1568),
                                 pool_on("avx512f", 3, 1, 40, 1568)};
    for (int p = 0; p < N_STORED_POOLS; p++) {
        CHECK(pools[p].pool != NULL);
        if (!pools[p].pool) return TEST_REPORT();
        CHECK(col_pool_isa(pools[p].pool) == (p == 3 ? COL_ISA_PORTABLE : p < 3 ? COL_ISA_AVX2
                                              : p == 5                       ? col_choose_isa(COL_ISA_AVX512F)
                                                                             : col_choose_isa(COL_ISA_AMX)));
    }
    test_quantized_rows();
    test_shapes(pools);
    test_token_counts(pools);
    test_extremes(pools);
#if defined(__x86_64__)
    test_stored_panels(pools);
#endif
    for (int p = 0; p < N_STORED_POOLS; p++) pool_done(&pools[p]);
    return TEST_REPORT();
}
