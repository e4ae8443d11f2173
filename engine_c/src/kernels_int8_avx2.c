/*
 * kernels_int8_avx2.c - q8_0 and q4_0 products on AVX2 (+FMA, F16C), in block order.
 *
 * Every path computes an output of a quantised product as col_dotq_blocks defines it: over the
 * blocks in order, acc = fma((float)isum, d_w * d_x, acc), isum the block's exact int32 sum. Here 8
 * rows sit in the 8 lanes of a vector, so a block costs one convert, one scale multiply and one
 * fused multiply-add per 8 outputs, and each lane is exactly that sequence for its row: neither
 * tile shape, batch size nor thread count can change a bit.
 *
 * AVX2 has no VNNI, and vpmaddubsw (unsigned x signed bytes, pairs saturated to int16) would
 * saturate on q8_0's weights biased by 128, so:
 * - q8_0 multiplies |w| (unsigned, at most 128) by x with w's sign (vpsignb; |x| <= 127), pair sums
 *   at most 32512, widened to int32 by vpmaddwd with ones;
 * - q4_0 multiplies the raw nibbles (unsigned, 0..15) by x: pair sums at most 3810, so a block's 8
 *   groups add in int16 (at most 30480) before one vpmaddwd; the nibbles' bias of 8 leaves as
 *   -8 * the sum of the token's block, the block correction col_quantize_row stores (batches add
 *   it per token and block, decode once per 8 rows).
 * Decode (one token, and batches of fewer than COL_Q_AVX2_PANEL_TOKENS, a token at a time) reads 8
 * distant rows of the thread's share as they are stored (8 streams through memory, prefetched
 * col_decode_tuning_here's bytes ahead) and turns the 8 rows' lane sums of a block into one vector of
 * block sums with vphaddd (q8_0), or of two blocks' with vphaddw while they fit in int16 (q4_0).
 * Larger batches pack 8 neighbouring rows a k-block at a time into a
 * panel on the stack (lane r holding row r's 4-byte group g of each block, the scales widened),
 * which all the tokens' passes then read, 4 tokens a pass; the outputs carry across k-blocks in y,
 * and the next panel's lines are fetched while the passes run.
 * Weights stored in that panel order (col_rows_int8_panels_avx2) need no packing: batches pass over
 * the stored panel (the first pass asking for the next one's lines, into L2), and decode reads 4
 * distant panels at once with the rows already in the lanes.
 * On CPUs with AVX-VNNI (`vnni`) each 4-byte group's products and their int32 sum are one
 * vpdpbusd, as on AVX-512: q8_0 read as w + 128 and q4_0's nibbles as they are, each block sum
 * started from the block's correction. The same exact integers, so the same bits.
 */
#include "kernels_internal.h"
#include "transpose_x86.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define LANES 8     /* rows per vector */
/* An empty asm that v passes through: gcc otherwise reassociates a pass's chains of integer adds
 * into trees, which keeps all of a block's products live at once and spills them to the stack. */
#define KEEP_CHAIN(v) __asm__("" : "+x"(v))
/* acc + the products of u's unsigned and s's signed bytes, four to an int32 lane (AVX-VNNI's
 * vpdpbusd, VEX-encoded). In asm so that the always-inline code that calls it under `vnni` still
 * compiles for AVX2 alone; callers without AVX-VNNI never reach it. */
COL_INLINE COL_T2 __m256i vnni_dot(__m256i acc, __m256i u, __m256i s)
{
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
    return acc;
}
#define PANEL_KB 16 /* blocks per panel (a k-block): 4 KiB of q8_0 weights, in L1 with the tokens' blocks */
/* Batches of fewer tokens run the decode tiles a token at a time: packing panels from memory cost
 * more than it saved below 6-8 tokens (bench_products, docs/performance.md). */
#ifndef COL_Q_AVX2_PANEL_TOKENS
#define COL_Q_AVX2_PANEL_TOKENS 8
#endif
/* Weights stored in panels: batches of fewer tokens run the decode kernel a token at a time (one
 * panel stream is too few misses in flight for passes of 2 tokens; from 3 they gain). */
#ifndef COL_Q_AVX2_STORED_TOKENS
#define COL_Q_AVX2_STORED_TOKENS 3
#endif
/* Rows of at most one k-block take panels from fewer tokens: a decode tile's set-up per 8 rows
 * (scales, transposes) is spread over too few blocks there (1024 x 384, 4-6 tokens: 1.3-1.7x). */
#ifndef COL_Q_AVX2_PANEL_TOKENS_SHORT
#define COL_Q_AVX2_PANEL_TOKENS_SHORT 3
#endif

/* The scales of blocks b0 .. b0 + 7 of 8 rows, lane r holding row r's: ws[k] for block b0 + k.
 * Reads 16 bytes from each row's scales, past its last scale into its payload when fewer than 8
 * blocks are left (lanes the caller does not use). */
COL_INLINE COL_T2 void row_scales(const uint8_t *const *p, uint64_t b0, __m256 *ws)
{
#pragma GCC unroll 8
    for (int r = 0; r < LANES; r++) ws[r] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p[r] + 2 * b0)));
    col_transpose8(ws, ws);
}

/* Lane r of the result: the sum of v[r]'s 8 lanes (exact: integers). */
COL_INLINE COL_T2 __m256i reduce8(const __m256i *v)
{
    const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* acc = fma(isum, d_w * d_x, acc), lane by lane: the definition's step. */
COL_INLINE COL_T2 __m256 block_step(__m256 acc, __m256i isum, __m256 dw, float dx)
{
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc);
}

/* Where block b's low (j < 16) and high halves sit among a q4_0 activation row's int8 values
 * (col_quantize_row: groups of four blocks, their low halves then their high halves). */
COL_INLINE uint64_t q4_low(uint64_t b)
{
    return b / 4 * 128 + b % 4 * 16;
}
COL_INLINE uint64_t q4_high(uint64_t nb, uint64_t b)
{
    const uint64_t g = b / 4, in_group = nb - 4 * g < 4 ? nb - 4 * g : 4;
    return g * 128 + in_group * 16 + b % 4 * 16;
}

/* ---- decode: 8 distant rows, one token ---------------------------------------------------- */

/* Outputs of rows p[0..7] (as stored) for the one token of qx, into out[0..7]. */
COL_INLINE COL_T2 void decode_q8(const uint8_t *const *p, uint64_t n, const uint8_t *qx, uint32_t ahead, float *out)
{
    const uint64_t nb = n / QK;
    const int8_t *xq = (const int8_t *)qx;
    const float *dx = (const float *)(const void *)(qx + n);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b0 = 0; b0 < nb; b0 += 8) {
        __m256 ws[8];
        row_scales(p, b0, ws);
        const uint64_t have = nb - b0 < 8 ? nb - b0 : 8;
        for (uint64_t k = 0; k < have; k++) {
            const uint64_t b = b0 + k;
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq + QK * b));
            __m256i v[8];
#pragma GCC unroll 8
            for (int r = 0; r < LANES; r++) {
                const uint8_t *payload = p[r] + 2 * nb + QK * b;
                _mm_prefetch((const char *)(payload + ahead), _MM_HINT_T0);
                const __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)payload);
                v[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w)), ones);
            }
            acc = block_step(acc, reduce8(v), ws[k], dx[b]);
        }
    }
    _mm256_storeu_ps(out, acc);
}

/* One q4_0 row's raw nibbles against the activations of two blocks (xlo: their low halves, xhi:
 * their high ones; a lone block in the low 128 bits): 16 int16 sums of 2 low and 2 high products,
 * lanes 0-7 the first block's, 8-15 the second's, each at most 2 * 2 * 15 * 127 = 7620 in size. */
COL_INLINE COL_T2 __m256i q4_pairs(__m256i raw, __m256i xlo, __m256i xhi)
{
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
}

/* q4_pairs of row p + at: its 32 bytes (two blocks), or 16 (one block) when `one`; the row
 * prefetched `ahead` bytes on when `fetch`. */
COL_INLINE COL_T2 __m256i q4_row(const uint8_t *p, uint64_t at, __m256i xlo, __m256i xhi, uint32_t ahead, int fetch,
                                 int one)
{
    if (fetch) _mm_prefetch((const char *)(p + at + ahead), _MM_HINT_T0);
    __m256i raw;
    if (one)
        raw = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(p + at)));
    else
        raw = _mm256_loadu_si256((const __m256i *)(const void *)(p + at));
    __m256i v = q4_pairs(raw, xlo, xhi);
    KEEP_CHAIN(v); /* a row's vector at a time, not all the products live at once */
    return v;
}

/* Blocks b and b + 1 (b even) of the 8 rows p[0..7] + at (block b's payload bytes) against their
 * activations' low and high halves: *first lane r gets row r's sum over block b, *second over
 * b + 1 (only *first when `one`: block b alone, in the low 128 bits). Two rounds of vphaddw add 4
 * of a row's int16 sums (at most 30480: exact), vpmaddwd the last 2 into int32, and a lane swap
 * puts rows 0-3 beside rows 4-7. */
COL_INLINE COL_T2 void q4_two(const uint8_t *const *p, uint64_t at, __m256i xlo, __m256i xhi, uint32_t ahead, int fetch,
                              int one, __m256i *first, __m256i *second)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i h01 = q4_row(p[0], at, xlo, xhi, ahead, fetch, one);
    h01 = _mm256_hadd_epi16(h01, q4_row(p[1], at, xlo, xhi, ahead, fetch, one));
    __m256i h23 = q4_row(p[2], at, xlo, xhi, ahead, fetch, one);
    h23 = _mm256_hadd_epi16(h23, q4_row(p[3], at, xlo, xhi, ahead, fetch, one));
    const __m256i r03 = _mm256_madd_epi16(_mm256_hadd_epi16(h01, h23), ones);
    __m256i h45 = q4_row(p[4], at, xlo, xhi, ahead, fetch, one);
    h45 = _mm256_hadd_epi16(h45, q4_row(p[5], at, xlo, xhi, ahead, fetch, one));
    __m256i h67 = q4_row(p[6], at, xlo, xhi, ahead, fetch, one);
    h67 = _mm256_hadd_epi16(h67, q4_row(p[7], at, xlo, xhi, ahead, fetch, one));
    const __m256i r47 = _mm256_madd_epi16(_mm256_hadd_epi16(h45, h67), ones);
    *first = _mm256_permute2x128_si256(r03, r47, 0x20);
    *second = _mm256_permute2x128_si256(r03, r47, 0x31);
}

/* The same for q4_0: two blocks (32 payload bytes) at a time, a last odd block alone. The raw
 * nibbles (w + 8) are multiplied, and each block's sum starts from its correction (-8 * the sum of
 * its activations, col_quantize_row), added once the 8 rows' sums are in lanes. A whole group of
 * 8 blocks reads its activations at fixed places: blocks b0 .. b0 + 7 fill two groups of four. */
COL_INLINE COL_T2 void decode_q4(const uint8_t *const *p, uint64_t n, const uint8_t *qx, uint32_t ahead, float *out)
{
    const uint64_t nb = n / QK;
    const int8_t *xq = (const int8_t *)qx;
    const float *dx = (const float *)(const void *)(qx + n);
    const int32_t *corr = (const int32_t *)(const void *)(qx + col_qrow_block_corrections(n));
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b0 = 0; b0 < nb; b0 += 8) {
        __m256 ws[8];
        row_scales(p, b0, ws);
        const uint64_t have = nb - b0 < 8 ? nb - b0 : 8;
        __m256i first, second;
        if (have == 8) {
            const int8_t *xg = xq + QK * b0; /* q4_low(b0) */
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int8_t *xl = xg + 128 * (i / 2) + 32 * (i % 2);
                const uint64_t b = b0 + 2 * (uint64_t)i;
                q4_two(p, 2 * nb + 16 * b, _mm256_loadu_si256((const __m256i *)(const void *)xl),
                       _mm256_loadu_si256((const __m256i *)(const void *)(xl + 64)), ahead, i % 2 == 0, 0, &first, &second);
                acc = block_step(acc, _mm256_add_epi32(first, _mm256_set1_epi32(corr[b])), ws[2 * i], dx[b]);
                acc = block_step(acc, _mm256_add_epi32(second, _mm256_set1_epi32(corr[b + 1])), ws[2 * i + 1], dx[b + 1]);
            }
            continue;
        }
        uint64_t k = 0;
        for (; k + 2 <= have; k += 2) {
            const uint64_t b = b0 + k; /* even: b and b + 1 share a group, their halves adjacent */
            q4_two(p, 2 * nb + 16 * b, _mm256_loadu_si256((const __m256i *)(const void *)(xq + q4_low(b))),
                   _mm256_loadu_si256((const __m256i *)(const void *)(xq + q4_high(nb, b))), ahead, !(k & 2), 0, &first,
                   &second);
            acc = block_step(acc, _mm256_add_epi32(first, _mm256_set1_epi32(corr[b])), ws[k], dx[b]);
            acc = block_step(acc, _mm256_add_epi32(second, _mm256_set1_epi32(corr[b + 1])), ws[k + 1], dx[b + 1]);
        }
        if (k < have) {
            const uint64_t b = b0 + k;
            q4_two(p, 2 * nb + 16 * b, _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(xq + q4_low(b)))),
                   _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(xq + q4_high(nb, b)))), ahead, 1, 1,
                   &first, &second);
            acc = block_step(acc, _mm256_add_epi32(first, _mm256_set1_epi32(corr[b])), ws[k], dx[b]);
        }
    }
    _mm256_storeu_ps(out, acc);
}

/* ---- batches: panels of 8 neighbouring rows ------------------------------------------------ */

/* A k-block of 8 rows: per block, 8 vectors whose lane r holds row r's group g of 4 bytes
 * (q8_0: w; q4_0: the nibbles, groups 0-3 the low ones, 4-7 the high ones), and the 8 rows'
 * scales. */
typedef struct panel {
    __m256i w[PANEL_KB][8];
    __m256 d[PANEL_KB];
} panel;

/* Pack blocks b0 .. b0 + kn - 1 of rows p[0..7]. */
COL_INLINE COL_T2 void pack_panel(const uint8_t *const *p, uint64_t nb, uint64_t b0, uint64_t kn, int q4, panel *pn)
{
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (uint64_t k = 0; k < kn; k += 8) {
        __m256 ws[8];
        row_scales(p, b0 + k, ws);
        for (uint64_t i = 0; i < 8 && k + i < kn; i++) pn->d[k + i] = ws[i];
    }
    for (uint64_t k = 0; k < kn; k++) {
        const uint64_t b = b0 + k;
        __m256 v[8];
#pragma GCC unroll 8
        for (int r = 0; r < LANES; r++) {
            __m256i w;
            if (q4) {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)(p[r] + 2 * nb + 16 * b));
                w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low4);
            } else {
                w = _mm256_loadu_si256((const __m256i *)(const void *)(p[r] + 2 * nb + QK * b));
            }
            v[r] = _mm256_castsi256_ps(w);
        }
        col_transpose8(v, v);
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) pn->w[k][g] = _mm256_castps_si256(v[g]);
    }
}

/* q8_0: one block of 8 rows in the lanes (w0: its 8 vectors of 32 bytes, lane r of vector g row r's
 * elements 4g .. 4g + 3, as packed and stored panels hold them) against NT tokens (x[b]: token b's
 * 32 int8 values of the block, corr[b]: its block correction, -128 x their sum): isum[b] lane r =
 * row r's exact int32 sum, as |w| x (x with w's sign) by vpmaddubsw, or with `vnni` as (w + 128) x
 * by vpdpbusd from the correction, which leaves each token one instruction a group. */
COL_INLINE COL_T2 void q8_panel_sums(const uint8_t *w0, const int8_t *const *x, const int32_t *corr, const int NT,
                                     __m256i *isum, const int vnni)
{
    const __m256i ones = _mm256_set1_epi16(1), bias = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 8
    for (int b = 0; b < NT; b++) isum[b] = vnni ? _mm256_set1_epi32(corr[b]) : _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)(w0 + 32 * g));
        const __m256i aw = vnni ? _mm256_xor_si256(w, bias) : _mm256_abs_epi8(w);
#pragma GCC unroll 8
        for (int b = 0; b < NT; b++) {
            int32_t x4;
            memcpy(&x4, x[b] + 4 * g, 4);
            if (vnni) {
                isum[b] = vnni_dot(isum[b], aw, _mm256_set1_epi32(x4));
            } else {
                const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(x4), w);
                isum[b] = _mm256_add_epi32(isum[b], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
                KEEP_CHAIN(isum[b]);
            }
        }
    }
}

/* Where token t of a batch's passes reads its activations (qx, rows of qb bytes; xq: int8 values,
 * dx: scales, corr: block corrections) and writes the 8 outputs from row r (y). */
COL_INLINE COL_T2 void pass_token(const col_matvec_job *j, const uint8_t *qx, uint64_t qb, uint64_t r, uint32_t t,
                           const int8_t **xq, const float **dx, const int32_t **corr, float **y)
{
    const uint64_t n = j->w.cols;
    const uint8_t *base = qx + (uint64_t)t * qb;
    *xq = (const int8_t *)base;
    *dx = (const float *)(const void *)(base + n);
    *corr = (const int32_t *)(const void *)(base + col_qrow_block_corrections(n));
    *y = j->y + (uint64_t)t * j->w.rows + r;
}

/* Tokens t .. t + NT - 1 over a panel's kn blocks (b0..): lanes of y[token][r .. r + 7] (nr of
 * them exist) carried in from the k-blocks before (none when b0 = 0) and out to the next. */
COL_INLINE COL_T2 void panel_pass(const col_matvec_job *j, const uint8_t *qx, const panel *pn, uint64_t r, int nr,
                                  uint64_t b0, uint64_t kn, uint32_t t, const int NT, const int q4, const int vnni)
{
    const uint64_t n = j->w.cols, nb = n / QK, qb = col_qrow_bytes(n);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const int8_t *xq[4];
    const float *dx[4];
    const int32_t *corr[4]; /* q4_0: -8 * the sum of each block's activations */
    float *y[4];
    __m256 acc[4];
#pragma GCC unroll 4
    for (int b = 0; b < NT; b++) {
        pass_token(j, qx, qb, r, t + (uint32_t)b, &xq[b], &dx[b], &corr[b], &y[b]);
        acc[b] = b0 == 0 ? _mm256_setzero_ps() : nr == LANES ? _mm256_loadu_ps(y[b]) : _mm256_maskload_ps(y[b], mask);
    }
    for (uint64_t k = 0; k < kn; k++) {
        __m256i isum[4];
        if (q4) {
#pragma GCC unroll 4
            for (int b = 0; b < NT; b++) isum[b] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m256i w = _mm256_load_si256(&pn->w[k][g]);
#pragma GCC unroll 4
                for (int b = 0; b < NT; b++) {
                    int32_t x4;
                    memcpy(&x4, xq[b] + (g < 4 ? q4_low(b0 + k) + 4 * g : q4_high(nb, b0 + k) + 4 * (g - 4)), 4);
                    if (vnni) {
                        isum[b] = vnni_dot(isum[b], w, _mm256_set1_epi32(x4));
                    } else {
                        isum[b] = _mm256_add_epi16(isum[b], _mm256_maddubs_epi16(w, _mm256_set1_epi32(x4)));
                        KEEP_CHAIN(isum[b]);
                    }
                }
            }
#pragma GCC unroll 4
            for (int b = 0; b < NT; b++)
                isum[b] = _mm256_add_epi32(vnni ? isum[b] : _mm256_madd_epi16(isum[b], ones),
                                           _mm256_set1_epi32(corr[b][b0 + k]));
        } else {
            const int8_t *x[4];
            int32_t ck[4];
#pragma GCC unroll 4
            for (int b = 0; b < NT; b++) x[b] = xq[b] + QK * (b0 + k), ck[b] = corr[b][b0 + k];
            q8_panel_sums((const uint8_t *)pn->w[k], x, ck, NT, isum, vnni);
        }
#pragma GCC unroll 4
        for (int b = 0; b < NT; b++) acc[b] = block_step(acc[b], isum[b], pn->d[k], dx[b][b0 + k]);
    }
#pragma GCC unroll 4
    for (int b = 0; b < NT; b++) {
        if (nr == LANES)
            _mm256_storeu_ps(y[b], acc[b]);
        else
            _mm256_maskstore_ps(y[b], mask, acc[b]);
    }
}

/* Ask for the lines of the next panel to pack: the next k-block of these rows, else the first of
 * the next 8 rows (their scales too), so they arrive while this panel's passes run. */
COL_INLINE void prefetch_next_panel(const col_matvec_job *j, uint64_t r, uint64_t rb, uint64_t b0, uint64_t pb)
{
    const uint64_t nb = j->w.cols / QK;
    uint64_t first = b0 + PANEL_KB;
    if (first >= nb) {
        if (r + LANES >= j->w.rows) return;
        r += LANES, first = 0;
    }
    const uint64_t last = first + PANEL_KB < nb ? first + PANEL_KB : nb;
    for (int a = 0; a < LANES && r + (uint64_t)a < j->w.rows; a++) {
        const char *row = (const char *)j->w.data + (r + (uint64_t)a) * rb;
        if (first == 0) _mm_prefetch(row, _MM_HINT_T0);
        for (uint64_t at = 2 * nb + first * pb; at < 2 * nb + last * pb; at += 64) _mm_prefetch(row + at, _MM_HINT_T0);
    }
}

/* Rows r .. r + nr - 1 (nr <= 8), every token, a k-block at a time. */
COL_INLINE COL_T2 void panel_rows(const col_matvec_job *j, const uint8_t *qx, uint64_t r, int nr, const int q4,
                                  const int vnni)
{
    const uint64_t n = j->w.cols, nb = n / QK, rb = col_dtype_row_bytes(j->w.dtype, n);
    const uint32_t nt = j->n_tokens;
    const uint8_t *p[LANES];
    for (int a = 0; a < LANES; a++) p[a] = (const uint8_t *)j->w.data + (r + (uint64_t)(a < nr ? a : 0)) * rb;
    panel pn;
    for (uint64_t b0 = 0; b0 < nb; b0 += PANEL_KB) {
        const uint64_t kn = nb - b0 < PANEL_KB ? nb - b0 : PANEL_KB;
        pack_panel(p, nb, b0, kn, q4, &pn);
        prefetch_next_panel(j, r, rb, b0, q4 ? 16 : QK);
        uint32_t t = 0;
        for (; t + 4 <= nt; t += 4) panel_pass(j, qx, &pn, r, nr, b0, kn, t, 4, q4, vnni);
        switch (nt - t) {
        case 3: panel_pass(j, qx, &pn, r, nr, b0, kn, t, 3, q4, vnni); break;
        case 2: panel_pass(j, qx, &pn, r, nr, b0, kn, t, 2, q4, vnni); break;
        case 1: panel_pass(j, qx, &pn, r, nr, b0, kn, t, 1, q4, vnni); break;
        default: break;
        }
    }
}

/* ---- weights stored in 8-row panels ---------------------------------------------------------- */

#define STORED_KB 128 /* blocks a batch's passes share from L1/L2: whole rows up to 4096 columns */
#define STORED_STREAMS 4 /* panels a decode reads at once, from 4 distant parts of the share */
/* Tokens a batch pass over a stored panel takes: 6 tokens' block sums and outputs and a group's
 * weight vectors fill AVX2's 16 registers, and each group's loads and q8_0's vpabsb serve 6
 * tokens; q4_0 passes keep 4, which measured faster on experts of ~16 tokens. */
#define STORED_PASS_TOKENS 6
#define STORED_PASS_TOKENS_Q4 4
#define STORED_PASS_TOKENS_Q4_VNNI 5 /* no int16 sums to hold: one more token's registers */
/* Passes on AVX-512 without VNNI (two panels a zmm): 12 tokens' sums and outputs fill the 32 registers */
#define STORED_PASS_MAX_512 12
#ifndef STORED_PASS_TOKENS_512
#define STORED_PASS_TOKENS_512 12
#endif
#ifndef STORED_PASS_TOKENS_Q4_512
#define STORED_PASS_TOKENS_Q4_512 12
#endif

/* Where the chunk a batch's passes read after this one lies (its first stored panel's scales and
 * payload from its first block, kn blocks in each of `panels` panels `stride` bytes apart; kn = 0 for
 * none): the first pass over a chunk asks for those lines, spread over its own blocks, so that they
 * come from memory while this chunk is computed. */
typedef struct {
    const uint8_t *sc, *pay;
    uint64_t kn, stride;
    int panels;
} stored_next;

/* Block i's share (of kn, this chunk's blocks) of the next chunk's lines. */
COL_INLINE void prefetch_stored(const stored_next *nx, uint64_t i, uint64_t kn, uint64_t bb)
{
    const uint64_t per = (nx->kn + kn - 1) / kn;
    for (uint64_t b = i * per; b < (i + 1) * per && b < nx->kn; b++)
        for (int p = 0; p < nx->panels; p++) {
            const uint64_t off = nx->stride * (uint64_t)p;
            for (uint64_t at = 0; at < bb; at += 64) _mm_prefetch((const char *)(nx->pay + off + bb * b + at), _MM_HINT_T1);
            if (b % 4 == 0) _mm_prefetch((const char *)(nx->sc + off + 16 * b), _MM_HINT_T1);
        }
}

/* The chunk after blocks b0 .. b0 + kn - 1 of the `panels` stored panels from row r: the next k-block
 * of these panels, else the first of the next `panels` panels if all lie in [r, r1). */
COL_INLINE stored_next next_stored(const col_matvec_job *j, uint64_t r, uint64_t r1, uint64_t b0, uint64_t kn, int panels)
{
    const uint64_t nb = j->w.cols / QK, rb = col_dtype_row_bytes(j->w.dtype, j->w.cols);
    const uint64_t bb = col_block_kind(j->w.dtype) == COL_DTYPE_Q4_0 ? 128 : 256;
    stored_next nx = {0, 0, 0, LANES * rb, panels};
    if (b0 + kn < nb)
        b0 += kn;
    else if (r + 2 * (uint64_t)panels * LANES <= r1)
        r += (uint64_t)panels * LANES, b0 = 0;
    else
        return nx;
    nx.sc = (const uint8_t *)j->w.data + r * rb + 16 * b0;
    nx.pay = (const uint8_t *)j->w.data + r * rb + 16 * nb + bb * b0;
    nx.kn = nb - b0 < STORED_KB ? nb - b0 : STORED_KB;
    return nx;
}

/* q4_0: block k of a stored panel (w0: its 4 vectors of stored bytes, lane r of vector g row r's
 * bytes 4g .. 4g + 3: the low nibbles of elements 4g .., the high ones of 16 + 4g ..) against NT
 * tokens (xq[b]: token b's int8 values, corr[b] its block corrections): isum[b] lane r = row r's
 * exact int32 sum, the raw nibbles x x in int16 (at most 30 480; in int32 with `vnni`) plus the
 * block's correction. */
COL_INLINE COL_T2 void q4_stored_sums(const uint8_t *w0, const int8_t *const *xq, const int32_t *const *corr, uint64_t nb,
                                      uint64_t k, const int NT, __m256i *isum, const int vnni)
{
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F);
    __m256i high = _mm256_setzero_si256(); /* one token by vpdpbusd: the high nibbles' own chain */
#pragma GCC unroll 8
    for (int b = 0; b < NT; b++) isum[b] = vnni ? _mm256_set1_epi32(corr[b][k]) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(w0 + 32 * g));
        const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
#pragma GCC unroll 8
        for (int b = 0; b < NT; b++) {
            int32_t xl, xh;
            memcpy(&xl, xq[b] + q4_low(k) + 4 * g, 4);
            memcpy(&xh, xq[b] + q4_high(nb, k) + 4 * g, 4);
            if (vnni && NT == 1) {
                isum[b] = vnni_dot(isum[b], lo, _mm256_set1_epi32(xl));
                high = vnni_dot(high, hi, _mm256_set1_epi32(xh));
            } else if (vnni) {
                isum[b] = vnni_dot(vnni_dot(isum[b], lo, _mm256_set1_epi32(xl)), hi, _mm256_set1_epi32(xh));
            } else {
                isum[b] = _mm256_add_epi16(isum[b], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
                isum[b] = _mm256_add_epi16(isum[b], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
                KEEP_CHAIN(isum[b]);
            }
        }
    }
    if (vnni && NT == 1)
        isum[0] = _mm256_add_epi32(isum[0], high);
    else if (!vnni)
#pragma GCC unroll 8
        for (int b = 0; b < NT; b++) isum[b] = _mm256_add_epi32(_mm256_madd_epi16(isum[b], ones), _mm256_set1_epi32(corr[b][k]));
}

/* The block sums of stored block k of a panel (w0: its payload) against one token (xq: its int8
 * values, corr: q4_0's block corrections): lane r row r's exact int32 sum. */
COL_INLINE COL_T2 __m256i stored_block(const uint8_t *w0, const int8_t *xq, const int32_t *corr, uint64_t nb, uint64_t k,
                                       const int q4, const int vnni)
{
    __m256i isum;
    if (q4) {
        q4_stored_sums(w0, &xq, &corr, nb, k, 1, &isum, 0);
    } else {
        const int8_t *x = xq + QK * k;
        q8_panel_sums(w0, &x, corr + k, 1, &isum, vnni);
    }
    return isum;
}

/* Decode: the NP stored panels at rows pr[0..NP-1] against the one token of qx, into y[pr[p]..]. */
COL_INLINE COL_T2 void stored_decode(const col_matvec_job *j, const uint8_t *qx, const uint64_t *pr, const int NP,
                                     float *y, uint32_t ahead, const int q4, const int vnni)
{
    const uint64_t n = j->w.cols, nb = n / QK, rb = col_dtype_row_bytes(j->w.dtype, n), bb = q4 ? 128 : 256;
    const int8_t *xq = (const int8_t *)qx;
    const float *dx = (const float *)(const void *)(qx + n);
    const int32_t *corr = (const int32_t *)(const void *)(qx + col_qrow_block_corrections(n));
    const uint8_t *sc[STORED_STREAMS], *pay[STORED_STREAMS]; /* each panel's scales, its payload */
    __m256 acc[STORED_STREAMS];
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++)
        sc[p] = (const uint8_t *)j->w.data + pr[p] * rb, pay[p] = sc[p] + 16 * nb, acc[p] = _mm256_setzero_ps();
    /* each panel's scales (16 bytes a block, before its payload) asked for at once: read a line per
     * 4 blocks, they would make a second, slow stream per panel */
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++)
        for (uint64_t at = 0; at < 16 * nb; at += 64) _mm_prefetch((const char *)(sc[p] + at), _MM_HINT_T0);
    for (uint64_t k = 0; k < nb; k++) {
        /* every panel's lines asked for before any block's arithmetic: the misses of all the
         * streams then fit in the window at once */
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
#pragma GCC unroll 4
            for (uint64_t at = 0; at < bb; at += 64) _mm_prefetch((const char *)(pay[p] + bb * k + at + ahead), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sc[p] + 16 * k)));
            acc[p] = block_step(acc[p], stored_block(pay[p] + bb * k, xq, corr, nb, k, q4, vnni), d, dx[k]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) _mm256_storeu_ps(y + pr[p], acc[p]);
}

/* Batches: tokens t .. t + NT - 1 over blocks b0 .. b0 + kn - 1 of the stored panel at row r, the
 * outputs carried in y between k-blocks as panel_pass does. */
COL_INLINE COL_T2 void stored_pass(const col_matvec_job *j, const uint8_t *qx, uint64_t r, uint64_t b0, uint64_t kn,
                                   uint32_t t, const int NT, const stored_next *nx, const int q4, const int vnni)
{
    const uint64_t n = j->w.cols, nb = n / QK, qb = col_qrow_bytes(n), bb = q4 ? 128 : 256;
    const uint8_t *sc = (const uint8_t *)j->w.data + r * col_dtype_row_bytes(j->w.dtype, n), *pay = sc + 16 * nb;
    const int8_t *xq[STORED_PASS_TOKENS];
    const float *dx[STORED_PASS_TOKENS];
    const int32_t *corr[STORED_PASS_TOKENS];
    float *y[STORED_PASS_TOKENS];
    __m256 acc[STORED_PASS_TOKENS];
#pragma GCC unroll 8
    for (int b = 0; b < NT; b++) {
        pass_token(j, qx, qb, r, t + (uint32_t)b, &xq[b], &dx[b], &corr[b], &y[b]);
        acc[b] = b0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(y[b]);
    }
    for (uint64_t k = b0; k < b0 + kn; k++) {
        const uint8_t *w0 = pay + bb * k;
        if (t == 0) prefetch_stored(nx, k - b0, kn, bb);
        __m256i isum[STORED_PASS_TOKENS];
        if (q4) {
            q4_stored_sums(w0, xq, corr, nb, k, NT, isum, vnni);
        } else {
            const int8_t *x[STORED_PASS_TOKENS];
            int32_t ck[STORED_PASS_TOKENS];
#pragma GCC unroll 8
            for (int b = 0; b < NT; b++) x[b] = xq[b] + QK * k, ck[b] = corr[b][k];
            q8_panel_sums(w0, x, ck, NT, isum, vnni);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sc + 16 * k)));
#pragma GCC unroll 8
        for (int b = 0; b < NT; b++) acc[b] = block_step(acc[b], isum[b], d, dx[b][k]);
    }
#pragma GCC unroll 8
    for (int b = 0; b < NT; b++) _mm256_storeu_ps(y[b], acc[b]);
}

/* A token at a time: the share cut into STORED_STREAMS parts of whole panels as even as they can
 * be, tile i takes panel i of each part that has one (the parts' last tile may be short). */
COL_INLINE COL_T2 void one_token_tiles(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint32_t ahead,
                                       const int q4, const int vnni)
{
    const uint64_t qb = col_qrow_bytes(j->w.cols), np = (r1 - r0) / LANES;
    uint64_t from[STORED_STREAMS + 1], pr[STORED_STREAMS];
    for (int s = 0; s <= STORED_STREAMS; s++) from[s] = np * (uint64_t)s / STORED_STREAMS;
    for (uint32_t t = 0; t < j->n_tokens; t++) {
        float *y = j->y + (uint64_t)t * j->w.rows;
        for (uint64_t i = 0;; i++) {
            int tile = 0;
            for (int s = 0; s < STORED_STREAMS; s++)
                if (from[s] + i < from[s + 1]) pr[tile++] = r0 + LANES * (from[s] + i);
            if (tile == STORED_STREAMS)
                stored_decode(j, qx + t * qb, pr, STORED_STREAMS, y, ahead, q4, vnni);
            else if (tile == 3)
                stored_decode(j, qx + t * qb, pr, 3, y, ahead, q4, vnni);
            else if (tile == 2)
                stored_decode(j, qx + t * qb, pr, 2, y, ahead, q4, vnni);
            else if (tile == 1)
                stored_decode(j, qx + t * qb, pr, 1, y, ahead, q4, vnni);
            else
                break;
        }
    }
}

/* Out of line: in one function with the batch passes, gcc allocated these tiles' registers worse
 * (docs/performance.md, the stored passes' decision row). */
static COL_T2 __attribute__((noinline)) void stored_rows_one_token(const col_matvec_job *j, const uint8_t *qx, uint64_t r0,
                                                                   uint64_t r1, uint32_t ahead, const int q4, int vnni)
{
    if (q4 && vnni)
        one_token_tiles(j, qx, r0, r1, ahead, 1, 1);
    else if (q4)
        one_token_tiles(j, qx, r0, r1, ahead, 1, 0);
    else if (vnni)
        one_token_tiles(j, qx, r0, r1, ahead, 0, 1);
    else
        one_token_tiles(j, qx, r0, r1, ahead, 0, 0);
}

/* Batch passes over the stored panels of rows [r0, r1), every token. */
COL_INLINE COL_T2 void stored_batch(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, const int q4,
                                    const int vnni)
{
    const uint64_t nb = j->w.cols / QK;
    const uint32_t nt = j->n_tokens;
    const int pass = q4 ? (vnni ? STORED_PASS_TOKENS_Q4_VNNI : STORED_PASS_TOKENS_Q4) : STORED_PASS_TOKENS;
    for (uint64_t r = r0; r < r1; r += LANES)
        for (uint64_t b0 = 0; b0 < nb; b0 += STORED_KB) {
            const uint64_t kn = nb - b0 < STORED_KB ? nb - b0 : STORED_KB;
            const stored_next nx = next_stored(j, r, r1, b0, kn, 1);
            uint32_t t = 0;
            for (; t + (uint32_t)pass <= nt; t += (uint32_t)pass) stored_pass(j, qx, r, b0, kn, t, pass, &nx, q4, vnni);
            switch (nt - t) {
            case 5: stored_pass(j, qx, r, b0, kn, t, 5, &nx, q4, vnni); break;
            case 4: stored_pass(j, qx, r, b0, kn, t, 4, &nx, q4, vnni); break;
            case 3: stored_pass(j, qx, r, b0, kn, t, 3, &nx, q4, vnni); break;
            case 2: stored_pass(j, qx, r, b0, kn, t, 2, &nx, q4, vnni); break;
            case 1: stored_pass(j, qx, r, b0, kn, t, 1, &nx, q4, vnni); break;
            default: break;
            }
        }
}

/* The 32 bytes at `at` of two panels' payloads, the first in the low half. */
COL_INLINE COL_T512 __m512i two_panels(const uint8_t *pay0, const uint8_t *pay1, uint64_t at)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(pay0 + at))),
                              _mm256_loadu_si256((const __m256i *)(const void *)(pay1 + at)), 1);
}

/* AVX-512 without VNNI (col_int8_form COL_INT8_MADDUBS_512): tokens t .. t + NT - 1 over blocks
 * b0 .. b0 + kn - 1 of the two stored panels at rows r and r + 8, one in each half of a zmm, as
 * stored_pass does for one (q8_0: x negated where w < 0 by a mask, AVX-512 having no vpsignb;
 * q4_0: the nibbles' int16 sums, then the block's correction), so each group's loads and their
 * vpabsb / nibble masks serve NT tokens and every instruction 16 rows. */
COL_INLINE COL_T512 void stored_pass_512(const col_matvec_job *j, const uint8_t *qx, uint64_t r, uint64_t b0, uint64_t kn,
                                         uint32_t t, const int NT, const stored_next *nx, const int q4)
{
    const uint64_t n = j->w.cols, nb = n / QK, qb = col_qrow_bytes(n), rb = col_dtype_row_bytes(j->w.dtype, n);
    const uint64_t bb = q4 ? 128 : 256;
    const uint8_t *sc0 = (const uint8_t *)j->w.data + r * rb, *sc1 = sc0 + LANES * rb;
    const uint8_t *pay0 = sc0 + 16 * nb, *pay1 = sc1 + 16 * nb;
    const __m512i ones = _mm512_set1_epi16(1), zero = _mm512_setzero_si512(), low4 = _mm512_set1_epi8(0x0F);
    const int8_t *xq[STORED_PASS_MAX_512];
    const float *dx[STORED_PASS_MAX_512];
    const int32_t *corr[STORED_PASS_MAX_512];
    float *y[STORED_PASS_MAX_512];
    __m512 acc[STORED_PASS_MAX_512];
#pragma GCC unroll 12
    for (int b = 0; b < NT; b++) {
        pass_token(j, qx, qb, r, t + (uint32_t)b, &xq[b], &dx[b], &corr[b], &y[b]);
        acc[b] = b0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(y[b]);
    }
    for (uint64_t k = b0; k < b0 + kn; k++) {
        if (t == 0) prefetch_stored(nx, k - b0, kn, bb);
        __m512i isum[STORED_PASS_MAX_512];
#pragma GCC unroll 12
        for (int b = 0; b < NT; b++) isum[b] = _mm512_setzero_si512();
        if (q4) {
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m512i w = two_panels(pay0, pay1, bb * k + 32 * g);
                const __m512i lo = _mm512_and_si512(w, low4), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
#pragma GCC unroll 12
                for (int b = 0; b < NT; b++) {
                    int32_t xl, xh;
                    memcpy(&xl, xq[b] + q4_low(k) + 4 * g, 4);
                    memcpy(&xh, xq[b] + q4_high(nb, k) + 4 * g, 4);
                    isum[b] = _mm512_add_epi16(isum[b], _mm512_maddubs_epi16(lo, _mm512_set1_epi32(xl)));
                    isum[b] = _mm512_add_epi16(isum[b], _mm512_maddubs_epi16(hi, _mm512_set1_epi32(xh)));
                    KEEP_CHAIN(isum[b]);
                }
            }
        } else {
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m512i w = two_panels(pay0, pay1, bb * k + 32 * g);
                const __m512i aw = _mm512_abs_epi8(w);
                const __mmask64 negative = _mm512_movepi8_mask(w);
#pragma GCC unroll 12
                for (int b = 0; b < NT; b++) {
                    int32_t x4;
                    memcpy(&x4, xq[b] + QK * k + 4 * g, 4);
                    const __m512i bx = _mm512_set1_epi32(x4), sx = _mm512_mask_sub_epi8(bx, negative, zero, bx);
                    isum[b] = _mm512_add_epi32(isum[b], _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), ones));
                    KEEP_CHAIN(isum[b]);
                }
            }
        }
        if (q4)
#pragma GCC unroll 12
            for (int b = 0; b < NT; b++)
                isum[b] = _mm512_add_epi32(_mm512_madd_epi16(isum[b], ones), _mm512_set1_epi32(corr[b][k]));
        const __m512 d = _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(sc0 + 16 * k))),
            _mm_loadu_si128((const __m128i *)(const void *)(sc1 + 16 * k)), 1));
#pragma GCC unroll 12
        for (int b = 0; b < NT; b++)
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[b]), _mm512_mul_ps(d, _mm512_set1_ps(dx[b][k])), acc[b]);
    }
#pragma GCC unroll 12
    for (int b = 0; b < NT; b++) _mm512_storeu_ps(y[b], acc[b]);
}

/* Batch passes over the stored panels of rows [r0, r1) on AVX-512 without VNNI: two panels a pass
 * (stored_pass_512), a last odd panel by stored_batch. */
COL_INLINE COL_T512 void stored_batch_512(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, const int q4)
{
    const uint64_t nb = j->w.cols / QK;
    const uint32_t nt = j->n_tokens, pass = q4 ? STORED_PASS_TOKENS_Q4_512 : STORED_PASS_TOKENS_512;
    uint64_t r = r0;
    for (; r + 2 * LANES <= r1; r += 2 * LANES)
        for (uint64_t b0 = 0; b0 < nb; b0 += STORED_KB) {
            const uint64_t kn = nb - b0 < STORED_KB ? nb - b0 : STORED_KB;
            const stored_next nx = next_stored(j, r, r1, b0, kn, 2);
            uint32_t t = 0;
            for (; t + pass <= nt; t += pass) stored_pass_512(j, qx, r, b0, kn, t, (int)pass, &nx, q4);
            switch (nt - t) {
#define LEFT(N) case N: stored_pass_512(j, qx, r, b0, kn, t, N, &nx, q4); break;
                LEFT(11) LEFT(10) LEFT(9) LEFT(8) LEFT(7) LEFT(6) LEFT(5) LEFT(4) LEFT(3) LEFT(2) LEFT(1)
#undef LEFT
            default: break;
            }
        }
    if (r < r1) stored_batch(j, qx, r, r1, q4, 0);
}

static COL_T512 __attribute__((noinline)) void stored_batch_q8_512(const col_matvec_job *j, const uint8_t *qx, uint64_t r0,
                                                                   uint64_t r1)
{
    stored_batch_512(j, qx, r0, r1, 0);
}

static COL_T512 __attribute__((noinline)) void stored_batch_q4_512(const col_matvec_job *j, const uint8_t *qx, uint64_t r0,
                                                                   uint64_t r1)
{
    stored_batch_512(j, qx, r0, r1, 1);
}

COL_INLINE COL_T2 void stored_rows(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint32_t ahead,
                                   const int q4, int vnni)
{
    if (j->n_tokens < COL_Q_AVX2_STORED_TOKENS)
        stored_rows_one_token(j, qx, r0, r1, ahead, q4, vnni);
    else if (vnni)
        stored_batch(j, qx, r0, r1, q4, 1);
    else
        stored_batch(j, qx, r0, r1, q4, 0);
}

COL_T2 void col_rows_int8_panels_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1,
                                      uint32_t ahead, int form)
{
    const int vnni = form == COL_INT8_AVX_VNNI;
    const int q4 = col_block_kind(j->w.dtype) == COL_DTYPE_Q4_0;
    const int wide = form == COL_INT8_MADDUBS_512 && j->n_tokens >= COL_Q_AVX2_STORED_TOKENS;
    if (wide && q4)
        stored_batch_q4_512(j, qx, r0, r1);
    else if (wide)
        stored_batch_q8_512(j, qx, r0, r1);
    else if (q4)
        stored_rows(j, qx, r0, r1, ahead, 1, vnni);
    else
        stored_rows(j, qx, r0, r1, ahead, 0, vnni);
}

/* ---- the walk ------------------------------------------------------------------------------- */

COL_INLINE COL_T2 void rows_q(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint32_t ahead,
                              const int q4, int vnni)
{
    const uint64_t n = j->w.cols, rb = col_dtype_row_bytes(j->w.dtype, n);
    const uint8_t *base = j->w.data;
    const uint32_t panel_from = n <= PANEL_KB * QK ? COL_Q_AVX2_PANEL_TOKENS_SHORT : COL_Q_AVX2_PANEL_TOKENS;
    if (j->n_tokens >= panel_from) {
        for (uint64_t r = r0; r < r1; r += LANES) {
            const int nr = r1 - r < LANES ? (int)(r1 - r) : LANES;
            if (vnni)
                panel_rows(j, qx, r, nr, q4, 1);
            else
                panel_rows(j, qx, r, nr, q4, 0);
        }
        return;
    }
    /* decode tiles, a token at a time (a few tokens' batch re-reads the rows from cache): tile i
     * takes rows r0 + i + s * q (s = 0..7) of the share's 8 parts, then the rows left over
     * together */
    const uint64_t q = (r1 - r0) / LANES, qb = col_qrow_bytes(n);
    const uint8_t *p[LANES];
    float out[LANES];
    for (uint32_t t = 0; t < j->n_tokens; t++)
        for (uint64_t i = 0; i <= q; i++) {
            const uint64_t first = i < q ? r0 + i : r0 + q * LANES, step = i < q ? q : 1;
            const int nr = i < q ? LANES : (int)(r1 - first);
            if (nr == 0) break;
            for (int a = 0; a < LANES; a++) p[a] = base + (first + (uint64_t)(a < nr ? a : 0) * step) * rb;
            if (q4)
                decode_q4(p, n, qx + t * qb, ahead, out);
            else
                decode_q8(p, n, qx + t * qb, ahead, out);
            for (int a = 0; a < nr; a++) j->y[(uint64_t)t * j->w.rows + first + (uint64_t)a * step] = out[a];
        }
}

COL_T2 void col_rows_int8_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint32_t ahead,
                               int form)
{
    const int vnni = form == COL_INT8_AVX_VNNI;
    if (j->w.dtype == COL_DTYPE_Q4_0)
        rows_q(j, qx, r0, r1, ahead, 1, vnni);
    else
        rows_q(j, qx, r0, r1, ahead, 0, vnni);
}
#endif
