/*
 * kernels.c - matrix-vector and matrix-matrix products over stored weights (f32, f16, bf16,
 * q8_0, q4_0) and the thread pool that splits them by output rows.
 *
 * Three paths behind one interface: portable C (runs everywhere), AVX2+FMA+F16C, and AVX-512
 * (F/BW/VL with VNNI for the int8 blocks). The SIMD paths are compiled with function target
 * attributes, so the default build flags stay portable, and one is chosen from CPUID when the
 * pool is created (the choice lives in the pool, hence in the session; no global state).
 *
 * Determinism by construction: every output element (row r, token t) is one dot product computed
 * by exactly one thread, with a fixed lane layout: a single vector accumulator walked left to
 * right over the row, a fixed horizontal reduction, then the scalar tail in order. Tiles (two rows
 * for one token in decode, one row for four tokens in a batch) only interleave independent
 * accumulators, so an output's bits depend neither on the thread count nor on the batch size:
 * a prefill equals the same tokens stepped one at a time.
 *
 * Quantised weights (q8_0, q4_0: blocks of 32 with an f16 scale) are multiplied against the
 * activations quantised per block of 32 to int8 (scale = max|x| / 127), with exact integer block
 * sums (VNNI vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd, which give the same integers) scaled by
 * d_w * d_x into f32 lanes. The activations are quantised once per product on the calling thread.
 *
 * The pool's workers spin on an atomic generation counter for a short while after each product
 * (a forward pass issues tens of products per token, too many for a condvar wake-up each), then
 * sleep on a condvar so an idle session costs no CPU.
 */
#include "kernels.h"

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
/* Spins of a worker waiting for the next product before it sleeps (~100 us). */
#define COL_SPIN_LIMIT 20000u
#define QK 32 /* elements per quantised block */

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

void col_load_row(const void *data, uint32_t dtype, uint64_t n, float *out)
{
    const uint8_t *p = data;
    if (dtype == COL_DTYPE_F32) {
        memcpy(out, data, n * sizeof(float));
    } else if (dtype == COL_DTYPE_Q8_0) {
        for (uint64_t b = 0; b < n / QK; b++, p += 34) {
            float d = col_f16_to_f32(rd16u(p));
            for (int j = 0; j < QK; j++) out[b * QK + j] = d * (float)(int8_t)p[2 + j];
        }
    } else if (dtype == COL_DTYPE_Q4_0) {
        for (uint64_t b = 0; b < n / QK; b++, p += 18) {
            float d = col_f16_to_f32(rd16u(p));
            for (int j = 0; j < 16; j++) {
                out[b * QK + j] = d * (float)((p[2 + j] & 0x0F) - 8);
                out[b * QK + j + 16] = d * (float)((p[2 + j] >> 4) - 8);
            }
        }
    } else {
        for (uint64_t i = 0; i < n; i++) out[i] = col_load_elem(data, dtype, i);
    }
}

static int is_block_dtype(uint32_t dtype)
{
    return dtype == COL_DTYPE_Q8_0 || dtype == COL_DTYPE_Q4_0;
}

/* ---- activation quantisation (shared by every path, so every path sees the same integers) ---- */

/* Layout of one quantised activation row of `cols` (nb = cols / 32 blocks), in bytes:
 * [nb*32] int8 values | [nb] f32 scales d_x | [nb][8] int32 q4 corrections -8 * sum of 4 values. */
static uint64_t qrow_bytes(uint64_t cols)
{
    return cols / QK * (QK + 4 + 32);
}

static void quantize_row(const float *x, uint64_t cols, uint8_t *out)
{
    uint64_t nb = cols / QK;
    int8_t *q = (int8_t *)out;
    float *d = (float *)(out + nb * QK);
    int32_t *c = (int32_t *)(out + nb * (QK + 4));
    for (uint64_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            float a = fabsf(xb[j]);
            if (a > amax) amax = a;
        }
        float dx = amax / 127.0f;
        float id = dx > 0.0f ? 1.0f / dx : 0.0f;
        d[b] = dx;
        for (int j = 0; j < QK; j++) {
            long v = lrintf(xb[j] * id);
            q[b * QK + j] = (int8_t)(v > 127 ? 127 : (v < -127 ? -127 : v));
        }
        for (int i = 0; i < 8; i++)
            c[b * 8 + i] = -8 * (q[b * QK + 4 * i] + q[b * QK + 4 * i + 1] + q[b * QK + 4 * i + 2] +
                                 q[b * QK + 4 * i + 3]);
    }
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

static float dotq_portable(const uint8_t *row, uint32_t dtype, const uint8_t *qx, uint64_t n)
{
    uint64_t nb = n / QK;
    const int8_t *q = (const int8_t *)qx;
    const float *d = (const float *)(qx + nb * QK);
    float acc = 0.0f;
    for (uint64_t b = 0; b < nb; b++) {
        int32_t isum = 0;
        if (dtype == COL_DTYPE_Q8_0) {
            const uint8_t *blk = row + b * 34;
            for (int j = 0; j < QK; j++) isum += (int8_t)blk[2 + j] * q[b * QK + j];
            acc += col_f16_to_f32(rd16u(blk)) * d[b] * (float)isum;
        } else {
            const uint8_t *blk = row + b * 18;
            for (int j = 0; j < 16; j++)
                isum += ((blk[2 + j] & 0x0F) - 8) * q[b * QK + j] + ((blk[2 + j] >> 4) - 8) * q[b * QK + j + 16];
            acc += col_f16_to_f32(rd16u(blk)) * d[b] * (float)isum;
        }
    }
    return acc;
}

static void rows_portable(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1)
{
    const col_weight *w = &j->w;
    uint64_t rb = col_dtype_row_bytes(w->dtype, w->cols), qb = qrow_bytes(w->cols);
    for (uint64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * rb;
        for (uint32_t t = 0; t < j->n_tokens; t++)
            j->y[(uint64_t)t * w->rows + r] = qx ? dotq_portable(row, w->dtype, qx + t * qb, w->cols)
                                                 : dot_portable(row, w->dtype, j->x + (uint64_t)t * w->cols, w->cols);
    }
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

/* Scalar tail of one output, in order, after the vector part `s`. */
static float tail(float s, const uint8_t *row, uint32_t dtype, const float *x, uint64_t i, uint64_t n)
{
    for (; i < n; i++) s += col_load_elem(row, dtype, i) * x[i];
    return s;
}

/* A tile of NR rows x NT tokens (NR <= 2, NT <= 4) for float weights. */
COL_INLINE COL_T2 void tile_f_avx2(const col_matvec_job *j, uint64_t r, int NR, int NT, uint32_t t, uint32_t dtype)
{
    const col_weight *w = &j->w;
    uint64_t n = w->cols, rb = col_dtype_row_bytes(dtype, n);
    const uint8_t *row[2] = {(const uint8_t *)w->data + r * rb, (const uint8_t *)w->data + (r + (NR > 1)) * rb};
    const float *x[4];
    for (int b = 0; b < 4; b++) x[b] = j->x + (uint64_t)(t + (b < NT ? b : 0)) * n;
    __m256 acc[8];
    for (int a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
    uint64_t i = 0;
    uint64_t esize = dtype == COL_DTYPE_F32 ? 4 : 2;
    for (; i + 8 <= n; i += 8)
        for (int a = 0; a < NR; a++) {
            if (NT == 1) _mm_prefetch((const char *)(row[a] + (i + 8) * esize + 2048), _MM_HINT_T0);
            __m256 wv = load8(row[a], dtype, i);
            for (int b = 0; b < NT; b++) acc[a * NT + b] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[b] + i), acc[a * NT + b]);
        }
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++)
            j->y[(uint64_t)(t + b) * w->rows + r + a] = tail(hsum8(acc[a * NT + b]), row[a], dtype, x[b], i, n);
}

COL_INLINE COL_T512 void tile_f_avx512(const col_matvec_job *j, uint64_t r, int NR, int NT, uint32_t t, uint32_t dtype)
{
    const col_weight *w = &j->w;
    uint64_t n = w->cols, rb = col_dtype_row_bytes(dtype, n);
    const uint8_t *row[2] = {(const uint8_t *)w->data + r * rb, (const uint8_t *)w->data + (r + (NR > 1)) * rb};
    const float *x[4];
    for (int b = 0; b < 4; b++) x[b] = j->x + (uint64_t)(t + (b < NT ? b : 0)) * n;
    __m512 acc[8];
    for (int a = 0; a < 8; a++) acc[a] = _mm512_setzero_ps();
    uint64_t i = 0;
    uint64_t esize = dtype == COL_DTYPE_F32 ? 4 : 2;
    for (; i + 16 <= n; i += 16)
        for (int a = 0; a < NR; a++) {
            /* decode streams each weight row once: ask for the line 2 KiB ahead, which the
             * hardware prefetcher alone does not keep up with (bf16 decode went from 56% to 86%
             * of the bandwidth limit on the 0.64 B bench model, 2 threads) */
            if (NT == 1) _mm_prefetch((const char *)(row[a] + (i + 16) * esize + 2048), _MM_HINT_T0);
            __m512 wv = load16(row[a], dtype, i);
            for (int b = 0; b < NT; b++) acc[a * NT + b] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[b] + i), acc[a * NT + b]);
        }
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++)
            j->y[(uint64_t)(t + b) * w->rows + r + a] = tail(hsum16(acc[a * NT + b]), row[a], dtype, x[b], i, n);
}

/* Integer sums of one weight block against one activation block, as 8 int32 lanes (lane i
 * covers elements 4i..4i+3 of the 32-element block in the layout of `wq`). */
COL_INLINE COL_T2 __m256i bsum_avx2(__m256i wq, __m256i xq, __m256i corr, int q4)
{
    __m256i ones = _mm256_set1_epi16(1);
    if (q4) /* wq holds unsigned 0..15: sum(wq*x) - 8*sum(x) */
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), ones), corr);
    /* |x| * (w with x's sign) == x * w; |x|, |w| <= 127 so the int16 pairs cannot saturate */
    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(xq), _mm256_sign_epi8(wq, xq));
    return _mm256_madd_epi16(p, ones);
}

COL_INLINE COL_T512 __m256i bsum_vnni(__m256i wq, __m256i xq, __m256i corr, int q4)
{
    if (q4) return _mm256_dpbusd_epi32(corr, wq, xq);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(xq), _mm256_sign_epi8(wq, xq));
}

/* Weight block b of a row as 32 bytes in activation order, and its scale. */
COL_INLINE COL_T2 __m256i wblock(const uint8_t *row, uint64_t b, int q4, float *d)
{
    if (!q4) {
        const uint8_t *blk = row + b * 34;
        *d = _cvtsh_ss(rd16u(blk));
        return _mm256_loadu_si256((const __m256i *)(blk + 2));
    }
    const uint8_t *blk = row + b * 18;
    *d = _cvtsh_ss(rd16u(blk));
    __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 2));
    __m128i m = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(raw, m), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
    return _mm256_insertf128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* A tile of NR rows x NT tokens for q8_0/q4_0 weights; VNNI selects the integer instruction. */
COL_INLINE COL_T512 void tile_q(const col_matvec_job *j, const uint8_t *qx, uint64_t r, int NR, int NT, uint32_t t,
                                int q4, int vnni)
{
    const col_weight *w = &j->w;
    uint64_t n = w->cols, nb = n / QK, rb = col_dtype_row_bytes(w->dtype, n), qb = qrow_bytes(n);
    const uint8_t *row[2] = {(const uint8_t *)w->data + r * rb, (const uint8_t *)w->data + (r + (NR > 1)) * rb};
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xc[4];
    for (int b = 0; b < 4; b++) {
        const uint8_t *base = qx + (uint64_t)(t + (b < NT ? b : 0)) * qb;
        xq[b] = (const int8_t *)base;
        xd[b] = (const float *)(base + nb * QK);
        xc[b] = (const int32_t *)(base + nb * (QK + 4));
    }
    __m256 acc[8];
    for (int a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
    uint64_t block_bytes = q4 ? 18 : 34;
    for (uint64_t blk = 0; blk < nb; blk++)
        for (int a = 0; a < NR; a++) {
            float dw;
            /* decode streams each row once: fetch 2 KiB ahead (see tile_f_avx512) */
            if (NT == 1) _mm_prefetch((const char *)(row[a] + blk * block_bytes + 2048), _MM_HINT_T0);
            __m256i wq = wblock(row[a], blk, q4, &dw);
            for (int b = 0; b < NT; b++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[b] + blk * QK));
                __m256i cv = q4 ? _mm256_loadu_si256((const __m256i *)(xc[b] + blk * 8)) : _mm256_setzero_si256();
                __m256i s = vnni ? bsum_vnni(wq, xv, cv, q4) : bsum_avx2(wq, xv, cv, q4);
                acc[a * NT + b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * xd[b][blk]), acc[a * NT + b]);
            }
        }
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++) j->y[(uint64_t)(t + b) * w->rows + r + a] = hsum8(acc[a * NT + b]);
}

/* The same tile for the AVX2 path (no VNNI): compiled without AVX-512 so it runs on AVX2-only CPUs. */
COL_INLINE COL_T2 void tile_q_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r, int NR, int NT, uint32_t t,
                                   int q4)
{
    const col_weight *w = &j->w;
    uint64_t n = w->cols, nb = n / QK, rb = col_dtype_row_bytes(w->dtype, n), qb = qrow_bytes(n);
    const uint8_t *row[2] = {(const uint8_t *)w->data + r * rb, (const uint8_t *)w->data + (r + (NR > 1)) * rb};
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xc[4];
    for (int b = 0; b < 4; b++) {
        const uint8_t *base = qx + (uint64_t)(t + (b < NT ? b : 0)) * qb;
        xq[b] = (const int8_t *)base;
        xd[b] = (const float *)(base + nb * QK);
        xc[b] = (const int32_t *)(base + nb * (QK + 4));
    }
    __m256 acc[8];
    for (int a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
    uint64_t block_bytes = q4 ? 18 : 34;
    for (uint64_t blk = 0; blk < nb; blk++)
        for (int a = 0; a < NR; a++) {
            float dw;
            /* decode streams each row once: fetch 2 KiB ahead (see tile_f_avx512) */
            if (NT == 1) _mm_prefetch((const char *)(row[a] + blk * block_bytes + 2048), _MM_HINT_T0);
            __m256i wq = wblock(row[a], blk, q4, &dw);
            for (int b = 0; b < NT; b++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[b] + blk * QK));
                __m256i cv = q4 ? _mm256_loadu_si256((const __m256i *)(xc[b] + blk * 8)) : _mm256_setzero_si256();
                __m256i s = bsum_avx2(wq, xv, cv, q4);
                acc[a * NT + b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * xd[b][blk]), acc[a * NT + b]);
            }
        }
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++) j->y[(uint64_t)(t + b) * w->rows + r + a] = hsum8(acc[a * NT + b]);
}

/* Walk rows [r0, r1) x all tokens in tiles: 2x1 for one token (two independent chains), 2x4
 * for batches (8 accumulators: each weight vector feeds four tokens, each token vector two rows). TILE(NR, NT, t) must expand to a call with literal NR and NT. */
#define WALK_TILES(TILE)                                                             \
    do {                                                                             \
        uint32_t nt_ = j->n_tokens;                                                  \
        if (nt_ == 1) {                                                              \
            uint64_t r = r0;                                                         \
            for (; r + 2 <= r1; r += 2) TILE(2, 1, 0);                               \
            if (r < r1) TILE(1, 1, 0);                                               \
        } else {                                                                     \
            uint64_t r = r0;                                                         \
            for (; r + 2 <= r1; r += 2) {                                            \
                uint32_t t = 0;                                                      \
                for (; t + 4 <= nt_; t += 4) TILE(2, 4, t);                          \
                switch (nt_ - t) {                                                   \
                case 3: TILE(2, 3, t); break;                                        \
                case 2: TILE(2, 2, t); break;                                        \
                case 1: TILE(2, 1, t); break;                                        \
                default: break;                                                      \
                }                                                                    \
            }                                                                        \
            for (; r < r1; r++) {                                                    \
                uint32_t t = 0;                                                      \
                for (; t + 4 <= nt_; t += 4) TILE(1, 4, t);                          \
                switch (nt_ - t) {                                                   \
                case 3: TILE(1, 3, t); break;                                        \
                case 2: TILE(1, 2, t); break;                                        \
                case 1: TILE(1, 1, t); break;                                        \
                default: break;                                                      \
                }                                                                    \
            }                                                                        \
        }                                                                            \
    } while (0)

static COL_T2 void rows_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1)
{
    switch (j->w.dtype) {
#define T(NR, NT, t) tile_f_avx2(j, r, NR, NT, t, COL_DTYPE_F32)
    case COL_DTYPE_F32: WALK_TILES(T); break;
#undef T
#define T(NR, NT, t) tile_f_avx2(j, r, NR, NT, t, COL_DTYPE_F16)
    case COL_DTYPE_F16: WALK_TILES(T); break;
#undef T
#define T(NR, NT, t) tile_f_avx2(j, r, NR, NT, t, COL_DTYPE_BF16)
    case COL_DTYPE_BF16: WALK_TILES(T); break;
#undef T
#define T(NR, NT, t) tile_q_avx2(j, qx, r, NR, NT, t, 0)
    case COL_DTYPE_Q8_0: WALK_TILES(T); break;
#undef T
#define T(NR, NT, t) tile_q_avx2(j, qx, r, NR, NT, t, 1)
    case COL_DTYPE_Q4_0: WALK_TILES(T); break;
#undef T
    default: break;
    }
}

static COL_T512 void rows_avx512(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1)
{
    switch (j->w.dtype) {
#define T(NR, NT, t) tile_f_avx512(j, r, NR, NT, t, COL_DTYPE_F32)
    case COL_DTYPE_F32: WALK_TILES(T); break;
#undef T
#define T(NR, NT, t) tile_f_avx512(j, r, NR, NT, t, COL_DTYPE_F16)
    case COL_DTYPE_F16: WALK_TILES(T); break;
#undef T
#define T(NR, NT, t) tile_f_avx512(j, r, NR, NT, t, COL_DTYPE_BF16)
    case COL_DTYPE_BF16: WALK_TILES(T); break;
#undef T
#define T(NR, NT, t) tile_q(j, qx, r, NR, NT, t, 0, 1)
    case COL_DTYPE_Q8_0: WALK_TILES(T); break;
#undef T
#define T(NR, NT, t) tile_q(j, qx, r, NR, NT, t, 1, 1)
    case COL_DTYPE_Q4_0: WALK_TILES(T); break;
#undef T
    default: break;
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
    /* the current batch, written before generation is bumped */
    const col_matvec_job *jobs;
    uint32_t n_jobs;
    uint64_t total_rows;
    /* scratch (caller-owned): per-job quantised activations */
    uint32_t max_jobs;
    uint64_t max_act_cols;
    const uint8_t **qx;            /* [max_jobs] */
    uint8_t *qbuf;                 /* quantised rows */
    const col_numerics *numerics;  /* a session's numerics variant (numerics.c), NULL = none */
};


static void job_rows(const col_pool *pool, const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1)
{
#if defined(__x86_64__)
    if (pool->isa == COL_ISA_AVX512) {
        rows_avx512(j, qx, r0, r1);
        return;
    }
    if (pool->isa == COL_ISA_AVX2) {
        rows_avx2(j, qx, r0, r1);
        return;
    }
#endif
    (void)pool;
    rows_portable(j, qx, r0, r1);
}

/* Thread `t` of `n` owns rows [R*t/n, R*(t+1)/n) of the batch's rows laid end to end. */
static void run_share(const col_pool *pool, uint32_t t, uint32_t n)
{
    uint64_t g0 = pool->total_rows * t / n, g1 = pool->total_rows * (t + 1) / n, base = 0;
    for (uint32_t k = 0; k < pool->n_jobs && base < g1; k++) {
        const col_matvec_job *j = &pool->jobs[k];
        uint64_t lo = g0 > base ? g0 - base : 0, hi = g1 - base < j->w.rows ? g1 - base : j->w.rows;
        if (lo < hi) job_rows(pool, j, k < pool->max_jobs ? pool->qx[k] : NULL, lo, hi);
        base += j->w.rows;
    }
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

uint64_t col_pool_scratch_size(uint32_t max_jobs, uint64_t max_act_cols)
{
    uint64_t ptrs = ((uint64_t)max_jobs * sizeof(const uint8_t *) + 63) & ~(uint64_t)63;
    return ptrs + qrow_bytes(max_act_cols) + 64;
}

col_pool *col_pool_create(uint32_t n_threads, void *scratch, uint32_t max_jobs, uint64_t max_act_cols,
                          const col_allocator *alloc)
{
    if (n_threads == 0 || (!scratch && (max_jobs || max_act_cols)) || !alloc) return NULL;
    col_pool *pool = col_alloc_zeroed(alloc, 1, sizeof *pool);
    if (!pool) return NULL;
    pool->alloc = *alloc;
    pool->n_threads = n_threads;
    pool->isa = detect_isa();
    const char *env = getenv("COLIBRI_KERNELS");
    if (env) { /* can only lower the choice: a forced path the CPU lacks would crash */
        col_isa want = strcmp(env, "portable") == 0 ? COL_ISA_PORTABLE
                     : strcmp(env, "avx2") == 0     ? COL_ISA_AVX2
                                                    : COL_ISA_AVX512;
        if (want < pool->isa) pool->isa = want;
    }
    pool->max_jobs = max_jobs;
    pool->max_act_cols = max_act_cols;
    if (scratch) {
        pool->qx = scratch;
        pool->qbuf = (uint8_t *)scratch + (((uint64_t)max_jobs * sizeof(const uint8_t *) + 63) & ~(uint64_t)63);
    }
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->n_done, 0);
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
    col_matmul_kernels(pool, jobs, n_jobs);
}

void col_matmul_kernels(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs)
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
    uint64_t total = 0, macs = 0, used = 0;
    for (uint32_t k = 0; k < n_jobs; k++) {
        const col_matvec_job *j = &jobs[k];
        total += j->w.rows;
        macs += j->w.rows * j->w.cols * j->n_tokens;
        const uint8_t *q = NULL;
        if (is_block_dtype(j->w.dtype)) {
            if (k > 0 && jobs[k - 1].x == j->x && jobs[k - 1].n_tokens == j->n_tokens &&
                jobs[k - 1].w.cols == j->w.cols && pool->qx[k - 1]) {
                q = pool->qx[k - 1]; /* same activations as the previous job (w1 and w3) */
            } else {
                uint64_t need = (uint64_t)j->n_tokens * j->w.cols;
                assert(k < pool->max_jobs && used + need <= pool->max_act_cols); /* sized by the session */
                if (k >= pool->max_jobs || used + need > pool->max_act_cols) return;
                uint8_t *dst = pool->qbuf + qrow_bytes(used);
                for (uint32_t t = 0; t < j->n_tokens; t++)
                    quantize_row(j->x + (uint64_t)t * j->w.cols, j->w.cols, dst + t * qrow_bytes(j->w.cols));
                used += need;
                q = dst;
            }
        }
        if (k < pool->max_jobs) pool->qx[k] = q;
    }
    pool->jobs = jobs;
    pool->n_jobs = n_jobs;
    pool->total_rows = total;
    if (pool->n_threads == 1 || pool->n_started + 1 < pool->n_threads || total < pool->n_threads ||
        macs < COL_PARALLEL_MIN_MACS) {
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

void col_matvec(col_pool *pool, const col_weight *w, const float *x, float *y)
{
    col_matvec_job job = {*w, x, y, 1};
    col_matmul_many(pool, &job, 1);
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
