/*
 * kernels_int8_avx512.c - q8_0 and q4_0 products on AVX-512 VNNI, in block order with rows in the
 * lanes: 16 rows' outputs in one vector, so each block of every row adds its exact int32 block sum
 * into its output with one fused multiply-add, acc = fma((float)isum, d_w * d_x, acc), which is
 * col_dotq_blocks's definition (kernels_quant.c) lane by lane. No lane tree and no float reduction
 * anywhere, so the decode and batch kernels, every tile and thread split give the same bits.
 *
 * Batches (several tokens) copy 16 neighbouring rows a k-block at a time into a panel in the
 * thread's staging: per block the 16 rows' scales as f32, then the payload with one row's 4-byte
 * group per lane (q8_0 as w + 128, the unsigned operand vpdpbusd wants; q4_0 as its raw bytes, the
 * nibbles split in registers). Each token then takes a block in 8 vpdpbusd with broadcast 4-byte
 * groups of its activations, as two chains of 4 (the block's low and high 16 values) added at the
 * end, the block sum starting from the block's correction (-128 or -8 times the sum of its
 * activations, col_quantize_row), and every pass of COL_PANEL_TOKENS tokens over
 * the panel reads it from L1. The partial sums of a panel live in y between k-blocks.
 *
 * Decode (one token) reads 16 rows where they lie, from 16 distant places of the thread's share
 * (one stream each), one 64-byte step of each row at a time: vpdpbusd gives each row 16 lane sums
 * (two q8_0 blocks or four q4_0 blocks), and a transpose tree of exact integer additions turns the
 * 16 rows' vectors into one vector of 16 row sums per block; the rows' scales come by one 32-bit
 * gather a step (transposed 16 blocks at a time where the offsets exceed 32 bits).
 *
 * Weights stored in 8-row panels (q8_0x8/q4_0x8) are read where they lie: batches of
 * COL_STORED_MIN_TOKENS or more copy two stored panels into the staging panel, and fewer tokens
 * (q8_0 from one, q4_0 from one or two as col_decode_tuning says) run one-token tiles of 4 or 8
 * distant panels (col_decode_tuning.stored_streams), a token at a time. There a 64-byte load
 * holds two 4-byte groups of the panel's 8 rows, vpdpbusd takes it against the token's two groups
 * placed to match (one vpermd each, shared by the tile's panels), and two panels' even and odd
 * groups' sums, added by 256-bit halves, make one vector of 16 row sums per block: no transposes
 * at all.
 */
#include "kernels_internal.h"
#include "transpose_x86.h"

#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__x86_64__)

#ifndef COL_PANEL_KBLOCKS
#define COL_PANEL_KBLOCKS 32 /* blocks of a panel's k-block: 18 KiB of q8_0, in L1 with 12 tokens' blocks */
#endif
#ifndef COL_PANEL_TOKENS
#define COL_PANEL_TOKENS 12 /* tokens per pass over a panel: 12 accumulators beside 8 weight vectors */
#endif
#ifndef COL_DECODE_ADJACENT
#define COL_DECODE_ADJACENT 1 /* neighbouring rows per decode stream (16 / this streams) */
#endif
#ifndef COL_DECODE_GATHER_LIMIT
#define COL_DECODE_GATHER_LIMIT INT32_MAX /* decode gathers scales below this byte offset (-D...=0 tests the transpose) */
#endif
#ifndef COL_PACK_AHEAD
#define COL_PACK_AHEAD 256 /* bytes ahead of its loads that packing prefetches each row */
#endif
#ifndef COL_PANEL_MIN_TOKENS
#define COL_PANEL_MIN_TOKENS 9 /* fewer tokens run the decode kernel once per token: packing costs more */
#endif
#ifndef COL_STORED_MIN_TOKENS
#define COL_STORED_MIN_TOKENS 6 /* the same for stored panels, whose copy into the staging panel costs less */
#endif

/* Bytes of one block of a panel: 16 f32 scales, then 8 (q8_0) or 4 (q4_0) vectors of payload. */
static uint64_t panel_block_bytes(int q4)
{
    return 64 + (q4 ? 4 : 8) * 64;
}

uint64_t col_int8_stage_bytes(void)
{
    return COL_PANEL_KBLOCKS * panel_block_bytes(0);
}

/* ---- batches: panels --------------------------------------------------------------------------- */

/* Blocks [k0, k1) of rows pr .. pr + nr - 1 (nr <= 16; lanes past nr repeat the last row) into the
 * panel at `panel` (64-byte aligned): 64 bytes of each row at a time (two q8_0 blocks, four q4_0),
 * transposed in registers; the scales 16 blocks at a time. */
COL_INLINE COL_T512Q void pack_panel(const col_weight *w, uint64_t pr, uint32_t nr, uint64_t k0, uint64_t k1, int q4,
                                    uint8_t *panel)
{
    const uint64_t nb = w->cols / QK, rb = col_dtype_row_bytes(w->dtype, w->cols), pbb = panel_block_bytes(q4);
    const uint8_t *row[16];
    for (uint32_t r = 0; r < 16; r++) row[r] = (const uint8_t *)w->data + (pr + (r < nr ? r : nr - 1)) * rb;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i v[16], o[16];
    for (uint64_t b = k0; b < k1; b += 16) {
        const uint64_t in_chunk = k1 - b < 16 ? k1 - b : 16;
        const __mmask16 m = (__mmask16)((1u << in_chunk) - 1u);
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) v[r] = _mm512_castps_si512(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row[r] + 2 * b)));
        col_transpose16(v, o);
        for (uint64_t c = 0; c < in_chunk; c++) _mm512_store_si512((void *)(panel + (b + c - k0) * pbb), o[c]);
    }
    const uint64_t per_step = q4 ? 4 : 2, bytes = q4 ? 16 : 32;
    for (uint64_t b = k0; b < k1; b += per_step) {
        const uint64_t in_step = k1 - b < per_step ? k1 - b : per_step;
        const __mmask64 m = in_step == per_step ? ~(__mmask64)0 : (((__mmask64)1 << (in_step * bytes)) - 1);
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) {
            _mm_prefetch((const char *)(row[r] + 2 * nb + b * bytes + COL_PACK_AHEAD), _MM_HINT_T0);
            v[r] = _mm512_maskz_loadu_epi8(m, row[r] + 2 * nb + b * bytes);
        }
        col_transpose16(v, o);
        const int groups = q4 ? 4 : 8; /* 4-byte groups of a block */
        for (uint64_t c = 0; c < in_step * (uint64_t)groups; c++) {
            uint8_t *dst = panel + (b + c / (uint64_t)groups - k0) * pbb + 64 + 64 * (c % (uint64_t)groups);
            _mm512_store_si512((void *)dst, q4 ? o[c] : _mm512_xor_si512(o[c], bias));
        }
    }
}

/* The same panel from weights stored in 8-row panels (COL_DTYPE_Q8_0X8/Q4_0X8): lanes 0-7 from the
 * stored panel at row pr, 8-15 from the one after it (nr > 8) or again from the first. A stored
 * panel already holds each row's 4-byte group g of a block in lane order, so a block is 8 (q8_0)
 * or 4 (q4_0) pairs of 32-byte loads, and its scales two rows of 8 f16. */
COL_INLINE COL_T512Q void pack_stored_panel(const col_weight *w, uint64_t pr, uint32_t nr, uint64_t k0, uint64_t k1, int q4,
                                           uint8_t *panel)
{
    const uint64_t nb = w->cols / QK, rb = col_dtype_row_bytes(w->dtype, w->cols), pbb = panel_block_bytes(q4);
    const uint64_t bb = q4 ? 128 : 256; /* payload bytes of a stored panel's block */
    const uint8_t *first = (const uint8_t *)w->data + pr * rb, *second = nr > 8 ? first + 8 * rb : first;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (uint64_t k = k0; k < k1; k++) {
        uint8_t *dst = panel + (k - k0) * pbb;
        const __m128i s0 = _mm_loadu_si128((const __m128i *)(const void *)(first + 16 * k));
        const __m128i s1 = _mm_loadu_si128((const __m128i *)(const void *)(second + 16 * k));
        _mm512_store_ps((void *)dst, _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(s0), s1, 1)));
        const uint8_t *p0 = first + 16 * nb + bb * k, *p1 = second + 16 * nb + bb * k;
        _mm_prefetch((const char *)(p0 + COL_PACK_AHEAD), _MM_HINT_T0);
        _mm_prefetch((const char *)(p1 + COL_PACK_AHEAD), _MM_HINT_T0);
        for (uint64_t g = 0; g < bb / 32; g++) {
            const __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(p0 + 32 * g));
            const __m256i hi = _mm256_loadu_si256((const __m256i *)(const void *)(p1 + 32 * g));
            const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            _mm512_store_si512((void *)(dst + 64 + 64 * g), q4 ? v : _mm512_xor_si512(v, bias));
        }
    }
}

/* The lines of the chunk a batch packs after this one (blocks k0 .. k0 + kn - 1 of `rows` streams:
 * a row's, or a stored panel's, scales at base + s_step * k and payload at base + p_off + p_step * k;
 * kn = 0 for none). The first pass over a chunk asks for them, spread over its own blocks, so that
 * they come from memory while this chunk is computed. */
typedef struct {
    const uint8_t *base[COL_PANEL_ROWS];
    uint64_t k0, kn, s_step, p_off, p_step;
    uint32_t rows;
} next_chunk;

/* The chunk after the one of rows pr .. pr + nr - 1 ending at block k1, in [pr, r1). */
static next_chunk chunk_after(const col_weight *w, uint64_t pr, uint32_t nr, uint64_t k1, uint64_t r1, int stored)
{
    const uint64_t nb = w->cols / QK, rb = col_dtype_row_bytes(w->dtype, w->cols);
    const int q4 = col_block_kind(w->dtype) == COL_DTYPE_Q4_0;
    next_chunk nx = {{0}, 0, 0, stored ? 16 : 2, 2 * nb, stored ? (q4 ? 128 : 256) : (q4 ? 16 : 32), 0};
    if (stored) nx.p_off = 16 * nb;
    if (k1 < nb) {
        nx.k0 = k1;
    } else if (pr + nr < r1) {
        pr += nr, nx.k0 = 0;
        nr = r1 - pr < COL_PANEL_ROWS ? (uint32_t)(r1 - pr) : COL_PANEL_ROWS;
    } else {
        return nx;
    }
    nx.kn = nb - nx.k0 < COL_PANEL_KBLOCKS ? nb - nx.k0 : COL_PANEL_KBLOCKS;
    nx.rows = stored ? (nr > COL_STORED_PANEL_ROWS ? 2 : 1) : nr;
    for (uint32_t r = 0; r < nx.rows; r++) nx.base[r] = (const uint8_t *)w->data + (pr + (stored ? COL_STORED_PANEL_ROWS * r : r)) * rb;
    return nx;
}

/* Block i's share (of kn, this chunk's blocks) of the next chunk's lines. */
COL_INLINE void prefetch_chunk(const next_chunk *nx, uint64_t i, uint64_t kn)
{
    const uint64_t per = (nx->kn + kn - 1) / kn;
    for (uint64_t k = nx->k0 + i * per; k < nx->k0 + (i + 1) * per && k < nx->k0 + nx->kn; k++)
        for (uint32_t r = 0; r < nx->rows; r++) {
            const uint8_t *pay = nx->base[r] + nx->p_off + nx->p_step * k;
            if (nx->p_step >= 64)
                for (uint64_t at = 0; at < nx->p_step; at += 64) _mm_prefetch((const char *)(pay + at), _MM_HINT_T1);
            else if ((nx->p_step * k) % 64 < nx->p_step)
                _mm_prefetch((const char *)pay, _MM_HINT_T1);
            if ((nx->s_step * k) % 64 < nx->s_step) _mm_prefetch((const char *)(nx->base[r] + nx->s_step * k), _MM_HINT_T1);
        }
}

COL_INLINE int32_t load4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Tokens t .. t + NT - 1 over blocks [k0, k1) of a panel (rows pr .. pr + nr - 1): the sums start
 * at zero for k0 = 0, else from y, and go back to y. */
COL_INLINE COL_T512Q void panel_pass(const col_matvec_job *j, const uint8_t *qx, const uint8_t *panel, uint64_t pr,
                                    uint32_t nr, uint64_t k0, uint64_t k1, uint32_t t, int NT, const next_chunk *nx, int q4)
{
    const uint64_t n = j->w.cols, nb = n / QK, qb = col_qrow_bytes(n), cbo = col_qrow_block_corrections(n);
    const uint64_t pbb = panel_block_bytes(q4), rows = j->w.rows;
    const __mmask16 m = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const uint8_t *x0 = qx + (uint64_t)t * qb;
    float *y0 = j->y + (uint64_t)t * rows + pr;
    __m512 acc[COL_PANEL_TOKENS];
#pragma GCC unroll 12
    for (int b = 0; b < NT; b++) acc[b] = k0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y0 + (uint64_t)b * rows);
    for (uint64_t k = k0; k < k1; k++) {
        const uint8_t *blk = panel + (k - k0) * pbb;
        if (t == 0) prefetch_chunk(nx, k - k0, k1 - k0);
        __m512i wv[8];
        if (q4) {
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) {
                const __m512i v = _mm512_load_si512((const void *)(blk + 64 + 64 * h));
                wv[h] = _mm512_and_si512(v, low4);
                wv[h + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            }
        } else {
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) wv[g] = _mm512_load_si512((const void *)(blk + 64 + 64 * g));
        }
        const __m512 dw = _mm512_load_ps((const void *)blk);
        /* where the block's low and high 16 values sit (col_xq_pos); one place for q8_0 */
        const uint64_t lo = col_xq_pos(col_block_kind(j->w.dtype), nb, k, 0), hi = col_xq_pos(col_block_kind(j->w.dtype), nb, k, 16);
        const uint8_t *xt = x0;
#pragma GCC unroll 12
        for (int b = 0; b < NT; b++, xt += qb) {
            const int8_t *xq = (const int8_t *)xt;
            __m512i isum = _mm512_set1_epi32(((const int32_t *)(const void *)(xt + cbo))[k]);
            /* two chains of 4 vpdpbusd, not one of 8: each token's chain is serial in program order,
             * and out-of-order execution overlaps tokens only as far as the latency lets it */
            __m512i isum_high = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                isum = _mm512_dpbusd_epi32(isum, wv[g], _mm512_set1_epi32(load4(xq + lo + 4 * g)));
                isum_high = _mm512_dpbusd_epi32(isum_high, wv[g + 4], _mm512_set1_epi32(load4(xq + hi + 4 * g)));
            }
            isum = _mm512_add_epi32(isum, isum_high); /* exact: integers */
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(((const float *)(const void *)(xt + n))[k]));
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[b]);
        }
    }
#pragma GCC unroll 12
    for (int b = 0; b < NT; b++) _mm512_mask_storeu_ps(y0 + (uint64_t)b * rows, m, acc[b]);
}

/* Every token over one panel's blocks [k0, k1), in passes of COL_PANEL_TOKENS. */
COL_INLINE COL_T512Q void panel_tokens(const col_matvec_job *j, const uint8_t *qx, const uint8_t *panel, uint64_t pr,
                                      uint32_t nr, uint64_t k0, uint64_t k1, const next_chunk *nx, int q4)
{
    const uint32_t nt = j->n_tokens;
    uint32_t t = 0;
    for (; t + COL_PANEL_TOKENS <= nt; t += COL_PANEL_TOKENS) panel_pass(j, qx, panel, pr, nr, k0, k1, t, COL_PANEL_TOKENS, nx, q4);
    switch (nt - t) {
#define PASS(c) \
    case c: panel_pass(j, qx, panel, pr, nr, k0, k1, t, c, nx, q4); break;
        PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6) PASS(7) PASS(8) PASS(9) PASS(10) PASS(11)
#undef PASS
    default: break;
    }
}

static COL_T512Q void rows_panels(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint8_t *stage,
                                 int q4, int stored)
{
    const uint64_t nb = j->w.cols / QK;
    for (uint64_t pr = r0; pr < r1; pr += COL_PANEL_ROWS) {
        const uint32_t nr = r1 - pr < COL_PANEL_ROWS ? (uint32_t)(r1 - pr) : COL_PANEL_ROWS;
        for (uint64_t k0 = 0; k0 < nb; k0 += COL_PANEL_KBLOCKS) {
            const uint64_t k1 = nb - k0 < COL_PANEL_KBLOCKS ? nb : k0 + COL_PANEL_KBLOCKS;
            if (stored)
                pack_stored_panel(&j->w, pr, nr, k0, k1, q4, stage);
            else
                pack_panel(&j->w, pr, nr, k0, k1, q4, stage);
            const next_chunk nx = chunk_after(&j->w, pr, nr, k1, r1, stored);
            if (q4)
                panel_tokens(j, qx, stage, pr, nr, k0, k1, &nx, 1);
            else
                panel_tokens(j, qx, stage, pr, nr, k0, k1, &nx, 0);
        }
    }
}

/* ---- decode: rows where they lie -------------------------------------------------------------- */

/* p[l]: row l's 16 lane sums, 4 consecutive lanes to a 128-bit quarter. u[i]'s quarter k holds, in
 * dword d, the sum of row 4i + d's four lanes of quarter k (exact: integer additions). */
COL_INLINE COL_T512Q void quarter_sums(const __m512i *p, __m512i *u)
{
    __m512i q1[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        q1[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]), _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(q1[2 * i], q1[2 * i + 1]), _mm512_unpackhi_epi64(q1[2 * i], q1[2 * i + 1]));
}

/* One 64-byte step of 16 rows at base + off[l] + at against the token's activations xq (blocks
 * b.., in_step of them: all four q4_0 or two q8_0 blocks of a step unless the row ends sooner,
 * `full` when they are all there): v[k] receives block b + k's 16 row sums without corrections. */
COL_INLINE COL_T512Q void decode_step(const uint8_t *base, const int64_t *off, uint64_t at, const int8_t *xq, uint64_t b,
                                     uint64_t in_step, int q4, int full, uint32_t ahead, __m512i *v)
{
    const __m512i low4 = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8((char)0x80);
    const __mmask64 m = full ? ~(__mmask64)0 : (((__mmask64)1 << (in_step * (q4 ? 16 : 32))) - 1);
    __m512i p[16], u[4];
    if (q4) {
        const __m512i xlo = full ? _mm512_loadu_si512((const void *)(xq + 32 * b)) : _mm512_maskz_loadu_epi8(m, xq + 32 * b);
        const __m512i xhi = full ? _mm512_loadu_si512((const void *)(xq + 32 * b + 64))
                                 : _mm512_maskz_loadu_epi8(m, xq + 32 * b + 16 * in_step);
#pragma GCC unroll 16
        for (int l = 0; l < 16; l++) {
            const uint8_t *pl = base + off[l] + at;
            _mm_prefetch((const char *)(pl + ahead), _MM_HINT_T0);
            const __m512i raw = full ? _mm512_loadu_si512((const void *)pl) : _mm512_maskz_loadu_epi8(m, pl);
            p[l] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(raw, low4), xlo);
            p[l] = _mm512_dpbusd_epi32(p[l], _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4), xhi);
        }
        quarter_sums(p, u);
        const __m512i t0 = _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i t1 = _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i t2 = _mm512_shuffle_i32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i t3 = _mm512_shuffle_i32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2));
        v[0] = _mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0));
        v[1] = _mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1));
        v[2] = _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0));
        v[3] = _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1));
    } else {
        const __m512i xv = full ? _mm512_loadu_si512((const void *)(xq + 32 * b)) : _mm512_maskz_loadu_epi8(m, xq + 32 * b);
#pragma GCC unroll 16
        for (int l = 0; l < 16; l++) {
            const uint8_t *pl = base + off[l] + at;
            _mm_prefetch((const char *)(pl + ahead), _MM_HINT_T0);
            const __m512i raw = full ? _mm512_loadu_si512((const void *)pl) : _mm512_maskz_loadu_epi8(m, pl);
            p[l] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(raw, bias), xv);
        }
        quarter_sums(p, u);
        const __m512i w01 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                             _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512i w23 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                             _mm512_shuffle_i32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
        v[0] = _mm512_shuffle_i32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0));
        v[1] = _mm512_shuffle_i32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* Blocks b .. b + 15's scales (those before nb) of the 16 rows at base + off[l], transposed to rows
 * in lanes: sc[k] holds block b + k's. Not inlined: its 32 vectors beside a step's pushed the
 * step's onto the stack. */
static COL_T512Q __attribute__((noinline)) void decode_scales(const uint8_t *base, const int64_t *off, uint64_t b,
                                                             uint64_t nb, float (*sc)[16])
{
    const __mmask16 ms = nb - b >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nb - b)) - 1u);
    __m512i v[16], o[16];
#pragma GCC unroll 16
    for (int l = 0; l < 16; l++)
        v[l] = _mm512_castps_si512(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(ms, base + off[l] + 2 * b)));
    col_transpose16(v, o);
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) _mm512_store_si512((void *)sc[k], o[k]);
}

/* Blocks b and b + 1's scales of the 16 rows at base + off32[l] as rows-in-lanes vectors, by one
 * gather: on short rows a step costs less than a share of a 16-block transpose. Reads 4 bytes at 2b
 * of each row, inside the row even for its last block. */
COL_INLINE COL_T512Q void scales2(const uint8_t *base, __m512i off32, uint64_t b, __m512 *s0, __m512 *s1)
{
    const __m512i g = _mm512_i32gather_epi32(off32, (const void *)(base + 2 * b), 1);
    *s0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
    *s1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
}

/* One token t against 16 rows at base + off[l] (l < 16); out[l] receives row l's output. `gather`:
 * the scales by scales2 each step instead of decode_scales every 16 blocks. */
COL_INLINE COL_T512Q void decode16(const col_matvec_job *j, const uint8_t *qx, uint32_t t, const uint8_t *base,
                                  const int64_t *off, int q4, int gather, uint32_t ahead, float *out)
{
    const uint64_t n = j->w.cols, nb = n / QK, qb = col_qrow_bytes(n);
    const uint8_t *xt = qx + (uint64_t)t * qb;
    const int8_t *xq = (const int8_t *)xt;
    const float *dx = (const float *)(const void *)(xt + n);
    const int32_t *cb = (const int32_t *)(const void *)(xt + col_qrow_block_corrections(n));
    const uint64_t per_step = q4 ? 4 : 2;
    __m512 acc = _mm512_setzero_ps();
    const __m512i o32 = gather ? _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_loadu_si512((const void *)off))),
                                                    _mm512_cvtepi64_epi32(_mm512_loadu_si512((const void *)(off + 8))), 1)
                               : _mm512_setzero_si512();
    __attribute__((aligned(64))) float sc[16][16]; /* sc[k]: the 16 rows' scales of block k of the current 16 */
    for (uint64_t b = 0; b < nb; b += per_step) {
        if (!gather && b % 16 == 0) decode_scales(base, off, b, nb, sc);
        const uint64_t in_step = nb - b < per_step ? nb - b : per_step;
        const uint64_t at = 2 * nb + b * (q4 ? 16 : 32); /* the step's payload in a row */
        __m512i v[4];
        if (in_step == per_step)
            decode_step(base, off, at, xq, b, in_step, q4, 1, ahead, v);
        else
            decode_step(base, off, at, xq, b, in_step, q4, 0, ahead, v);
        __m512 s[4];
        if (gather) {
            scales2(base, o32, b, &s[0], &s[1]);
            if (q4) scales2(base, o32, b + 2, &s[2], &s[3]);
        }
#pragma GCC unroll 4
        for (uint64_t k = 0; k < in_step; k++) {
            const __m512i isum = _mm512_add_epi32(v[k], _mm512_set1_epi32(cb[b + k]));
            const __m512 dw = gather ? s[k] : _mm512_load_ps(sc[(b + k) % 16]);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(dx[b + k])), acc);
        }
    }
    _mm512_storeu_ps(out, acc);
}

/* decode16 with its constant arguments chosen from the weight's type and row length. */
COL_INLINE COL_T512Q void decode16_any(const col_matvec_job *j, const uint8_t *qx, uint32_t t, const uint8_t *base,
                                      const int64_t *off, int q4, uint32_t ahead, float *out)
{
    /* the gather's offsets are 32-bit; off[15] is the farthest row */
    const int gather = off[15] + 2 * (int64_t)(j->w.cols / QK) < COL_DECODE_GATHER_LIMIT;
    if (q4 && gather)
        decode16(j, qx, t, base, off, 1, 1, ahead, out);
    else if (q4)
        decode16(j, qx, t, base, off, 1, 0, ahead, out);
    else if (gather)
        decode16(j, qx, t, base, off, 0, 1, ahead, out);
    else
        decode16(j, qx, t, base, off, 0, 0, ahead, out);
}

/* Rows [r0, r1) of tokens [t0, t1): whole tiles of 16 rows from 16 distant places of the share (one
 * memory stream each), then the rows left over in one tile; each tile for every token in turn, so
 * a few tokens read its rows from L1 after the first. */
static COL_T512Q void rows_decode(const col_matvec_job *j, const uint8_t *qx, uint32_t t0, uint32_t t1, uint64_t r0,
                                 uint64_t r1, int q4, uint32_t ahead)
{
    const uint64_t rb = col_dtype_row_bytes(j->w.dtype, j->w.cols), rows = j->w.rows;
    const uint64_t n16 = (r1 - r0) / 16;
    const uint8_t *data = (const uint8_t *)j->w.data;
    int64_t off[16];
    float out[16];
    /* lane l: row COL_DECODE_ADJACENT * i + l % COL_DECODE_ADJACENT of stream l / COL_DECODE_ADJACENT */
    enum { P = COL_DECODE_ADJACENT };
    uint64_t at[16];
    for (uint64_t l = 0; l < 16; l++) at[l] = l / P * P * n16 + l % P;
    for (int l = 0; l < 16; l++) off[l] = (int64_t)(at[l] * rb);
    for (uint64_t i = 0; i < n16; i++)
        for (uint32_t t = t0; t < t1; t++) {
            decode16_any(j, qx, t, data + (r0 + P * i) * rb, off, q4, ahead, out);
            float *y = j->y + (uint64_t)t * rows;
            for (int l = 0; l < 16; l++) y[r0 + P * i + at[l]] = out[l];
        }
    const uint64_t rest = r0 + 16 * n16, nr = r1 - rest;
    if (nr == 0) return;
    for (uint64_t l = 0; l < 16; l++) off[l] = (int64_t)((l < nr ? l : nr - 1) * rb);
    for (uint32_t t = t0; t < t1; t++) {
        decode16_any(j, qx, t, data + rest * rb, off, q4, ahead, out);
        memcpy(j->y + (uint64_t)t * rows + rest, out, nr * sizeof *out);
    }
}

/* ---- decode: weights stored in 8-row panels -------------------------------------------------- */

enum { STORED_STREAMS_MAX = 8 }; /* col_decode_tuning.stored_streams: at most 8 panels a tile */

/* Activations of block k placed to match a 64-byte load of a stored panel, which holds the 8 rows'
 * 4-byte groups g (lanes 0-7) and g + 1 (lanes 8-15): q8_0 x[i] lanes 0-7 the token's group 2i of
 * the block, lanes 8-15 group 2i + 1; q4_0 x[0..1] likewise from the block's low half (the low
 * nibbles' elements), x[2..3] from its high half. */
COL_INLINE COL_T512Q void stored_x(const int8_t *xq, uint64_t nb, uint64_t k, int q4, __m512i *x)
{
    const __m512i two = _mm512_set1_epi32(2);
    const __m512i i0 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), i1 = _mm512_add_epi32(i0, two);
    if (q4) {
        const uint8_t *lo = (const uint8_t *)xq + col_xq_pos(COL_DTYPE_Q4_0, nb, k, 0);
        const uint8_t *hi = (const uint8_t *)xq + col_xq_pos(COL_DTYPE_Q4_0, nb, k, 16);
        const __m512i l = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)lo));
        const __m512i h = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)hi));
        x[0] = _mm512_permutexvar_epi32(i0, l), x[1] = _mm512_permutexvar_epi32(i1, l);
        x[2] = _mm512_permutexvar_epi32(i0, h), x[3] = _mm512_permutexvar_epi32(i1, h);
    } else {
        const __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(xq + QK * k)));
        const __m512i i2 = _mm512_add_epi32(i1, two), i3 = _mm512_add_epi32(i2, two);
        x[0] = _mm512_permutexvar_epi32(i0, v), x[1] = _mm512_permutexvar_epi32(i1, v);
        x[2] = _mm512_permutexvar_epi32(i2, v), x[3] = _mm512_permutexvar_epi32(i3, v);
    }
}

/* One stored block (pay: its 256 or 128 payload bytes) against stored_x's vectors: lane r < 8 row
 * r's exact sum over the block's even groups, lane 8 + r over its odd ones, without the block's
 * correction (q8_0 read as w + 128, q4_0 as the raw nibbles). */
COL_INLINE COL_T512Q __m512i stored_sums(const uint8_t *pay, const __m512i *x, int q4)
{
    __m512i s = _mm512_setzero_si512();
    if (q4) {
        const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i raw = _mm512_loadu_si512((const void *)(pay + 64 * h));
            s = _mm512_dpbusd_epi32(s, _mm512_and_si512(raw, low4), x[h]);
            s = _mm512_dpbusd_epi32(s, _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4), x[2 + h]);
        }
    } else {
        const __m512i bias = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            s = _mm512_dpbusd_epi32(s, _mm512_xor_si512(_mm512_loadu_si512((const void *)(pay + 64 * i)), bias), x[i]);
    }
    return s;
}

/* One token (qx: its activations) against the NP stored panels at rows pr[0..NP-1], into
 * y[pr[p] ..]: panels 2i and 2i + 1 share one vector of 16 outputs (their even and odd groups'
 * sums added by 256-bit halves), a last odd panel runs in 8 lanes. As the AVX2 tiles: every
 * panel's scales asked for at the start, every panel's next lines before any block's arithmetic. */
COL_INLINE COL_T512Q void stored_tile(const col_matvec_job *j, const uint8_t *qx, const uint64_t *pr, const int NP, float *y,
                                     uint32_t ahead, const int q4)
{
    const uint64_t n = j->w.cols, nb = n / QK, rb = col_dtype_row_bytes(j->w.dtype, n), bb = q4 ? 128 : 256;
    const int8_t *xq = (const int8_t *)qx;
    const float *dx = (const float *)(const void *)(qx + n);
    const int32_t *corr = (const int32_t *)(const void *)(qx + col_qrow_block_corrections(n));
    const uint8_t *sc[STORED_STREAMS_MAX], *pay[STORED_STREAMS_MAX]; /* each panel's scales, its payload */
    __m512 acc[STORED_STREAMS_MAX / 2];
    __m256 odd = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int p = 0; p < NP; p++) sc[p] = (const uint8_t *)j->w.data + pr[p] * rb, pay[p] = sc[p] + 16 * nb;
#pragma GCC unroll 8
    for (int p = 0; p < NP / 2; p++) acc[p] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int p = 0; p < NP; p++)
        for (uint64_t at = 0; at < 16 * nb; at += 64) _mm_prefetch((const char *)(sc[p] + at), _MM_HINT_T0);
    for (uint64_t k = 0; k < nb; k++) {
        if (ahead)
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++)
#pragma GCC unroll 4
                for (uint64_t at = 0; at < bb; at += 64) _mm_prefetch((const char *)(pay[p] + bb * k + at + ahead), _MM_HINT_T0);
        __m512i x[4];
        stored_x(xq, nb, k, q4, x);
        const __m512i ck = _mm512_set1_epi32(corr[k]);
        const __m512 dk = _mm512_set1_ps(dx[k]);
#pragma GCC unroll 8
        for (int p = 0; p < NP / 2; p++) {
            const __m512i a = stored_sums(pay[2 * p] + bb * k, x, q4), b = stored_sums(pay[2 * p + 1] + bb * k, x, q4);
            const __m512i halves = _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                                    _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
            const __m128i sa = _mm_loadu_si128((const __m128i *)(const void *)(sc[2 * p] + 16 * k));
            const __m128i sb = _mm_loadu_si128((const __m128i *)(const void *)(sc[2 * p + 1] + 16 * k));
            const __m512 dw = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(sa), sb, 1));
            acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(halves, ck)), _mm512_mul_ps(dw, dk), acc[p]);
        }
        if (NP % 2) {
            const __m512i a = stored_sums(pay[NP - 1] + bb * k, x, q4);
            const __m256i isum = _mm256_add_epi32(_mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1)),
                                                  _mm512_castsi512_si256(ck));
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sc[NP - 1] + 16 * k)));
            odd = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm512_castps512_ps256(dk)), odd);
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < NP / 2; p++) {
        _mm256_storeu_ps(y + pr[2 * p], _mm512_castps512_ps256(acc[p]));
        _mm256_storeu_ps(y + pr[2 * p + 1], _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p]), 1)));
    }
    if (NP % 2) _mm256_storeu_ps(y + pr[NP - 1], odd);
}

/* Rows [r0, r1) (whole panels) of every token, each tile for every token before the next tile
 * (its panels then come from L2 for the tokens after the first, where a token at a time read the
 * whole share from memory again for each): the share cut into S parts of whole panels as even as
 * they can be (S, a constant where inlined, at most STORED_STREAMS_MAX), tile i takes panel i of
 * each part that has one (the parts' last tile may be short). */
COL_INLINE COL_T512Q void stored_tokens(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint32_t ahead,
                                       const int q4, const int S)
{
    const uint64_t qb = col_qrow_bytes(j->w.cols), np = (r1 - r0) / 8;
    uint64_t from[STORED_STREAMS_MAX + 1], pr[STORED_STREAMS_MAX];
    for (int s = 0; s <= S; s++) from[s] = np * (uint64_t)s / (uint64_t)S;
    for (uint64_t i = 0;; i++) {
        int tile = 0;
        for (int s = 0; s < S; s++)
            if (from[s] + i < from[s + 1]) pr[tile++] = r0 + 8 * (from[s] + i);
        if (tile == 0) break;
        for (uint32_t t = 0; t < j->n_tokens; t++) {
            float *y = j->y + (uint64_t)t * j->w.rows;
            const uint8_t *x = qx + t * qb;
            switch (tile) {
#define TILE(c) \
    case c: \
        if (c <= S) stored_tile(j, x, pr, c, y, ahead, q4); /* no code for tiles past S */ \
        break;
                TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7) TILE(8)
#undef TILE
            default: break;
            }
        }
    }
}

/* stored_tokens with the tuning's panels a tile, each count its own code. */
COL_INLINE COL_T512Q void stored_tokens_tuned(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1,
                                             col_decode_tuning tune, const int q4)
{
    if (tune.stored_streams == 8)
        stored_tokens(j, qx, r0, r1, tune.stored, q4, 8);
    else
        stored_tokens(j, qx, r0, r1, tune.stored, q4, 4);
}

COL_T512Q void col_rows_int8_avx512(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint8_t *stage,
                                   uint64_t stage_bytes, col_decode_tuning tune)
{
    const int q4 = col_block_kind(j->w.dtype) == COL_DTYPE_Q4_0;
    const int stored = is_panel_dtype(j->w.dtype);
    if (j->n_tokens >= (stored ? COL_STORED_MIN_TOKENS : COL_PANEL_MIN_TOKENS) && stage && stage_bytes >= col_int8_stage_bytes()) {
        rows_panels(j, qx, r0, r1, stage, q4, stored);
        return;
    }
    /* one token of q4_0 takes the tile the CPU decodes faster with (int16 sums in 256-bit vectors on
     * Intel, these tiles on AMD); from 2 tokens these are ahead (performance.md, "q4_0 decode from
     * stored panels") */
    if (stored && q4 && j->n_tokens == 1 && !tune.q4_zmm)
        col_rows_int8_panels_avx2(j, qx, r0, r1, tune.q, 0); /* one token: vpdpbusd is not used */
    else if (stored && q4)
        stored_tokens_tuned(j, qx, r0, r1, tune, 1);
    else if (stored)
        stored_tokens_tuned(j, qx, r0, r1, tune, 0);
    else
        rows_decode(j, qx, 0, j->n_tokens, r0, r1, q4, tune.q);
}

#endif
