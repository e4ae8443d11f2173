/* test_kernels.c - the matrix kernels (kernels.c, kernels_amx.c) on every path this CPU has
 * (portable, AVX2, AVX-512, AMX), every weight dtype, and shapes chosen to reach every tail: rows
 * of 1..37 (fewer rows than decode streams or a tile's 16, and rows left over after them), columns
 * of 32..1056 (a q8_0 row with an odd block count, q4_0 rows whose last group of four blocks is
 * partial, a last chunk of fewer than 16 scales) and, for float weights, 17 and 100 (a partial
 * block of 32), 1..17 tokens (whole and partial tiles of four; one to four AMX token groups).
 *
 * The reference is computed here, in double precision, from weights this file writes in the
 * format's layout (docs/format.md), not from the engine's own loaders: q8_0/q4_0 weights are
 * multiplied with activations quantised by the documented rule (d = max|x| / 127, q = round(x / d)).
 * Then: one thread and three threads give the same bits, and a batch of tokens gives the same
 * bits as the tokens one at a time (prefill equals stepping). */
#include "harness.h"
#include "kernels_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint32_t rng_state = 12345u;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)((rng_state >> 8) & 0xFFFFFF) / (float)0x800000 - 1.0f;
}

static uint16_t f32_to_f16(float f) /* round to nearest even; the test's values are normal */
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    uint32_t sign = (b >> 16) & 0x8000u;
    int32_t e = (int32_t)((b >> 23) & 0xFF) - 127 + 15;
    uint32_t m = b & 0x7FFFFFu;
    if (e <= 0) return (uint16_t)sign; /* flush tiny values: the test never needs them */
    uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
    uint32_t rest = m & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)h;
}

static float f16_value(uint16_t h) { return col_f16_to_f32(h); }

static uint16_t f32_to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

/* Store `rows` x `cols` values as `dtype`; *stored receives the values the stored bytes stand for. */
static uint8_t *store(const float *v, uint64_t rows, uint64_t cols, uint32_t dtype, double *stored)
{
    uint64_t rb = col_dtype_row_bytes(dtype, cols), nb = cols / 32;
    uint8_t *out = calloc(rows * rb + 64, 1);
    for (uint64_t r = 0; r < rows; r++) {
        const float *x = v + r * cols;
        uint8_t *row = out + r * rb;
        double *s = stored + r * cols;
        if (dtype == COL_DTYPE_F32) {
            memcpy(row, x, cols * 4);
            for (uint64_t i = 0; i < cols; i++) s[i] = x[i];
        } else if (dtype == COL_DTYPE_F16 || dtype == COL_DTYPE_BF16) {
            for (uint64_t i = 0; i < cols; i++) {
                uint16_t h = dtype == COL_DTYPE_F16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
                memcpy(row + 2 * i, &h, 2);
                s[i] = dtype == COL_DTYPE_F16 ? f16_value(h) : col_bf16_to_f32(h);
            }
        } else {
            for (uint64_t b = 0; b < nb; b++) {
                const float *xb = x + 32 * b;
                float amax = 0.0f, m = 0.0f;
                for (int j = 0; j < 32; j++)
                    if (fabsf(xb[j]) > amax) amax = fabsf(xb[j]), m = xb[j];
                uint16_t d16 = f32_to_f16(dtype == COL_DTYPE_Q8_0 ? amax / 127.0f : m / -8.0f);
                float d = f16_value(d16), id = d != 0.0f ? 1.0f / d : 0.0f;
                memcpy(row + 2 * b, &d16, 2);
                uint8_t *payload = row + 2 * nb;
                for (int j = 0; j < 32; j++) {
                    if (dtype == COL_DTYPE_Q8_0) {
                        long q = lrintf(xb[j] * id);
                        q = q > 127 ? 127 : q < -127 ? -127 : q;
                        payload[32 * b + j] = (uint8_t)(int8_t)q;
                        s[32 * b + j] = (double)d * (double)q;
                    } else {
                        float t = truncf(xb[j] * id + 8.5f);
                        int q = t < 0.0f ? 0 : t > 15.0f ? 15 : (int)t;
                        uint8_t *byte = payload + 16 * b + (j & 15);
                        *byte = (uint8_t)(j < 16 ? (*byte & 0xF0) | q : (*byte & 0x0F) | (q << 4));
                        s[32 * b + j] = (double)d * (double)(q - 8);
                    }
                }
            }
        }
    }
    return out;
}

/* The activations as int8 kernels see them: per block of 32, d = max|x| / 127, q = round(x / d). */
static void quantised_activations(const float *x, uint64_t cols, double *out)
{
    for (uint64_t b = 0; b < cols / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[32 * b + j]) > amax) amax = fabsf(x[32 * b + j]);
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            long q = lrintf(x[32 * b + j] * id);
            out[32 * b + j] = (double)d * (double)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
    }
}

typedef struct run {
    col_pool *pool;
    void *scratch;
} run;

static run pool_for(const char *isa, uint32_t threads, uint32_t max_tokens, uint64_t max_cols)
{
    run r;
    setenv("COLIBRI_KERNELS", isa, 1);
    col_allocator alloc;
    col_allocator_or_default(NULL, &alloc);
    col_pool_limits limits = {1, max_tokens * max_cols, max_tokens, max_cols};
    col_isa chosen = col_choose_isa(COL_ISA_AMX);
    uint64_t bytes = col_pool_scratch_size(chosen, threads, &limits);
    r.scratch = NULL;
    if (posix_memalign(&r.scratch, 64, bytes) != 0) r.scratch = NULL;
    r.pool = col_pool_create(chosen, threads, r.scratch, bytes, &limits, &alloc);
    unsetenv("COLIBRI_KERNELS");
    return r;
}

static void pool_done(run *r)
{
    col_pool_free(r->pool);
    free(r->scratch);
}

static const uint32_t dtypes[] = {COL_DTYPE_F32, COL_DTYPE_F16, COL_DTYPE_BF16, COL_DTYPE_Q8_0, COL_DTYPE_Q4_0};
static const uint64_t col_sizes[] = {17, 32, 64, 96, 100, 160, 224, 544, 1056};
static const uint64_t row_sizes[] = {1, 3, 4, 7, 9, 11, 37};
static const uint32_t token_counts[] = {1, 2, 5, 6, 17};

/* Every shape on one path: the reference agrees, and thread counts and batch sizes change no bit. */
static void test_path(const char *isa)
{
    enum { MAX_T = 17 };
    run one = pool_for(isa, 1, MAX_T, 1056), three = pool_for(isa, 3, MAX_T, 1056);
    CHECK(one.pool && three.pool);
    if (!one.pool || !three.pool) return;
    if (strcmp(col_isa_name(col_pool_isa(one.pool)), isa) != 0) { /* only AMX depends on the OS */
        fprintf(stderr, "%s: not available here, runs %s\n", isa, col_isa_name(col_pool_isa(one.pool)));
        CHECK(strcmp(isa, "amx") == 0);
        pool_done(&one);
        pool_done(&three);
        return;
    }
    int bad_ref = 0, bad_threads = 0, bad_batch = 0;
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++)
        for (size_t ci = 0; ci < sizeof col_sizes / sizeof *col_sizes; ci++)
            for (size_t ri = 0; ri < sizeof row_sizes / sizeof *row_sizes; ri++)
                for (size_t ti = 0; ti < sizeof token_counts / sizeof *token_counts; ti++) {
                    uint32_t dtype = dtypes[di], nt = token_counts[ti];
                    uint64_t cols = col_sizes[ci], rows = row_sizes[ri];
                    if ((dtype == COL_DTYPE_Q8_0 || dtype == COL_DTYPE_Q4_0) && cols % 32 != 0) continue;
                    float *wv = malloc(rows * cols * sizeof *wv), *x = malloc(nt * cols * sizeof *x);
                    double *ws = malloc(rows * cols * sizeof *ws), *xs = malloc(cols * sizeof *xs);
                    for (uint64_t i = 0; i < rows * cols; i++) wv[i] = frand();
                    for (uint64_t i = 0; i < nt * cols; i++) x[i] = frand();
                    uint8_t *data = store(wv, rows, cols, dtype, ws);
                    col_weight w = {data, dtype, rows, cols, 0};
                    float *y1 = calloc(nt * rows, sizeof *y1), *y3 = calloc(nt * rows, sizeof *y3);
                    float *ystep = calloc(rows, sizeof *ystep);
                    col_matvec_job job1 = {w, x, y1, nt, NULL}, job3 = {w, x, y3, nt, NULL};
                    col_matmul_many(one.pool, &job1, 1);
                    col_matmul_many(three.pool, &job3, 1);
                    bool quantised = dtype == COL_DTYPE_Q8_0 || dtype == COL_DTYPE_Q4_0;
                    for (uint32_t t = 0; t < nt; t++) {
                        if (quantised)
                            quantised_activations(x + t * cols, cols, xs);
                        else
                            for (uint64_t i = 0; i < cols; i++) xs[i] = x[t * cols + i];
                        for (uint64_t r = 0; r < rows; r++) {
                            double ref = 0.0, mag = 0.0;
                            for (uint64_t i = 0; i < cols; i++) {
                                ref += ws[r * cols + i] * xs[i];
                                mag += fabs(ws[r * cols + i] * xs[i]);
                            }
                            if (fabs((double)y1[t * rows + r] - ref) > 1e-5 * mag + 1e-6) bad_ref++;
                        }
                        col_matvec_job step = {w, x + t * cols, ystep, 1, NULL};
                        col_matmul_many(three.pool, &step, 1);
                        if (memcmp(ystep, y1 + t * rows, rows * sizeof *ystep) != 0) bad_batch++;
                    }
                    if (memcmp(y1, y3, nt * rows * sizeof *y1) != 0) bad_threads++;
                    free(wv), free(x), free(ws), free(xs), free(data), free(y1), free(y3), free(ystep);
                }
    if (bad_ref || bad_threads || bad_batch)
        fprintf(stderr, "%s: %d outputs off the reference, %d products differ by thread count, %d tokens "
                        "differ between batch and step\n", isa, bad_ref, bad_threads, bad_batch);
    CHECK(bad_ref == 0);
    CHECK(bad_threads == 0);
    CHECK(bad_batch == 0);
    pool_done(&one);
    pool_done(&three);
}

/* What a vector path computes for one f32 output, in scalar: lane l (of 16 on AVX-512, 8 on AVX2)
 * accumulates the products of columns l, l + lanes, ... of the whole blocks with a fused
 * multiply-add, in order; the lanes are summed by halving (lane i + lane i + lanes/2, then i + the
 * next half of those, down to the last two); the columns past the last whole block are added one
 * by one. */
static float vector_order(const float *w, const float *x, uint64_t cols, unsigned lanes)
{
    float lane[16] = {0};
    uint64_t whole = cols / lanes * lanes;
    for (uint64_t i = 0; i < whole; i++) lane[i % lanes] = fmaf(w[i], x[i], lane[i % lanes]);
    for (unsigned half = lanes / 2; half >= 1; half /= 2)
        for (unsigned i = 0; i < half; i++) lane[i] += lane[i + half];
    float s = lane[0];
    for (uint64_t i = whole; i < cols; i++) s += w[i] * x[i];
    return s;
}

/* AVX-512 without VNNI (Skylake-SP/X) runs AVX-512's float kernels and AVX2's q8_0/q4_0 ones: every
 * product has the bits of the AVX-512 path (q8_0/q4_0 the same on every path), and float ones differ
 * from AVX2's somewhere (lane order), so they did not run on AVX2. Needs a CPU with VNNI to compare. */
static void test_avx512f_bits(void)
{
    enum { NT = 17, ROWS = 37, COLS = 1056 };
    run f = pool_for("avx512f", 2, NT, COLS), v = pool_for("avx512", 2, NT, COLS), a = pool_for("avx2", 2, NT, COLS);
    CHECK(f.pool && v.pool && a.pool);
    if (!f.pool || !v.pool || !a.pool) return;
    CHECK(strcmp(col_isa_name(col_pool_isa(f.pool)), "avx512f") == 0);
    int off_avx512 = 0, float_like_avx2 = 0;
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++)
        for (uint32_t nt = 1; nt <= NT; nt += NT - 1) {
            const uint32_t dtype = dtypes[di];
            float *wv = malloc(ROWS * COLS * sizeof *wv), *x = malloc(nt * COLS * sizeof *x);
            double *ws = malloc(ROWS * COLS * sizeof *ws);
            for (uint64_t i = 0; i < ROWS * COLS; i++) wv[i] = frand();
            for (uint64_t i = 0; i < nt * COLS; i++) x[i] = frand();
            uint8_t *data = store(wv, ROWS, COLS, dtype, ws);
            col_weight w = {data, dtype, ROWS, COLS, 0};
            float *y[3];
            const run *pools[3] = {&f, &v, &a};
            for (int p = 0; p < 3; p++) {
                y[p] = calloc(nt * ROWS, sizeof *y[p]);
                col_matvec_job job = {w, x, y[p], nt, NULL};
                col_matmul_many(pools[p]->pool, &job, 1);
            }
            if (memcmp(y[0], y[1], nt * ROWS * sizeof *y[0]) != 0) off_avx512++;
            if (dtype == COL_DTYPE_F32 && memcmp(y[0], y[2], nt * ROWS * sizeof *y[0]) == 0) float_like_avx2++;
            for (int p = 0; p < 3; p++) free(y[p]);
            free(wv), free(x), free(ws), free(data);
        }
    if (off_avx512 || float_like_avx2)
        fprintf(stderr, "avx512f: %d products off the avx512 path's bits, %d f32 products with the avx2 path's\n",
                off_avx512, float_like_avx2);
    CHECK(off_avx512 == 0);
    CHECK(float_like_avx2 == 0);
    pool_done(&f), pool_done(&v), pool_done(&a);
}

/* A pool on `isa` whose scratch is one line short of what it asks for: no per-thread staging. */
static run pool_unstaged(const char *isa, uint32_t max_tokens, uint64_t max_cols)
{
    run r = {NULL, NULL};
    col_allocator alloc;
    col_allocator_or_default(NULL, &alloc);
    col_pool_limits limits = {1, max_tokens * max_cols, max_tokens, max_cols};
    setenv("COLIBRI_KERNELS", isa, 1);
    const col_isa chosen = col_choose_isa(COL_ISA_AMX);
    const uint64_t bytes = col_pool_scratch_size(chosen, 1, &limits) - 64;
    if (posix_memalign(&r.scratch, 64, bytes) != 0) r.scratch = NULL;
    if (r.scratch) r.pool = col_pool_create(chosen, 1, r.scratch, bytes, &limits, &alloc);
    unsetenv("COLIBRI_KERNELS");
    return r;
}

/* The float tiles of a vector path (decode's 8 distant rows; the batches' 6 x 4 on AVX-512, 3 x 4
 * on AVX2, walked in blocks of rows; the tiles left over; on AVX-512, long rows walked in column
 * blocks with the lane sums carried across, up to 8 tiles a block at a time, in chunks of 128
 * tokens) give every output exactly the bits of that order for f32, f16 and bf16 weights (the
 * values they stand for), however many outputs share a tile's final sums, with and without room
 * for the staging. */
static void test_float_order(const char *isa, unsigned lanes)
{
    enum { MAX_T = 130 };
    /* the second pool's scratch has no room for carried sums (sized for rows of 1000 columns):
     * its long rows run as whole-row tiles, which must give the same bits; the third has no
     * staging at all */
    run pools[3] = {pool_for(isa, 1, MAX_T, 2100), pool_for(isa, 1, MAX_T, 1000), pool_unstaged(isa, MAX_T, 2100)};
    CHECK(pools[0].pool != NULL && pools[1].pool != NULL && pools[2].pool != NULL);
    if (!pools[0].pool || !pools[1].pool || !pools[2].pool) return;
    static const uint32_t kinds[] = {COL_DTYPE_F32, COL_DTYPE_F16, COL_DTYPE_BF16};
    static const uint64_t cols_list[] = {16, 17, 100, 1056, 2100};
    static const uint64_t rows_list[] = {1, 5, 11, 37, 100};
    static const uint32_t tokens_list[] = {1, 3, 4, 9, 17, 70, 130};
    int bad = 0, checked = 0;
    for (size_t ki = 0; ki < 3; ki++)
        for (size_t pi = 0; pi < 3; pi++)
            for (size_t ci = pi == 0 ? 0 : 4; ci < 5; ci++)
                for (size_t ri = 0; ri < 5; ri++)
                    for (size_t ti = 0; ti < 7; ti++) {
                        const uint32_t dtype = kinds[ki];
                        uint64_t cols = cols_list[ci], rows = rows_list[ri];
                        uint32_t nt = tokens_list[ti];
                        if ((rows == 100 || nt == 130) && cols != 2100) continue; /* long rows: groups of tiles, token chunks */
                        if (dtype != COL_DTYPE_F32 && pi > 0 && nt < 9) continue; /* the other pools differ in batches */
                        float *w = malloc(rows * cols * sizeof *w), *x = malloc(nt * cols * sizeof *x);
                        float *y = calloc(nt * rows, sizeof *y);
                        double *ws = malloc(rows * cols * sizeof *ws);
                        for (uint64_t i = 0; i < rows * cols; i++) w[i] = frand();
                        for (uint64_t i = 0; i < nt * cols; i++) x[i] = frand() * (i % 7 == 0 ? 1e4f : 1.0f);
                        uint8_t *data = store(w, rows, cols, dtype, ws);
                        for (uint64_t i = 0; i < rows * cols; i++) w[i] = (float)ws[i]; /* exact */
                        col_matvec_job job = {{data, dtype, rows, cols, 0}, x, y, nt, NULL};
                        col_matmul_many(pools[pi].pool, &job, 1);
                        for (uint32_t t = 0; t < nt; t++)
                            for (uint64_t r = 0; r < rows; r++) {
                                float want = vector_order(w + r * cols, x + t * cols, cols, lanes), got = y[t * rows + r];
                                bad += memcmp(&want, &got, sizeof want) != 0;
                                checked++;
                            }
                        free(w), free(x), free(y), free(ws), free(data);
                    }
    if (bad) fprintf(stderr, "%s: %d of %d float outputs differ from the documented order\n", isa, bad, checked);
    CHECK(bad == 0);
    for (int i = 0; i < 3; i++) pool_done(&pools[i]);
}

/* A batch of bf16 or f16 weights gives the same bits whether its tiles are widened to f32 once
 * (Intel's tuning, from 8 tokens or from 1) or in every token pass (AMD's), and with or without
 * the scratch that holds the widened tile: whole rows, long rows in column blocks, rows with a
 * scalar tail, rows left over after the 6-row tiles, called on the whole matrix and on two shares. */
static void test_widened_tiles(void)
{
    enum { MAX_T = 70, MAX_C = 2100 };
    static const uint32_t kinds[] = {COL_DTYPE_F16, COL_DTYPE_BF16};
    static const uint64_t cols_list[] = {17, 100, 1024, 1040, 2100};
    static const uint64_t rows_list[] = {6, 13, 37};
    static const uint32_t tokens_list[] = {2, 8, 9, 17, 70};
    static const uint32_t widen_list[] = {0, 8, 1};
    run pool = pool_for("avx512", 1, MAX_T, MAX_C);
    CHECK(pool.pool != NULL);
    if (!pool.pool) return;
    const uint64_t stage_bytes = COL_KBLOCK_TILES * col_kblock_carry_bytes(MAX_T) + COL_WIDE_TILE_BYTES;
    uint8_t *stage = NULL;
    CHECK(posix_memalign((void **)&stage, 64, stage_bytes) == 0);
    int differ = 0, checked = 0;
    for (size_t ki = 0; ki < 2; ki++)
        for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++)
            for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
                for (size_t ti = 0; ti < sizeof tokens_list / sizeof *tokens_list; ti++) {
                    const uint32_t dtype = kinds[ki], nt = tokens_list[ti];
                    const uint64_t cols = cols_list[ci], rows = rows_list[ri];
                    float *w = malloc(rows * cols * sizeof *w), *x = malloc(nt * cols * sizeof *x);
                    float *want = malloc(nt * rows * sizeof *want), *got = malloc(nt * rows * sizeof *got);
                    double *ws = malloc(rows * cols * sizeof *ws);
                    for (uint64_t i = 0; i < rows * cols; i++) w[i] = frand();
                    for (uint64_t i = 0; i < nt * cols; i++) x[i] = frand();
                    uint8_t *data = store(w, rows, cols, dtype, ws);
                    const col_matvec_job job = {{data, dtype, rows, cols, 0}, x, want, nt, NULL};
                    col_matmul_many(pool.pool, &job, 1);
                    for (size_t wi = 0; wi < sizeof widen_list / sizeof *widen_list; wi++)
                        for (int staged = 0; staged < 2; staged++)
                            for (int split = 0; split < 2; split++) {
                                col_decode_tuning tune = col_decode_tuning_here();
                                tune.widen_tokens = widen_list[wi];
                                const col_matvec_job jb = {{data, dtype, rows, cols, 0}, x, got, nt, NULL};
                                memset(got, 0xFF, nt * rows * sizeof *got);
                                const uint64_t mid = split ? rows / 2 : rows;
                                uint8_t *st = staged ? stage : NULL;
                                const uint64_t sb = staged ? stage_bytes : 0;
                                col_rows_avx512(&jb, NULL, 0, mid, st, sb, tune);
                                if (mid < rows) col_rows_avx512(&jb, NULL, mid, rows, st, sb, tune);
                                differ += memcmp(want, got, nt * rows * sizeof *got) != 0;
                                checked++;
                            }
                    free(w), free(x), free(want), free(got), free(ws), free(data);
                }
    if (differ) fprintf(stderr, "widened tiles: %d of %d products differ from the pool's\n", differ, checked);
    CHECK(differ == 0);
    free(stage);
    pool_done(&pool);
}

/* A q8_0/q4_0 row of raw bytes: payloads from the whole int8 range (q8_0's -128 included, which
 * the converter never writes but a file may hold) and f16 scales drawn from `scales`. */
static uint8_t *raw_quantised(uint32_t dtype, uint64_t rows, uint64_t cols, const uint16_t *scales, size_t n_scales)
{
    const uint64_t rb = col_dtype_row_bytes(dtype, cols), nb = cols / 32;
    uint8_t *out = malloc(rows * rb + 64);
    for (uint64_t r = 0; r < rows; r++) {
        uint8_t *row = out + r * rb;
        for (uint64_t b = 0; b < nb; b++) {
            rng_state = rng_state * 1664525u + 1013904223u;
            memcpy(row + 2 * b, &scales[(rng_state >> 8) % n_scales], 2);
        }
        for (uint64_t i = 2 * nb; i < rb; i++) {
            rng_state = rng_state * 1664525u + 1013904223u;
            row[i] = (uint8_t)(rng_state >> 16);
            if ((rng_state >> 4) % 5 == 0) row[i] = 0x80; /* q8_0: -128; q4_0: nibbles 0 and 8 */
        }
    }
    return out;
}

/* The AVX-512 quantised products give exactly the bits of the portable reference (col_dotq_blocks,
 * the definition: block order, one fused multiply-add per block): q8_0 and q4_0, 1..40 tokens (the
 * decode kernel, panels of 1..12 tokens a pass), rows that fill no panel or leave part of one,
 * one block, an odd block count, a partial last q4_0 group, several k-blocks of a panel; scales
 * subnormal, huge, zero, infinite and NaN; activations of the largest magnitude and all-zero blocks;
 * on 1, 2 and 3 threads, with and without room for the panels, and each token stepped alone. */
static void test_int8_definition(void)
{
    enum { MAX_T = 40, MAX_C = 2112 };
    static const uint16_t plain[] = {0x2000, 0x2400, 0x1C00, 0x2A55, 0x3000};
    static const uint16_t extreme[] = {0x2000, 0x0001, 0x03FF, 0x7BFF, 0x0000, 0x8400, 0x7C00, 0xFC00, 0x7E00, 0x2400};
    run ref = pool_for("portable", 1, MAX_T, MAX_C);
    run pools[4] = {pool_for("avx512", 1, MAX_T, MAX_C), pool_for("avx512", 2, MAX_T, MAX_C),
                    pool_for("avx512", 3, MAX_T, MAX_C), {NULL, NULL}};
    { /* scratch one line short: no staging, every token through the decode kernel */
        col_allocator alloc;
        col_allocator_or_default(NULL, &alloc);
        col_pool_limits limits = {1, MAX_T * MAX_C, MAX_T, MAX_C};
        setenv("COLIBRI_KERNELS", "avx512", 1);
        const col_isa isa = col_choose_isa(COL_ISA_AMX);
        const uint64_t bytes = col_pool_scratch_size(isa, 1, &limits) - 64;
        CHECK(posix_memalign(&pools[3].scratch, 64, bytes) == 0);
        pools[3].pool = col_pool_create(isa, 1, pools[3].scratch, bytes, &limits, &alloc);
        unsetenv("COLIBRI_KERNELS");
    }
    CHECK(ref.pool && pools[0].pool && pools[1].pool && pools[2].pool && pools[3].pool);
    if (!ref.pool || !pools[0].pool || !pools[1].pool || !pools[2].pool || !pools[3].pool) return;
    CHECK(col_pool_isa(pools[0].pool) >= COL_ISA_AVX512);
    static const uint64_t cols_list[] = {32, 64, 96, 160, 224, 1056, 2112};
    static const uint64_t rows_list[] = {1, 5, 16, 17, 35, 64};
    int bad = 0, bad_step = 0, checked = 0;
    for (int dq = 0; dq < 2; dq++)
        for (int ext = 0; ext < 2; ext++)
            for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++)
                for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
                    for (uint32_t nt = 1; nt <= MAX_T; nt++) {
                        const uint32_t dtype = dq ? COL_DTYPE_Q4_0 : COL_DTYPE_Q8_0;
                        const uint64_t cols = cols_list[ci], rows = rows_list[ri];
                        /* every token count on two shapes; a few elsewhere */
                        if (!(ci == 3 || ci == 5) && nt != 1 && nt != 2 && nt != 13 && nt != 40) continue;
                        if (ext && rows != 17 && rows != 35) continue;
                        uint8_t *data = ext ? raw_quantised(dtype, rows, cols, extreme, sizeof extreme / sizeof *extreme)
                                            : raw_quantised(dtype, rows, cols, plain, sizeof plain / sizeof *plain);
                        float *x = malloc(nt * cols * sizeof *x), *want = malloc(nt * rows * sizeof *want);
                        float *got = malloc(nt * rows * sizeof *got), *ystep = malloc(rows * sizeof *ystep);
                        for (uint64_t i = 0; i < nt * cols; i++) {
                            x[i] = frand();
                            if (ext && i % 97 == 0) x[i] = i % 2 ? 3.4028235e38f : -3.4028235e38f;
                            if (ext && (i / 32) % 7 == 3) x[i] = 0.0f; /* a block of zeros */
                        }
                        col_weight w = {data, dtype, rows, cols, 0};
                        col_matvec_job rj = {w, x, want, nt, NULL};
                        col_matmul_many(ref.pool, &rj, 1);
                        for (int p = 0; p < 4; p++) {
                            col_matvec_job jb = {w, x, got, nt, NULL};
                            col_matmul_many(pools[p].pool, &jb, 1);
                            bad += memcmp(want, got, nt * rows * sizeof *got) != 0;
                            checked++;
                        }
                        for (uint32_t t = 0; t < nt; t++) {
                            col_matvec_job step = {w, x + t * cols, ystep, 1, NULL};
                            col_matmul_many(pools[2].pool, &step, 1);
                            bad_step += memcmp(ystep, want + t * rows, rows * sizeof *ystep) != 0;
                        }
                        free(data), free(x), free(want), free(got), free(ystep);
                    }
    if (bad || bad_step)
        fprintf(stderr, "int8 definition: %d of %d products differ from the portable reference, %d steps from it\n", bad,
                checked, bad_step);
    CHECK(bad == 0);
    CHECK(bad_step == 0);
    pool_done(&ref);
    for (int p = 0; p < 4; p++) pool_done(&pools[p]);
}

/* q8_0x8/q4_0x8 weights as raw bytes (payloads from the whole byte range, -128 included) whose
 * panels' scales are drawn from `scales`: panels hold their rows' blocks in another order, so any
 * bytes are a matrix the definition (col_dotq_stored) reads. */
static uint8_t *raw_panels(uint32_t dtype, uint64_t rows, uint64_t cols, const uint16_t *scales, size_t n_scales)
{
    const uint64_t rb = col_dtype_row_bytes(dtype, cols), nb = cols / 32;
    uint8_t *out = malloc(rows * rb + 64);
    for (uint64_t i = 0; i < rows * rb; i++) {
        rng_state = rng_state * 1664525u + 1013904223u;
        out[i] = (rng_state >> 4) % 5 == 0 ? 0x80 : (uint8_t)(rng_state >> 16);
    }
    for (uint64_t p = 0; p < rows / 8; p++)
        for (uint64_t i = 0; i < 8 * nb; i++) { /* a panel's scales: 8 per block, ahead of its payload */
            rng_state = rng_state * 1664525u + 1013904223u;
            memcpy(out + 8 * p * rb + 2 * i, &scales[(rng_state >> 8) % n_scales], 2);
        }
    return out;
}

/* The AVX-512 kernel over stored panels gives the definition's bits (col_dotq_stored) for 1..9
 * tokens: 1 to 9 panels (tiles of 1..8 distant panels, a last odd one in 8 lanes), one block, an
 * odd block count, a partial last q4_0 group, long rows; extreme scales and activations; called
 * on the whole matrix and on two shares, with and without staging, under each vendor's tuning
 * (4 or 8 panels a one-token tile, either tile for one token of q4_0), and through AVX-512 pools
 * of 1 and 3 threads, each token also stepped alone. */
static void test_int8_stored_panels_avx512(void)
{
    enum { MAX_T = 13, MAX_C = 4128 };
    static const uint16_t plain[] = {0x2000, 0x2400, 0x1C00, 0x2A55, 0x3000};
    static const uint16_t extreme[] = {0x2000, 0x0001, 0x03FF, 0x7BFF, 0x0000, 0x8400, 0x7C00, 0xFC00, 0x7E00, 0x2400};
    static const uint64_t cols_list[] = {32, 64, 96, 160, 1056, 4128};
    static const uint64_t rows_list[] = {8, 16, 24, 32, 40, 48, 56, 72};
    static const uint32_t tokens_list[] = {1, 2, 3, 5, 8, 9, 13};
    run pools[2] = {pool_for("avx512", 1, MAX_T, MAX_C), pool_for("avx512", 3, MAX_T, MAX_C)};
    CHECK(pools[0].pool && pools[1].pool);
    if (!pools[0].pool || !pools[1].pool) return;
    uint8_t *stage = NULL;
    CHECK(posix_memalign((void **)&stage, 64, col_int8_stage_bytes()) == 0);
    int bad = 0, checked = 0;
    for (int dq = 0; dq < 2; dq++)
        for (int ext = 0; ext < 2; ext++)
            for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++)
                for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
                    for (size_t ti = 0; ti < sizeof tokens_list / sizeof *tokens_list; ti++) {
                        const uint32_t dtype = dq ? COL_DTYPE_Q4_0X8 : COL_DTYPE_Q8_0X8, nt = tokens_list[ti];
                        const uint64_t cols = cols_list[ci], rows = rows_list[ri], qb = col_qrow_bytes(cols);
                        if (ext && rows != 24 && rows != 40) continue;
                        if (cols == 4128 && nt > 2) continue;
                        uint8_t *data = ext ? raw_panels(dtype, rows, cols, extreme, sizeof extreme / sizeof *extreme)
                                            : raw_panels(dtype, rows, cols, plain, sizeof plain / sizeof *plain);
                        float *x = malloc(nt * cols * sizeof *x), *want = malloc(nt * rows * sizeof *want);
                        float *got = malloc(nt * rows * sizeof *got);
                        uint8_t *qx = malloc(nt * qb);
                        for (uint64_t i = 0; i < nt * cols; i++) {
                            x[i] = frand();
                            if (ext && i % 97 == 0) x[i] = i % 2 ? 3.4028235e38f : -3.4028235e38f;
                            if (ext && (i / 32) % 7 == 3) x[i] = 0.0f; /* a block of zeros */
                        }
                        for (uint32_t t = 0; t < nt; t++) {
                            col_quantize_row(x + t * cols, cols, dtype, COL_ISA_PORTABLE, qx + t * qb);
                            for (uint64_t r = 0; r < rows; r++) want[t * rows + r] = col_dotq_stored(data, dtype, r, qx + t * qb, cols);
                        }
                        const col_weight w = {data, dtype, rows, cols, 0};
                        const col_matvec_job job = {w, x, got, nt, NULL};
                        for (int split = 0; split < 2; split++)
                            for (int staged = 0; staged < 2; staged++)
                                for (int tuning = 0; tuning < 4; tuning++) { /* each vendor's one-token tiles */
                                    col_decode_tuning tune = col_decode_tuning_here();
                                    tune.q4_zmm = tuning & 1;
                                    tune.stored_streams = tuning & 2 ? 8 : 4;
                                    memset(got, 0xFF, nt * rows * sizeof *got);
                                    const uint64_t mid = split ? rows / 16 * 8 : rows;
                                    uint8_t *st = staged ? stage : NULL;
                                    const uint64_t sb = staged ? col_int8_stage_bytes() : 0;
                                    col_rows_int8_avx512(&job, qx, 0, mid, st, sb, tune);
                                    if (mid < rows) col_rows_int8_avx512(&job, qx, mid, rows, st, sb, tune);
                                    bad += memcmp(want, got, nt * rows * sizeof *got) != 0;
                                    checked++;
                                }
                        for (int p = 0; p < 2; p++) {
                            col_matvec_job jb = {w, x, got, nt, NULL};
                            col_matmul_many(pools[p].pool, &jb, 1);
                            bad += memcmp(want, got, nt * rows * sizeof *got) != 0;
                            for (uint32_t t = 0; t < nt; t++) {
                                col_matvec_job step = {w, x + t * cols, got, 1, NULL};
                                col_matmul_many(pools[p].pool, &step, 1);
                                bad += memcmp(want + t * rows, got, rows * sizeof *got) != 0;
                            }
                            checked += 1 + (int)nt;
                        }
                        free(data), free(x), free(want), free(got), free(qx);
                    }
    if (bad) fprintf(stderr, "int8 stored panels: %d of %d products differ from the definition\n", bad, checked);
    CHECK(bad == 0);
    CHECK(checked > 1000);
    free(stage);
    for (int p = 0; p < 2; p++) pool_done(&pools[p]);
}

/* bf16x16 (docs/format.md "bf16 panels"), written here from the documented layout: rows in panels
 * of 16, each pair of columns of a panel's rows in one 64-byte line. */
static uint16_t *bf16_panels(const uint16_t *rows_bf16, uint64_t rows, uint64_t cols)
{
    uint16_t *out = calloc(rows * cols + 32, sizeof *out);
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t c = 0; c < cols; c++)
            out[r / 16 * 16 * cols + c / 2 * 32 + 2 * (r % 16) + c % 2] = rows_bf16[r * cols + c];
    return out;
}

/* vdpbf16ps's view of a bf16 (subnormals read as zero) and of a sum (subnormals flushed). */
static float dp_in(uint16_t h)
{
    return col_bf16_to_f32((h & 0x7F80u) == 0 ? (uint16_t)(h & 0x8000u) : h);
}
static float dp_out(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    if ((b & 0x7F800000u) == 0) b &= 0x80000000u;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* On one path: exact products over bf16 panels are one fused multiply-add chain per output over
 * its row in column order, and bf16 dot products one chain of vdpbf16ps lane steps (odd product,
 * then even) with the activations rounded to bf16; bit for bit, on 1 and 3 threads, a batch equal
 * to its tokens one at a time. */
static void test_bf16_panels(const char *isa)
{
    enum { MAX_T = 17, MAX_C = 1056 };
    static const uint64_t cols_list[] = {2, 30, 64, 100, 1056};
    /* 272 rows: 17 panels, one token's tiles of 8 (and of 4) distant panels and one left over */
    static const uint64_t rows_list[] = {16, 32, 48, 64, 80, 112, 272};
    static const uint32_t tokens_list[] = {1, 2, 3, 5, 8, 9, 17};
    run pools[2] = {pool_for(isa, 1, MAX_T, MAX_C), pool_for(isa, 3, MAX_T, MAX_C)};
    CHECK(pools[0].pool && pools[1].pool);
    if (!pools[0].pool || !pools[1].pool) return;
    int bad = 0, checked = 0;
    for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
            for (size_t ti = 0; ti < sizeof tokens_list / sizeof *tokens_list; ti++) {
                const uint64_t cols = cols_list[ci], rows = rows_list[ri];
                const uint32_t nt = tokens_list[ti];
                uint16_t *w16 = malloc(rows * cols * sizeof *w16);
                for (uint64_t i = 0; i < rows * cols; i++) w16[i] = f32_to_bf16(frand() * (i % 53 == 0 ? 1e-38f : 1.0f));
                uint16_t *panels = bf16_panels(w16, rows, cols);
                float *x = malloc(nt * cols * sizeof *x), *want = malloc(nt * rows * sizeof *want);
                float *want_dp = malloc(nt * rows * sizeof *want_dp), *got = malloc(nt * rows * sizeof *got);
                float *row = malloc(cols * sizeof *row);
                for (uint64_t i = 0; i < nt * cols; i++) x[i] = frand();
                for (uint64_t r = 0; r < rows; r++) {
                    col_load_matrix_range(panels, COL_DTYPE_BF16X16, cols, r, 0, cols, row);
                    for (uint64_t c = 0; c < cols; c++) bad += row[c] != col_bf16_to_f32(w16[r * cols + c]);
                    for (uint32_t t = 0; t < nt; t++) {
                        float acc = 0.0f, dp = 0.0f;
                        for (uint64_t c = 0; c < cols; c++) acc = fmaf(col_bf16_to_f32(w16[r * cols + c]), x[t * cols + c], acc);
                        for (uint64_t c = 0; c < cols; c += 2)
                            for (int e = 1; e >= 0; e--)
                                dp = dp_out(fmaf(dp_in(w16[r * cols + c + e]), dp_in(f32_to_bf16(x[t * cols + c + e])), dp));
                        want[t * rows + r] = acc;
                        want_dp[t * rows + r] = dp;
                    }
                }
                const col_weight w = {panels, COL_DTYPE_BF16X16, rows, cols, 0};
                for (int p = 0; p < 2; p++)
                    for (int dot = 0; dot < 2; dot++) {
                        const float *expect = dot ? want_dp : want;
                        col_matvec_job jb = {w, x, got, nt, NULL};
                        memset(got, 0xFF, nt * rows * sizeof *got);
                        if (dot) col_matmul_bf16_dot(pools[p].pool, &jb, 1);
                        else col_matmul_many(pools[p].pool, &jb, 1);
                        bad += memcmp(expect, got, nt * rows * sizeof *got) != 0;
                        for (uint32_t t = 0; t < nt; t++) {
                            col_matvec_job step = {w, x + t * cols, got, 1, NULL};
                            if (dot) col_matmul_bf16_dot(pools[p].pool, &step, 1);
                            else col_matmul_many(pools[p].pool, &step, 1);
                            bad += memcmp(expect + t * rows, got, rows * sizeof *got) != 0;
                        }
                        checked += 1 + (int)nt;
                    }
                free(w16), free(panels), free(x), free(want), free(want_dp), free(got), free(row);
            }
    if (bad) fprintf(stderr, "bf16 panels (%s): %d of %d products differ from the definition\n", isa, bad, checked);
    CHECK(bad == 0);
    CHECK(checked > 1000);
    for (int p = 0; p < 2; p++) pool_done(&pools[p]);
}

/* col_load_range reads any part of a row in the stored layout (the numerics variants read long
 * rows 32 elements at a time). */
static void test_load_range(void)
{
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++) {
        uint64_t cols = 160;
        float v[160], got[160];
        double want[160];
        for (int i = 0; i < 160; i++) v[i] = frand();
        uint8_t *data = store(v, 1, cols, dtypes[di], want);
        int bad = 0;
        col_load_row(data, dtypes[di], cols, got);
        for (int i = 0; i < 160; i++) bad += got[i] != (float)want[i];
        col_load_range(data, dtypes[di], cols, 37, 64, got);
        for (int i = 0; i < 64; i++) bad += got[i] != (float)want[37 + i];
        CHECK(bad == 0);
        free(data);
    }
}

/* A batch big enough that its activations are quantised or packed on the pool's threads gives the
 * same bits as one thread (which prepares them alone) and as its tokens stepped one at a time. */
static void test_parallel_preparation(void)
{
    enum { NT = 70, COLS = 1024, ROWS = 40 };
    run one = pool_for("amx", 1, NT, COLS), three = pool_for("amx", 3, NT, COLS);
    CHECK(one.pool && three.pool);
    if (!one.pool || !three.pool) return;
    const uint32_t kinds[] = {COL_DTYPE_BF16, COL_DTYPE_Q8_0, COL_DTYPE_Q4_0, COL_DTYPE_F32};
    float *wv = malloc(ROWS * COLS * sizeof *wv), *x = malloc(NT * COLS * sizeof *x);
    double *ws = malloc(ROWS * COLS * sizeof *ws);
    float *y1 = malloc(NT * ROWS * sizeof *y1), *y3 = malloc(NT * ROWS * sizeof *y3), ystep[ROWS];
    for (uint64_t i = 0; i < ROWS * COLS; i++) wv[i] = frand();
    for (uint64_t i = 0; i < NT * COLS; i++) x[i] = frand();
    for (size_t d = 0; d < sizeof kinds / sizeof *kinds; d++) {
        uint8_t *data = store(wv, ROWS, COLS, kinds[d], ws);
        col_weight w = {data, kinds[d], ROWS, COLS, 0};
        col_matvec_job a = {w, x, y1, NT, NULL}, b = {w, x, y3, NT, NULL};
        col_matmul_many(one.pool, &a, 1);
        col_matmul_many(three.pool, &b, 1);
        CHECK(memcmp(y1, y3, sizeof(float) * NT * ROWS) == 0);
        int bad_step = 0;
        for (uint32_t t = 0; t < NT; t++) {
            col_matvec_job step = {w, x + t * COLS, ystep, 1, NULL};
            col_matmul_many(three.pool, &step, 1);
            bad_step += memcmp(ystep, y3 + t * ROWS, sizeof ystep) != 0;
        }
        CHECK(bad_step == 0);
        free(data);
    }
    free(wv), free(x), free(ws), free(y1), free(y3);
    pool_done(&one);
    pool_done(&three);
}

/* A task's items counted as they run; a worker stalls in its first piece, as if preempted. */
typedef struct count_task {
    _Atomic uint32_t *runs; /* [n] */
    _Atomic uint32_t stalled;
} count_task;

static void count_items(void *ctx, uint32_t thread, uint64_t i0, uint64_t i1)
{
    count_task *c = ctx;
    if (thread != 0 && atomic_fetch_add(&c->stalled, 1) == 0) {
        const struct timespec stall = {0, 3000000};
        nanosleep(&stall, NULL);
    }
    for (uint64_t i = i0; i < i1; i++) atomic_fetch_add(&c->runs[i], 1);
}

/* col_pool_run runs every item exactly once while a worker stalls inside a piece it began (the
 * other threads take over the rest of its chunk), for item counts from one to a thousand. */
static void test_pool_run_items_once(void)
{
    enum { MAX_N = 1000 };
    run three = pool_for("portable", 3, 1, 32);
    CHECK(three.pool != NULL);
    if (!three.pool) return;
    _Atomic uint32_t *runs = malloc(MAX_N * sizeof *runs);
    static const uint64_t counts[] = {1, 2, 3, 7, 64, 300, MAX_N};
    int wrong = 0;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        for (uint64_t i = 0; i < MAX_N; i++) atomic_init(&runs[i], 0);
        count_task c = {runs, 0};
        col_pool_run(three.pool, count_items, &c, counts[k]);
        for (uint64_t i = 0; i < MAX_N; i++) wrong += atomic_load(&runs[i]) != (i < counts[k] ? 1u : 0u);
    }
    CHECK(wrong == 0);
    if (wrong) fprintf(stderr, "pool run: %d items not run exactly once\n", wrong);
    free(runs);
    pool_done(&three);
}

/* A chain of experts-like groups (col_matmul_chain): group g's first stage is up[2g] and up[2g+1]
 * (D_FF rows over D_MODEL columns), its step h[g] = h[2g] * h[2g+1], its second stage down[g]
 * (D_MODEL rows over D_FF) over h[2g]; a first-stage job of no group beside them; the last group has
 * no first-stage rows (its step fills its input). A worker stalls in its first step, as if
 * preempted, so threads wait for groups and take over the stalled one's rows. */
enum { CHAIN_GROUPS = 4, CHAIN_TOKENS = 5, D_MODEL = 256, D_FF = 96 };

typedef struct chain_ctx {
    float *h;                  /* [2 * CHAIN_GROUPS][CHAIN_TOKENS][D_FF] */
    _Atomic uint32_t stalled;
    uint32_t tokens;
} chain_ctx;

static void chain_step(void *ctx, uint32_t thread, uint32_t g)
{
    chain_ctx *c = ctx;
    if (thread != 0 && atomic_fetch_add(&c->stalled, 1) == 0) {
        const struct timespec stall = {0, 2000000};
        nanosleep(&stall, NULL);
    }
    float *a = c->h + (uint64_t)2 * g * CHAIN_TOKENS * D_FF, *b = a + (uint64_t)CHAIN_TOKENS * D_FF;
    for (uint64_t i = 0; i < (uint64_t)c->tokens * D_FF; i++)
        a[i] = g == CHAIN_GROUPS - 1 ? 0.25f * (float)(i % 7) - 0.75f : a[i] * b[i];
}

/* The jobs of the chain above on weights of `dtype`, for `tokens` tokens: outputs into h, y
 * [CHAIN_GROUPS][tokens][D_MODEL] and side [tokens][D_FF]. Returns the first stage's job count. */
static uint32_t chain_jobs(const uint8_t *up, const uint8_t *down, uint32_t dtype, const float *x, uint32_t tokens,
                           float *h, float *y, float *side, col_matvec_job *jobs, uint32_t *group)
{
    const uint64_t up_bytes = D_FF * col_dtype_row_bytes(dtype, D_MODEL), down_bytes = D_MODEL * col_dtype_row_bytes(dtype, D_FF);
    uint32_t n = 0;
    for (uint32_t g = 0; g + 1 < CHAIN_GROUPS; g++)
        for (uint32_t half = 0; half < 2; half++) {
            group[n] = g;
            jobs[n++] = (col_matvec_job){{up + (2 * g + half) * up_bytes, dtype, D_FF, D_MODEL, 0}, x,
                                         h + (uint64_t)(2 * g + half) * CHAIN_TOKENS * D_FF, tokens, NULL};
        }
    group[n] = COL_CHAIN_NONE;
    jobs[n++] = (col_matvec_job){{up, dtype, D_FF, D_MODEL, 0}, x, side, tokens, NULL};
    const uint32_t first = n;
    for (uint32_t g = 0; g < CHAIN_GROUPS; g++) {
        group[n] = g;
        jobs[n++] = (col_matvec_job){{down + g * down_bytes, dtype, D_MODEL, D_FF, 0}, h + (uint64_t)2 * g * CHAIN_TOKENS * D_FF,
                                     y + (uint64_t)g * CHAIN_TOKENS * D_MODEL, tokens, NULL};
    }
    return first;
}

/* A chain gives the bits of its stages run one after the other (col_matmul_many, every step,
 * col_matmul_many) on 1 thread, on 1 and 3 threads, for one token and several, float and int8
 * weights, while a worker stalls in a step. */
static void test_chain_matches_stages(const char *isa)
{
    col_allocator alloc;
    col_allocator_or_default(NULL, &alloc);
    const col_pool_limits limits = {3 * CHAIN_GROUPS + 1, 3 * CHAIN_GROUPS * CHAIN_TOKENS * D_MODEL, CHAIN_TOKENS, D_MODEL};
    run pools[2];
    const uint32_t threads[2] = {1, 3};
    setenv("COLIBRI_KERNELS", isa, 1);
    for (int p = 0; p < 2; p++) {
        const col_isa chosen = col_choose_isa(COL_ISA_AMX);
        const uint64_t bytes = col_pool_scratch_size(chosen, threads[p], &limits);
        pools[p].scratch = NULL;
        if (posix_memalign(&pools[p].scratch, 64, bytes) != 0) pools[p].scratch = NULL;
        pools[p].pool = col_pool_create(chosen, threads[p], pools[p].scratch, bytes, &limits, &alloc);
    }
    unsetenv("COLIBRI_KERNELS");
    CHECK(pools[0].pool && pools[1].pool);
    const uint32_t kinds[] = {COL_DTYPE_F32, COL_DTYPE_BF16, COL_DTYPE_Q8_0, COL_DTYPE_Q4_0};
    const uint64_t n_up = 2 * CHAIN_GROUPS * D_FF * D_MODEL, n_down = CHAIN_GROUPS * D_MODEL * D_FF;
    float *wu = malloc(n_up * sizeof *wu), *wd = malloc(n_down * sizeof *wd), *x = malloc(CHAIN_TOKENS * D_MODEL * sizeof *x);
    double *stored = malloc(n_up * sizeof *stored);
    const uint64_t h_n = 2 * CHAIN_GROUPS * CHAIN_TOKENS * D_FF, y_n = CHAIN_GROUPS * CHAIN_TOKENS * D_MODEL;
    float *h[3], *y[3], *side[3];
    for (int v = 0; v < 3; v++) {
        h[v] = calloc(h_n, sizeof(float));
        y[v] = calloc(y_n, sizeof(float));
        side[v] = calloc(CHAIN_TOKENS * D_FF, sizeof(float));
    }
    for (uint64_t i = 0; i < n_up; i++) wu[i] = frand();
    for (uint64_t i = 0; i < n_down; i++) wd[i] = frand();
    for (uint64_t i = 0; i < CHAIN_TOKENS * D_MODEL; i++) x[i] = frand();
    int differ = 0;
    for (size_t d = 0; pools[0].pool && pools[1].pool && d < sizeof kinds / sizeof *kinds; d++) {
        uint8_t *up = store(wu, 2 * CHAIN_GROUPS * D_FF, D_MODEL, kinds[d], stored);
        uint8_t *down = store(wd, CHAIN_GROUPS * D_MODEL, D_FF, kinds[d], stored);
        for (uint32_t tokens = 1; tokens <= CHAIN_TOKENS; tokens += CHAIN_TOKENS - 1) {
            col_matvec_job jobs[3 * CHAIN_GROUPS + 1];
            uint32_t group[3 * CHAIN_GROUPS + 1];
            for (int v = 0; v < 3; v++) { /* v = 0: the stages one after the other; 1, 2: a chain on 1 and 3 threads */
                memset(h[v], 0, h_n * sizeof(float));
                memset(y[v], 0, y_n * sizeof(float));
                const uint32_t first = chain_jobs(up, down, kinds[d], x, tokens, h[v], y[v], side[v], jobs, group);
                const uint32_t n_jobs = first + CHAIN_GROUPS;
                chain_ctx c = {h[v], 0, tokens};
                if (v == 0) {
                    col_matmul_many(pools[0].pool, jobs, first);
                    for (uint32_t g = 0; g < CHAIN_GROUPS; g++) chain_step(&c, 0, g);
                    col_matmul_many(pools[0].pool, jobs + first, n_jobs - first);
                } else {
                    col_matmul_chain(pools[v - 1].pool, jobs, first, n_jobs, group, CHAIN_GROUPS, chain_step, &c);
                }
            }
            for (int v = 1; v < 3; v++)
                differ += memcmp(y[0], y[v], y_n * sizeof(float)) != 0 || memcmp(h[0], h[v], h_n * sizeof(float)) != 0 ||
                          memcmp(side[0], side[v], (uint64_t)tokens * D_FF * sizeof(float)) != 0;
        }
        free(up), free(down);
    }
    CHECK(differ == 0);
    if (differ) fprintf(stderr, "chain (%s): %d runs differ from the stages run in turn\n", isa, differ);
    for (int v = 0; v < 3; v++) free(h[v]), free(y[v]), free(side[v]);
    free(wu), free(wd), free(x), free(stored);
    pool_done(&pools[0]);
    pool_done(&pools[1]);
}

/* AMX pools of 1 and 3 threads for products within (max_t, max_c): 1 when both run AMX; 0 (with a
 * note, or a failed CHECK when a pool could not be made) otherwise, nothing left to free. */
static int amx_pools(const char *test, uint32_t max_t, uint64_t max_c, run *one, run *three)
{
    *one = pool_for("amx", 1, max_t, max_c);
    *three = pool_for("amx", 3, max_t, max_c);
    CHECK(one->pool && three->pool);
    if (one->pool && three->pool && col_pool_isa(one->pool) == COL_ISA_AMX) return 1;
    if (one->pool && three->pool) fprintf(stderr, "%s: AMX not available here\n", test);
    pool_done(one);
    pool_done(three);
    return 0;
}

/* AMX batches over long rows walk chunks of 32 blocks, several 32-row blocks at a time, saving
 * the C tiles between chunks: a bf16 product over rows of 2112 columns (three chunks; 200 rows:
 * six 32-row blocks and a short rest) gives the same bits on 1 and 3 threads and as its tokens
 * stepped one at a time, with three activation parts and with one. */
static void test_amx_long_rows(void)
{
    enum { NT = 40, COLS = 2112, ROWS = 200 };
    run one, three;
    if (!amx_pools("amx long rows", NT, COLS, &one, &three)) return;
    float *wv = malloc(ROWS * COLS * sizeof *wv), *x = malloc(NT * COLS * sizeof *x);
    double *ws = malloc(ROWS * COLS * sizeof *ws);
    float *y1 = malloc(NT * ROWS * sizeof *y1), *y3 = malloc(NT * ROWS * sizeof *y3), ystep[ROWS];
    for (uint64_t i = 0; i < ROWS * COLS; i++) wv[i] = frand();
    uint8_t *data = store(wv, ROWS, COLS, COL_DTYPE_BF16, ws);
    col_weight w = {data, COL_DTYPE_BF16, ROWS, COLS, 0};
    for (int x_bf16 = 0; x_bf16 <= 1; x_bf16++) {
        for (uint64_t i = 0; i < NT * COLS; i++) x[i] = frand();
        if (x_bf16) col_round_bf16(one.pool, x, NT * COLS);
        col_matvec_job a = {w, x, y1, NT, NULL}, b = {w, x, y3, NT, NULL};
        col_matmul_kernels(one.pool, &a, 1, x_bf16);
        col_matmul_kernels(three.pool, &b, 1, x_bf16);
        CHECK(memcmp(y1, y3, sizeof(float) * NT * ROWS) == 0);
        int bad_step = 0;
        for (uint32_t t = 0; t < NT; t++) {
            col_matvec_job step = {w, x + t * COLS, ystep, 1, NULL};
            col_matmul_kernels(three.pool, &step, 1, x_bf16);
            bad_step += memcmp(ystep, y3 + t * ROWS, sizeof ystep) != 0;
        }
        if (bad_step) fprintf(stderr, "amx long rows (x_bf16 %d): %d tokens differ between batch and step\n", x_bf16, bad_step);
        CHECK(bad_step == 0);
    }
    free(data);
    free(wv), free(x), free(ws), free(y1), free(y3);
    pool_done(&one);
    pool_done(&three);
}

/* AMX decode walks a thread's rows as groups of 8 rows from 8 streams (run_decode), the rows left
 * over apart: bf16 products of 203 and 1000 rows (25 rows a stream and 3 left over, 125 and none,
 * on one thread; other splits on three) stepped one token at a time give a batch's bits on 1 and 3
 * threads, with three activation parts and with one. */
static void test_amx_decode_streams(void)
{
    enum { NT = 6, COLS = 1024, MAX_ROWS = 1000 };
    static const uint64_t row_counts[] = {203, MAX_ROWS};
    run one, three;
    if (!amx_pools("amx decode streams", NT, COLS, &one, &three)) return;
    float *wv = malloc(MAX_ROWS * COLS * sizeof *wv), *x = malloc(NT * COLS * sizeof *x);
    double *ws = malloc(MAX_ROWS * COLS * sizeof *ws);
    float *y = malloc(NT * MAX_ROWS * sizeof *y), *y1 = malloc(MAX_ROWS * sizeof *y1), *y3 = malloc(MAX_ROWS * sizeof *y3);
    for (uint64_t i = 0; i < MAX_ROWS * COLS; i++) wv[i] = frand();
    int bad = 0;
    for (size_t ri = 0; ri < sizeof row_counts / sizeof *row_counts; ri++) {
        const uint64_t rows = row_counts[ri];
        uint8_t *data = store(wv, rows, COLS, COL_DTYPE_BF16, ws);
        col_weight w = {data, COL_DTYPE_BF16, rows, COLS, 0};
        for (int x_bf16 = 0; x_bf16 <= 1; x_bf16++) {
            for (uint64_t i = 0; i < NT * COLS; i++) x[i] = frand();
            if (x_bf16) col_round_bf16(one.pool, x, NT * COLS);
            col_matvec_job batch = {w, x, y, NT, NULL};
            col_matmul_kernels(one.pool, &batch, 1, x_bf16);
            for (uint32_t t = 0; t < NT; t++) {
                col_matvec_job s1 = {w, x + t * COLS, y1, 1, NULL}, s3 = {w, x + t * COLS, y3, 1, NULL};
                col_matmul_kernels(one.pool, &s1, 1, x_bf16);
                col_matmul_kernels(three.pool, &s3, 1, x_bf16);
                bad += memcmp(y1, y + t * rows, rows * sizeof *y1) != 0;
                bad += memcmp(y3, y + t * rows, rows * sizeof *y3) != 0;
            }
        }
        free(data);
    }
    if (bad) fprintf(stderr, "amx decode streams: %d steps differ from the batch\n", bad);
    CHECK(bad == 0);
    free(wv), free(x), free(ws), free(y), free(y1), free(y3);
    pool_done(&one);
    pool_done(&three);
}

/* A pool given scratch sized for the vector paths, on a machine that would choose AMX, runs
 * AVX-512 instead of overrunning it (the session sizes its scratch before creating the pool; the
 * choice could change in between, e.g. with COLIBRI_KERNELS). */
static void test_amx_falls_back_when_scratch_is_short(void)
{
    col_allocator alloc;
    col_allocator_or_default(NULL, &alloc);
    col_pool_limits limits = {1, 6 * 1056, 6, 1056};
    if (col_choose_isa(COL_ISA_AMX) != COL_ISA_AMX) { /* nothing to fall back from */
        fprintf(stderr, "amx fallback: AMX not available here\n");
        return;
    }
    uint64_t vector_only = col_pool_scratch_size(COL_ISA_AVX512, 2, &limits);
    CHECK(vector_only < col_pool_scratch_size(COL_ISA_AMX, 2, &limits));
    void *scratch = NULL;
    CHECK(posix_memalign(&scratch, 64, vector_only) == 0);
    col_pool *pool = col_pool_create(COL_ISA_AMX, 2, scratch, vector_only, &limits, &alloc);
    CHECK(pool != NULL);
    if (pool) CHECK(strcmp(col_isa_name(col_pool_isa(pool)), "avx512") == 0);
    col_pool_free(pool);
    free(scratch);
}

/* RMSNorm rows on one path: the bits of the definition written out here (the squares summed in
 * one chain from element 0 up), for every length 1..300 (every tail of 16) and long rows, with
 * values of mixed magnitude, in place and out of place. */
static void test_rmsnorm_row(col_isa isa)
{
    enum { N = 2100 };
    float *x = malloc(N * sizeof *x), *w = malloc(N * sizeof *w), *out = malloc(N * sizeof *out),
          *in_place = malloc(N * sizeof *in_place);
    for (int i = 0; i < N; i++) {
        x[i] = frand() * (i % 7 == 0 ? 300.0f : 1.0f);
        w[i] = 1.0f + 0.5f * frand();
    }
    int wrong = 0;
    for (uint64_t n = 1; n <= N; n = n < 300 ? n + 1 : n + 900) {
        float ss = 0.0f;
        for (uint64_t i = 0; i < n; i++) ss += x[i] * x[i];
        const float inv = 1.0f / sqrtf(ss / (float)n + 1e-6f);
        col_rmsnorm_row(isa, x, w, 1e-6f, n, out);
        memcpy(in_place, x, n * sizeof *x);
        col_rmsnorm_row(isa, in_place, w, 1e-6f, n, in_place);
        for (uint64_t i = 0; i < n; i++) {
            const float want = w[i] * (x[i] * inv);
            wrong += memcmp(&out[i], &want, sizeof want) != 0 || memcmp(&in_place[i], &want, sizeof want) != 0;
        }
    }
    CHECK(wrong == 0);
    if (wrong) fprintf(stderr, "rmsnorm rows %s: %d elements off the definition\n", col_isa_name(isa), wrong);
    free(x), free(w), free(out), free(in_place);
}

/* Same bits, or both NaN (a NaN's payload may follow either operand of an add). */
static int same_float(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

/* RMSNorm of several rows at once on one path: each row the bits of the definition (as
 * test_rmsnorm_row), for 1..19 rows (whole and partial groups of 8 lanes), lengths with every tail
 * of 8 and Qwen3's head of 128, in place and out of place; values of mixed magnitude, and rows
 * whose squares overflow, are subnormal, zero or NaN. */
static void test_rmsnorm_rows(col_isa isa)
{
    enum { ROWS = 19, MAXN = 1031 };
    static const uint64_t lengths[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 64, 127, 128, 129, 1024, 1031};
    float *x = malloc(ROWS * MAXN * sizeof *x), *w = malloc(MAXN * sizeof *w), *out = malloc(ROWS * MAXN * sizeof *out),
          *in_place = malloc(ROWS * MAXN * sizeof *in_place);
    for (int i = 0; i < MAXN; i++) w[i] = 1.0f + 0.5f * frand();
    int wrong = 0;
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        const uint64_t n = lengths[li];
        for (uint64_t r = 0; r < ROWS; r++)
            for (uint64_t i = 0; i < n; i++) {
                float v = frand() * (i % 7 == 0 ? 300.0f : 1.0f);
                if (r == 3) v *= 1e20f;                       /* squares overflow to inf */
                if (r == 5) v *= 1e-30f;                      /* squares underflow */
                if (r == 6) v = 0.0f;                         /* a sum of zero: eps alone */
                if (r == 9 && i == n / 2) v = NAN;
                if (r == 10 && i == n - 1) v = 1e19f;         /* the last square alone overflows */
                x[r * n + i] = v;
            }
        for (uint32_t rows = 1; rows <= ROWS; rows++) {
            col_rmsnorm_rows(isa, x, w, 1e-6f, n, rows, out);
            memcpy(in_place, x, rows * n * sizeof *x);
            col_rmsnorm_rows(isa, in_place, w, 1e-6f, n, rows, in_place);
            for (uint64_t r = 0; r < rows; r++) {
                const float *xr = x + r * n;
                float ss = 0.0f;
                for (uint64_t i = 0; i < n; i++) ss += xr[i] * xr[i];
                const float inv = 1.0f / sqrtf(ss / (float)n + 1e-6f);
                for (uint64_t i = 0; i < n; i++) {
                    const float want = w[i] * (xr[i] * inv);
                    wrong += !same_float(out[r * n + i], want) || !same_float(in_place[r * n + i], want);
                }
            }
        }
    }
    CHECK(wrong == 0);
    if (wrong) fprintf(stderr, "rmsnorm of several rows %s: %d elements off the definition\n", col_isa_name(isa), wrong);
    free(x), free(w), free(out), free(in_place);
}

/* acc += w * x on one path: the portable loop's bits (a product, then a sum) for every tail. */
static void test_add_scaled(col_isa isa)
{
    enum { N = 77 };
    float x[N], acc[N], want[N];
    int wrong = 0;
    for (uint64_t n = 0; n <= N; n++) {
        for (int i = 0; i < N; i++) acc[i] = want[i] = frand() * 3.0f, x[i] = frand();
        const float w = frand() * 7.0f;
        for (uint64_t i = 0; i < n; i++) want[i] += w * x[i];
        col_add_scaled(isa, acc, w, x, n);
        wrong += memcmp(acc, want, sizeof acc) != 0; /* and nothing past n written */
    }
    CHECK(wrong == 0);
}

/* The greedy choice on one path: the first of equal largest values, a NaN never chosen over a
 * number (0 when every value is NaN or -inf), for every length around the vector widths. */
static void test_first_largest(col_isa isa)
{
    enum { N = 41 };
    float x[N];
    int wrong = 0;
    for (uint32_t n = 1; n <= N; n++) {
        for (uint32_t i = 0; i < N; i++) x[i] = -1.0f - (float)i;
        for (uint32_t at = 0; at < n; at++) { /* the largest at each place, then tied later */
            const float keep = x[at];
            x[at] = 5.0f;
            wrong += col_first_largest(isa, x, n) != at;
            if (at + 1 < n) { /* tied by the last one */
                const float last = x[n - 1];
                x[n - 1] = 5.0f;
                wrong += col_first_largest(isa, x, n) != at;
                x[n - 1] = last;
            }
            x[at] = keep;
        }
        x[0] = NAN; /* a NaN first, then everywhere, then -inf everywhere but one NaN */
        wrong += col_first_largest(isa, x, n) != (n > 1 ? 1u : 0u);
        for (uint32_t i = 0; i < n; i++) x[i] = NAN;
        wrong += col_first_largest(isa, x, n) != 0;
        for (uint32_t i = 0; i < n; i++) x[i] = -INFINITY;
        x[n / 2] = NAN;
        wrong += col_first_largest(isa, x, n) != 0;
    }
    CHECK(wrong == 0);
}

/* RoPE's rotate_half on one path: the portable loop's bits (two products, then a difference or a
 * sum) for every half length, and nothing past 2 * half written. */
static void test_rotate_half(col_isa isa)
{
    enum { HALF = 70 };
    float v[2 * HALF + 1], want[2 * HALF + 1], c[HALF], s[HALF];
    int wrong = 0;
    for (uint32_t half = 0; half <= HALF; half++) {
        for (int i = 0; i < 2 * HALF + 1; i++) v[i] = want[i] = frand() * 4.0f;
        for (int i = 0; i < HALF; i++) c[i] = frand(), s[i] = frand();
        for (uint32_t i = 0; i < half; i++) {
            float x1 = want[i], x2 = want[i + half];
            want[i] = x1 * c[i] - x2 * s[i];
            want[i + half] = x2 * c[i] + x1 * s[i];
        }
        col_rotate_half(isa, v, half, c, s);
        wrong += memcmp(v, want, sizeof v) != 0;
    }
    CHECK(wrong == 0);
}

/* The SwiGLU gate on one path: within 4 ulp of silu(a) * b computed in double precision over a
 * sweep of inputs (exp from underflow to overflow), the special values as the C library gives
 * them (0, infinities, NaN), every tail length, and the same bits on 1 and 3 threads when the
 * gate is long enough to be split among them. */
static void test_swiglu_gate(const char *isa)
{
    enum { N = 70000 };
    run one = pool_for(isa, 1, 1, 32), three = pool_for(isa, 3, 1, 32);
    CHECK(one.pool && three.pool);
    if (!one.pool || !three.pool) return;
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *g1 = malloc(N * sizeof *g1),
          *g3 = malloc(N * sizeof *g3);
    for (int i = 0; i < N; i++) {
        a[i] = -120.0f + 240.0f * (float)i / (float)N + 1e-3f * frand(); /* exp(-a) from 0 to inf */
        b[i] = frand();
    }
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.7f, -88.7f, 1e-30f, -1e-30f, 103.9f};
    memcpy(a, special, sizeof special);
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) b[i] = 1.5f;
    memcpy(g1, a, N * sizeof *a);
    memcpy(g3, a, N * sizeof *a);
    col_swiglu_gate(one.pool, g1, b, N);
    col_swiglu_gate(three.pool, g3, b, N);
    CHECK(memcmp(g1, g3, N * sizeof *g1) == 0);
    int far = 0, special_wrong = 0;
    for (int i = 0; i < N; i++) {
        double want = (double)a[i] / (1.0 + exp(-(double)a[i])) * (double)b[i];
        float libm = a[i] / (1.0f + expf(-a[i])) * b[i];
        if (i < (int)(sizeof special / sizeof *special)) {
            special_wrong += !(isnan(libm) ? isnan(g1[i]) : g1[i] == libm && signbit(g1[i]) == signbit(libm));
            continue;
        }
        if (a[i] < -87.0f) { /* exp(-a) near or past the f32 range: the result is as small as expf's */
            special_wrong += !(fabsf(g1[i] - libm) <= fmaxf(fabsf(libm) * 5e-7f, 1e-44f));
            continue;
        }
        double ulp = fmax(fabs(want) * 1.2e-7, 1e-45);
        far += fabs((double)g1[i] - want) > 4.0 * ulp;
    }
    CHECK(far == 0);
    CHECK(special_wrong == 0);
    int tails_wrong = 0; /* lengths 1..40 give the same values as the long run (element-wise) */
    for (int n = 1; n <= 40; n++) {
        float t[40];
        memcpy(t, a + 1000, (size_t)n * sizeof *t);
        col_swiglu_gate(one.pool, t, b + 1000, (uint64_t)n);
        tails_wrong += memcmp(t, g1 + 1000, (size_t)n * sizeof *t) != 0;
    }
    CHECK(tails_wrong == 0);
    if (far || special_wrong) fprintf(stderr, "swiglu gate %s: %d far, %d special wrong\n", isa, far, special_wrong);
    free(a), free(b), free(g1), free(g3);
    pool_done(&one);
    pool_done(&three);
}

/* The query heads of a KV group on one path, against a double-precision softmax(q.K * scale) . V
 * per head: head dimensions with and without a partial block of 16 (17, 64, 80, 128, 200, and
 * 288: more strips of dimensions than AVX-512 carries from chunk to chunk of a step's values), key
 * counts around the groups of keys the AVX-512 scores use (1..35) and 101 (a step's values in
 * chunks of 28 rows on AVX-512, the last odd), keys spaced by a stride as in the cache, 1..5 or 8
 * heads per group, without and with a sink logit per head (GPT-OSS: in the softmax, its
 * probability dropped). Every head's output is also the same, bit for bit, as that head run alone
 * without prefetching (a head's result must not depend on its group or on the prefetch distance,
 * which makes it a step's). A cache of halves (kv_f16) gives the bits of the same job over f32
 * rows holding the halves' values, step and block alike. */
static void test_attend_heads(const char *isa)
{
    run r = pool_for(isa, 1, 1, 32);
    CHECK(r.pool != NULL);
    if (!r.pool) return;
    enum { MAX_KEYS = 101, MAX_D = 288, MAX_Q = 8, STRIDE = 2 * MAX_D + 3, CELLS = MAX_KEYS * STRIDE };
    float *k = malloc(CELLS * sizeof *k), *v = malloc(CELLS * sizeof *v), q[MAX_Q * MAX_D],
          *scores = malloc(MAX_Q * MAX_KEYS * sizeof *scores), out[MAX_Q * MAX_D], alone[MAX_D], sinks[MAX_Q];
    float *k_wide = malloc(CELLS * sizeof *k_wide), *v_wide = malloc(CELLS * sizeof *v_wide), halves_out[MAX_Q * MAX_D];
    uint16_t *k_half = malloc(CELLS * sizeof *k_half), *v_half = malloc(CELLS * sizeof *v_half);
    for (int i = 0; i < CELLS; i++) k[i] = 2.0f * frand(), v[i] = frand();
    for (int h = 0; h < MAX_Q; h++) sinks[h] = 4.0f * frand();
    col_f16_row(col_pool_isa(r.pool), k, CELLS, k_half);
    col_f16_row(col_pool_isa(r.pool), v, CELLS, v_half);
    for (int i = 0; i < CELLS; i++) k_wide[i] = col_f16_to_f32(k_half[i]), v_wide[i] = col_f16_to_f32(v_half[i]);
    const uint32_t dims[] = {17, 64, 80, 128, 200, 288}, groups[] = {1, 2, 3, 4, 5, 8};
    int bad = 0, grouped_differs = 0, halves_differ = 0;
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        uint32_t d = dims[di];
        for (uint32_t i = 0; i < MAX_Q * d; i++) q[i] = frand();
        for (size_t gi = 0; gi < sizeof groups / sizeof *groups; gi++) {
            uint32_t nq = groups[gi];
            for (int sunk = 0; sunk < 2; sunk++) for (uint32_t n = 1; n <= MAX_KEYS; n = n < 35 ? n + 1 : MAX_KEYS) {
                const float *sink = sunk ? sinks : NULL;
                /* prefetching changes nothing */
                col_head_job job = {.q = q, .k = k, .v = v, .stride = STRIDE, .n_keys = n, .d = d, .scale = 0.125f,
                                    .n_q = nq, .prefetch = 7, .sinks = sink};
                col_attend_head(r.pool, &job, scores, out);
                for (int step = 0; step < 2; step++) {
                    col_head_job wide = job, half = job;
                    wide.k = k_wide, wide.v = v_wide, half.k = k_half, half.v = v_half, half.kv_f16 = 1;
                    wide.prefetch = half.prefetch = step ? 7 : 0;
                    float wide_out[MAX_Q * MAX_D];
                    col_attend_head(r.pool, &wide, scores, wide_out);
                    col_attend_head(r.pool, &half, scores, halves_out);
                    halves_differ += memcmp(wide_out, halves_out, nq * d * sizeof *wide_out) != 0;
                }
                for (uint32_t h = 0; h < nq; h++) {
                    col_head_job one = {.q = q + h * d, .k = k, .v = v, .stride = STRIDE, .n_keys = n, .d = d,
                                        .scale = 0.125f, .n_q = 1, .sinks = sink ? sink + h : NULL};
                    col_attend_head(r.pool, &one, scores, alone);
                    grouped_differs += memcmp(alone, out + h * d, d * sizeof *alone) != 0;
                    double p[MAX_KEYS], max = sink ? sink[h] : -INFINITY, sum = 0.0;
                    for (uint32_t t = 0; t < n; t++) {
                        double dot = 0.0;
                        for (uint32_t i = 0; i < d; i++) dot += (double)q[h * d + i] * k[t * STRIDE + i];
                        p[t] = dot * 0.125;
                        max = p[t] > max ? p[t] : max;
                    }
                    for (uint32_t t = 0; t < n; t++) sum += p[t] = exp(p[t] - max);
                    if (sink) sum += exp(sink[h] - max);
                    for (uint32_t i = 0; i < d; i++) {
                        double want = 0.0;
                        for (uint32_t t = 0; t < n; t++) want += p[t] / sum * v[t * STRIDE + i];
                        bad += fabs(out[h * d + i] - want) > 2e-6;
                    }
                }
                if (n == MAX_KEYS) break;
            }
        }
    }
    CHECK(bad == 0);
    CHECK(grouped_differs == 0);
    CHECK(halves_differ == 0);
    if (bad || grouped_differs || halves_differ)
        fprintf(stderr, "attend heads %s: %d outputs off, %d grouped heads differ, %d half caches differ\n", isa, bad,
                grouped_differs, halves_differ);
    free(k), free(v), free(scores), free(k_wide), free(v_wide), free(k_half), free(v_half);
    pool_done(&r);
}

/* x rounded to the nearest bf16 (ties to even), as the act-bf16 numerics variant rounds it. */
static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* col_round_bf16 on a path: the bits of round_bf16 (the scalar rule) for every element, with ties,
 * signed zeros, subnormals, the largest finite value (to Inf), Inf and NaN (unchanged), on a short
 * array with a vector tail and on one long enough for the pool's threads. */
static void test_round_bf16(const char *isa)
{
    run r = pool_for(isa, 3, 1, 32);
    CHECK(r.pool != NULL);
    if (!r.pool) return;
    static const uint64_t sizes[] = {37, 100003};
    for (size_t si = 0; si < 2; si++) {
        uint64_t n = sizes[si];
        float *v = malloc(n * sizeof *v), *want = malloc(n * sizeof *want);
        for (uint64_t i = 0; i < n; i++) v[i] = frand() * 1000.0f;
        const float special[] = {1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f, -0.0f, 0.0f, 1e-39f, -3e-40f,
                                 3.4028235e38f, INFINITY, -INFINITY, NAN};
        for (size_t k = 0; k < sizeof special / sizeof *special; k++) v[k * 3] = special[k];
        for (uint64_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &v[i], 4);
            want[i] = (bits & 0x7F800000u) == 0x7F800000u ? v[i] : round_bf16(v[i]);
        }
        col_round_bf16(r.pool, v, n);
        CHECK(memcmp(v, want, n * sizeof *v) == 0);
        free(v), free(want);
    }
    pool_done(&r);
}

/* col_round_f16 on a path: the portable conversion's bits (test_numerics checks its rounding) for
 * values across the half range and past it, with ties, subnormal and underflowing halves, the
 * largest half and the first value that rounds to Inf, Inf and NaNs of both signs and several
 * payloads, on a short array and on one long enough for the pool's threads. */
static void test_round_f16(const char *isa)
{
    run r = pool_for(isa, 3, 1, 32);
    CHECK(r.pool != NULL);
    if (!r.pool) return;
    static const uint64_t sizes[] = {37, 100003};
    for (size_t si = 0; si < 2; si++) {
        uint64_t n = sizes[si];
        float *v = malloc(n * sizeof *v), *want = malloc(n * sizeof *want);
        for (uint64_t i = 0; i < n; i++) v[i] = ldexpf(frand(), (int)(i % 48) - 30);
        uint32_t nan_bits[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7FA12345u};
        float nans[4];
        memcpy(nans, nan_bits, sizeof nans);
        const float special[] = {1.0f + 0x1p-11f, 1.0f + 0x1p-10f + 0x1p-11f, -0.0f, 0.0f, 0x1p-24f, 0x1p-25f,
                                 0x1.8p-25f, -0x1.8p-24f, 0x1p-26f, 65504.0f, 65519.0f, 65520.0f, -65520.0f,
                                 3.4e38f, INFINITY, -INFINITY, nans[0], nans[1], nans[2], nans[3]};
        for (size_t k = 0; k < sizeof special / sizeof *special; k++) v[k] = special[k];
        memcpy(want, v, n * sizeof *v);
        col_round_f16(NULL, want, n);
        uint16_t *halves = malloc(n * sizeof *halves); /* the same values as bits (the KV cache's) */
        col_f16_row(col_pool_isa(r.pool), v, n, halves);
        int halves_wrong = 0;
        for (uint64_t i = 0; i < n; i++) {
            const float back = col_f16_to_f32(halves[i]);
            halves_wrong += memcmp(&back, &want[i], sizeof back) != 0;
        }
        CHECK(halves_wrong == 0);
        col_round_f16(r.pool, v, n);
        CHECK(memcmp(v, want, n * sizeof *v) == 0);
        free(v), free(want), free(halves);
    }
    pool_done(&r);
}

/* Activations that are bf16 values already (x_bf16): the AMX path packs one part per token, 16
 * tokens per tile, and every output keeps the bits three parts give, on any thread count, in a
 * batch as in a step. Signed zeros and a subnormal are among the activations. */
static void test_amx_one_part(void)
{
    enum { MAX_T = 70, MAX_C = 1056 };
    run one, three;
    if (!amx_pools("amx one part", MAX_T, MAX_C, &one, &three)) return;
    static const uint64_t cols_list[] = {17, 32, 100, 1056};
    static const uint64_t rows_list[] = {1, 7, 16, 37};
    static const uint32_t nt_list[] = {1, 2, 5, 6, 16, 17, 33, 70};
    int differs = 0, differs_threads = 0, differs_step = 0;
    for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
            for (size_t ti = 0; ti < sizeof nt_list / sizeof *nt_list; ti++) {
                uint64_t cols = cols_list[ci], rows = rows_list[ri];
                uint32_t nt = nt_list[ti];
                float *wv = malloc(rows * cols * sizeof *wv), *x = malloc(nt * cols * sizeof *x);
                double *ws = malloc(rows * cols * sizeof *ws);
                for (uint64_t i = 0; i < rows * cols; i++) wv[i] = frand();
                for (uint64_t i = 0; i < nt * cols; i++) x[i] = round_bf16(frand());
                x[0] = -0.0f;
                if (nt * cols > 2) x[1] = 0.0f, x[2] = 1e-39f; /* 1e-39: a bf16 subnormal */
                uint8_t *data = store(wv, rows, cols, COL_DTYPE_BF16, ws);
                col_weight w = {data, COL_DTYPE_BF16, rows, cols, 0};
                float *y_three = malloc(nt * rows * sizeof(float)), *y_one = malloc(nt * rows * sizeof(float));
                float *y_one3 = malloc(nt * rows * sizeof(float)), *ystep = malloc(rows * sizeof(float));
                col_matvec_job a = {w, x, y_three, nt, NULL}, b = {w, x, y_one, nt, NULL}, c = {w, x, y_one3, nt, NULL};
                col_matmul_kernels(one.pool, &a, 1, 0);
                col_matmul_kernels(one.pool, &b, 1, 1);
                col_matmul_kernels(three.pool, &c, 1, 1);
                differs += memcmp(y_three, y_one, nt * rows * sizeof(float)) != 0;
                differs_threads += memcmp(y_one, y_one3, nt * rows * sizeof(float)) != 0;
                for (uint32_t t = 0; t < nt; t++) {
                    col_matvec_job step = {w, x + t * cols, ystep, 1, NULL};
                    col_matmul_kernels(three.pool, &step, 1, 1);
                    differs_step += memcmp(ystep, y_one + t * rows, rows * sizeof(float)) != 0;
                }
                free(wv), free(x), free(ws), free(data), free(y_three), free(y_one), free(y_one3), free(ystep);
            }
    if (differs || differs_threads || differs_step)
        fprintf(stderr, "amx one part: %d products differ from three parts, %d by thread count, %d steps from "
                        "their batch\n", differs, differs_threads, differs_step);
    CHECK(differs == 0);
    CHECK(differs_threads == 0);
    CHECK(differs_step == 0);
    pool_done(&one);
    pool_done(&three);
}

int main(void)
{
    test_load_range();
    test_amx_falls_back_when_scratch_is_short();
    test_parallel_preparation();
    test_pool_run_items_once();
    test_chain_matches_stages("portable");
    test_chain_matches_stages("amx");
    test_path("portable");
    test_bf16_panels("portable");
    test_round_bf16("portable");
    test_round_f16("portable");
    test_swiglu_gate("portable");
    test_rmsnorm_row(COL_ISA_PORTABLE);
    test_rmsnorm_rows(COL_ISA_PORTABLE);
    test_add_scaled(COL_ISA_PORTABLE);
    test_first_largest(COL_ISA_PORTABLE);
    test_rotate_half(COL_ISA_PORTABLE);
    test_attend_heads("portable");
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_path("avx2");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_bf16_panels("avx2");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_float_order("avx2", 8);
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
        test_path("avx512f");
        test_bf16_panels("avx512f");
        test_float_order("avx512f", 16);
        test_swiglu_gate("avx512f");
        test_round_bf16("avx512f");
        test_round_f16("avx512f");
        test_attend_heads("avx512f");
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        test_path("avx512");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        test_bf16_panels("avx512");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        test_avx512f_bits();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        test_float_order("avx512", 16);
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        test_widened_tiles();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        test_int8_definition();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        test_int8_stored_panels_avx512();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_swiglu_gate("avx2");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_rmsnorm_row(COL_ISA_AVX2);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_rmsnorm_rows(COL_ISA_AVX2);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_add_scaled(COL_ISA_AVX2);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_first_largest(COL_ISA_AVX2);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_rotate_half(COL_ISA_AVX2);
    if (__builtin_cpu_supports("avx512f")) test_swiglu_gate("avx512");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_round_bf16("avx2");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        test_round_bf16("avx512");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_round_f16("avx2");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        test_round_f16("avx512");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_attend_heads("avx2");
    if (__builtin_cpu_supports("avx512f")) test_attend_heads("avx512");
    test_path("amx");
    test_bf16_panels("amx");
    test_amx_one_part();
    test_amx_long_rows();
    test_amx_decode_streams();
#endif
    return TEST_REPORT();
}
