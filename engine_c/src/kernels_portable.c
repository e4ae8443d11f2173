/*
 * kernels_portable.c - the portable path: every kernel in plain C, for any CPU, and the
 * reference the SIMD paths are tested against.
 *
 * An output is one accumulator walked left to right over its row (stored elements widened to f32,
 * or int8 blocks: kernels_quant.c). An attention head runs alone: its scores, an f32 softmax (the
 * maximum subtracted, expf, divided by the sum), then its weighted values; the AVX2 path reuses the
 * softmax and the value sums. The SwiGLU gate uses the C library's expf. RMSNorm's sum of squares
 * is one chain on every path (col_rmsnorm_inv); the AVX2 code vectorises only the scaling.
 */
#include "kernels_internal.h"

#include <math.h>
#include <string.h>

/* ---- portable path ----------------------------------------------------------------------- */

static float dot_portable(const void *row, uint32_t dtype, const float *x, uint64_t n)
{
    float acc = 0.0f;
    switch (dtype) {
    case COL_DTYPE_F16: {
        const uint16_t *w = row;
        for (uint64_t i = 0; i < n; i++) acc += col_f16_to_f32(w[i]) * x[i];
        break;
    }
    case COL_DTYPE_BF16: {
        const uint16_t *w = row;
        for (uint64_t i = 0; i < n; i++) acc += col_bf16_to_f32(w[i]) * x[i];
        break;
    }
    default: {
        const float *w = row;
        for (uint64_t i = 0; i < n; i++) acc += w[i] * x[i];
        break;
    }
    }
    return acc;
}

/* Row `lane` of a bf16x16 panel (docs/format.md) against x: one chain over the row in column order,
 * each step a fused multiply-add, the bits every path gives (theirs keep the panel's rows in lanes). */
static float dot_panel_portable(const uint16_t *panel, uint64_t lane, const float *x, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; i++)
        acc = fmaf(col_bf16_to_f32(panel[i / 2 * 2 * COL_BF16_PANEL_ROWS + 2 * lane + i % 2]), x[i], acc);
    return acc;
}

/* Rows [r0, r1) of job j over bf16x16 panels, every token, each output by `dot`. */
static void rows_of_panels(const col_matvec_job *j, uint64_t r0, uint64_t r1,
                           float (*dot)(const uint16_t *panel, uint64_t lane, const float *x, uint64_t n))
{
    const col_weight *w = &j->w;
    for (uint64_t r = r0; r < r1; r++) {
        const uint16_t *panel = (const uint16_t *)w->data + r / COL_BF16_PANEL_ROWS * COL_BF16_PANEL_ROWS * w->cols;
        for (uint32_t t = 0; t < j->n_tokens; t++)
            j->y[(uint64_t)t * w->rows + r] = dot(panel, r % COL_BF16_PANEL_ROWS, j->x + (uint64_t)t * w->cols, w->cols);
    }
}

void col_rows_portable(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1)
{
    const col_weight *w = &j->w;
    if (is_bf16_panel(w->dtype)) {
        rows_of_panels(j, r0, r1, dot_panel_portable);
        return;
    }
    uint64_t rb = col_dtype_row_bytes(w->dtype, w->cols), qb = col_qrow_bytes(w->cols);
    for (uint64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * rb; /* float rows */
        for (uint32_t t = 0; t < j->n_tokens; t++)
            j->y[(uint64_t)t * w->rows + r] = qx ? col_dotq_stored(w->data, w->dtype, r, qx + t * qb, w->cols)
                                                 : dot_portable(row, w->dtype, j->x + (uint64_t)t * w->cols, w->cols);
    }
}

/* ---- bf16 dot products ----------------------------------------------------------------------- */

/* A bf16 value as f32, a subnormal read as zero of its sign (vdpbf16ps's DAZ). */
static float bf16_daz(uint16_t h)
{
    return col_bf16_to_f32((h & 0x7F80u) == 0 ? (uint16_t)(h & 0x8000u) : h);
}

/* A subnormal f32 flushed to zero of its sign (vdpbf16ps's FTZ). */
static float flush_subnormal(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    if ((b & 0x7F800000u) == 0) b &= 0x80000000u;
    memcpy(&v, &b, sizeof v);
    return v;
}

float col_dot_bf16_portable(const uint16_t *w, const float *x, uint64_t n)
{
    float acc[16] = {0};
    for (uint64_t k = 0; k < n; k += 32)
        for (uint32_t l = 0; l < 16; l++)
            for (uint32_t e = 2; e-- > 0;) { /* the odd element, then the even one */
                const uint64_t i = k + 2 * l + e;
                uint16_t xb = 0;
                if (i < n) col_pack_bf16(x + i, 1, COL_ISA_PORTABLE, &xb);
                acc[l] = flush_subnormal(fmaf(i < n ? bf16_daz(w[i]) : 0.0f, bf16_daz(xb), acc[l]));
            }
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

float col_dot_bf16_panel_portable(const uint16_t *panel, uint64_t lane, const float *x, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t k = 0; k < n; k += 2)
        for (uint32_t e = 2; e-- > 0;) { /* the odd element, then the even one */
            uint16_t xb = 0;
            col_pack_bf16(x + k + e, 1, COL_ISA_PORTABLE, &xb);
            acc = flush_subnormal(fmaf(bf16_daz(panel[k * COL_BF16_PANEL_ROWS + 2 * lane + e]), bf16_daz(xb), acc));
        }
    return acc;
}

void col_rows_bf16dot_portable(const col_matvec_job *j, uint64_t r0, uint64_t r1)
{
    const col_weight *w = &j->w;
    if (is_bf16_panel(w->dtype)) {
        rows_of_panels(j, r0, r1, col_dot_bf16_panel_portable);
        return;
    }
    for (uint64_t r = r0; r < r1; r++) {
        const uint16_t *row = (const uint16_t *)w->data + r * w->cols;
        for (uint32_t t = 0; t < j->n_tokens; t++)
            j->y[(uint64_t)t * w->rows + r] = col_dot_bf16_portable(row, j->x + (uint64_t)t * w->cols, w->cols);
    }
}

/* v[i] to the nearest bf16, ties to even; Inf and NaN unchanged. No branch, so it vectorises
 * where the compiler does (the AVX-512 version below is the same arithmetic). */
void col_round_bf16_portable(float *v, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], sizeof b);
        uint32_t r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
        b = (b & 0x7F800000u) == 0x7F800000u ? b : r;
        memcpy(&v[i], &b, sizeof b);
    }
}

/* f32 -> IEEE half bits, round to nearest even, overflow to Inf. */
static uint16_t f32_to_f16_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | (ax > 0x7F800000u ? 0x7E00u : 0x7C00u));
    if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7C00u); /* >= 65536 */
    if (ax < 0x38800000u) {                                    /* below 2^-14: subnormal half */
        float a;
        memcpy(&a, &ax, sizeof a);
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f)); /* units of 2^-24, exact scaling */
    }
    uint32_t h = (((ax >> 23) - 127u + 15u) << 10) | ((ax & 0x7FFFFFu) >> 13), rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

void col_round_f16_portable(float *v, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) v[i] = col_f16_to_f32(f32_to_f16_bits(v[i]));
}

void col_f16_row_portable(const float *x, uint64_t n, uint16_t *out)
{
    for (uint64_t i = 0; i < n; i++) out[i] = f32_to_f16_bits(x[i]);
}

/* h1[i] = silu(h1[i]) * h3[i] with the C library's expf. */
void col_swiglu_gate_portable(float *h1, const float *h3, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) h1[i] = h1[i] / (1.0f + expf(-h1[i])) * h3[i];
}

/* col_rmsnorm_row's definition: the sum of squares as one chain of adds, from element 0 up. */
void col_rmsnorm_row_portable(const float *x, const float *w, float eps, uint64_t n, float *out)
{
    const float inv = col_rmsnorm_inv(x, eps, n);
    for (uint64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

/* ---- one attention head ------------------------------------------------------------------ */

/* Softmax of n scores in place, in f32: subtract the maximum, exponentiate, divide by the sum;
 * with `sink` (NULL: none), its logit joins the maximum and its exponential the sum. */
void col_softmax_in_place(float *scores, uint32_t n, const float *sink)
{
    float max = sink ? *sink : -INFINITY, sum = 0.0f;
    for (uint32_t t = 0; t < n; t++)
        if (scores[t] > max) max = scores[t];
    for (uint32_t t = 0; t < n; t++) {
        scores[t] = expf(scores[t] - max);
        sum += scores[t];
    }
    if (sink) sum += expf(*sink - max);
    float inv = 1.0f / sum;
    for (uint32_t t = 0; t < n; t++) scores[t] *= inv;
}

/* Element `at` of a cached row, as f32 (a half widens exactly). */
static float kv_elem(const col_head_job *h, const void *base, uint64_t at)
{
    return h->kv_f16 ? col_f16_to_f32(((const uint16_t *)base)[at]) : ((const float *)base)[at];
}

float col_weighted_value(const col_head_job *h, const float *p, uint32_t i)
{
    float acc = 0.0f;
    for (uint32_t t = 0; t < h->n_keys; t++) acc += p[t] * kv_elem(h, h->v, (uint64_t)t * h->stride + i);
    return acc;
}

void col_attend_head_portable(const col_head_job *h, float *scores, float *out)
{
    for (uint32_t t = 0; t < h->n_keys; t++) {
        const uint64_t row = (uint64_t)t * h->stride;
        float dot = 0.0f;
        for (uint32_t i = 0; i < h->d; i++) dot += h->q[i] * kv_elem(h, h->k, row + i);
        scores[t] = dot * h->scale;
    }
    col_softmax_in_place(scores, h->n_keys, h->sinks);
    for (uint32_t i = 0; i < h->d; i++) out[i] = col_weighted_value(h, scores, i);
}
