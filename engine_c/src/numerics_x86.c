/*
 * numerics_x86.c - the numerics variants' products (numerics.c) on AVX-512 and AVX2, with the bits
 * of numerics.c's reference loops.
 *
 * A variant fixes the order of every operation of a dot product (one accumulator left to right, a
 * pairwise tree, L lanes, S parts; fused or not), so its vector form cannot spread one dot product
 * over the lanes as the kernels do. Each lane computes another output row instead: a group of W
 * rows (16 on AVX-512, 8 on AVX2) is read W columns at a time, each W x W block of weights widened
 * to f32 (as col_load_range does: exact) and transposed in registers, so that column i is one
 * vector holding w[r][i] of the W rows; the reference's operations then run on W rows at once
 * (numerics_lanes.h), one IEEE operation per lane. Weights stored in 8-row panels (q8_0x8,
 * q4_0x8) need no transpose: a panel keeps its rows in the lanes already. So a variant's outputs
 * have the same bits on every path, for any thread count and batch, and a lab run costs a few
 * times the default's instead of the scalar loops' 30-75 times.
 */
#include "kernels_internal.h"
#include "numerics.h"
#include "transpose_x86.h"

#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__x86_64__)

#define NX_TOKENS 4                  /* tokens a pass over a group's columns serves */
#define NX_BLOCKED_ACC COL_MAX_LANES /* lane sums a blocked pass holds (lanes x tokens) */

/* ---- AVX-512: 16 rows, blocks of 32 columns ------------------------------------------------ */

COL_INLINE __mmask16 nx_lanes_below(uint64_t n) /* the first min(n, 16) lanes */
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* The 16 x 16 transpose (col_transpose16) of f32 rows: r[a] holds 16 values of row a, out[c] value
 * c of each row (lane a). */
COL_INLINE COL_T512 void transpose16(const __m512 *r, __m512 *out)
{
    __m512i v[16];
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) v[a] = _mm512_castps_si512(r[a]);
    col_transpose16(v, v);
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) out[c] = _mm512_castsi512_ps(v[c]);
}

/* Half h (columns [16 h, 16 h + 16)) of a q8_0 / q4_0 block of 32 at column i of a row, as f32:
 * scale * q, exact. q4_0: byte j of a block holds element j (low nibble) and j + 16 (high). */
COL_INLINE COL_T512 __m512 quant_half16(const uint8_t *row, uint32_t dtype, uint64_t n, uint64_t i, int h)
{
    const uint64_t nb = n / QK, b = i / QK;
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(rd16u(row + 2 * b)));
    __m512i q;
    if (dtype == COL_DTYPE_Q8_0) {
        q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * nb + i + 16 * (uint64_t)h)));
    } else {
        q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * nb + 16 * b)));
        q = h ? _mm512_srli_epi32(q, 4) : _mm512_and_si512(q, _mm512_set1_epi32(0x0F));
        q = _mm512_sub_epi32(q, _mm512_set1_epi32(8));
    }
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
}

/* The 32 bytes at `at` of two 8-row q8_0x8 / q4_0x8 panels (docs/format.md) as one vector: a 4-byte
 * group of the first panel's rows in lanes 0-7, of the second's in 8-15. fill_avx512 takes each
 * column of a block from it by a shift or two (scale * q, exact, as fill_groups8 on AVX2). */
COL_INLINE COL_T512 __m512i panel_pair(const uint8_t *first, const uint8_t *second, uint64_t at)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(first + at))),
                              _mm256_loadu_si256((const __m256i *)(const void *)(second + at)), 1);
}

/* A group's 32 rows are two vectors, so that a reduction's chain of dependent additions has a
 * second, independent one beside it (one chain waited on the adder's latency). */
typedef struct v32 {
    __m512 v[2];
} v32;
COL_INLINE COL_T512 v32 v32_zero(void)
{
    v32 r = {{_mm512_setzero_ps(), _mm512_setzero_ps()}};
    return r;
}
COL_INLINE COL_T512 v32 v32_add(v32 a, v32 b)
{
    v32 r = {{_mm512_add_ps(a.v[0], b.v[0]), _mm512_add_ps(a.v[1], b.v[1])}};
    return r;
}
COL_INLINE COL_T512 v32 v32_mul(v32 a, __m512 x)
{
    v32 r = {{_mm512_mul_ps(a.v[0], x), _mm512_mul_ps(a.v[1], x)}};
    return r;
}
COL_INLINE COL_T512 v32 v32_fma(v32 a, __m512 x, v32 c)
{
    v32 r = {{_mm512_fmadd_ps(a.v[0], x, c.v[0]), _mm512_fmadd_ps(a.v[1], x, c.v[1])}};
    return r;
}

typedef struct lanes_avx512 lanes_avx512;
static COL_T512 void fill_avx512(lanes_avx512 *g, uint64_t block);
static COL_T512 void store_avx512(float *y, v32 v, uint32_t n)
{
    _mm512_mask_storeu_ps(y, nx_lanes_below(n), v.v[0]);
    if (n > 16) _mm512_mask_storeu_ps(y + 16, nx_lanes_below(n - 16), v.v[1]);
}

#define W 32
#define BW 32
#define V v32
#define VX __m512
#define TGT COL_T512
#define FN(name) name##_avx512
#define V_ZERO() v32_zero()
#define V_ADD(a, b) v32_add(a, b)
#define V_MUL(a, x) v32_mul(a, x)
#define V_FMA(a, x, c) v32_fma(a, x, c)
#define V_BCAST(p) _mm512_set1_ps(*(p))
#include "numerics_lanes.h"

/* Columns [32 block, 32 block + 32) of the 32 rows, as two halves of 16 rows. A 16-bit row's 32
 * elements are one 64-byte load, transposed as 16 pairs (each 32-bit lane holds an even column in
 * its low half, the next column in its high half) and then split, which takes half the shuffles of
 * two f32 transposes. */
static COL_T512 void fill_avx512(lanes_avx512 *g, uint64_t block)
{
    const uint64_t i = block * 32, n = g->n, left = n - i;
    __m512 r[16], t[16];
    for (int half = 0; half < 2; half++) {
        const uint8_t *const *row = g->row + 16 * half;
        if (is_bf16_panel(g->dtype)) { /* a half is a panel: a line holds a pair of its 16 rows */
            const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
#pragma GCC unroll 16
            for (uint64_t q = 0; q < 16; q++) {
                const __m512i v = i + 2 * q < n ? _mm512_loadu_si512((const void *)(row[0] + 64 * (i / 2 + q)))
                                                : _mm512_setzero_si512();
                g->col[2 * q].v[half] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                g->col[2 * q + 1].v[half] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
            }
            continue;
        }
        switch (g->dtype) {
        case COL_DTYPE_F32:
            for (int h = 0; h < 2 && 16 * (uint64_t)h < left; h++) {
                const __mmask16 m = nx_lanes_below(left - 16 * (uint64_t)h);
#pragma GCC unroll 16
                for (int k = 0; k < 16; k++) r[k] = _mm512_maskz_loadu_ps(m, (const float *)row[k] + i + 16 * h);
                transpose16(r, t);
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) g->col[16 * h + c].v[half] = t[c];
            }
            break;
        case COL_DTYPE_F16:
        case COL_DTYPE_BF16: {
            const __mmask32 m = left >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++)
                r[k] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, (const uint16_t *)row[k] + i));
            transpose16(r, t);
            if (g->dtype == COL_DTYPE_BF16) {
                const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) {
                    const __m512i p = _mm512_castps_si512(t[c]);
                    g->col[2 * c].v[half] = _mm512_castsi512_ps(_mm512_slli_epi32(p, 16));
                    g->col[2 * c + 1].v[half] = _mm512_castsi512_ps(_mm512_and_si512(p, high));
                }
            } else {
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) {
                    const __m512i p = _mm512_castps_si512(t[c]);
                    g->col[2 * c].v[half] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(p));
                    g->col[2 * c + 1].v[half] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(p, 16)));
                }
            }
            break;
        }
        case COL_DTYPE_Q8_0X8:
        case COL_DTYPE_Q4_0X8: {
            const int q4 = g->dtype == COL_DTYPE_Q4_0X8;
            const uint8_t *p0 = row[0], *p1 = row[8];
            const uint64_t nb = n / QK, at = 16 * nb + (q4 ? 128 : 256) * block;
            const __m512 d = _mm512_cvtph_ps(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(p0 + 16 * block))),
                _mm_loadu_si128((const __m128i *)(const void *)(p1 + 16 * block)), 1));
            if (q4) {
                const __m512i low4 = _mm512_set1_epi32(0x0F), eight = _mm512_set1_epi32(8);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    const __m512i v = panel_pair(p0, p1, at + 32 * (uint64_t)q);
#pragma GCC unroll 4
                    for (int b = 0; b < 4; b++) {
                        const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, 8 * b), low4), eight);
                        const __m512i hi = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, 8 * b + 4), low4), eight);
                        g->col[4 * q + b].v[half] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo));
                        g->col[16 + 4 * q + b].v[half] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi));
                    }
                }
            } else {
#pragma GCC unroll 8
                for (int q = 0; q < 8; q++) {
                    const __m512i v = panel_pair(p0, p1, at + 32 * (uint64_t)q);
#pragma GCC unroll 4
                    for (int b = 0; b < 4; b++) {
                        const __m512i w = _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * b), 24);
                        g->col[4 * q + b].v[half] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(w));
                    }
                }
            }
            break;
        }
        default: /* q8_0 / q4_0: a block of 32 columns is one quantised block */
            for (int h = 0; h < 2; h++) {
#pragma GCC unroll 16
                for (int k = 0; k < 16; k++) r[k] = quant_half16(row[k], g->dtype, n, i, h);
                transpose16(r, t);
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) g->col[16 * h + c].v[half] = t[c];
            }
            break;
        }
    }
    g->block = block;
}

#undef W
#undef BW
#undef V
#undef VX
#undef TGT
#undef FN
#undef V_ZERO
#undef V_ADD
#undef V_MUL
#undef V_FMA
#undef V_BCAST

/* ---- AVX2: 8 rows, blocks of 16 columns ----------------------------------------------------- */

/* 16 rows as two vectors, for the same reason as v32. */
typedef struct v16 {
    __m256 v[2];
} v16;
COL_INLINE COL_T2 v16 v16_zero(void)
{
    v16 r = {{_mm256_setzero_ps(), _mm256_setzero_ps()}};
    return r;
}
COL_INLINE COL_T2 v16 v16_add(v16 a, v16 b)
{
    v16 r = {{_mm256_add_ps(a.v[0], b.v[0]), _mm256_add_ps(a.v[1], b.v[1])}};
    return r;
}
COL_INLINE COL_T2 v16 v16_mul(v16 a, __m256 x)
{
    v16 r = {{_mm256_mul_ps(a.v[0], x), _mm256_mul_ps(a.v[1], x)}};
    return r;
}
COL_INLINE COL_T2 v16 v16_fma(v16 a, __m256 x, v16 c)
{
    v16 r = {{_mm256_fmadd_ps(a.v[0], x, c.v[0]), _mm256_fmadd_ps(a.v[1], x, c.v[1])}};
    return r;
}

/* Four columns of the 8 x 8 transpose of 32-bit elements of 8 rows, read at byte `at` (16 bytes of
 * each): lane k of out[c] element c of row k. Each 128-bit half is loaded beside the half it pairs
 * with (rows k and k + 4), so that in-lane shuffles finish it: col_transpose8's vperm2f128 are 8
 * micro-ops each on Zen 1, and four columns at a time stay in registers. */
COL_INLINE COL_T2 void transpose4_rows(const uint8_t *const *row, uint64_t at, __m256 *out)
{
    __m256 v[4], t[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps((const float *)(const void *)(row[k] + at))),
                                    _mm_loadu_ps((const float *)(const void *)(row[k + 4] + at)), 1);
    t[0] = _mm256_unpacklo_ps(v[0], v[1]), t[1] = _mm256_unpackhi_ps(v[0], v[1]);
    t[2] = _mm256_unpacklo_ps(v[2], v[3]), t[3] = _mm256_unpackhi_ps(v[2], v[3]);
    out[0] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t[0]), _mm256_castps_pd(t[2])));
    out[1] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t[0]), _mm256_castps_pd(t[2])));
    out[2] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t[1]), _mm256_castps_pd(t[3])));
    out[3] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t[1]), _mm256_castps_pd(t[3])));
}

typedef struct lanes_avx2 lanes_avx2;
static COL_T2 void fill_avx2(lanes_avx2 *g, uint64_t block);
static COL_T2 void store_avx2(float *y, v16 v, uint32_t n)
{
    float buf[16];
    _mm256_storeu_ps(buf, v.v[0]);
    _mm256_storeu_ps(buf + 8, v.v[1]);
    memcpy(y, buf, n * sizeof(float));
}

#define W 16
#define BW 16
#define V v16
#define VX __m256
#define TGT COL_T2
#define FN(name) name##_avx2
#define V_ZERO() v16_zero()
#define V_ADD(a, b) v16_add(a, b)
#define V_MUL(a, x) v16_mul(a, x)
#define V_FMA(a, x, c) v16_fma(a, x, c)
#define V_BCAST(p) _mm256_broadcast_ss(p)
#include "numerics_lanes.h"

/* Columns [i, i + 16) of 8 of the group's 16-bit rows (`row`, lanes 8 half ..) into the group's
 * columns: rows as pairs, their 32-bit elements transposed, then each pair split and widened
 * (bf16 by shifts; f16 packed to 8 x 16 bits, values < 2^16 so no saturation, then F16C). */
COL_INLINE COL_T2 void fill_pairs16(lanes_avx2 *g, const uint8_t *const *row, uint64_t i, int half, const int bf16)
{
    const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u), low = _mm256_set1_epi32(0xFFFF);
    __m256 t[4];
#pragma GCC unroll 2
    for (int q = 0; q < 2; q++) {
        transpose4_rows(row, 2 * i + 16 * (uint64_t)q, t);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i p = _mm256_castps_si256(t[c]);
            if (bf16) {
                g->col[8 * q + 2 * c].v[half] = _mm256_castsi256_ps(_mm256_slli_epi32(p, 16));
                g->col[8 * q + 2 * c + 1].v[half] = _mm256_castsi256_ps(_mm256_and_si256(p, high));
            } else {
                const __m256i lo16 = _mm256_packus_epi32(_mm256_and_si256(p, low), _mm256_and_si256(p, low));
                const __m256i hi16 = _mm256_packus_epi32(_mm256_srli_epi32(p, 16), _mm256_srli_epi32(p, 16));
                g->col[8 * q + 2 * c].v[half] =
                    _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm256_castsi256_si128(lo16), _mm256_extracti128_si256(lo16, 1)));
                g->col[8 * q + 2 * c + 1].v[half] =
                    _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm256_castsi256_si128(hi16), _mm256_extracti128_si256(hi16, 1)));
            }
        }
    }
}

/* A vpshufb control that moves byte b of each 32-bit lane to the lane's top byte, zeroing the rest. */
COL_INLINE COL_T2 __m256i top_byte(int b)
{
    return _mm256_add_epi32(_mm256_set1_epi32((int)((uint32_t)b << 24 | 0x808080u)),
                            _mm256_setr_epi32(0, 4 << 24, 8 << 24, 12 << 24, 0, 4 << 24, 8 << 24, 12 << 24));
}

/* Columns [i, i + 16) (half of quantised block i / 32) of 8 q8_0 / q4_0 rows into the group's
 * columns, lanes 8 half .., from the rows' 4-byte groups of those columns: lane r of grp[c] row r's
 * bytes 4c .. 4c + 3 of them (q8_0: elements i + 4c ..; q4_0: the block's bytes 4c .., whose low
 * nibbles are elements 4c .. and high ones 16 + 4c ..), d the rows' scales of the block. A column
 * is a group's byte moved to the top of each lane: q * 2^24 (q4_0: (nibble - 8) * 2^24 or 2^28),
 * which times the scale * 2^-24 (2^-28) is scale * q as col_load_matrix_range computes it (both
 * exact). No shifts: Zen 1 has one pipe for them. */
COL_INLINE COL_T2 void fill_groups8(lanes_avx2 *g, const __m256i *grp, __m256 d, int half, const int q4, const int high)
{
    const __m256 dq = _mm256_mul_ps(d, _mm256_set1_ps(q4 && high ? 0x1p-28f : 0x1p-24f));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) {
            __m256i w = _mm256_shuffle_epi8(grp[c], top_byte(b));
            if (q4 && high) /* n << 28 with its top bit flipped: (n - 8) << 28 as a signed lane */
                w = _mm256_xor_si256(_mm256_and_si256(w, _mm256_set1_epi32((int)0xF0000000u)),
                                     _mm256_set1_epi32((int)0x80000000u));
            else if (q4)
                w = _mm256_sub_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x0F000000)), _mm256_set1_epi32(0x08000000));
            g->col[4 * c + b].v[half] = _mm256_mul_ps(dq, _mm256_cvtepi32_ps(w));
        }
}

/* The same from 8 rows stored as q8_0x8 / q4_0x8 panels (docs/format.md, `panel` the 8 rows'),
 * whose blocks keep each 4-byte group of the 8 rows in the lanes of one vector already; or from 8
 * rows stored as rows, their groups transposed (transpose4_rows). */
COL_INLINE COL_T2 void fill_quant8(lanes_avx2 *g, const uint8_t *const *row, uint64_t i, int half, const int q4,
                                   const int high)
{
    const uint64_t nb = g->n / QK, k = i / QK;
    __m256i grp[4];
    __m256 d;
    if (is_panel_dtype(g->dtype)) {
        const uint8_t *payload = row[0] + 16 * nb + (q4 ? 128 : 256) * k;
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            grp[c] = _mm256_loadu_si256((const __m256i *)(const void *)(payload + 32 * (q4 || !high ? c : 4 + c)));
        d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row[0] + 16 * k)));
    } else {
        __m256 t[4];
        transpose4_rows(row, 2 * nb + (q4 ? 16 * k : i), t);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) grp[c] = _mm256_castps_si256(t[c]);
        d = _mm256_cvtph_ps(_mm_setr_epi16((short)rd16u(row[0] + 2 * k), (short)rd16u(row[1] + 2 * k),
                                           (short)rd16u(row[2] + 2 * k), (short)rd16u(row[3] + 2 * k),
                                           (short)rd16u(row[4] + 2 * k), (short)rd16u(row[5] + 2 * k),
                                           (short)rd16u(row[6] + 2 * k), (short)rd16u(row[7] + 2 * k)));
    }
    fill_groups8(g, grp, d, half, q4, high);
}

/* Columns [16 block, 16 block + 16) of the 16 rows, as two halves of 8 rows, 16-bit rows as pairs
 * as on AVX-512. A float row's last, partial block is widened by col_load_range (exact, as the
 * reference does). */
static COL_T2 void fill_avx2(lanes_avx2 *g, uint64_t block)
{
    const uint64_t i = block * 16, n = g->n;
    __m256 r[8], t[8];
    for (int half = 0; half < 2; half++) {
        const uint8_t *const *row = g->row + 8 * half;
        if (is_bf16_panel(g->dtype)) { /* the group is a panel: a half is 32 bytes of each line */
            const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
#pragma GCC unroll 8
            for (uint64_t q = 0; q < 8; q++) {
                const __m256i v = i + 2 * q < n
                                      ? _mm256_loadu_si256((const __m256i *)(const void *)(row[0] + 64 * (i / 2 + q) + 32 * half))
                                      : _mm256_setzero_si256();
                g->col[2 * q].v[half] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                g->col[2 * q + 1].v[half] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
            }
            continue;
        }
        if (i + 16 > n) {
            float buf[8][16];
            memset(buf, 0, sizeof buf);
            for (int k = 0; k < 8; k++) col_load_range(row[k], g->dtype, n, i, n - i, buf[k]);
            for (int h = 0; h < 2; h++) {
                for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(buf[k] + 8 * h);
                col_transpose8(r, t);
                for (int c = 0; c < 8; c++) g->col[8 * h + c].v[half] = t[c];
            }
        } else if (g->dtype == COL_DTYPE_F32) {
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                transpose4_rows(row, 4 * i + 16 * (uint64_t)q, t);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) g->col[4 * q + c].v[half] = t[c];
            }
        } else if (g->dtype == COL_DTYPE_BF16) {
            fill_pairs16(g, row, i, half, 1);
        } else if (g->dtype == COL_DTYPE_F16) {
            fill_pairs16(g, row, i, half, 0);
        } else { /* q8_0 / q4_0, as rows or panels: 16 columns are half a quantised block */
            const int q4 = col_block_kind(g->dtype) == COL_DTYPE_Q4_0, high = i % QK != 0;
            if (q4 && high)
                fill_quant8(g, row, i, half, 1, 1);
            else if (q4)
                fill_quant8(g, row, i, half, 1, 0);
            else if (high)
                fill_quant8(g, row, i, half, 0, 1);
            else
                fill_quant8(g, row, i, half, 0, 0);
        }
    }
    g->block = block;
}

#undef W
#undef BW
#undef V
#undef VX
#undef TGT
#undef FN
#undef V_ZERO
#undef V_ADD
#undef V_MUL
#undef V_FMA
#undef V_BCAST

#endif /* __x86_64__ */
