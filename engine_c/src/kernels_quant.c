/*
 * kernels_quant.c - what every kernel path must agree on, bit for bit: stored elements as f32,
 * and activations as int8 blocks.
 *
 * f16 and bf16 elements widen to f32 exactly. Quantised weights (q8_0, q4_0: a row's f16 scales,
 * then its payload, blocks of 32) are multiplied against the activations quantised per block of
 * 32 to int8 (d = max|x| / 127, rounded half to even). A product is defined in block order: per
 * output, acc = fmaf((float)isum_b, d_w[b] * d_x[b], acc) for b = 0, 1, .. with isum_b the exact
 * int32 sum of the block's 32 products, so every path, tile shape, batch size and thread count
 * gives the same bits by construction (docs/performance.md). The activations are quantised here
 * once per product, in the order the weight dtype's SIMD kernels read them and with the
 * corrections those kernels need, so every path sees the same integers; the AVX-512 version of a
 * block's quantisation sits beside the scalar one because the two must give the same bytes.
 * col_dotq_blocks is that definition in plain C: the portable path and the tests' reference.
 */
#include "kernels_internal.h"

#include <math.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

/* Block b of row r of a quantised matrix (docs/format.md), nb blocks a row: where its f16 scale
 * sits and the stored byte of its element j (q8_0: the int8 itself; q4_0: element j in the low
 * nibble when j < 16, else element j - 16's byte's high nibble). Rows: a row's nb scales, then
 * its payload (q8_0 32 bytes a block in element order, q4_0 16). Panels of 8 rows: the panel's
 * scales block by block (row r % 8's at 2 (r % 8)), then per block each row's 4-byte groups in
 * the lanes of 32-byte vectors. */
typedef struct stored_block {
    const uint8_t *scale;
    const uint8_t *payload; /* byte 0 of the block in row r: groups of 4 bytes `step` apart */
    uint64_t step;
} stored_block;

static stored_block block_at(const uint8_t *m, uint32_t dtype, uint64_t nb, uint64_t r, uint64_t b)
{
    const int q4 = col_block_kind(dtype) == COL_DTYPE_Q4_0;
    const uint64_t pb = q4 ? 16 : QK, rb = nb * (2 + pb);
    stored_block s;
    if (is_panel_dtype(dtype)) {
        const uint8_t *panel = m + r / COL_STORED_PANEL_ROWS * COL_STORED_PANEL_ROWS * rb;
        const uint64_t lane = r % COL_STORED_PANEL_ROWS;
        s.scale = panel + 2 * (COL_STORED_PANEL_ROWS * b + lane);
        s.payload = panel + 2 * COL_STORED_PANEL_ROWS * nb + COL_STORED_PANEL_ROWS * pb * b + 4 * lane;
        s.step = 4 * COL_STORED_PANEL_ROWS;
    } else {
        s.scale = m + r * rb + 2 * b;
        s.payload = m + r * rb + 2 * nb + pb * b;
        s.step = 4;
    }
    return s;
}

/* Element j of a block as stored: its quantised value (q4_0: nibble - 8). */
static int32_t weight_q(const stored_block *s, uint32_t dtype, uint32_t j)
{
    const uint32_t k = col_block_kind(dtype) == COL_DTYPE_Q8_0 ? j : j & 15u; /* the stored byte */
    const uint8_t byte = s->payload[k / 4 * s->step + k % 4];
    if (col_block_kind(dtype) == COL_DTYPE_Q8_0) return (int8_t)byte;
    return (int32_t)(j < 16 ? byte & 0x0F : byte >> 4) - 8;
}

void col_load_matrix_range(const void *matrix, uint32_t dtype, uint64_t cols, uint64_t r, uint64_t first,
                           uint64_t count, float *out)
{
    if (is_bf16_panel(dtype)) { /* row r's pairs, 64 bytes apart in its panel */
        const uint16_t *panel = (const uint16_t *)matrix + r / COL_BF16_PANEL_ROWS * COL_BF16_PANEL_ROWS * cols;
        const uint64_t lane = r % COL_BF16_PANEL_ROWS;
        for (uint64_t i = first; i < first + count; i++)
            out[i - first] = col_bf16_to_f32(panel[i / 2 * 2 * COL_BF16_PANEL_ROWS + 2 * lane + i % 2]);
        return;
    }
    if (!is_block_dtype(dtype)) {
        col_load_range((const uint8_t *)matrix + r * col_dtype_row_bytes(dtype, cols), dtype, cols, first, count, out);
        return;
    }
    for (uint64_t i = first; i < first + count; i++) {
        const stored_block s = block_at(matrix, dtype, cols / QK, r, i / QK);
        out[i - first] = col_f16_to_f32(rd16u(s.scale)) * (float)weight_q(&s, dtype, (uint32_t)(i % QK));
    }
}

void col_load_range(const void *row, uint32_t dtype, uint64_t cols, uint64_t first, uint64_t count, float *out)
{
    if (dtype == COL_DTYPE_F32) {
        memcpy(out, (const float *)row + first, count * sizeof(float));
    } else if (is_block_dtype(dtype)) {
        col_load_matrix_range(row, dtype, cols, 0, first, count, out);
    } else {
        for (uint64_t i = first; i < first + count; i++) out[i - first] = col_load_elem(row, dtype, i);
    }
}

void col_load_row(const void *data, uint32_t dtype, uint64_t n, float *out)
{
    col_load_range(data, dtype, n, 0, n, out);
}

/* ---- activation quantisation (shared by every path, so every path sees the same integers) ---- */

/* Layout of one quantised activation row of `cols` (nb = cols / 32 blocks), in bytes:
 * [cols] int8 values | [nb] f32 scales d_x | [nb] int32 block corrections.
 * The int8 values are in the order the weight dtype's SIMD kernels read them (col_xq_pos), and the
 * block corrections (-128, or -8, times the sum of the block's 32 values) turn VNNI's unsigned x
 * signed products into signed ones: q8_0 kernels multiply w + 128, q4_0 kernels the raw nibble
 * q = w + 8, and each block sum starts from its correction. */
uint64_t col_qrow_bytes(uint64_t cols)
{
    return cols / QK * (QK + 4 + 4);
}

/* Store block b's 32 int8 values (element order) where the weight dtype's kernels read them
 * (the arrangement of col_xq_pos, a half block at a time). */
static void place_block(int8_t *q, uint32_t wdtype, uint64_t nb, uint64_t b, const int8_t *vals)
{
    if (wdtype != COL_DTYPE_Q4_0) {
        memcpy(q + b * QK, vals, QK);
        return;
    }
    memcpy(q + col_xq_pos(wdtype, nb, b, 0), vals, 16);
    memcpy(q + col_xq_pos(wdtype, nb, b, 16), vals + 16, 16);
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

/* The block correction a row stores beside its values: the weights' bias (q8_0's 128 in the
 * kernels that bias it, q4_0's nibble offset 8) times the block's sum of x, negated. */
static inline int32_t block_correction(uint32_t wdtype, int32_t sum)
{
    return (wdtype == COL_DTYPE_Q8_0 ? -128 : -8) * sum;
}

/* Block b of a row by quantize_block's rules into the row's parts (col_quantize_row's layout): its
 * values placed, its scale and its correction. */
static void quantize_block_into(const float *xb, uint32_t wdtype, uint64_t nb, uint64_t b, int8_t *q, float *d,
                                int32_t *cb)
{
    int8_t vals[QK];
    int32_t sum = 0;
    d[b] = quantize_block(xb, vals);
    place_block(q, wdtype, nb, b, vals);
    for (uint32_t j = 0; j < QK; j++) sum += vals[j];
    cb[b] = block_correction(wdtype, sum);
}

#if defined(__x86_64__)
/* col_quantize_row on AVX-512: the maximum is exact in any order, the product is the same IEEE
 * multiply, and vcvtps2dq rounds half to even under the default MXCSR, so the bytes are
 * quantize_block's; stored straight into place_block's arrangement, each block's sum from its two
 * vectors. A block with a NaN takes the scalar rules. */
__attribute__((target("avx512f"))) static void quantize_row_avx512(const float *x, uint64_t cols, uint32_t wdtype, uint8_t *out)
{
    const uint64_t nb = cols / QK;
    int8_t *q = (int8_t *)out;
    float *d = (float *)(out + cols);
    int32_t *cb = (int32_t *)(out + col_qrow_block_corrections(cols));
    const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
    for (uint64_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK;
        int8_t *lo_at = q + (wdtype == COL_DTYPE_Q4_0 ? col_xq_pos(wdtype, nb, b, 0) : b * QK);
        int8_t *hi_at = q + (wdtype == COL_DTYPE_Q4_0 ? col_xq_pos(wdtype, nb, b, 16) : b * QK + 16);
        const __m512 lo = _mm512_loadu_ps(xb), hi = _mm512_loadu_ps(xb + 16);
        /* a NaN found by compare: _mm512_reduce_max_ps's treatment of one differs by compiler
         * (clang's skips it) */
        if (_mm512_cmp_ps_mask(lo, lo, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(hi, hi, _CMP_UNORD_Q)) {
            quantize_block_into(xb, wdtype, nb, b, q, d, cb);
            continue;
        }
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        const float dx = amax / 127.0f;
        const __m512 id = _mm512_set1_ps(dx > 0.0f ? 1.0f / dx : 0.0f);
        const __m512i qlo = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(lo, id)), bottom), top);
        const __m512i qhi = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(hi, id)), bottom), top);
        _mm_storeu_si128((__m128i *)(void *)lo_at, _mm512_cvtepi32_epi8(qlo));
        _mm_storeu_si128((__m128i *)(void *)hi_at, _mm512_cvtepi32_epi8(qhi));
        d[b] = dx;
        cb[b] = block_correction(wdtype, _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi)));
    }
}

/* The same with AVX2 (the same reasoning; no 32 -> 8 bit conversion, so two saturating packs,
 * exact after the clamp, and a lane reorder): the 32 values in *vals (element order), their sum in
 * *sum. A block with a NaN or an infinity takes the scalar rules. */
__attribute__((target("avx2"))) static inline float quantize_block_avx2(const float *xb, __m256i *vals, int32_t *sum)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 x[4], amax8 = _mm256_setzero_ps(), special = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        x[k] = _mm256_loadu_ps(xb + 8 * k);
        const __m256 a = _mm256_and_ps(x[k], abs_mask);
        special = _mm256_or_ps(special, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ)); /* NaN or inf */
        amax8 = _mm256_max_ps(amax8, a);
    }
    if (_mm256_movemask_ps(special)) {
        int8_t v[QK];
        const float d = quantize_block(xb, v);
        int32_t s = 0;
        for (int j = 0; j < QK; j++) s += v[j];
        *vals = _mm256_loadu_si256((const __m256i *)(const void *)v);
        *sum = s;
        return d;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float amax = _mm_cvtss_f32(m4), dx = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(dx > 0.0f ? 1.0f / dx : 0.0f);
    const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-127);
    __m256i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x[k], id)), bottom), top);
    /* per 128-bit lane: q0, q1, q2, q3 four each (the low lane elements 0-3, the high 4-7) */
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    *vals = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    *sum = _mm_cvtsi128_si32(s4);
    return dx;
}

/* col_quantize_row on AVX2 (place_block's arrangement, the values stored from the register: a
 * 16-byte reload of a 32-byte store stalled the loop), the blocks' sums from the vectors. */
__attribute__((target("avx2"))) static void quantize_row_avx2(const float *x, uint64_t cols, uint32_t wdtype, uint8_t *out)
{
    const uint64_t nb = cols / QK;
    int8_t *q = (int8_t *)out;
    float *d = (float *)(out + cols);
    int32_t *cb = (int32_t *)(out + col_qrow_block_corrections(cols));
    for (uint64_t b = 0; b < nb; b++) {
        int32_t sum;
        __m256i v;
        d[b] = quantize_block_avx2(x + b * QK, &v, &sum);
        if (wdtype == COL_DTYPE_Q4_0) {
            _mm_storeu_si128((__m128i *)(void *)(q + col_xq_pos(wdtype, nb, b, 0)), _mm256_castsi256_si128(v));
            _mm_storeu_si128((__m128i *)(void *)(q + col_xq_pos(wdtype, nb, b, 16)), _mm256_extracti128_si256(v, 1));
        } else {
            _mm256_storeu_si256((__m256i *)(void *)(q + b * QK), v);
        }
        cb[b] = block_correction(wdtype, sum);
    }
}
#endif

void col_quantize_row(const float *x, uint64_t cols, uint32_t wdtype, col_isa isa, uint8_t *out)
{
    wdtype = col_block_kind(wdtype); /* panels read the activations of their blocks' row dtype */
    isa = col_isa_int8(isa);
#if defined(__x86_64__)
    if (isa == COL_ISA_AVX2) {
        quantize_row_avx2(x, cols, wdtype, out);
        return;
    }
    if (isa >= COL_ISA_AVX512) {
        quantize_row_avx512(x, cols, wdtype, out);
        return;
    }
#endif
    (void)isa;
    const uint64_t nb = cols / QK;
    float *d = (float *)(out + cols);
    int32_t *cb = (int32_t *)(out + col_qrow_block_corrections(cols));
    for (uint64_t b = 0; b < nb; b++) quantize_block_into(x + b * QK, wdtype, nb, b, (int8_t *)out, d, cb);
}

uint64_t col_qrow_block_corrections(uint64_t cols)
{
    return cols + cols / QK * 4;
}

/* ---- activations of bf16 dot products ------------------------------------------------------- */

/* The bf16 nearest x's f32 bits (ties to even; Inf kept; a NaN to the quiet NaN of its sign). */
static uint16_t bf16_of_bits(uint32_t b)
{
    if ((b & 0x7F800000u) == 0x7F800000u) return (uint16_t)((b & 0x7FFFFFu) ? ((b >> 16) & 0x8000u) | 0x7FC0u : b >> 16);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

#if defined(__x86_64__)
/* The same 16 at a time (integer arithmetic: the same bits). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void pack_bf16_avx512(const float *x, uint64_t n, uint16_t *out)
{
    const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), exp_mask = _mm512_set1_epi32(0x7F800000);
    const __m512i mant = _mm512_set1_epi32(0x7FFFFF), sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512i quiet = _mm512_set1_epi32(0x7FC00000);
    for (uint64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512i b = _mm512_maskz_loadu_epi32(m, x + i);
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, half), _mm512_and_si512(_mm512_srli_epi32(b, 16), one));
        const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(b, exp_mask), exp_mask);
        const __mmask16 nan = special & _mm512_test_epi32_mask(b, mant);
        r = _mm512_mask_blend_epi32(special, r, b);
        r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(_mm512_and_si512(b, sign), quiet));
        _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
}
#endif

void col_pack_bf16(const float *x, uint64_t n, col_isa isa, uint16_t *out)
{
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512F) {
        pack_bf16_avx512(x, n, out);
        return;
    }
#endif
    (void)isa;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], sizeof b);
        out[i] = bf16_of_bits(b);
    }
}

/* Exact integer dot product of a stored weight block (block b) with its activation block. */
static int32_t block_isum(const stored_block *s, uint32_t dtype, const int8_t *xq, uint64_t nb, uint64_t b)
{
    int32_t isum = 0;
    for (uint32_t j = 0; j < QK; j++) isum += weight_q(s, dtype, j) * xq[col_xq_pos(col_block_kind(dtype), nb, b, j)];
    return isum;
}

float col_dotq_stored(const uint8_t *matrix, uint32_t dtype, uint64_t r, const uint8_t *qx, uint64_t n)
{
    uint64_t nb = n / QK;
    const float *d = (const float *)(qx + n);
    float acc = 0.0f;
    for (uint64_t b = 0; b < nb; b++) {
        const stored_block s = block_at(matrix, dtype, nb, r, b);
        const float scale = col_f16_to_f32(rd16u(s.scale)) * d[b]; /* one f32 multiply */
        acc = fmaf((float)block_isum(&s, dtype, (const int8_t *)qx, nb, b), scale, acc);
    }
    return acc;
}

float col_dotq_blocks(const uint8_t *row, uint32_t dtype, const uint8_t *qx, uint64_t n)
{
    return col_dotq_stored(row, dtype, 0, qx, n);
}
