/*
 * numerics.c - the numerics variants a session can run instead of the default kernels, so the
 * routing-jitter lab measures real computations rather than simulating them after the fact.
 *
 * Each variant is a computation a deployment could run:
 *   reduction order   SEQUENTIAL (one accumulator, the scalar loop), PAIRWISE (recursive halving
 *                     with leaves of 8, numpy's shape), BLOCKED by L lanes (element i goes to lane
 *                     i % L, then the lanes are summed as a pairwise tree: the shape of an L-wide
 *                     SIMD accumulator), each with or without fused multiply-add;
 *   thread split      each dot product cut into S contiguous parts of the row (split-K among S
 *                     workers), each part reduced as above, the partial sums combined from the
 *                     last part to the first (a fixed order that differs from the sequential one);
 *   activations       bf16 or f16 storage between operations: the input vector and the output of
 *                     every weight product, the embedding row and the residual stream after every
 *                     residual add are rounded to nearest even (norm sums, attention scores and
 *                     softmax, SwiGLU and the MoE weighted sum still compute in f32);
 *   bf16 dot products bf16 weights multiplied by the pairs of AVX512-BF16's vdpbf16ps, the
 *                     activations rounded to bf16 for them (COL_REDUCTION_BF16_DOT): the fast
 *                     choice where a CPU has the instruction and no AMX (the kernels define its
 *                     bits: col_dot_bf16_portable), and what it costs in routing, measured here;
 *   router noise      after the gate product, logit j moves by k ULPs, k uniform in [-N, N] from a
 *                     counter-based hash of (seed, position, layer, j): no generator state, so a
 *                     decision's noise does not depend on anything computed before it.
 * Weight precision is not a session setting: it is the same checkpoint written as f32/f16/bf16
 * (colibri.jitter does that), run with the default numerics.
 *
 * The reference loops below define each variant: an output is one dot product of its row, the
 * weights converted to f32 (block dtypes dequantised; the default path's int8 activation
 * quantisation is not modelled), in the variant's order, so its bits depend neither on the thread
 * count nor on how positions are batched. They are scalar and run on the portable path; the AVX2
 * and AVX-512 paths run numerics_x86.c's vector loops, which compute many rows at once with the
 * same operations per row and so give the same bits. Either way the rows are split over the pool's
 * threads (col_matmul_walk).
 */
#include "numerics.h"

#include "kernels_internal.h"

#include <math.h>
#include <string.h>

#define COL_MAX_NOISE_ULPS (1u << 22)

/* ---- configuration ----------------------------------------------------------------------- */

int32_t col_numerics_check(const col_session_config *c, char *err, size_t errlen)
{
    if (c->reduction > COL_REDUCTION_BF16_DOT)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "unknown reduction %u", c->reduction);
    if (c->reduction == COL_REDUCTION_BF16_DOT && (c->fma || c->split > 1))
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG,
                             "bf16 dot products fix their own operations: fma and split do not apply");
    if (c->reduction == COL_REDUCTION_BLOCKED && (c->lanes < 1 || c->lanes > COL_MAX_LANES))
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "blocked reduction needs lanes in 1..%u, got %u",
                             COL_MAX_LANES, c->lanes);
    if (c->reduction != COL_REDUCTION_BLOCKED && c->lanes != 0)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "lanes %u set without the blocked reduction", c->lanes);
    if (c->fma > 1) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "fma must be 0 or 1");
    if (c->split > COL_MAX_SPLIT)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "split %u outside 0..%u", c->split, COL_MAX_SPLIT);
    if (c->activation > COL_ACTIVATION_F16)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "unknown activation precision %u", c->activation);
    if (c->kv_precision > COL_KV_F16)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "unknown KV cache precision %u", c->kv_precision);
    if (c->router_noise_ulps > COL_MAX_NOISE_ULPS)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "router_noise_ulps %u above %u", c->router_noise_ulps,
                             COL_MAX_NOISE_ULPS);
    return COL_OK;
}

col_numerics col_numerics_of(const col_session_config *c)
{
    col_numerics nx = {c->reduction, c->lanes, c->fma, c->split, c->activation, c->router_noise_ulps, c->noise_seed};
    if (nx.reduction == COL_REDUCTION_DEFAULT && (nx.fma || nx.split > 1)) nx.reduction = COL_REDUCTION_SEQUENTIAL;
    return nx;
}

int col_numerics_hooks_products(const col_numerics *nx)
{
    return nx->reduction != COL_REDUCTION_DEFAULT || nx->activation != COL_ACTIVATION_F32;
}

int col_numerics_packs_bf16(const col_numerics *nx)
{
    return nx && nx->reduction == COL_REDUCTION_BF16_DOT &&
           (nx->activation == COL_ACTIVATION_F32 || nx->activation == COL_ACTIVATION_BF16);
}

/* ---- rounding to bf16 / f16 -------------------------------------------------------------- */

void col_numerics_round(const col_numerics *nx, struct col_pool *pool, float *v, uint64_t n)
{
    if (!nx || nx->activation == COL_ACTIVATION_F32) return;
    if (nx->activation == COL_ACTIVATION_BF16) /* the pool's vector kernels: every activation of
                                                  every product passes through here */
        col_round_bf16(pool, v, n);
    else
        col_round_f16(pool, v, n);
}

/* ---- router-logit noise ------------------------------------------------------------------ */

/* splitmix64 finaliser (as router.c's Gumbel noise, with its own salt below) */
static uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int32_t col_numerics_noise_ulps(uint64_t seed, uint32_t n_ulps, uint32_t position, uint32_t layer,
                                uint32_t expert)
{
    if (n_ulps == 0) return 0;
    uint64_t key = ((uint64_t)position << 32) ^ ((uint64_t)layer << 16) ^ expert ^ 0x6A697474657255ull; /* "jitterU" */
    uint64_t h = mix64(seed ^ mix64(key));
    uint64_t span = 2ull * n_ulps + 1ull;
    return (int32_t)(h % span) - (int32_t)n_ulps; /* modulo bias < span / 2^64: negligible */
}

/* Float bits <-> a signed integer line where adjacent floats differ by 1 (+0 and -0 both 0). */
static int64_t ordered_of(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return (b & 0x80000000u) ? -(int64_t)(b & 0x7FFFFFFFu) : (int64_t)b;
}

static float float_of_ordered(int64_t o)
{
    uint32_t b = o >= 0 ? (uint32_t)o : (0x80000000u | (uint32_t)(-o));
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

void col_numerics_perturb(const col_numerics *nx, float *logits, uint32_t n, uint32_t position, uint32_t layer)
{
    if (!nx || nx->noise_ulps == 0) return;
    const int64_t max_finite = 0x7F7FFFFF;
    for (uint32_t j = 0; j < n; j++) {
        if (!isfinite(logits[j])) continue;
        int64_t o = ordered_of(logits[j]) + col_numerics_noise_ulps(nx->noise_seed, nx->noise_ulps, position, layer, j);
        if (o > max_finite) o = max_finite;
        if (o < -max_finite) o = -max_finite;
        logits[j] = float_of_ordered(o);
    }
}

/* ---- reference dot products -------------------------------------------------------------- */

/* One stored row as f32: the whole row converted once (`full`, rows up to COL_ROW_BUFFER
 * elements, the common case) or, for longer rows, 32 elements at a time. */
#define COL_ROW_BUFFER 16384u
typedef struct row_reader {
    const float *full;    /* the converted row, or NULL */
    const uint8_t *data;  /* the matrix */
    uint32_t dtype;
    uint64_t row;         /* of the matrix */
    uint64_t n;
    uint64_t block;       /* index of the cached block, UINT64_MAX for none */
    float buf[32];
} row_reader;

static float row_at(row_reader *r, uint64_t i)
{
    if (r->full) return r->full[i];
    uint64_t b = i / 32;
    if (b != r->block) {
        uint64_t first = b * 32, count = r->n - first < 32 ? r->n - first : 32;
        col_load_matrix_range(r->data, r->dtype, r->n, r->row, first, count, r->buf);
        r->block = b;
    }
    return r->buf[i % 32];
}

static float mac(float acc, float w, float x, uint32_t use_fma)
{
    return use_fma ? fmaf(w, x, acc) : acc + w * x;
}

static float dot_sequential(row_reader *r, const float *x, uint64_t lo, uint64_t hi, uint32_t use_fma)
{
    float acc = 0.0f;
    for (uint64_t i = lo; i < hi; i++) acc = mac(acc, row_at(r, i), x[i], use_fma);
    return acc;
}

static float dot_pairwise(row_reader *r, const float *x, uint64_t lo, uint64_t hi, uint32_t use_fma)
{
    if (hi - lo <= COL_PAIRWISE_LEAF) return dot_sequential(r, x, lo, hi, use_fma);
    uint64_t mid = lo + (hi - lo) / 2;
    float left = dot_pairwise(r, x, lo, mid, use_fma);
    return left + dot_pairwise(r, x, mid, hi, use_fma);
}

static float sum_tree(const float *v, uint32_t lo, uint32_t hi)
{
    if (hi - lo == 1) return v[lo];
    uint32_t mid = lo + (hi - lo) / 2;
    return sum_tree(v, lo, mid) + sum_tree(v, mid, hi);
}

static float dot_blocked(row_reader *r, const float *x, uint64_t lo, uint64_t hi, uint32_t lanes, uint32_t use_fma)
{
    float acc[COL_MAX_LANES];
    for (uint32_t l = 0; l < lanes; l++) acc[l] = 0.0f;
    for (uint64_t i = lo; i < hi; i++) {
        uint32_t l = (uint32_t)((i - lo) % lanes);
        acc[l] = mac(acc[l], row_at(r, i), x[i], use_fma);
    }
    return sum_tree(acc, 0, lanes);
}

static float dot_part(const col_numerics *nx, row_reader *r, const float *x, uint64_t lo, uint64_t hi)
{
    if (lo >= hi) return 0.0f;
    switch (nx->reduction) {
    case COL_REDUCTION_PAIRWISE: return dot_pairwise(r, x, lo, hi, nx->fma);
    case COL_REDUCTION_BLOCKED: return dot_blocked(r, x, lo, hi, nx->lanes, nx->fma);
    default: return dot_sequential(r, x, lo, hi, nx->fma);
    }
}

static float dot_variant(const col_numerics *nx, row_reader *r, const float *x)
{
    uint64_t n = r->n;
    uint32_t parts = nx->split > 1 ? nx->split : 1;
    if (parts == 1) return dot_part(nx, r, x, 0, n);
    /* part p covers [n*p/S, n*(p+1)/S); combined from the last part to the first */
    float total = dot_part(nx, r, x, n * (parts - 1) / parts, n);
    for (uint32_t p = parts - 1; p-- > 0;) total += dot_part(nx, r, x, n * p / parts, n * (p + 1) / parts);
    return total;
}

/* Rows [r0, r1) of job j, every token, by the reference loops. */
static void reference_rows(const col_numerics *nx, const col_matvec_job *j, uint64_t r0, uint64_t r1)
{
    row_reader r;
    float row_f32[COL_ROW_BUFFER]; /* 64 KiB of stack: no allocation on the token path */
    for (uint64_t row = r0; row < r1; row++) {
        r.data = j->w.data;
        r.dtype = j->w.dtype;
        r.row = row;
        r.n = j->w.cols;
        r.block = UINT64_MAX;
        r.full = NULL;
        if (r.n <= COL_ROW_BUFFER) {
            col_load_matrix_range(r.data, r.dtype, r.n, row, 0, r.n, row_f32);
            r.full = row_f32;
        }
        for (uint32_t t = 0; t < j->n_tokens; t++)
            j->y[(uint64_t)t * j->w.rows + row] = dot_variant(nx, &r, j->x + (uint64_t)t * j->w.cols);
    }
}

/* A variant's products on the pool (col_matmul_walk): the path's vector loops, which give the
 * reference's bits, or the reference itself on the portable path. */
typedef struct variant_walk {
    const col_numerics *nx;
    col_isa isa;
} variant_walk;

static void variant_rows(const void *ctx, const col_matvec_job *j, uint64_t r0, uint64_t r1)
{
    const variant_walk *v = ctx;
#if defined(__x86_64__)
    if (v->isa >= COL_ISA_AVX512F) {
        col_numerics_rows_avx512(v->nx, j, r0, r1);
        return;
    }
    if (v->isa == COL_ISA_AVX2) {
        col_numerics_rows_avx2(v->nx, j, r0, r1);
        return;
    }
#endif
    reference_rows(v->nx, j, r0, r1);
}

static uint32_t variant_align(col_isa isa)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512F) return COL_NUMERICS_ROWS_AVX512;
    if (isa == COL_ISA_AVX2) return COL_NUMERICS_ROWS_AVX2;
#endif
    (void)isa;
    return 1;
}

void col_numerics_matmul(const col_numerics *nx, col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs)
{
    /* inputs: session scratch activations, rounded where they are stored (idempotent, so an
     * input shared by two jobs is unaffected by the second rounding) */
    for (uint32_t k = 0; k < n_jobs; k++) /* a job given packed rows (xq) has no f32 input */
        if (jobs[k].x) col_numerics_round(nx, pool, (float *)(uintptr_t)jobs[k].x, (uint64_t)jobs[k].n_tokens * jobs[k].w.cols);
    if (nx->reduction == COL_REDUCTION_DEFAULT) {
        col_matmul_kernels(pool, jobs, n_jobs, nx->activation == COL_ACTIVATION_BF16);
    } else if (nx->reduction == COL_REDUCTION_BF16_DOT) {
        col_matmul_bf16_dot(pool, jobs, n_jobs);
    } else {
        const variant_walk walk = {nx, col_pool_isa(pool)};
        uint32_t align = variant_align(walk.isa);
        for (uint32_t k = 0; k < n_jobs; k++) /* a group of the vector loops takes whole panels */
            if (is_bf16_panel(jobs[k].w.dtype) && align < COL_BF16_PANEL_ROWS) align = COL_BF16_PANEL_ROWS;
        col_matmul_walk(pool, jobs, n_jobs, variant_rows, &walk, align);
    }
    for (uint32_t k = 0; k < n_jobs; k++)
        col_numerics_round(nx, pool, jobs[k].y, (uint64_t)jobs[k].n_tokens * jobs[k].w.rows);
}
