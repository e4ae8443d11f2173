/*
 * kernels.c - matrix-vector and matrix-matrix products over stored weights (f32, f16, bf16,
 * q8_0, q4_0) and the thread pool that splits them by output rows.
 *
 * Four paths behind one interface: portable C (runs everywhere), AVX2+FMA+F16C, AVX-512
 * (F/BW/VL with VNNI for the int8 blocks), and AMX, which is AVX-512 with bf16 weights on the
 * tile unit (kernels_amx.c). The SIMD paths are compiled with function target attributes, so the
 * default build flags stay portable, and one is chosen from CPUID (and the session's ceiling)
 * when the pool is created (the choice lives in the pool, hence in the session; no global
 * state).
 *
 * Determinism by construction: every output element (row r, token t) is one dot product computed
 * by exactly one thread, with a fixed lane layout: a single vector accumulator walked left to
 * right over the row, a fixed horizontal reduction, then the scalar tail in order. Tiles (eight
 * distant rows for one token in decode, six (AVX-512) or two (AVX2) neighbouring rows for four
 * tokens in a batch) only interleave independent accumulators, and which thread or chunk
 * computes a row never matters, so an output's bits depend neither on the thread count nor on
 * the batch size: a prefill equals the same tokens stepped one at a time.
 *
 * Quantised weights (q8_0, q4_0: rows of f16 scales then payload, blocks of 32) are multiplied
 * against the activations quantised per block of 32 to int8 (scale = max|x| / 127), with exact
 * integer block sums (VNNI vpdpbusd over 64 payload bytes per step, or AVX2 vpmaddubsw +
 * vpmaddwd, which give the same integers) scaled by d_w * d_x into f32 lanes. The activations are
 * quantised once per product on the calling thread, in the order the weight dtype's kernels read.
 *
 * The pool's workers spin on an atomic generation counter for a short while after each product
 * (a forward pass issues tens of products per token, too many for a condvar wake-up each), then
 * sleep on a condvar so an idle session costs no CPU.
 */
#include "kernels.h"
#include "kernels_amx.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Products smaller than this many multiply-adds are not worth waking the workers. */
#define COL_PARALLEL_MIN_MACS (1u << 14)
/* Products are cut into chunks of decreasing size (plan_chunks), each of at least
 * COL_GUIDED_MIN_MACS multiply-adds (a chunk's rows are read as up to 8 streams, which need some
 * length to pay off) and at most COL_MAX_CHUNKS of them. */
#ifndef COL_GUIDED_MIN_MACS
#define COL_GUIDED_MIN_MACS (1u << 17)
#endif
#define COL_MAX_CHUNKS 64
/* Element-wise kernels (the SwiGLU gate, bf16 rounding) run on the pool from this many elements,
 * in pieces of COL_ELEMENTWISE_PIECE: serial, the gate was 5-10 % of a bf16 prefill once the
 * products ran on AMX tiles, the rounding 14 % of an act-bf16 one. */
#define COL_ELEMENTWISE_PARALLEL (1u << 15)
#define COL_ELEMENTWISE_PIECE 4096
/* Activations of a batch are prepared on the pool from this many elements (prepare_activations). */
#define COL_PREPARE_PARALLEL_ELEMS (1u << 16)
/* Spins of a worker waiting for the next product before it sleeps (~100 us). */
#define COL_SPIN_LIMIT 20000u
#define QK 32 /* elements per quantised block */
#ifndef COL_PREFETCH_AHEAD
#define COL_PREFETCH_AHEAD 1024 /* bytes ahead of a decode tile's weight loads (see tile_f_avx512) */
#endif
/* The same for q8_0/q4_0 payloads: 2 KiB measured 2.4% and 3.5% faster than 1 KiB for q4_0
 * decode in paired in-process runs (q8_0: no difference). */
#define COL_PREFETCH_AHEAD_Q 2048

/* ---- element conversion ------------------------------------------------------------------ */

float col_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu;
    uint32_t mantissa = h & 0x3FFu;
    uint32_t bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exponent = 127 - 15 + 1;
            while ((mantissa & 0x400u) == 0) {
                mantissa <<= 1;
                exponent--;
            }
            mantissa &= 0x3FFu;
            bits = sign | (exponent << 23) | (mantissa << 13);
        }
    } else if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float col_bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float col_load_elem(const void *data, uint32_t dtype, uint64_t i)
{
    switch (dtype) {
    case COL_DTYPE_F16: return col_f16_to_f32(((const uint16_t *)data)[i]);
    case COL_DTYPE_BF16: return col_bf16_to_f32(((const uint16_t *)data)[i]);
    default: return ((const float *)data)[i];
    }
}

static uint16_t rd16u(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* Quantised rows (docs/format.md): nb = cols / 32 f16 scales, then the payload. q8_0: one int8
 * per element in element order. q4_0: 16 bytes per block, byte j holding element j (low nibble)
 * and element j + 16 (high nibble), value q - 8. */
static int32_t weight_q(const uint8_t *payload, uint32_t dtype, uint64_t b, uint32_t j)
{
    if (dtype == COL_DTYPE_Q8_0) return (int8_t)payload[b * QK + j];
    uint8_t byte = payload[b * 16 + (j & 15u)];
    return (int32_t)(j < 16 ? byte & 0x0F : byte >> 4) - 8;
}

void col_load_range(const void *row, uint32_t dtype, uint64_t cols, uint64_t first, uint64_t count, float *out)
{
    if (dtype == COL_DTYPE_F32) {
        memcpy(out, (const float *)row + first, count * sizeof(float));
    } else if (dtype == COL_DTYPE_Q8_0 || dtype == COL_DTYPE_Q4_0) {
        const uint8_t *p = row, *payload = p + 2 * (cols / QK);
        for (uint64_t i = first; i < first + count; i++)
            out[i - first] = col_f16_to_f32(rd16u(p + 2 * (i / QK))) * (float)weight_q(payload, dtype, i / QK, (uint32_t)(i % QK));
    } else {
        for (uint64_t i = first; i < first + count; i++) out[i - first] = col_load_elem(row, dtype, i);
    }
}

void col_load_row(const void *data, uint32_t dtype, uint64_t n, float *out)
{
    col_load_range(data, dtype, n, 0, n, out);
}

static int is_block_dtype(uint32_t dtype)
{
    return dtype == COL_DTYPE_Q8_0 || dtype == COL_DTYPE_Q4_0;
}

/* ---- activation quantisation (shared by every path, so every path sees the same integers) ---- */

/* Layout of one quantised activation row of `cols` (nb = cols / 32 blocks), in bytes:
 * [cols] int8 values | [nb] f32 scales d_x | [cols / 4] int32 lane corrections.
 * The int8 values are in the order the weight dtype's SIMD kernels read them (xq_pos), and the
 * corrections turn VNNI's unsigned x signed products into signed ones: q8_0 kernels multiply
 * w + 128 (so lane L holds -128 * the sum of values 4L..4L+3), q4_0 kernels multiply the raw
 * nibble q = w + 8 (lane L of group G holds -8 * the sum of the 8 values its two products read). */
static uint64_t qrow_bytes(uint64_t cols)
{
    return cols / QK * (QK + 4 + 32);
}

/* Where element j of block b sits among the int8 values of an activation row of nb blocks. q8_0
 * kernels read element order. q4_0 kernels read groups of four blocks as the four low halves then
 * the four high halves, the order of the nibbles of 64 payload bytes (a last group of fewer
 * blocks is arranged the same way with its own count). */
static uint64_t xq_pos(uint32_t wdtype, uint64_t nb, uint64_t b, uint32_t j)
{
    if (wdtype != COL_DTYPE_Q4_0) return b * QK + j;
    uint64_t g = b / 4, in_group = nb - g * 4 < 4 ? nb - g * 4 : 4, k = b % 4;
    return g * 128 + (j < 16 ? k * 16 + j : in_group * 16 + k * 16 + (j - 16));
}

/* Store block b's 32 int8 values (element order) where the weight dtype's kernels read them
 * (the arrangement of xq_pos, a half block at a time). */
static void place_block(int8_t *q, uint32_t wdtype, uint64_t nb, uint64_t b, const int8_t *vals)
{
    if (wdtype != COL_DTYPE_Q4_0) {
        memcpy(q + b * QK, vals, QK);
        return;
    }
    memcpy(q + xq_pos(wdtype, nb, b, 0), vals, 16);
    memcpy(q + xq_pos(wdtype, nb, b, 16), vals + 16, 16);
}

/* One block of 32 activations to int8: d = max|x| / 127, q = x * (1/d) rounded half to even and
 * clamped to [-127, 127] (a NaN becomes -127, what the SIMD conversion's "integer indefinite"
 * clamps to, so every path gives the same bytes). Returns d. */
static float quantize_block(const float *xb, int8_t *vals)
{
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        float a = fabsf(xb[j]);
        if (a > amax) amax = a;
    }
    float dx = amax / 127.0f;
    float id = dx > 0.0f ? 1.0f / dx : 0.0f;
    for (int j = 0; j < QK; j++) {
        /* round half to even like lrintf, without its library call per element: |x*id| <= 127
         * (plus rounding), far below 2^22, where adding and subtracting 1.5 * 2^23 leaves exactly
         * the nearest integer */
        float v = (xb[j] * id + 12582912.0f) - 12582912.0f;
        vals[j] = (int8_t)(v != v ? -127 : v > 127.0f ? 127 : (v < -127.0f ? -127 : (int)v));
    }
    return dx;
}

#if defined(__x86_64__)
/* The same with AVX-512: the maximum is exact in any order, the product is the same IEEE
 * multiply, and vcvtps2dq rounds half to even under the default MXCSR, so the bytes are
 * identical to quantize_block's. */
__attribute__((target("avx512f"))) static float quantize_block_avx512(const float *xb, int8_t *vals)
{
    __m512 lo = _mm512_loadu_ps(xb), hi = _mm512_loadu_ps(xb + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    if (amax != amax) return quantize_block(xb, vals); /* NaN: the scalar rules */
    float dx = amax / 127.0f;
    __m512 id = _mm512_set1_ps(dx > 0.0f ? 1.0f / dx : 0.0f);
    const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
    __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, id)), qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, id));
    qlo = _mm512_min_epi32(_mm512_max_epi32(qlo, bottom), top);
    qhi = _mm512_min_epi32(_mm512_max_epi32(qhi, bottom), top);
    _mm_storeu_si128((__m128i *)vals, _mm512_cvtepi32_epi8(qlo));
    _mm_storeu_si128((__m128i *)(vals + 16), _mm512_cvtepi32_epi8(qhi));
    return dx;
}
#endif

static void quantize_row(const float *x, uint64_t cols, uint32_t wdtype, col_isa isa, uint8_t *out)
{
    uint64_t nb = cols / QK;
    int8_t *q = (int8_t *)out, vals[QK];
    float *d = (float *)(out + cols);
    int32_t *c = (int32_t *)(out + cols + nb * 4);
    for (uint64_t b = 0; b < nb; b++) {
#if defined(__x86_64__)
        if (isa >= COL_ISA_AVX512)
            d[b] = quantize_block_avx512(x + b * QK, vals);
        else
#endif
            d[b] = quantize_block(x + b * QK, vals);
        place_block(q, wdtype, nb, b, vals);
    }
    (void)isa;
    memset(c, 0, cols);
    if (wdtype == COL_DTYPE_Q8_0) {
        for (uint64_t l = 0; l < cols / 4; l++)
            c[l] = -128 * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
    } else {
        for (uint64_t g = 0; g < nb / 4; g++)
            for (uint64_t l = 0; l < 16; l++) {
                const int8_t *lo = q + g * 128 + 4 * l, *hi = lo + 64;
                c[g * 16 + l] = -8 * (lo[0] + lo[1] + lo[2] + lo[3] + hi[0] + hi[1] + hi[2] + hi[3]);
            }
    }
}

/* Exact integer dot product of weight block b with its activation block. */
static int32_t block_isum(const uint8_t *payload, uint32_t dtype, const int8_t *xq, uint64_t nb, uint64_t b)
{
    int32_t isum = 0;
    for (uint32_t j = 0; j < QK; j++) isum += weight_q(payload, dtype, b, j) * xq[xq_pos(dtype, nb, b, j)];
    return isum;
}

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

/* Sum over blocks b0.. of isum * (d_w * d_x), in block order. */
static float dotq_blocks(const uint8_t *row, uint32_t dtype, const uint8_t *qx, uint64_t n, uint64_t b0)
{
    uint64_t nb = n / QK;
    const float *d = (const float *)(qx + n);
    float acc = 0.0f;
    for (uint64_t b = b0; b < nb; b++)
        acc += col_f16_to_f32(rd16u(row + 2 * b)) * d[b] * (float)block_isum(row + 2 * nb, dtype, (const int8_t *)qx, nb, b);
    return acc;
}

static void rows_portable(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1)
{
    const col_weight *w = &j->w;
    uint64_t rb = col_dtype_row_bytes(w->dtype, w->cols), qb = qrow_bytes(w->cols);
    for (uint64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * rb;
        for (uint32_t t = 0; t < j->n_tokens; t++)
            j->y[(uint64_t)t * w->rows + r] = qx ? dotq_blocks(row, w->dtype, qx + t * qb, w->cols, 0)
                                                 : dot_portable(row, w->dtype, j->x + (uint64_t)t * w->cols, w->cols);
    }
}

/* v[i] to the nearest bf16, ties to even; Inf and NaN unchanged. No branch, so it vectorises
 * where the compiler does (the AVX-512 version below is the same arithmetic). */
static void round_bf16_portable(float *v, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], sizeof b);
        uint32_t r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
        b = (b & 0x7F800000u) == 0x7F800000u ? b : r;
        memcpy(&v[i], &b, sizeof b);
    }
}

/* h1[i] = silu(h1[i]) * h3[i] with the C library's expf. */
static void swiglu_gate_portable(float *h1, const float *h3, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) h1[i] = h1[i] / (1.0f + expf(-h1[i])) * h3[i];
}

/* ---- one attention head ------------------------------------------------------------------ */

/* Softmax of n scores in place, in f32: subtract the maximum, exponentiate, divide by the sum. */
/* softmax of the n scores, with the sink's logit in the maximum and the sum when `sink` (NULL:
 * none). */
static void softmax_in_place(float *scores, uint32_t n, const float *sink)
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

static float weighted_value(const col_head_job *h, const float *p, uint32_t i)
{
    float acc = 0.0f;
    for (uint32_t t = 0; t < h->n_keys; t++) acc += p[t] * h->v[(uint64_t)t * h->stride + i];
    return acc;
}

static void attend_head_portable(const col_head_job *h, float *scores, float *out)
{
    for (uint32_t t = 0; t < h->n_keys; t++) {
        const float *kt = h->k + (uint64_t)t * h->stride;
        float dot = 0.0f;
        for (uint32_t i = 0; i < h->d; i++) dot += h->q[i] * kt[i];
        scores[t] = dot * h->scale;
    }
    softmax_in_place(scores, h->n_keys, h->sinks);
    for (uint32_t i = 0; i < h->d; i++) out[i] = weighted_value(h, scores, i);
}

/* ---- x86 SIMD paths ---------------------------------------------------------------------- */
#if defined(__x86_64__)

#define COL_T2 __attribute__((target("avx2,fma,f16c")))
#define COL_T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define COL_INLINE static inline __attribute__((always_inline))

/* Fixed-order horizontal sum of 8 lanes: (0+4, 1+5, 2+6, 3+7), then pairs, then the last two. */
COL_INLINE COL_T2 float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* hsum8 of 8 vectors at once, bit for bit (the same additions in the same order, by a transpose
 * tree as in hsum16x16 below), out[k] = hsum8(acc[k]) for k < n (a constant after inlining, at
 * most 24): the end of every AVX2 tile, whose accumulators then stay in registers. Old and new
 * binaries in turns on the AVX2 path, a 128-token prompt: f32 1.12x, q4 1.02x. */
COL_INLINE COL_T2 __m256 hsum8x8(const __m256 *v)
{
    __m256 s4[4], s2[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* halves: v[2i] in the low 128 bits, v[2i+1] in the high */
        s4[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                              _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) { /* pairs: lane h holds v[4i + h] (elements 0-1), v[4i + 2 + h] (2-3) */
        __m256d lo = _mm256_unpacklo_pd(_mm256_castps_pd(s4[2 * i]), _mm256_castps_pd(s4[2 * i + 1]));
        __m256d hi = _mm256_unpackhi_pd(_mm256_castps_pd(s4[2 * i]), _mm256_castps_pd(s4[2 * i + 1]));
        s2[i] = _mm256_add_ps(_mm256_castpd_ps(lo), _mm256_castpd_ps(hi));
    }
    return _mm256_add_ps(_mm256_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)), /* lane 4h + q: v[2q + h] */
                         _mm256_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

COL_INLINE COL_T2 void hsum8_many(const __m256 *acc, int n, float *out)
{
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
#pragma GCC unroll 3
    for (int k0 = 0; k0 < n; k0 += 8) {
        __m256 v[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) v[k] = k0 + k < n ? acc[k0 + k] : _mm256_setzero_ps();
        __m256 sums = _mm256_permutevar8x32_ps(hsum8x8(v), order);
        _mm256_maskstore_ps(out + k0, _mm256_cmpgt_epi32(_mm256_set1_epi32(n - k0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                            sums);
    }
}

COL_INLINE COL_T512 float hsum16(__m512 v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

COL_INLINE __mmask16 lanes_below(uint64_t n) /* the first min(n, 16) lanes */
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* hsum16 of 16 vectors at once, bit for bit: each vector's lanes meet in the same additions in the
 * same order (lane i + lane i+8, then i + i+4 of those, then i + i+2, then the last two), by a
 * transpose tree that sums two vectors' halves (then quarters, pairs) with one add. Lane 4L + q of
 * the result holds the sum of v[4q + L]. */
COL_INLINE COL_T512 __m512 hsum16x16(const __m512 *v)
{
    __m512 s8[8], s4[4], s2[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* halves: v[2i] in the low 256 bits, v[2i+1] in the high */
        s8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* quarters: 128-bit lane L holds v[4i + L] */
        s4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) { /* pairs: lane L holds v[8i + L] (elements 0-1), v[8i + 4 + L] (2-3) */
        __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(s4[2 * i]), _mm512_castps_pd(s4[2 * i + 1]));
        __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(s4[2 * i]), _mm512_castps_pd(s4[2 * i + 1]));
        s2[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    return _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* out[k] = hsum16(acc[k]) for k < n (n a constant after inlining, at most 32): the end of every
 * AVX-512 tile. One tree per 16 outputs instead of 16 horizontal sums, and, every index being a
 * constant, the accumulators stay in registers (summed one by one in a loop, they had been kept in
 * a stack array that was zeroed and reloaded for every tile). Old and new `colibri run` binaries
 * in turns, a 128-token prompt: f32 1.17x, q4 1.11x; decode unchanged (0.98-1.00x). */
COL_INLINE COL_T512 void hsum16_many(const __m512 *acc, int n, float *out)
{
    static const int32_t natural[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    const __m512i order = _mm512_loadu_si512((const void *)natural);
#pragma GCC unroll 2
    for (int k0 = 0; k0 < n; k0 += 16) {
        __m512 v[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) v[k] = k0 + k < n ? acc[k0 + k] : _mm512_setzero_ps();
        __m512 sums = _mm512_permutexvar_ps(order, hsum16x16(v));
        _mm512_mask_storeu_ps(out + k0, lanes_below((uint64_t)(n - k0)), sums);
    }
}

COL_INLINE COL_T2 __m256 load8(const uint8_t *row, uint32_t dtype, uint64_t i)
{
    if (dtype == COL_DTYPE_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (dtype == COL_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

COL_INLINE COL_T512 __m512 load16(const uint8_t *row, uint32_t dtype, uint64_t i)
{
    if (dtype == COL_DTYPE_F32) return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (dtype == COL_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Scalar tail of one output, in order, after the vector part `s`. Only called when there is a
 * tail: a call into this (non-VEX) code from the AVX-512 tiles cost more than the tile itself
 * (perf: 12% of q8_0 decode in an empty tail call's first SSE instruction). */
static float tail_loop(float s, const uint8_t *row, uint32_t dtype, const float *x, uint64_t i, uint64_t n)
{
    for (; i < n; i++) s += col_load_elem(row, dtype, i) * x[i];
    return s;
}
static inline __attribute__((always_inline)) float tail(float s, const uint8_t *row, uint32_t dtype, const float *x,
                                                         uint64_t i, uint64_t n)
{
    return i < n ? tail_loop(s, row, dtype, x, i, n) : s;
}

/* Tiles. A tile computes NR rows x NT tokens (tokens t .. t+NT-1) of one product; its rows are
 * r, r + step, ..., r + (NR-1) * step. Decode (one token) takes its rows from NR distant places
 * of the thread's share (step = share / NR), so each row is a separate stream through memory:
 * that keeps enough cache-line misses in flight for one core to approach the machine's read
 * bandwidth, which a single front-to-back stream per core does not (about 60% of the limit on the
 * development VM). Batches take neighbouring rows (step 1) so each loaded weight vector feeds NT
 * tokens. Every (row, token) output is the same sequence of operations whatever the tile, so
 * neither the tile shape, the batch size nor the thread count changes a bit. */
#define MAX_TILE_ROWS 8
#define MAX_TILE 24 /* NR * NT */

/* A batch tile reads its rows from memory in its first token pass and from cache in the others,
 * and the hardware prefetcher does not run ahead from one tile's rows into the next: the first pass
 * waited on memory. So each token pass of a tile (tokens [t, t + NT) of n_tokens) prefetches its
 * share of the next tile's bytes into L2, one line per step of the k loop, and the next tile's
 * first pass finds its rows there. One line per step at most: where a pass's share is more (fewer
 * than 24 tokens for an f32 tile of 6 rows), nothing is prefetched, since the prefetches then
 * competed with the tile's own loads (f32, 2 threads: 0.93-0.96x at 8-16 tokens; and two lines per
 * step over part of a pass were 0.91-0.93x of one line at 32 tokens, likely why an earlier attempt
 * with two found nothing). Paired in one process, 2 threads: f32 products of 32 tokens
 * 1.09-1.14x (2816 x 1024 and 1024 x 2816), 128 tokens 1.03-1.05x; prefill of 128 tokens f32
 * 1.06-1.09x, bf16 on AVX-512 1.12x, q8 1.06x, q4 1.09x (AVX2 path: 1.03-1.07x). Prefetches
 * change no bits. */
typedef struct next_tile_prefetch {
    const char *at, *end;
} next_tile_prefetch;

/* The slice of the next tile's bytes for the pass over tokens [t, t + NT) of a tile: none for
 * decode (one token, distant rows), a tile's only pass, the last tile, or where the slice is more
 * than a line per step. */
COL_INLINE next_tile_prefetch next_tile_slice(const col_matvec_job *j, uint64_t r, uint64_t step, int NR, int NT,
                                              uint32_t t, uint64_t rb, uint64_t steps)
{
    next_tile_prefetch pf = {NULL, NULL};
    const uint64_t units = j->n_tokens;
    if (NT == 1 || (uint64_t)NT == units || step != 1 || r + 2 * (uint64_t)NR > j->w.rows) return pf;
    const uint64_t tile = (uint64_t)NR * rb;
    const char *next = (const char *)j->w.data + (r + (uint64_t)NR) * rb;
    pf.at = next + (tile * t / units & ~(uint64_t)63);
    pf.end = next + tile * (t + (uint64_t)NT) / units;
    uint64_t lines = (uint64_t)(pf.end - pf.at + 63) / 64;
    if (lines > steps) pf.at = pf.end;
    return pf;
}

/* One step of the k loop: the slice's next line, if any is left. */
COL_INLINE void next_tile_step(next_tile_prefetch *pf)
{
    if (pf->at < pf->end) {
        _mm_prefetch(pf->at, _MM_HINT_T1);
        pf->at += 64;
    }
}

/* A tile for float weights: one vector accumulator per output, walked left to right. */
COL_INLINE COL_T2 void tile_f_avx2(const col_matvec_job *j, uint64_t r, uint64_t step, int NR, int NT, uint32_t t,
                                   uint32_t dtype)
{
    const col_weight *w = &j->w;
    uint64_t n = w->cols, rb = col_dtype_row_bytes(dtype, n), esize = dtype == COL_DTYPE_F32 ? 4 : 2;
    const uint8_t *row[MAX_TILE_ROWS];
    const float *x[4];
    __m256 acc[MAX_TILE];
    for (int a = 0; a < NR; a++) row[a] = (const uint8_t *)w->data + (r + (uint64_t)a * step) * rb;
    for (int b = 0; b < NT; b++) x[b] = j->x + (uint64_t)(t + b) * n;
#pragma GCC unroll 24
    for (int k = 0; k < NR * NT; k++) acc[k] = _mm256_setzero_ps();
    next_tile_prefetch pf = next_tile_slice(j, r, step, NR, NT, t, rb, n / 8);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        next_tile_step(&pf);
#pragma GCC unroll 8
        for (int a = 0; a < NR; a++) {
            if (NT == 1) _mm_prefetch((const char *)(row[a] + i * esize + COL_PREFETCH_AHEAD), _MM_HINT_T0);
            __m256 wv = load8(row[a], dtype, i);
#pragma GCC unroll 4
            for (int b = 0; b < NT; b++) acc[a * NT + b] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[b] + i), acc[a * NT + b]);
        }
    }
    float sums[MAX_TILE];
    hsum8_many(acc, NR * NT, sums);
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++)
            j->y[(uint64_t)(t + b) * w->rows + r + (uint64_t)a * step] = tail(sums[a * NT + b], row[a], dtype, x[b], i, n);
}

/* Columns [k0, k1) of a tile (k0 a multiple of 16; rb the row bytes): the lane sums start at zero
 * for k0 = 0 and from `carry` (NR * NT vectors) otherwise; a block that ends before the row does
 * leaves them in `carry`, the last one sums them and writes the outputs. carry may be NULL for a
 * whole row. */
COL_INLINE COL_T512 void tile_f_avx512_cols(const col_matvec_job *j, uint64_t r, uint64_t step, int NR, int NT,
                                            uint32_t t, uint32_t dtype, uint64_t rb, uint64_t k0, uint64_t k1,
                                            __m512 *carry, next_tile_prefetch pf)
{
    const col_weight *w = &j->w;
    uint64_t n = w->cols, esize = dtype == COL_DTYPE_F32 ? 4 : 2;
    const uint8_t *row[MAX_TILE_ROWS];
    const float *x[4];
    __m512 acc[MAX_TILE];
    for (int a = 0; a < NR; a++) row[a] = (const uint8_t *)w->data + (r + (uint64_t)a * step) * rb;
    for (int b = 0; b < NT; b++) x[b] = j->x + (uint64_t)(t + b) * n;
#pragma GCC unroll 24
    for (int k = 0; k < NR * NT; k++) acc[k] = k0 == 0 || !carry ? _mm512_setzero_ps() : carry[k];
    uint64_t i = k0;
    for (; i + 16 <= k1; i += 16) {
        next_tile_step(&pf);
#pragma GCC unroll 8
        for (int a = 0; a < NR; a++) {
            /* decode reads each weight once: ask for lines ahead of the loads as well, which the
             * hardware prefetcher alone does not keep up with (perf: the loop stalled on the
             * first use of each load) */
            if (NT == 1) _mm_prefetch((const char *)(row[a] + i * esize + COL_PREFETCH_AHEAD), _MM_HINT_T0);
            __m512 wv = load16(row[a], dtype, i);
#pragma GCC unroll 4
            for (int b = 0; b < NT; b++) acc[a * NT + b] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[b] + i), acc[a * NT + b]);
        }
    }
    if (k1 < n && carry) {
#pragma GCC unroll 24
        for (int k = 0; k < NR * NT; k++) carry[k] = acc[k];
        return;
    }
    float sums[MAX_TILE];
    hsum16_many(acc, NR * NT, sums);
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++)
            j->y[(uint64_t)(t + b) * w->rows + r + (uint64_t)a * step] = tail(sums[a * NT + b], row[a], dtype, x[b], i, n);
}

COL_INLINE COL_T512 void tile_f_avx512(const col_matvec_job *j, uint64_t r, uint64_t step, int NR, int NT, uint32_t t,
                                       uint32_t dtype)
{
    const uint64_t n = j->w.cols, rb = col_dtype_row_bytes(dtype, n);
    tile_f_avx512_cols(j, r, step, NR, NT, t, dtype, rb, 0, n, NULL, next_tile_slice(j, r, step, NR, NT, t, rb, n / 16));
}

/* The quantised activations of token b of a tile (layout: qrow_bytes). */
typedef struct qx_row {
    const int8_t *q;
    const float *d;
    const int32_t *c;
    const uint8_t *base;
} qx_row;

COL_INLINE qx_row qx_at(const uint8_t *qx, uint64_t n, uint32_t token)
{
    const uint8_t *base = qx + (uint64_t)token * qrow_bytes(n);
    qx_row x = {(const int8_t *)base, (const float *)(base + n), (const int32_t *)(base + n + n / QK * 4), base};
    return x;
}

/* A tile for q8_0/q4_0 weights, AVX-512 VNNI. One step reads 64 payload bytes of each row (two
 * q8_0 blocks or four q4_0 blocks), forms 16 int32 lane sums with vpdpbusd (lanes 8 per block for
 * q8_0, 4 for q4_0; the corrections of quantize_row start each sum), and adds them to the
 * accumulator scaled lane by lane by d_w * d_x of the lane's block. The scales of 16 blocks are
 * read and multiplied once per chunk of 16 blocks. Blocks left over after whole steps (a q8_0
 * row of an odd block count, q4_0 rows of nb % 4 != 0) are summed exactly like the portable path
 * and added after the vector part. */
COL_INLINE COL_T512 void tile_q_avx512(const col_matvec_job *j, const uint8_t *qx, uint64_t r, uint64_t step, int NR,
                                       int NT, uint32_t t, int q4)
{
    const col_weight *w = &j->w;
    const uint64_t n = w->cols, nb = n / QK, rb = col_dtype_row_bytes(w->dtype, n);
    const uint64_t per_step = q4 ? 4 : 2, n_steps = nb / per_step, steps_per_chunk = 16 / per_step;
    const uint8_t *row[MAX_TILE_ROWS];
    qx_row x[4];
    __m512 acc[MAX_TILE];
    for (int a = 0; a < NR; a++) row[a] = (const uint8_t *)w->data + (r + (uint64_t)a * step) * rb;
    for (int b = 0; b < NT; b++) x[b] = qx_at(qx, n, t + (uint32_t)b);
#pragma GCC unroll 24
    for (int k = 0; k < NR * NT; k++) acc[k] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8((char)0x80);
    /* lane -> block within the step: lane / 8 for q8_0, lane / 4 for q4_0 */
    const __m512i lane_block = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                 q4 ? 2 : 3);
    next_tile_prefetch pf = next_tile_slice(j, r, step, NR, NT, t, rb, n_steps);
    uint64_t s = 0;
    for (uint64_t c = 0; s < n_steps; c++) {
        uint64_t left = nb - 16 * c;
        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m512 sc[MAX_TILE], xs[4];
        for (int b = 0; b < NT; b++) xs[b] = _mm512_maskz_loadu_ps(m, x[b].d + 16 * c);
#pragma GCC unroll 8
        for (int a = 0; a < NR; a++) {
            __m512 ws = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row[a] + 32 * c));
            for (int b = 0; b < NT; b++) sc[a * NT + b] = _mm512_mul_ps(ws, xs[b]);
        }
        for (uint64_t k = 0; k < steps_per_chunk && s < n_steps; k++, s++) {
            __m512i idx = _mm512_add_epi32(lane_block, _mm512_set1_epi32((int)(k * per_step)));
            next_tile_step(&pf);
#pragma GCC unroll 8
            for (int a = 0; a < NR; a++) {
                const uint8_t *payload = row[a] + 2 * nb + 64 * s;
                if (NT == 1) _mm_prefetch((const char *)(payload + COL_PREFETCH_AHEAD_Q), _MM_HINT_T0);
                __m512i raw = _mm512_loadu_si512((const void *)payload), lo, hi = raw;
                if (q4) {
                    lo = _mm512_and_si512(raw, low4);
                    hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
                } else {
                    lo = _mm512_xor_si512(raw, bias); /* w + 128: vpdpbusd wants unsigned bytes */
                }
#pragma GCC unroll 4
                for (int b = 0; b < NT; b++) {
                    __m512i sum = _mm512_loadu_si512((const void *)(x[b].c + 16 * s));
                    sum = _mm512_dpbusd_epi32(sum, lo, _mm512_loadu_si512((const void *)(x[b].q + (q4 ? 128 : 64) * s)));
                    if (q4) sum = _mm512_dpbusd_epi32(sum, hi, _mm512_loadu_si512((const void *)(x[b].q + 128 * s + 64)));
                    acc[a * NT + b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_permutexvar_ps(idx, sc[a * NT + b]),
                                                      acc[a * NT + b]);
                }
            }
        }
    }
    float sums[MAX_TILE];
    hsum16_many(acc, NR * NT, sums);
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++)
            j->y[(uint64_t)(t + b) * w->rows + r + (uint64_t)a * step] =
                sums[a * NT + b] + (n_steps * per_step < nb ? dotq_blocks(row[a], w->dtype, x[b].base, n, n_steps * per_step) : 0.0f);
}

/* The same for AVX2 without VNNI: a step is one q8_0 block (32 bytes; vpmaddubsw of |x| and w with
 * x's sign, so no correction) or two q4_0 blocks (32 bytes, half a group of four: the nibbles are
 * unsigned and the pair sums cannot saturate, 15 * 127 * 2 < 32767). Chunks of 8 blocks. */
COL_INLINE COL_T2 void tile_q_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r, uint64_t step, int NR,
                                   int NT, uint32_t t, int q4)
{
    const col_weight *w = &j->w;
    const uint64_t n = w->cols, nb = n / QK, rb = col_dtype_row_bytes(w->dtype, n);
    const uint64_t per_step = q4 ? 2 : 1, n_steps = q4 ? nb / 4 * 2 : nb, steps_per_chunk = 8 / per_step;
    const uint8_t *row[MAX_TILE_ROWS];
    qx_row x[4];
    __m256 acc[MAX_TILE];
    for (int a = 0; a < NR; a++) row[a] = (const uint8_t *)w->data + (r + (uint64_t)a * step) * rb;
    for (int b = 0; b < NT; b++) x[b] = qx_at(qx, n, t + (uint32_t)b);
#pragma GCC unroll 24
    for (int k = 0; k < NR * NT; k++) acc[k] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const __m256i lane_block = q4 ? _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0) : _mm256_setzero_si256();
    next_tile_prefetch pf = next_tile_slice(j, r, step, NR, NT, t, rb, n_steps);
    uint64_t s = 0;
    for (uint64_t c = 0; s < n_steps; c++) {
        float wbuf[8] = {0}, xbuf[8] = {0};
        uint64_t have = nb - 8 * c < 8 ? nb - 8 * c : 8;
        __m256 sc[MAX_TILE], xs[4];
        for (int b = 0; b < NT; b++) {
            memcpy(xbuf, x[b].d + 8 * c, have * sizeof(float));
            xs[b] = _mm256_loadu_ps(xbuf);
        }
        for (int a = 0; a < NR; a++) {
            for (uint64_t k = 0; k < have; k++) wbuf[k] = _cvtsh_ss(rd16u(row[a] + 16 * c + 2 * k));
            __m256 ws = _mm256_loadu_ps(wbuf);
            for (int b = 0; b < NT; b++) sc[a * NT + b] = _mm256_mul_ps(ws, xs[b]);
        }
        for (uint64_t k = 0; k < steps_per_chunk && s < n_steps; k++, s++) {
            __m256i idx = _mm256_add_epi32(lane_block, _mm256_set1_epi32((int)(k * per_step)));
            next_tile_step(&pf);
#pragma GCC unroll 8
            for (int a = 0; a < NR; a++) {
                const uint8_t *payload = row[a] + 2 * nb + 32 * s;
                if (NT == 1) _mm_prefetch((const char *)(payload + COL_PREFETCH_AHEAD_Q), _MM_HINT_T0);
                __m256i raw = _mm256_loadu_si256((const __m256i *)payload);
                __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
#pragma GCC unroll 4
                for (int b = 0; b < NT; b++) {
                    __m256i sum;
                    if (q4) {
                        const int8_t *xg = x[b].q + 128 * (s / 2) + 32 * (s % 2);
                        sum = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xg)), ones),
                                               _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xg + 64))), ones));
                        sum = _mm256_add_epi32(sum, _mm256_loadu_si256((const __m256i *)(x[b].c + 16 * (s / 2) + 8 * (s % 2))));
                    } else {
                        __m256i xv = _mm256_loadu_si256((const __m256i *)(x[b].q + 32 * s));
                        sum = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(raw, xv)), ones);
                    }
                    acc[a * NT + b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_permutevar8x32_ps(sc[a * NT + b], idx),
                                                      acc[a * NT + b]);
                }
            }
        }
    }
    float sums[MAX_TILE];
    hsum8_many(acc, NR * NT, sums);
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++)
            j->y[(uint64_t)(t + b) * w->rows + r + (uint64_t)a * step] =
                sums[a * NT + b] + (n_steps * per_step < nb ? dotq_blocks(row[a], w->dtype, x[b].base, n, n_steps * per_step) : 0.0f);
}

/* Walk rows [r0, r1) x all tokens in tiles. One token: NRD rows at a time from NRD streams, then
 * the rows left over one by one. Batches: NRB neighbouring rows x 4 tokens (then 3, 2, 1), then
 * the rows left over in tiles of 4 and 2 rows (where NRB is larger) and one by one, since a chunk
 * can end anywhere. TILE(NR, NT, r, step, t) must expand to a call with literal NR and NT. */
#define WALK_TILES(TILE, NRD, NRB)                                                   \
    do {                                                                             \
        uint32_t nt_ = j->n_tokens;                                                  \
        if (nt_ == 1) {                                                              \
            uint64_t q_ = (r1 - r0) / (NRD);                                         \
            for (uint64_t i_ = 0; i_ < q_; i_++) TILE(NRD, 1, r0 + i_, q_, 0);      \
            for (uint64_t r_ = r0 + q_ * (NRD); r_ < r1; r_++) TILE(1, 1, r_, 1, 0); \
        } else {                                                                     \
            uint64_t r_ = r0;                                                        \
            for (; r_ + (NRB) <= r1; r_ += (NRB)) WALK_TOKENS(TILE, NRB, r_);        \
            if ((NRB) > 4 && r_ + 4 <= r1) { WALK_TOKENS(TILE, 4, r_); r_ += 4; }    \
            if ((NRB) > 2 && r_ + 2 <= r1) { WALK_TOKENS(TILE, 2, r_); r_ += 2; }    \
            for (; r_ < r1; r_++) WALK_TOKENS(TILE, 1, r_);                          \
        }                                                                            \
    } while (0)
#define WALK_TOKENS(TILE, NR, r)                                                     \
    do {                                                                             \
        uint32_t t_ = 0;                                                             \
        for (; t_ + 4 <= nt_; t_ += 4) TILE(NR, 4, r, 1, t_);                        \
        switch (nt_ - t_) {                                                          \
        case 3: TILE(NR, 3, r, 1, t_); break;                                        \
        case 2: TILE(NR, 2, r, 1, t_); break;                                        \
        case 1: TILE(NR, 1, r, 1, t_); break;                                        \
        default: break;                                                              \
        }                                                                            \
    } while (0)

#ifndef COL_DECODE_STREAMS
#define COL_DECODE_STREAMS 8
#endif
/* Neighbouring rows per batch tile on AVX-512, for every weight dtype. A float tile of 6 rows x 4
 * tokens keeps 24 accumulators, the 4 token vectors and a weight vector in the 32 registers and
 * loads 10 vectors per 24 multiply-adds (4 x 4 loaded 8 per 16); a quantised tile loads each
 * token's int8 block and block sums once for 6 rows instead of 2. The token rows come from L2, so
 * fewer loads of them per multiply-add is what counts. Paired in-process on 32-token expert
 * products: f32 1.04-1.07x over 4 rows, q8_0 and q4_0 1.2-1.4x over 2 rows; 8 rows were no
 * better for q8_0/q4_0 (0.99-1.07x over 6) and more tokens per tile were slower for f32. */
#ifndef COL_BATCH_ROWS_512
#define COL_BATCH_ROWS_512 6
#endif
#define COL_BATCH_ROWS_AVX2 2 /* rows per batch tile on AVX2 (16 ymm registers) */

static COL_T2 void rows_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1)
{
    switch (j->w.dtype) {
#define T(NR, NT, r, step, t) tile_f_avx2(j, r, step, NR, NT, t, COL_DTYPE_F32)
    case COL_DTYPE_F32: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_AVX2); break;
#undef T
#define T(NR, NT, r, step, t) tile_f_avx2(j, r, step, NR, NT, t, COL_DTYPE_F16)
    case COL_DTYPE_F16: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_AVX2); break;
#undef T
#define T(NR, NT, r, step, t) tile_f_avx2(j, r, step, NR, NT, t, COL_DTYPE_BF16)
    case COL_DTYPE_BF16: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_AVX2); break;
#undef T
#define T(NR, NT, r, step, t) tile_q_avx2(j, qx, r, step, NR, NT, t, 0)
    case COL_DTYPE_Q8_0: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_AVX2); break;
#undef T
#define T(NR, NT, r, step, t) tile_q_avx2(j, qx, r, step, NR, NT, t, 1)
    case COL_DTYPE_Q4_0: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_AVX2); break;
#undef T
    default: break;
    }
}

/* Batches over long rows. A 6-row tile over all of a 2816-column row holds 66 KiB of weights,
 * more than L1, and re-read them from L2 in every token pass. So rows of more than
 * COL_BATCH_KBLOCK columns are walked a block of that many columns at a time, the tiles' lane
 * accumulators carried from one block to the next (tile_f_avx512_cols), so every output gets
 * exactly the operations of a tile over the whole row (ninth session: 1.14-1.28x on 1024 x 2816
 * and 4096 x 4096 products). From 24 tokens on, up to COL_KBLOCK_TILES neighbouring tiles walk
 * their blocks together (tiles_kblocked_avx512): each column block of every tile runs before the
 * next block, so the block's columns of the tokens, read from L2, serve all of them. A tile alone
 * streamed all of its tokens' columns through L2 again, from L3 once they no longer fit there
 * (7 MiB at 14336 columns and 128 tokens). Old and new bench_products binaries in turns, f32, 2
 * threads, from memory: 4096 x 14336 1.37x, 1.52-1.78x at 32 and 128 tokens; 14336 x 4096
 * 1.21-1.30x and 4096 x 4096 1.44x at 128; the bench model's 1024 x 2816 1.14x at 128 tokens,
 * 1.08x at 64, 1.00x at 32; with fewer tokens a block's token columns are small, and a group was
 * slower (0.90x at 8: its tiles' rows are farther apart), so a tile walks alone. Groups of 4 or 16
 * tiles did about as well as 8. */
#define COL_BATCH_KBLOCK 1024
#define COL_KBLOCK_TOKENS 128 /* tokens walked together; a batch with more walks them in chunks */
#define COL_KBLOCK_TILES 8

/* Bytes of carried lane sums one tile of a batch of n_tokens needs: a 6 x 4 tile's 24 vectors
 * for each pass of 4 tokens of a chunk. */
static uint64_t kblock_carry_bytes(uint32_t n_tokens)
{
    const uint64_t chunk = n_tokens < COL_KBLOCK_TOKENS ? n_tokens : COL_KBLOCK_TOKENS;
    return (chunk + 3) / 4 * COL_BATCH_ROWS_512 * 4 * 64;
}

/* The slice of tile-block (rows rn .. rn + NR - 1, columns [k0, k1)) that pass p of the P passes
 * of the tile-block before it prefetches: the NR row segments are dealt to the passes in order and
 * each segment's passes split it evenly, so a pass's slice is one contiguous range. None with
 * fewer passes than rows, past the last row, or where the slice is more than a line per step. */
COL_INLINE next_tile_prefetch next_block_slice(const col_matvec_job *j, uint64_t rn, int NR, uint64_t k0, uint64_t k1,
                                               uint32_t p, uint32_t P, uint64_t rb, uint64_t esize, uint64_t steps)
{
    next_tile_prefetch pf = {NULL, NULL};
    if (P < (uint32_t)NR || rn + (uint64_t)NR > j->w.rows) return pf;
    const uint32_t seg = p * (uint32_t)NR / P;
    const uint32_t q0 = (seg * P + (uint32_t)NR - 1) / (uint32_t)NR, q1 = ((seg + 1) * P + (uint32_t)NR - 1) / (uint32_t)NR;
    const uint64_t bytes = (k1 - k0) * esize;
    const char *base = (const char *)j->w.data + (rn + seg) * rb + k0 * esize;
    pf.at = base + (bytes * (p - q0) / (q1 - q0) & ~(uint64_t)63);
    pf.end = base + bytes * (p + 1 - q0) / (q1 - q0);
    if ((uint64_t)(pf.end - pf.at + 63) / 64 > steps) pf.at = pf.end;
    return pf;
}

/* Tiles r, r + NR, .. (n_tiles of them) over long rows: for each chunk of up to COL_KBLOCK_TOKENS
 * tokens, each column block of every tile before the next block. `carry` holds n_tiles *
 * kblock_carry_bytes(n_tokens) (64-byte aligned). Each tile-block's passes prefetch the next
 * tile-block's weights into L2 (next_block_slice): the next tile's in this block, else the first
 * tile's in the next block, else the next group's first. */
COL_INLINE COL_T512 void tiles_kblocked_avx512(const col_matvec_job *j, uint64_t r, uint32_t n_tiles, uint32_t dtype,
                                               __m512 *carry)
{
    enum { NR = COL_BATCH_ROWS_512 };
    const uint32_t nt = j->n_tokens;
    const uint64_t n = j->w.cols, rb = col_dtype_row_bytes(dtype, n), esize = dtype == COL_DTYPE_F32 ? 4 : 2;
    const uint64_t n_blocks = (n + COL_BATCH_KBLOCK - 1) / COL_BATCH_KBLOCK;
    for (uint32_t c0 = 0; c0 < nt; c0 += COL_KBLOCK_TOKENS) {
        const uint32_t c1 = nt - c0 < COL_KBLOCK_TOKENS ? nt : c0 + COL_KBLOCK_TOKENS, P = (c1 - c0 + 3) / 4;
        for (uint64_t b = 0; b < n_blocks; b++) {
            const uint64_t k0 = b * COL_BATCH_KBLOCK, k1 = n - k0 < COL_BATCH_KBLOCK ? n : k0 + COL_BATCH_KBLOCK;
            for (uint32_t g = 0; g < n_tiles; g++) {
                const uint64_t rr = r + (uint64_t)g * NR;
                uint64_t rn = rr + NR, nk0 = k0, nk1 = k1;
                if (g + 1 == n_tiles) {
                    const int last = b + 1 == n_blocks;
                    rn = last ? r + (uint64_t)n_tiles * NR : r;
                    nk0 = last ? 0 : k1;
                    nk1 = n - nk0 < COL_BATCH_KBLOCK ? n : nk0 + COL_BATCH_KBLOCK;
                }
                for (uint32_t t = c0, p = 0; t < c1; t += 4, p++) {
                    const uint32_t m = c1 - t < 4 ? c1 - t : 4;
                    const next_tile_prefetch pf = next_block_slice(j, rn, NR, nk0, nk1, p, P, rb, esize, (k1 - k0) / 16);
                    __m512 *tile_carry = carry + ((uint64_t)g * P + p) * NR * 4;
                    switch (m) {
                    case 4: tile_f_avx512_cols(j, rr, 1, NR, 4, t, dtype, rb, k0, k1, tile_carry, pf); break;
                    case 3: tile_f_avx512_cols(j, rr, 1, NR, 3, t, dtype, rb, k0, k1, tile_carry, pf); break;
                    case 2: tile_f_avx512_cols(j, rr, 1, NR, 2, t, dtype, rb, k0, k1, tile_carry, pf); break;
                    default: tile_f_avx512_cols(j, rr, 1, NR, 1, t, dtype, rb, k0, k1, tile_carry, pf); break;
                    }
                }
            }
        }
    }
}

#define COL_KBLOCK_GROUP_TOKENS 24 /* fewer tokens: one tile at a time */

/* The whole tiles of rows [r0, r1) of a batch over long rows, in groups of as many tiles as the
 * thread's `carry` scratch (carry_bytes) holds, at most COL_KBLOCK_TILES. Returns the first row
 * not done: r0 when the scratch holds no tile (the caller's whole-row tiles give the same bits).
 * Not inlined: inlined into rows_avx512, it made gcc compile the short rows' tiles there slower
 * (2816 x 1024 products at 128 tokens 0.75-0.80x). */
static COL_T512 __attribute__((noinline)) uint64_t rows_kblocked_avx512(const col_matvec_job *j, uint64_t r0, uint64_t r1,
                                                                        uint32_t dtype, uint8_t *carry, uint64_t carry_bytes)
{
    enum { NR = COL_BATCH_ROWS_512 };
    uint64_t fit = carry ? carry_bytes / kblock_carry_bytes(j->n_tokens) : 0;
    if (fit > COL_KBLOCK_TILES) fit = COL_KBLOCK_TILES;
    if (fit > 1 && j->n_tokens < COL_KBLOCK_GROUP_TOKENS) fit = 1;
    while (fit > 0 && r0 + NR <= r1) {
        const uint64_t tiles = (r1 - r0) / NR < fit ? (r1 - r0) / NR : fit;
        tiles_kblocked_avx512(j, r0, (uint32_t)tiles, dtype, (__m512 *)(void *)carry);
        r0 += tiles * NR;
    }
    return r0;
}

/* Float weights on AVX-512: batches over long rows in column blocks (rows_kblocked_avx512) for
 * whole 6-row tiles, everything else (decode, short rows, the rows left over) by WALK_TILES. */
#define WALK_FLOAT_512(TILE, dtype)                                                                 \
    do {                                                                                            \
        if (j->n_tokens > 1 && j->w.cols > COL_BATCH_KBLOCK)                                        \
            r0 = rows_kblocked_avx512(j, r0, r1, dtype, carry, carry_bytes);                        \
        WALK_TILES(TILE, COL_DECODE_STREAMS, COL_BATCH_ROWS_512);                                    \
    } while (0)

/* Rows [r0, r1) of job j on AVX-512; `carry` (carry_bytes, may be NULL) is the thread's scratch
 * for batches over long rows. */
static COL_T512 void rows_avx512(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint8_t *carry,
                                 uint64_t carry_bytes)
{
    switch (j->w.dtype) {
#define T(NR, NT, r, step, t) tile_f_avx512(j, r, step, NR, NT, t, COL_DTYPE_F32)
    case COL_DTYPE_F32: WALK_FLOAT_512(T, COL_DTYPE_F32); break;
#undef T
#define T(NR, NT, r, step, t) tile_f_avx512(j, r, step, NR, NT, t, COL_DTYPE_F16)
    case COL_DTYPE_F16: WALK_FLOAT_512(T, COL_DTYPE_F16); break;
#undef T
#define T(NR, NT, r, step, t) tile_f_avx512(j, r, step, NR, NT, t, COL_DTYPE_BF16)
    case COL_DTYPE_BF16: WALK_FLOAT_512(T, COL_DTYPE_BF16); break;
#undef T
#define T(NR, NT, r, step, t) tile_q_avx512(j, qx, r, step, NR, NT, t, 0)
    case COL_DTYPE_Q8_0: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_512); break;
#undef T
#define T(NR, NT, r, step, t) tile_q_avx512(j, qx, r, step, NR, NT, t, 1)
    case COL_DTYPE_Q4_0: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_512); break;
#undef T
    default: break;
    }
}

/* exp(x), 16 at a time, for the SwiGLU gate and the softmax of a head: x = n ln2 + r with |r| <=
 * ln2 / 2 (ln2 in two parts, so r is exact to a few ulp), exp(r) by its Taylor series to r^7
 * (truncation below 6e-9 relative, so the result is within 2 ulp of expf), scaled by 2^n with
 * vscalefps, which gives 0 and inf past the range. x is clamped to [-150, 150] first (exp is 0 or
 * inf there already) so that n stays finite; a NaN passes through the clamp (the second operand of
 * max/min is returned). */
COL_INLINE COL_T512 __m512 exp16(__m512 x)
{
    x = _mm512_min_ps(_mm512_set1_ps(150.0f), _mm512_max_ps(_mm512_set1_ps(-150.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* The query heads of one KV group (col_attend_head) on AVX-512, in three passes over the keys, up
 * to four heads at a time so that each key and value line fetched serves all of them:
 * - scores: each (head, key) product accumulates in one vector over the blocks of 16 of q and the
 *   key (the last block masked); 16 such vectors (4 heads x 4 keys, 2 x 8 or 1 x 16) are summed
 *   lane-wise by one transpose tree (sum16x16), which gives every vector the same additions in
 *   the same order, so a score depends only on its query and key, never on which heads or keys
 *   shared its tree (missing keys are zero vectors);
 * - softmax per head: the maximum, exp16 of the differences and their sum in 16 lanes, summed once;
 * - values: each (head, block of 16 dimensions) output has two chains, even and odd keys, added at
 *   the end; 16 chains run at once (4 heads x 2 blocks, 2 x 4 or 1 x 8).
 * A job whose cache comes from memory (decode: the step's weights have flushed it) asks for the
 * lines of the keys and values `prefetch` positions ahead. One head at a time with a horizontal
 * sum per key, the heads were 3.1 % of a q4 decode step at 144 positions and 35 % at 1536 (perf,
 * phase times). The tree's loops are unrolled and a full set of keys loads without per-key masks
 * (key_scores), so the 16 accumulators stay in registers; before, gcc stored them to the stack
 * after every block: 1.13x from memory (2 threads, 1536 positions, d = 64, 4 query heads; C
 * driver), 1.2x from L2 on one thread, the same bits. The result is a fixed function of a head's
 * inputs, so a step and a prefill block agree bit for bit. */
COL_INLINE COL_T512 __m512 sum16x16(__m512 *a)
{
    __m512 x[8], y[4], z[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* lanes 4L..4L+3: keys 2i, 2i+1 interleaved, elements 0+2 and 1+3 */
        x[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* each 128-bit lane: keys 4i..4i+3, the lane's four elements summed */
        __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]));
        __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]));
        y[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* 128-bit lanes (0 + 1, 2 + 3) of y[2i], then of y[2i + 1] */
        z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The scores of heads h0 .. h0 + HC - 1 against the KC = 16 / HC keys from `key`, of which the
 * first `here` exist (all of them when `full`, a constant, is set: the loads then need no per-key
 * mask), scaled, in lane j * KC + k. */
COL_INLINE COL_T512 __m512 key_scores(const col_head_job *h, uint32_t h0, const uint32_t HC, const float *key,
                                      uint32_t here, const int full)
{
    const uint32_t KC = 16 / HC;
    __m512 acc[16];
#pragma GCC unroll 16
    for (uint32_t a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
    for (uint32_t i = 0; i < h->d; i += 16) {
        const __mmask16 m = lanes_below(h->d - i);
        __m512 kb[16];
#pragma GCC unroll 16
        for (uint32_t k = 0; k < KC; k++) /* a missing key loads nothing (mask 0) */
            kb[k] = _mm512_maskz_loadu_ps(full || k < here ? m : 0, key + (uint64_t)k * h->stride + i);
#pragma GCC unroll 4
        for (uint32_t j = 0; j < HC; j++) {
            const __m512 qb = _mm512_maskz_loadu_ps(m, h->q + (uint64_t)(h0 + j) * h->d + i);
#pragma GCC unroll 16
            for (uint32_t k = 0; k < KC; k++) acc[j * KC + k] = _mm512_fmadd_ps(qb, kb[k], acc[j * KC + k]);
        }
    }
    return _mm512_mul_ps(sum16x16(acc), _mm512_set1_ps(h->scale));
}

/* Scores of heads h0 .. h0 + HC - 1 (HC = 1, 2 or 4) against every key, 16 / HC keys per tree;
 * head j's scores go to scores + j * n_keys. */
COL_INLINE COL_T512 void group_scores(const col_head_job *h, uint32_t h0, const uint32_t HC, float *scores)
{
    const uint32_t KC = 16 / HC;
    for (uint32_t t0 = 0; t0 < h->n_keys; t0 += KC) {
        const uint32_t here = h->n_keys - t0 < KC ? h->n_keys - t0 : KC;
        const float *key = h->k + (uint64_t)t0 * h->stride;
        if (h->prefetch && t0 + h->prefetch < h->n_keys) /* the lines of the keys that far ahead */
            for (uint32_t k = 0; k < KC && t0 + h->prefetch + k < h->n_keys; k++)
                for (uint32_t i = 0; i < h->d; i += 16)
                    _mm_prefetch((const char *)(key + (uint64_t)(h->prefetch + k) * h->stride + i), _MM_HINT_T0);
        const __m512 sc = here == KC ? key_scores(h, h0, HC, key, KC, 1) : key_scores(h, h0, HC, key, here, 0);
        float *dst = scores + (uint64_t)h0 * h->n_keys + t0;
        if (HC == 1) {
            _mm512_mask_storeu_ps(dst, lanes_below(here), sc);
        } else if (HC == 2) {
            const __mmask8 m8 = (__mmask8)lanes_below(here);
            _mm256_mask_storeu_ps(dst, m8, _mm512_castps512_ps256(sc));
            _mm256_mask_storeu_ps(dst + h->n_keys, m8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sc), 1)));
        } else {
            const __mmask8 m4 = (__mmask8)lanes_below(here);
            _mm_mask_storeu_ps(dst, m4, _mm512_castps512_ps128(sc));
            _mm_mask_storeu_ps(dst + h->n_keys, m4, _mm512_extractf32x4_ps(sc, 1));
            _mm_mask_storeu_ps(dst + 2 * (uint64_t)h->n_keys, m4, _mm512_extractf32x4_ps(sc, 2));
            _mm_mask_storeu_ps(dst + 3 * (uint64_t)h->n_keys, m4, _mm512_extractf32x4_ps(sc, 3));
        }
    }
}

/* softmax_in_place's job in 16 lanes; the sink's exponential (the same exp16) joins the lane sum
 * last. */
static COL_T512 void softmax_avx512(float *scores, uint32_t n, const float *sink)
{
    __m512 max = _mm512_set1_ps(sink ? *sink : -INFINITY);
    for (uint32_t t = 0; t < n; t += 16)
        max = _mm512_max_ps(_mm512_mask_loadu_ps(max, lanes_below(n - t), scores + t), max);
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(max));
    __m512 sum = _mm512_setzero_ps();
    for (uint32_t t = 0; t < n; t += 16) {
        __mmask16 m = lanes_below(n - t);
        __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + t), top)));
        sum = _mm512_add_ps(sum, e);
        _mm512_mask_storeu_ps(scores + t, m, e);
    }
    if (sink) sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(1, exp16(_mm512_sub_ps(_mm512_set1_ps(*sink), top))));
    const __m512 inv = _mm512_set1_ps(1.0f / hsum16(sum));
    for (uint32_t t = 0; t < n; t += 16) {
        __mmask16 m = lanes_below(n - t);
        _mm512_mask_storeu_ps(scores + t, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, scores + t), inv));
    }
}

/* Outputs of heads h0 .. h0 + HC - 1 from their probabilities p + j * n_keys, 8 / HC blocks of 16
 * dimensions per pass. */
COL_INLINE COL_T512 void group_values(const col_head_job *h, uint32_t h0, const uint32_t HC, const float *p,
                                      float *out)
{
    const uint32_t BP = 8 / HC, n = h->n_keys;
    for (uint32_t i0 = 0; i0 < h->d; i0 += 16 * BP) {
        __mmask16 m[8];
        __m512 even[16], odd[16]; /* [j * BP + b] */
#pragma GCC unroll 8
        for (uint32_t b = 0; b < BP; b++) m[b] = i0 + 16 * b < h->d ? lanes_below(h->d - i0 - 16 * b) : 0;
#pragma GCC unroll 16
        for (uint32_t a = 0; a < 16; a++) even[a] = odd[a] = _mm512_setzero_ps();
        const float *v = h->v + i0;
        uint32_t t = 0;
        for (; t + 2 <= n; t += 2) {
            const float *v0 = v + (uint64_t)t * h->stride, *v1 = v0 + h->stride;
            if (h->prefetch && t + h->prefetch + 1 < n)
#pragma GCC unroll 8
                for (uint32_t b = 0; b < BP; b++) {
                    _mm_prefetch((const char *)(v0 + (uint64_t)h->prefetch * h->stride + 16 * b), _MM_HINT_T0);
                    _mm_prefetch((const char *)(v1 + (uint64_t)h->prefetch * h->stride + 16 * b), _MM_HINT_T0);
                }
            __m512 x0[8], x1[8];
#pragma GCC unroll 8
            for (uint32_t b = 0; b < BP; b++) {
                x0[b] = _mm512_maskz_loadu_ps(m[b], v0 + 16 * b);
                x1[b] = _mm512_maskz_loadu_ps(m[b], v1 + 16 * b);
            }
#pragma GCC unroll 4
            for (uint32_t j = 0; j < HC; j++) {
                const __m512 p0 = _mm512_set1_ps(p[(uint64_t)j * n + t]), p1 = _mm512_set1_ps(p[(uint64_t)j * n + t + 1]);
#pragma GCC unroll 8
                for (uint32_t b = 0; b < BP; b++) {
                    even[j * BP + b] = _mm512_fmadd_ps(p0, x0[b], even[j * BP + b]);
                    odd[j * BP + b] = _mm512_fmadd_ps(p1, x1[b], odd[j * BP + b]);
                }
            }
        }
        if (t < n) {
            const float *v0 = v + (uint64_t)t * h->stride;
#pragma GCC unroll 4
            for (uint32_t j = 0; j < HC; j++) {
                const __m512 p0 = _mm512_set1_ps(p[(uint64_t)j * n + t]);
#pragma GCC unroll 8
                for (uint32_t b = 0; b < BP; b++)
                    even[j * BP + b] = _mm512_fmadd_ps(p0, _mm512_maskz_loadu_ps(m[b], v0 + 16 * b), even[j * BP + b]);
            }
        }
#pragma GCC unroll 4
        for (uint32_t j = 0; j < HC; j++)
#pragma GCC unroll 8
            for (uint32_t b = 0; b < BP; b++)
                if (m[b])
                    _mm512_mask_storeu_ps(out + (uint64_t)(h0 + j) * h->d + i0 + 16 * b, m[b],
                                          _mm512_add_ps(even[j * BP + b], odd[j * BP + b]));
    }
}

COL_INLINE COL_T512 void attend_heads(const col_head_job *h, uint32_t h0, const uint32_t HC, float *scores, float *out)
{
    group_scores(h, h0, HC, scores);
    for (uint32_t j = 0; j < HC; j++)
        softmax_avx512(scores + (uint64_t)(h0 + j) * h->n_keys, h->n_keys, h->sinks ? h->sinks + h0 + j : NULL);
    group_values(h, h0, HC, scores + (uint64_t)h0 * h->n_keys, out);
}

static COL_T512 void attend_group_avx512(const col_head_job *h, float *scores, float *out)
{
    for (uint32_t h0 = 0; h0 < h->n_q;) {
        const uint32_t left = h->n_q - h0;
        if (left >= 4) {
            attend_heads(h, h0, 4, scores, out);
            h0 += 4;
        } else if (left >= 2) {
            attend_heads(h, h0, 2, scores, out);
            h0 += 2;
        } else {
            attend_heads(h, h0, 1, scores, out);
            h0 += 1;
        }
    }
}

COL_INLINE COL_T2 float dot_head_avx2(const float *a, const float *b, uint32_t d)
{
    __m256 acc = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum8(acc);
    for (; i < d; i++) s += a[i] * b[i];
    return s;
}

static COL_T2 void attend_head_avx2(const col_head_job *h, float *scores, float *out)
{
    for (uint32_t t = 0; t < h->n_keys; t++) scores[t] = dot_head_avx2(h->q, h->k + (uint64_t)t * h->stride, h->d) * h->scale;
    softmax_in_place(scores, h->n_keys, h->sinks);
    uint32_t i = 0;
    for (; i + 8 <= h->d; i += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (uint32_t t = 0; t < h->n_keys; t++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(scores[t]), _mm256_loadu_ps(h->v + (uint64_t)t * h->stride + i), acc);
        _mm256_storeu_ps(out + i, acc);
    }
    for (; i < h->d; i++) out[i] = weighted_value(h, scores, i);
}

/* h1[i] = silu(h1[i]) * h3[i] = h1[i] / (1 + exp(-h1[i])) * h3[i], 16 at a time (a tail of
 * fewer under a mask, so every element goes through the same operations). */
static COL_T512 void swiglu_gate_avx512(float *h1, const float *h3, uint64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (uint64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 z = _mm512_maskz_loadu_ps(m, h1 + i), b = _mm512_maskz_loadu_ps(m, h3 + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), z));
        _mm512_mask_storeu_ps(h1 + i, m, _mm512_mul_ps(_mm512_div_ps(z, _mm512_add_ps(one, e)), b));
    }
}

static col_isa detect_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return COL_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return COL_ISA_AVX2;
    return COL_ISA_PORTABLE;
}
#else
static col_isa detect_isa(void)
{
    return COL_ISA_PORTABLE;
}
#endif

const char *col_isa_name(col_isa isa)
{
    switch (isa) {
    case COL_ISA_AVX2: return "avx2";
    case COL_ISA_AVX512: return "avx512";
    case COL_ISA_AMX: return "amx";
    default: return "portable";
    }
}

/* ---- thread pool ------------------------------------------------------------------------- */

typedef struct worker_arg {
    col_pool *pool;
    uint32_t index;           /* 1..n_threads-1; the caller is 0 */
} worker_arg;

struct col_pool {
    uint32_t n_threads;
    col_isa isa;
    pthread_t *threads;       /* [n_threads - 1] */
    worker_arg *args;         /* [n_threads - 1], what each worker was started with */
    col_allocator alloc;      /* what the pool, threads and args were allocated with */
    uint32_t n_started;
    pthread_mutex_t mutex;
    pthread_cond_t work_ready;
    _Atomic uint64_t generation;   /* bumped for each batch */
    _Atomic uint32_t n_done;       /* workers finished with the current batch */
    _Atomic uint32_t n_sleeping;   /* workers blocked on work_ready */
    _Atomic int stopping;
    /* the current batch, written before generation is bumped: products, or a task */
    col_pool_task task;
    void *task_ctx;
    uint64_t n_items;
    const col_matvec_job *jobs;
    uint32_t n_jobs;
    int x_bf16;                /* every activation of the batch is a bf16 value (col_matmul_kernels) */
    uint64_t total_work;       /* sum over jobs of rows * row_work */
    uint32_t n_chunks;         /* products: pieces the threads take in turn */
    uint64_t chunk_end[COL_MAX_CHUNKS]; /* work at which chunk c ends (it starts where c - 1 ends) */
    _Atomic uint32_t next_chunk;
    /* scratch (caller-owned): per-job prepared activations, per-thread AMX staging */
    uint32_t max_jobs;
    uint64_t act_capacity;         /* bytes at act_buf */
    uint8_t **act;                 /* [max_jobs]; a job sharing the previous one's holds the same pointer */
    uint8_t *act_buf;              /* quantised rows or AMX-packed activations */
    uint8_t *stage;                /* [n_threads][stage_bytes] */
    uint64_t stage_bytes;
    const col_numerics *numerics;  /* a session's numerics variant (numerics.c), NULL = none */
};


/* Rows [r0, r1) of job j on thread t; `act` is the job's prepared activations (quantised for int8
 * weights, packed for AMX tiles, NULL otherwise). */
static void job_rows(const col_pool *pool, const col_matvec_job *j, const uint8_t *act, uint32_t t, uint64_t r0,
                     uint64_t r1)
{
#if defined(__x86_64__)
    if (pool->isa == COL_ISA_AMX && col_amx_handles(j->w.dtype)) {
        col_amx_rows(j, pool->x_bf16, act, pool->stage + (uint64_t)t * pool->stage_bytes, pool->stage_bytes, r0, r1);
        return;
    }
    if (pool->isa >= COL_ISA_AVX512) {
        rows_avx512(j, act, r0, r1, pool->stage ? pool->stage + (uint64_t)t * pool->stage_bytes : NULL, pool->stage_bytes);
        return;
    }
    if (pool->isa == COL_ISA_AVX2) {
        rows_avx2(j, act, r0, r1);
        return;
    }
#endif
    (void)pool, (void)t;
    rows_portable(j, act, r0, r1);
}

static void dispatch(col_pool *pool, int worth_sharing);

/* Work of one output row of a job: its multiply-adds. Shares are cut by work, not rows, because
 * the products of a batch differ in width and token count (a prefill block's experts see from one
 * to all of its tokens), and equal rows left one thread waiting for the other. */
static uint64_t row_work(const col_matvec_job *j)
{
    return j->w.cols * j->n_tokens;
}

/* Rows per tile of a batch (more than one token) on the pool's path: a chunk of a batch starts and
 * ends on a multiple of it, so that no chunk ends in a short tile, which does less with each
 * weight or token vector it loads (a vector tile of one row loads 4 token vectors per 4
 * multiply-adds instead of 10 per 24; an AMX block of a few rows costs the tile multiplies of 32).
 * Paired prefill: bf16 1.05x, bf16 with act-bf16 1.04x, q4 1.03x, f32 1.01x. Decode tiles take
 * distant rows and need no such edge. */
static uint64_t batch_tile_rows(const col_pool *pool, const col_matvec_job *j)
{
    if (j->n_tokens == 1) return 1;
#if defined(__x86_64__)
    if (pool->isa == COL_ISA_AMX && col_amx_handles(j->w.dtype)) return col_amx_tile_rows(j->n_tokens, pool->x_bf16);
    if (pool->isa >= COL_ISA_AVX512) return COL_BATCH_ROWS_512;
    if (pool->isa == COL_ISA_AVX2) return COL_BATCH_ROWS_AVX2;
#endif
    (void)pool;
    return 1;
}

/* The first row of job j whose work starts at or after `g` (the batch's work, rows laid end to
 * end, the job's rows starting at `base`), moved down to a multiple of `align` rows. */
static uint64_t chunk_edge(const col_matvec_job *j, uint64_t g, uint64_t base, uint64_t align)
{
    const uint64_t c = row_work(j);
    if (g <= base) return 0;
    uint64_t r = (g - base + c - 1) / c;
    return r >= j->w.rows ? j->w.rows : r - r % align;
}

/* Chunk c of a batch of products: the rows whose work starts in [chunk_end[c - 1], chunk_end[c])
 * of the batch's work, rows laid end to end, each edge moved down to a whole batch tile. */
static void run_chunk(const col_pool *pool, uint32_t t, uint32_t chunk)
{
    uint64_t g0 = chunk ? pool->chunk_end[chunk - 1] : 0, g1 = pool->chunk_end[chunk], base = 0;
    for (uint32_t k = 0; k < pool->n_jobs && base < g1; k++) {
        const col_matvec_job *j = &pool->jobs[k];
        const uint64_t align = batch_tile_rows(pool, j);
        uint64_t lo = chunk_edge(j, g0, base, align), hi = chunk_edge(j, g1, base, align);
        if (lo < hi) job_rows(pool, j, k < pool->max_jobs ? pool->act[k] : NULL, t, lo, hi);
        base += j->w.rows * row_work(j);
    }
}

/* Cut a batch of `work` multiply-adds into chunks for the pool's n threads, guided: each chunk is
 * the work left divided by 2n, but at least COL_GUIDED_MIN_MACS (and a 32nd of the work, so there
 * are at most COL_MAX_CHUNKS; and at most an n-th of the work, so each thread gets one), so the
 * first chunks are long (their rows make long streams) and the last ones short. Equal chunks (2-8
 * per product, as before) left the calling thread waiting 9 % of a q4 decode step for the worker
 * to finish its last one; guided chunks cut that wait to 2 %. Paired in-process runs: prefill
 * 1.03-1.07x (f32, bf16, q4); decode 0.99-1.03x, since while one thread waits the other reads
 * faster. */
static void plan_chunks(col_pool *pool, uint64_t work)
{
    const uint64_t n = pool->n_threads, least_by_work = work / (COL_MAX_CHUNKS / 2);
    uint64_t least = least_by_work > COL_GUIDED_MIN_MACS ? least_by_work : COL_GUIDED_MIN_MACS;
    if (least > (work + n - 1) / n) least = (work + n - 1) / n; /* a small product: one chunk per thread */
    uint64_t done = 0;
    uint32_t c = 0;
    while (done < work && c + 1 < COL_MAX_CHUNKS) {
        uint64_t size = (work - done) / (2 * n);
        size = size > least ? size : least;
        done = work - done > size ? done + size : work;
        pool->chunk_end[c++] = done;
    }
    if (done < work || c == 0) pool->chunk_end[c++] = work;
    pool->n_chunks = c;
}

/* Thread `t` of `n`'s part of the current batch. A task is split statically (items
 * [N*t/n, N*(t+1)/n)). Products are cut into chunks that the threads take in turn from a shared
 * counter, so a thread that the memory system serves more slowly for a while does fewer chunks
 * instead of holding the other up at the end of the product. Which thread computes a row never
 * changes its bits. */
static void run_share(col_pool *pool, uint32_t t, uint32_t n)
{
    if (pool->task) {
        uint64_t i0 = pool->n_items * t / n, i1 = pool->n_items * (t + 1) / n;
        if (i0 < i1) pool->task(pool->task_ctx, t, i0, i1);
        return;
    }
    if (n == 1) {
        for (uint32_t c = 0; c < pool->n_chunks; c++) run_chunk(pool, t, c);
        return;
    }
    for (uint32_t c; (c = atomic_fetch_add(&pool->next_chunk, 1)) < pool->n_chunks;) run_chunk(pool, t, c);
}

/* One step of a spin-wait: pause, and after a while yield the core, because on an oversubscribed
 * machine the thread being waited for may be the one that needs it. */
static void cpu_relax(uint32_t spins)
{
    if (spins > 2000u) {
        sched_yield();
        return;
    }
#if defined(__x86_64__)
    _mm_pause();
#endif
}

static void *worker_main(void *p)
{
    worker_arg arg = *(worker_arg *)p;
    col_pool *pool = arg.pool;
    uint64_t seen = 0;
    for (;;) {
        uint32_t spins = 0;
        uint64_t g;
        while ((g = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stopping)) {
            if (++spins < COL_SPIN_LIMIT) {
                cpu_relax(spins);
                continue;
            }
            pthread_mutex_lock(&pool->mutex);
            atomic_fetch_add(&pool->n_sleeping, 1);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stopping))
                pthread_cond_wait(&pool->work_ready, &pool->mutex);
            atomic_fetch_sub(&pool->n_sleeping, 1);
            pthread_mutex_unlock(&pool->mutex);
            spins = 0;
        }
        if (atomic_load(&pool->stopping)) break;
        seen = g;
        run_share(pool, arg.index, pool->n_threads);
        atomic_fetch_add(&pool->n_done, 1);
    }
    return NULL;
}

col_isa col_choose_isa(col_isa ceiling)
{
    col_isa isa = detect_isa();
    if (isa == COL_ISA_AVX512 && ceiling == COL_ISA_AMX && col_amx_enable()) isa = COL_ISA_AMX;
    if (isa > ceiling) isa = ceiling;
    const char *env = getenv("COLIBRI_KERNELS");
    if (env) { /* can only lower the choice: a forced path the CPU lacks would crash */
        col_isa want = strcmp(env, "portable") == 0 ? COL_ISA_PORTABLE
                     : strcmp(env, "avx2") == 0     ? COL_ISA_AVX2
                     : strcmp(env, "avx512") == 0   ? COL_ISA_AVX512
                                                    : COL_ISA_AMX;
        if (want < isa) isa = want;
    }
    return isa;
}

/* Scratch layout: [max_jobs] activation pointers | activations | [n_threads] AMX staging. The
 * activations of a batch take, per job, n_tokens quantised rows, or AMX-packed tokens, which
 * need at most ceil(nt / 5) * ceil(cols / 32) * 1024 <= 32 (nt + 4) (cols + 31) / 5 bytes
 * = 6.4 nt cols + 198.4 nt + 25.6 cols + 793.6 (col_amx_packed_bytes), plus 64 of slack and 64
 * of alignment. */
static uint64_t pointers_bytes(uint32_t max_jobs)
{
    return ((uint64_t)max_jobs * sizeof(uint8_t *) + 63) & ~(uint64_t)63;
}
static uint64_t act_bytes(col_isa isa, const col_pool_limits *l)
{
    uint64_t q = qrow_bytes(l->max_act_cols) + 64 * (uint64_t)l->max_jobs;
    uint64_t amx = 32 * (uint64_t)l->max_act_cols / 5 + 1 +
                   (uint64_t)l->max_jobs * (199 * (uint64_t)l->max_tokens + 26 * (uint64_t)l->max_cols + 794 + 128);
    uint64_t bytes = isa == COL_ISA_AMX && amx > q ? amx : q;
    return (bytes + 63) & ~(uint64_t)63; /* the staging after it is 64-byte aligned */
}
/* Per-thread staging: the AMX path's, and on AVX-512 (which the AMX path runs for other dtypes)
 * the carried lane sums of a group of tiles over long rows (rows_kblocked_avx512). */
static uint64_t stage_bytes(col_isa isa, const col_pool_limits *l)
{
    uint64_t amx = isa == COL_ISA_AMX ? (col_amx_stage_bytes(l->max_cols, l->max_tokens) + 63) & ~(uint64_t)63 : 0, carry = 0;
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512 && l->max_tokens > 1 && l->max_cols > COL_BATCH_KBLOCK)
        carry = COL_KBLOCK_TILES * kblock_carry_bytes(l->max_tokens);
#endif
    return amx > carry ? amx : carry;
}
static uint64_t scratch_bytes_for(col_isa isa, uint32_t n_threads, const col_pool_limits *l)
{
    return pointers_bytes(l->max_jobs) + act_bytes(isa, l) + n_threads * stage_bytes(isa, l);
}

uint64_t col_pool_scratch_size(col_isa isa, uint32_t n_threads, const col_pool_limits *limits)
{
    return scratch_bytes_for(isa, n_threads, limits);
}

col_pool *col_pool_create(col_isa isa, uint32_t n_threads, void *scratch, uint64_t scratch_bytes,
                          const col_pool_limits *limits, const col_allocator *alloc)
{
    if (n_threads == 0 || !limits || !alloc) return NULL;
    if (!scratch && scratch_bytes_for(COL_ISA_PORTABLE, n_threads, limits) > 0) return NULL;
    col_pool *pool = col_alloc_zeroed(alloc, 1, sizeof *pool);
    if (!pool) return NULL;
    pool->alloc = *alloc;
    pool->n_threads = n_threads;
    const col_isa can = col_choose_isa(isa); /* never a path this machine lacks */
    pool->isa = can < isa ? can : isa;
    if (pool->isa == COL_ISA_AMX &&
        (limits->max_jobs == 0 || scratch_bytes_for(COL_ISA_AMX, n_threads, limits) > scratch_bytes))
        pool->isa = COL_ISA_AVX512; /* no room to pack activations: the vector path needs none */
    pool->max_jobs = limits->max_jobs;
    if (scratch) {
        pool->act = scratch;
        pool->act_buf = (uint8_t *)scratch + pointers_bytes(limits->max_jobs);
        pool->act_capacity = act_bytes(pool->isa, limits);
        pool->stage = pool->act_buf + pool->act_capacity;
        pool->stage_bytes = stage_bytes(pool->isa, limits);
        if (scratch_bytes_for(pool->isa, n_threads, limits) > scratch_bytes)
            pool->stage_bytes = 0; /* no room for carried sums: long rows run as whole-row tiles, same bits */
    }
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->n_done, 0);
    atomic_init(&pool->next_chunk, 0);
    atomic_init(&pool->n_sleeping, 0);
    atomic_init(&pool->stopping, 0);
    if (pthread_mutex_init(&pool->mutex, NULL) != 0) {
        col_dealloc(alloc, pool);
        return NULL;
    }
    pthread_cond_init(&pool->work_ready, NULL);
    if (n_threads > 1) {
        pool->threads = col_alloc_zeroed(alloc, n_threads - 1, sizeof *pool->threads);
        pool->args = col_alloc_zeroed(alloc, n_threads - 1, sizeof *pool->args);
        if (!pool->threads || !pool->args) {
            col_pool_free(pool);
            return NULL;
        }
        for (uint32_t i = 1; i < n_threads; i++) {
            worker_arg *arg = &pool->args[i - 1];
            arg->pool = pool;
            arg->index = i;
            if (pthread_create(&pool->threads[i - 1], NULL, worker_main, arg) != 0) {
                col_pool_free(pool);
                return NULL;
            }
            pool->n_started++;
        }
    }
    return pool;
}

void col_pool_free(col_pool *pool)
{
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->stopping, 1);
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    for (uint32_t i = 0; i < pool->n_started; i++) pthread_join(pool->threads[i], NULL);
    const col_allocator alloc = pool->alloc;
    col_dealloc(&alloc, pool->threads);
    col_dealloc(&alloc, pool->args);
    pthread_cond_destroy(&pool->work_ready);
    pthread_mutex_destroy(&pool->mutex);
    col_dealloc(&alloc, pool);
}

void col_attend_head(const col_pool *pool, const col_head_job *head, float *scores, float *out)
{
    const col_isa isa = col_pool_isa(pool);
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512) {
        attend_group_avx512(head, scores, out);
        return;
    }
#endif
    (void)isa; /* only x86 has paths to choose from */
    for (uint32_t j = 0; j < head->n_q; j++) {
        col_head_job one = *head;
        one.q = head->q + (uint64_t)j * head->d;
        one.n_q = 1;
        one.sinks = head->sinks ? head->sinks + j : NULL;
#if defined(__x86_64__)
        if (isa == COL_ISA_AVX2) {
            attend_head_avx2(&one, scores, out + (uint64_t)j * head->d);
            continue;
        }
#endif
        attend_head_portable(&one, scores, out + (uint64_t)j * head->d);
    }
}

static COL_T512 void round_bf16_avx512(float *v, uint64_t n)
{
    const __m512i exp_mask = _mm512_set1_epi32(0x7F800000), half = _mm512_set1_epi32(0x7FFF);
    const __m512i one = _mm512_set1_epi32(1), keep = _mm512_set1_epi32((int)0xFFFF0000u);
    for (uint64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512i b = _mm512_maskz_loadu_epi32(m, v + i);
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, half), _mm512_and_si512(_mm512_srli_epi32(b, 16), one));
        r = _mm512_and_si512(r, keep);
        __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(b, exp_mask), exp_mask);
        _mm512_mask_storeu_epi32(v + i, m, _mm512_mask_blend_epi32(special, r, b));
    }
}

static void round_bf16_range(col_isa isa, float *v, uint64_t n)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512) {
        round_bf16_avx512(v, n);
        return;
    }
#endif
    (void)isa;
    round_bf16_portable(v, n);
}

static void swiglu_gate_range(col_isa isa, float *h1, const float *h3, uint64_t n)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512) {
        swiglu_gate_avx512(h1, h3, n);
        return;
    }
#endif
    (void)isa;
    swiglu_gate_portable(h1, h3, n);
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

col_isa col_pool_isa(const col_pool *pool)
{
    return pool ? pool->isa : COL_ISA_PORTABLE;
}

void col_pool_set_numerics(col_pool *pool, const col_numerics *numerics)
{
    if (pool) pool->numerics = numerics;
}

void col_matmul_many(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs)
{
    if (pool && pool->numerics) { /* numerics variant: numerics.c runs it (and calls back below) */
        col_numerics_matmul(pool->numerics, pool, jobs, n_jobs);
        return;
    }
    col_matmul_kernels(pool, jobs, n_jobs, 0);
}

/* Token t of job j's activations into the place the job's kernels read them from. */
static void prepare_token(const col_pool *pool, const col_matvec_job *j, uint8_t *act, uint32_t t)
{
    if (pool->isa == COL_ISA_AMX && col_amx_handles(j->w.dtype))
        col_amx_pack(j->x, j->n_tokens, j->w.cols, pool->x_bf16, t, t + 1, act);
    else
        quantize_row(j->x + (uint64_t)t * j->w.cols, j->w.cols, j->w.dtype, pool->isa, act + t * qrow_bytes(j->w.cols));
}

typedef struct prepare_ctx {
    const col_pool *pool;
    const col_matvec_job *jobs;
    uint32_t n_jobs;
} prepare_ctx;

/* Items [i0, i1) of the tokens of every job that prepares its own activations, jobs in order. */
static void prepare_items(void *ctx, uint32_t thread, uint64_t i0, uint64_t i1)
{
    const prepare_ctx *c = ctx;
    (void)thread;
    uint64_t base = 0;
    for (uint32_t k = 0; k < c->n_jobs && base < i1; k++) {
        uint8_t *act = c->pool->act[k];
        if (!act || (k > 0 && act == c->pool->act[k - 1])) continue; /* none, or the previous job's */
        const col_matvec_job *j = &c->jobs[k];
        for (uint64_t i = i0 > base ? i0 : base; i < i1 && i < base + j->n_tokens; i++)
            prepare_token(c->pool, j, act, (uint32_t)(i - base));
        base += j->n_tokens;
    }
}

/* Quantise or pack the activations of a batch: on the calling thread when small (a decode step),
 * else split by tokens over the pool. Every token's bytes are the same either way. Paired
 * in-process runs against the calling thread alone: prefill 1.07x (bf16, AMX packing) and 1.10x
 * (q4, int8 quantisation and AMX packing). */
static void prepare_activations(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, uint64_t n_tokens,
                                uint64_t n_elems)
{
    prepare_ctx ctx = {pool, jobs, n_jobs};
    if (n_elems < COL_PREPARE_PARALLEL_ELEMS || pool->n_threads == 1)
        prepare_items(&ctx, 0, 0, n_tokens);
    else
        col_pool_run(pool, prepare_items, &ctx, n_tokens);
}

void col_matmul_kernels(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, int x_bf16)
{
    if (n_jobs == 0) return;
    if (!pool) { /* single-threaded portable path; float weights only (no scratch for int8 rows) */
        for (uint32_t k = 0; k < n_jobs; k++) {
            assert(!is_block_dtype(jobs[k].w.dtype));
            if (!is_block_dtype(jobs[k].w.dtype)) rows_portable(&jobs[k], NULL, 0, jobs[k].w.rows);
        }
        return;
    }
    assert(n_jobs <= pool->max_jobs || pool->max_jobs == 0);
    uint64_t rows = 0, macs = 0, used = 0, own_tokens = 0, own_elems = 0;
    for (uint32_t k = 0; k < n_jobs; k++) {
        const col_matvec_job *j = &jobs[k];
        rows += j->w.rows;
        macs += j->w.rows * row_work(j);
        const int amx = pool->isa == COL_ISA_AMX && col_amx_handles(j->w.dtype);
        uint8_t *act = NULL;
        if (amx || is_block_dtype(j->w.dtype)) {
            const col_matvec_job *prev = k > 0 ? &jobs[k - 1] : NULL;
            if (prev && prev->x == j->x && prev->n_tokens == j->n_tokens && prev->w.cols == j->w.cols &&
                (amx ? col_amx_handles(prev->w.dtype) : prev->w.dtype == j->w.dtype) && pool->act[k - 1]) {
                act = pool->act[k - 1]; /* same activations as the previous job (w1 and w3; q, k and v) */
            } else {
                uint64_t need = amx ? col_amx_packed_bytes(j->n_tokens, j->w.cols, x_bf16)
                                    : j->n_tokens * qrow_bytes(j->w.cols);
                need = (need + 63) & ~(uint64_t)63;
                assert(k < pool->max_jobs && used + need <= pool->act_capacity); /* sized by the session */
                if (k >= pool->max_jobs || used + need > pool->act_capacity) return;
                act = pool->act_buf + used;
                used += need;
                own_tokens += j->n_tokens;
                own_elems += (uint64_t)j->n_tokens * j->w.cols;
            }
        }
        if (k < pool->max_jobs) pool->act[k] = act;
    }
    pool->x_bf16 = x_bf16;
    prepare_activations(pool, jobs, n_jobs, own_tokens, own_elems);
    pool->task = NULL;
    pool->jobs = jobs;
    pool->n_jobs = n_jobs;
    pool->total_work = macs;
    plan_chunks(pool, macs);
    atomic_store(&pool->next_chunk, 0);
    dispatch(pool, rows >= pool->n_threads && macs >= COL_PARALLEL_MIN_MACS);
}

void col_pool_run(col_pool *pool, col_pool_task fn, void *ctx, uint64_t n_items)
{
    if (n_items == 0) return;
    if (!pool) {
        fn(ctx, 0, 0, n_items);
        return;
    }
    pool->task = fn;
    pool->task_ctx = ctx;
    pool->n_items = n_items;
    dispatch(pool, n_items >= pool->n_threads);
    pool->task = NULL;
}

uint32_t col_pool_threads(const col_pool *pool)
{
    return pool ? pool->n_threads : 1;
}

/* Run the batch just described in the pool: on all threads, or on the caller alone when it is not
 * worth waking the workers (or they are not all running). Returns when every share is done. */
static void dispatch(col_pool *pool, int worth_sharing)
{
    if (pool->n_threads == 1 || pool->n_started + 1 < pool->n_threads || !worth_sharing) {
        run_share(pool, 0, 1);
        return;
    }
    atomic_store(&pool->n_done, 0);
    atomic_fetch_add(&pool->generation, 1);
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->work_ready);
        pthread_mutex_unlock(&pool->mutex);
    }
    run_share(pool, 0, pool->n_threads);
    for (uint32_t spins = 0; atomic_load(&pool->n_done) < pool->n_threads - 1; spins++) cpu_relax(spins);
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
