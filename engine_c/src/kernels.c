/*
 * kernels.c - the front of the kernel layer (kernels.h): which path runs a call.
 *
 * The forward pass calls kernels.h and never names a path. This file chooses the path a pool runs
 * (CPUID, the session's ceiling, COLIBRI_KERNELS) and sends to it the calls that are not
 * products: the query heads of one KV head (col_attend_head), the row kernels a caller runs on its
 * own thread (RMSNorm rows, scaled adds) and the element-wise kernels (the SwiGLU gate, bf16 and
 * f16 rounding), split over the pool's threads when they are long. Products go
 * through the pool (pool.c), which hands each chunk to its path's row walker. The paths live
 * beside it: kernels_portable.c (plain C, everywhere), kernels_x86.c (AVX2 and AVX-512) and
 * kernels_amx.c (bf16 weights and q8_0/q4_0 batches on AMX tiles); kernels_quant.c holds the
 * element conversions and the int8 activation blocks they all share, kernels_internal.h what they
 * declare to each other.
 */
#include "kernels_amx.h"
#include "kernels_internal.h"

#include <stdlib.h>
#include <string.h>

/* Element-wise kernels (the SwiGLU gate, bf16 and f16 rounding) run on the pool from this many elements,
 * in pieces of COL_ELEMENTWISE_PIECE: a block's worth is too much for the calling thread alone. */
#define COL_ELEMENTWISE_PARALLEL (1u << 15)
#define COL_ELEMENTWISE_PIECE 4096

const char *col_isa_name(col_isa isa)
{
    switch (isa) {
    case COL_ISA_AVX2: return "avx2";
    case COL_ISA_AVX512F: return "avx512f";
    case COL_ISA_AVX512: return "avx512";
    case COL_ISA_AMX: return "amx";
    default: return "portable";
    }
}

col_isa col_choose_isa(col_isa ceiling)
{
    col_isa isa = col_detect_isa();
    if (isa == COL_ISA_AVX512 && ceiling == COL_ISA_AMX && col_amx_enable()) isa = COL_ISA_AMX;
    if (isa > ceiling) isa = ceiling;
    const char *env = getenv("COLIBRI_KERNELS");
    if (env) { /* can only lower the choice: a forced path the CPU lacks would crash */
        col_isa want = strcmp(env, "portable") == 0 ? COL_ISA_PORTABLE
                     : strcmp(env, "avx2") == 0     ? COL_ISA_AVX2
                     : strcmp(env, "avx512f") == 0  ? COL_ISA_AVX512F
                     : strcmp(env, "avx512") == 0   ? COL_ISA_AVX512
                                                    : COL_ISA_AMX;
        if (want < isa) isa = want;
    }
    return isa;
}

void col_attend_head(const col_pool *pool, const col_head_job *head, float *scores, float *out)
{
    const col_isa isa = col_pool_isa(pool);
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512F) {
        col_attend_group_avx512(head, scores, out);
        return;
    }
    if (isa == COL_ISA_AVX2) {
        col_attend_group_avx2(head, scores, out);
        return;
    }
#endif
    (void)isa; /* only x86 has paths to choose from */
    for (uint32_t j = 0; j < head->n_q; j++) {
        col_head_job one = *head;
        one.q = head->q + (uint64_t)j * head->d;
        one.n_q = 1;
        one.sinks = head->sinks ? head->sinks + j : NULL;
        col_attend_head_portable(&one, scores, out + (uint64_t)j * head->d);
    }
}

static void round_bf16_range(col_isa isa, float *v, uint64_t n)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512F) {
        col_round_bf16_avx512(v, n);
        return;
    }
    if (isa == COL_ISA_AVX2) {
        col_round_bf16_avx2(v, n);
        return;
    }
#endif
    (void)isa;
    col_round_bf16_portable(v, n);
}

static void round_f16_range(col_isa isa, float *v, uint64_t n)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512F) {
        col_round_f16_avx512(v, n);
        return;
    }
    if (isa == COL_ISA_AVX2) {
        col_round_f16_avx2(v, n);
        return;
    }
#endif
    (void)isa;
    col_round_f16_portable(v, n);
}

void col_f16_row(col_isa isa, const float *x, uint64_t n, uint16_t *out)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512F) {
        col_f16_row_avx512(x, n, out);
        return;
    }
    if (isa == COL_ISA_AVX2) {
        col_f16_row_avx2(x, n, out);
        return;
    }
#endif
    (void)isa;
    col_f16_row_portable(x, n, out);
}

static void swiglu_gate_range(col_isa isa, float *h1, const float *h3, uint64_t n)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512F) {
        col_swiglu_gate_avx512(h1, h3, n);
        return;
    }
    if (isa == COL_ISA_AVX2) {
        col_swiglu_gate_avx2(h1, h3, n);
        return;
    }
#endif
    (void)isa;
    col_swiglu_gate_portable(h1, h3, n);
}

void col_rmsnorm_row(col_isa isa, const float *x, const float *w, float eps, uint64_t n, float *out)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX2) {
        col_rmsnorm_row_avx2(x, w, eps, n, out);
        return;
    }
#endif
    (void)isa;
    col_rmsnorm_row_portable(x, w, eps, n, out);
}

void col_rmsnorm_rows(col_isa isa, const float *x, const float *w, float eps, uint64_t n, uint32_t rows, float *out)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX2) {
        col_rmsnorm_rows_avx2(x, w, eps, n, rows, out);
        return;
    }
#endif
    (void)isa;
    for (uint32_t r = 0; r < rows; r++) col_rmsnorm_row_portable(x + (uint64_t)r * n, w, eps, n, out + (uint64_t)r * n);
}

void col_add_scaled(col_isa isa, float *acc, float w, const float *x, uint64_t n)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX2) {
        col_add_scaled_avx2(acc, w, x, n);
        return;
    }
#endif
    (void)isa;
    for (uint64_t i = 0; i < n; i++) acc[i] += w * x[i];
}

uint32_t col_first_largest(col_isa isa, const float *x, uint32_t n)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX2) return col_first_largest_avx2(x, n);
#endif
    (void)isa;
    uint32_t best = 0;
    float top = x[0] == x[0] ? x[0] : -INFINITY;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > top) {
            top = x[i];
            best = i;
        }
    return best;
}

void col_rotate_half(col_isa isa, float *v, uint32_t half, const float *c, const float *s)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX2) {
        col_rotate_half_avx2(v, half, c, s);
        return;
    }
#endif
    (void)isa;
    for (uint32_t i = 0; i < half; i++) {
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c[i] - x2 * s[i];
        v[i + half] = x2 * c[i] + x1 * s[i];
    }
}

/* An element-wise kernel over v[0..n) (and w alongside, when it reads one), on the pool's threads
 * in pieces of COL_ELEMENTWISE_PIECE when n is large. An element's result does not depend on the
 * piece it falls in. */
typedef struct elementwise_task {
    void (*range)(col_isa isa, float *v, const float *w, uint64_t n);
    col_isa isa;
    float *v;
    const float *w;
    uint64_t n;
} elementwise_task;

static void elementwise_pieces(void *ctx, uint32_t thread, uint64_t i0, uint64_t i1)
{
    const elementwise_task *e = ctx;
    (void)thread;
    uint64_t a = i0 * COL_ELEMENTWISE_PIECE, b = i1 * COL_ELEMENTWISE_PIECE < e->n ? i1 * COL_ELEMENTWISE_PIECE : e->n;
    if (a < b) e->range(e->isa, e->v + a, e->w ? e->w + a : NULL, b - a);
}

static void run_elementwise(col_pool *pool, elementwise_task *task)
{
    const uint64_t pieces = (task->n + COL_ELEMENTWISE_PIECE - 1) / COL_ELEMENTWISE_PIECE;
    if (task->n < COL_ELEMENTWISE_PARALLEL)
        elementwise_pieces(task, 0, 0, pieces);
    else
        col_pool_run(pool, elementwise_pieces, task, pieces);
}

void col_swiglu_gate(col_pool *pool, float *h1, const float *h3, uint64_t n)
{
    elementwise_task task = {swiglu_gate_range, col_pool_isa(pool), h1, h3, n};
    run_elementwise(pool, &task);
}

void col_swiglu_gate_here(const col_pool *pool, float *h1, const float *h3, uint64_t n)
{
    swiglu_gate_range(col_pool_isa(pool), h1, h3, n);
}

static void round_range(col_isa isa, float *v, const float *unused, uint64_t n)
{
    (void)unused;
    round_bf16_range(isa, v, n);
}

void col_round_bf16(col_pool *pool, float *v, uint64_t n)
{
    elementwise_task task = {round_range, col_pool_isa(pool), v, NULL, n};
    run_elementwise(pool, &task);
}

static void round_f16(col_isa isa, float *v, const float *unused, uint64_t n)
{
    (void)unused;
    round_f16_range(isa, v, n);
}

void col_round_f16(col_pool *pool, float *v, uint64_t n)
{
    elementwise_task task = {round_f16, col_pool_isa(pool), v, NULL, n};
    run_elementwise(pool, &task);
}

/* ---- weight views ------------------------------------------------------------------------ */

col_weight col_weight_of(const col_tensor_info *t)
{
    col_weight w = {t->data, t->dtype, t->shape[0], t->ndim > 1 ? t->shape[1] : 1, 0};
    return w;
}

col_weight col_weight_expert(const col_tensor_info *t, uint32_t e)
{
    uint64_t stride = t->shape[1] * col_dtype_row_bytes(t->dtype, t->shape[2]);
    col_weight w = {(const uint8_t *)t->data + stride * e, t->dtype, t->shape[1], t->shape[2], stride};
    return w;
}
