/*
 * kernels_x86.c - the AVX2 and AVX-512 paths: products in register tiles, attention heads, the
 * SwiGLU gate, bf16 and f16 rounding; and on AVX2 (for AVX-512 pools too) RMSNorm rows and scaled
 * adds, which give the portable loops' bits.
 *
 * Compiled with function target attributes, not -march flags, so the file builds for any x86-64
 * (and elsewhere to the one function saying there is no SIMD path); the pool runs this code only
 * where CPUID found the instructions (col_detect_isa).
 *
 * A tile computes NR rows x NT tokens of one product, one vector accumulator per output walked
 * left to right over the row, reduced in a fixed order (lane i + i+8, then i + i+4, i + i+2, the
 * last two) by a transpose tree that makes exactly those additions for 16 (or 8) outputs at once,
 * then the scalar tail in order. Decode tiles take 8 distant rows of the thread's share (8 streams
 * through memory); batch tiles take 6 (AVX-512) or 3 (AVX2) neighbouring rows x 4 tokens, so each
 * weight vector loaded feeds 4 tokens (AVX2 walks them a block of rows at a time, rows_batch_avx2).
 * Tiles only interleave independent accumulators, so neither
 * the tile shape, the batch size nor the thread count changes an output's bits: a prefill equals
 * the same tokens stepped. Quantised rows run in block order with rows in the lanes
 * (kernels_int8_avx512.c, kernels_int8_avx2.c), the bits of col_dotq_blocks.
 *
 * The AVX-512 attention kernel runs up to four query heads of a KV head together, so each key and
 * value read serves all of them; exp16, a vector exp within 2 ulp of expf, serves its softmax and
 * the SwiGLU gate. AVX2 runs the heads one at a time with the portable softmax.
 */
#include "kernels_internal.h"
#include "transpose_x86.h"

#include <math.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

/* Bytes ahead of a decode tile's weight loads that it prefetches each row (col_decode_tuning_here):
 * the best distance is the machine's. On Intel (Emerald Rapids) 1 KiB for float rows and 2 KiB for
 * q8_0/q4_0 payloads, whose arithmetic per byte leaves the prefetch more time; on AMD (Zen 4) 256
 * bytes for both, where those distances made decode products 1.04-1.34x slower. */
#ifndef COL_PREFETCH_AHEAD
#define COL_PREFETCH_AHEAD 1024
#endif
#ifndef COL_PREFETCH_AHEAD_Q
#define COL_PREFETCH_AHEAD_Q 2048
#endif
#ifndef COL_PREFETCH_AHEAD_AMD
#define COL_PREFETCH_AHEAD_AMD 256
#endif
#ifndef COL_STORED_AHEAD
#define COL_STORED_AHEAD 1024 /* the AVX-512 stored-panel tiles on Intel (its 2 KiB for rows measured slower there) */
#endif
#ifndef COL_STORED_AHEAD_AMD
#define COL_STORED_AHEAD_AMD 0 /* Zen 4's hardware prefetchers alone read the stored panels faster */
#endif
#ifndef COL_FLOAT_STREAMS_AMD
#define COL_FLOAT_STREAMS_AMD 4 /* col_decode_tuning.f_streams on AMD */
#endif
#ifndef COL_STORED_STREAMS
#define COL_STORED_STREAMS 4 /* col_decode_tuning.stored_streams on Intel with AMX and on AMD */
#endif
#ifndef COL_STORED_STREAMS_NO_AMX
#define COL_STORED_STREAMS_NO_AMX 8 /* col_decode_tuning.stored_streams on Intel without AMX */
#endif
#ifndef COL_Q4_ZMM_DECODE_NO_AMX
#define COL_Q4_ZMM_DECODE_NO_AMX 1 /* col_decode_tuning.q4_zmm on Intel without AMX */
#endif
#ifndef COL_Q4_ZMM_DECODE_AMD
#define COL_Q4_ZMM_DECODE_AMD 1 /* col_decode_tuning.q4_zmm on AMD */
#endif

/* ---- x86 SIMD paths ---------------------------------------------------------------------- */
#if defined(__x86_64__)


/* Fixed-order horizontal sum of 8 lanes: (0+4, 1+5, 2+6, 3+7), then pairs, then the last two. */
COL_INLINE COL_T2 float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Two adjacent floats (any alignment) repeated across the vector; memcpy, because
 * _mm256_broadcast_sd dereferences a double pointer and the pair is only 4-byte aligned. */
COL_INLINE COL_T2 __m256 broadcast_pair(const float *p)
{
    double d;
    memcpy(&d, p, sizeof d);
    return _mm256_castpd_ps(_mm256_set1_pd(d));
}

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

/* hsum8 of 8 vectors at once, bit for bit (the same additions in the same order, by a transpose
 * tree as in hsum16x16 below), out[k] = hsum8(acc[k]) for k < n (a constant after inlining, at
 * most 24): the end of every AVX2 tile, whose accumulators then stay in registers. out has room
 * for n rounded up to 8: whole vectors are stored, since a masked store (vmaskmovps) is slow on
 * AMD and the outputs' scalar reloads then wait for it. */
COL_INLINE COL_T2 void hsum8_many(const __m256 *acc, int n, float *out)
{
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
#pragma GCC unroll 3
    for (int k0 = 0; k0 < n; k0 += 8) {
        __m256 v[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) v[k] = k0 + k < n ? acc[k0 + k] : _mm256_setzero_ps();
        __m256 sums = _mm256_permutevar8x32_ps(hsum8x8(v), order);
        _mm256_storeu_ps(out + k0, sums);
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

/* hsum16x16 of 8 vectors (the same bits: a vector's lanes only ever meet each other): half the
 * shuffles. Lane 4L holds the sum of v[L], lane 4L + 1 that of v[4 + L]. */
COL_INLINE COL_T512 __m512 hsum16x8(const __m512 *v)
{
    __m512 s8[4], s4[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        s8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        s4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(s4[0]), _mm512_castps_pd(s4[1]));
    const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(s4[0]), _mm512_castps_pd(s4[1]));
    const __m512 s2 = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    return _mm512_add_ps(_mm512_shuffle_ps(s2, s2, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(s2, s2, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The sums of v[0 .. count) in lanes 0 .. count - 1 (count a constant after inlining, at most 16;
 * the lanes past it hold sums of whatever v holds there), by one tree: hsum16x8 up to 8. The
 * vectors go into the tree in the order its result lanes come out in, so no permutation (whose
 * index vector held a register across the tiles' loops and made gcc spill there). */
COL_INLINE COL_T512 __m512 hsum16_in_order(const __m512 *v, int count)
{
    __m512 w[16];
    if (count > 8) {
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) w[k] = v[k % 4 * 4 + k / 4]; /* lane 4L + q sums w[4q + L] */
        return hsum16x16(w);
    }
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) { /* lanes 4L, 4L + 1 sum w[L], w[4 + L] */
        w[l] = v[2 * l];
        w[4 + l] = v[2 * l + 1];
    }
    return _mm512_maskz_compress_ps(0x3333, hsum16x8(w));
}

/* out[k] = hsum16(acc[k]) for k < n (n a constant after inlining, at most 32): the end of a tile
 * whose outputs are not neighbours (decode's distant rows). One tree per 16 outputs, every index a
 * constant, so the accumulators stay in registers (a loop of horizontal sums kept them in a stack
 * array). */
COL_INLINE COL_T512 void hsum16_many(const __m512 *acc, int n, float *out)
{
#pragma GCC unroll 2
    for (int k0 = 0; k0 < n; k0 += 16) {
        __m512 v[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) v[k] = k0 + k < n ? acc[k0 + k] : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(out + k0, lanes_below((uint64_t)(n - k0)), hsum16_in_order(v, n - k0 < 16 ? n - k0 : 16));
    }
}

/* The end of a tile of NR neighbouring rows x NT tokens (acc[a * NT + b]): the sums go straight
 * into y, token b's NR rows at y + b * ystride, under masks, instead of through a stack array and
 * one scalar store per output. Outputs taken token-major, so a token's rows are neighbouring lanes. */
COL_INLINE COL_T512 void hsum16_store_rows(const __m512 *acc, int NR, int NT, float *y, uint64_t ystride)
{
    const int n = NR * NT;
#pragma GCC unroll 2
    for (int k0 = 0; k0 < n; k0 += 16) {
        __m512 v[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) v[k] = k0 + k < n ? acc[(k0 + k) % NR * NT + (k0 + k) / NR] : _mm512_setzero_ps();
        const __m512 sums = hsum16_in_order(v, n - k0 < 16 ? n - k0 : 16);
#pragma GCC unroll 8
        for (int b = 0; b < NT; b++) {
            const int lo = b * NR - k0, hi = lo + NR; /* token b's lanes, before clipping to 0 .. 15 */
            if (hi <= 0 || lo >= 16) continue;
            const uint32_t mask = (hi >= 16 ? 0xFFFFu : (1u << hi) - 1u) & ~(lo <= 0 ? 0u : (1u << lo) - 1u);
            /* lane l is output k0 + l: row k0 + l - b * NR of token b; masked lanes are not touched */
            _mm512_mask_storeu_ps(y + ((int64_t)b * (int64_t)ystride + k0 - b * NR), (__mmask16)mask, sums);
        }
    }
}

COL_INLINE COL_T2 __m256 load8(const uint8_t *row, uint32_t dtype, uint64_t i)
{
    if (dtype == COL_DTYPE_F32) return _mm256_loadu_ps((const float *)row + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (dtype == COL_DTYPE_F16) return _mm256_cvtph_ps(h);
    /* bf16 into f32's high halves by one in-lane shuffle of h in both halves: vpmovzxwd + vpslld
     * were two vector operations, and on Zen 1 they bounded bf16 decode (docs/performance.md) */
    const __m256i both = _mm256_broadcastsi128_si256(h);
    const __m256i high = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                          -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(both, high));
}

COL_INLINE COL_T512 __m512 load16(const uint8_t *row, uint32_t dtype, uint64_t i)
{
    if (dtype == COL_DTYPE_F32) return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (dtype == COL_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Scalar tail of one output, in order, after the vector part `s`: columns [i, n), the row's
 * weights from column k0 at `row`. Only called when there is a tail: a call into this non-VEX code
 * from an AVX-512 tile costs an SSE/AVX transition. */
static float tail_loop(float s, const uint8_t *row, uint32_t dtype, const float *x, uint64_t i, uint64_t n, uint64_t k0)
{
    for (; i < n; i++) s += col_load_elem(row, dtype, i - k0) * x[i];
    return s;
}
static inline __attribute__((always_inline)) float tail(float s, const uint8_t *row, uint32_t dtype, const float *x,
                                                         uint64_t i, uint64_t n, uint64_t k0)
{
    return i < n ? tail_loop(s, row, dtype, x, i, n, k0) : s;
}

/* Tiles. A tile computes NR rows x NT tokens (tokens t .. t+NT-1) of one product; its rows are
 * r, r + step, ..., r + (NR-1) * step. Decode (one token) takes its rows from NR distant places
 * of the thread's share (step = share / NR), so each row is a separate stream through memory:
 * that keeps enough cache-line misses in flight for one core to approach the machine's read
 * bandwidth, which a single front-to-back stream per core does not. Batches take neighbouring rows (step 1) so each loaded weight vector feeds NT
 * tokens. Every (row, token) output is the same sequence of operations whatever the tile, so
 * neither the tile shape, the batch size nor the thread count changes a bit. */
#define MAX_TILE_ROWS 8
#define MAX_TILE 24 /* NR * NT */
#define MAX_TILE_TOKENS 8

/* A batch tile reads its rows from memory in its first token pass and from cache in the others,
 * and the hardware prefetcher does not run ahead from one tile's rows into the next. So each token
 * pass of a tile (tokens [t, t + NT) of n_tokens, a tile's only pass too) prefetches its share of
 * the next tile's bytes into L2, spread over the steps of its k loop, and the next tile's first
 * pass finds its rows there: as many lines a step as cover the share, at most NEXT_TILE_MAX_LINES
 * (an f32 tile of 6 rows in one pass asks for the first two thirds). Prefetches change no bits. */
typedef struct next_tile_prefetch {
    const char *at, *end;
    uint64_t per; /* lines a step */
} next_tile_prefetch;
#define NEXT_TILE_MAX_LINES 4

/* The slice of the next tile's bytes for the pass over tokens [t, t + NT) of a tile and its lines
 * a step: none for decode (one token, distant rows, prefetched ahead), rows shorter than a step,
 * or the last tile. */
COL_INLINE next_tile_prefetch next_tile_slice(const col_matvec_job *j, uint64_t r, uint64_t step, int NR, int NT,
                                              uint32_t t, uint64_t rb, uint64_t steps)
{
    next_tile_prefetch pf = {NULL, NULL, 0};
    if ((NT == 1 && j->n_tokens == 1) || step != 1 || steps == 0 || r + 2 * (uint64_t)NR > j->w.rows) return pf;
    const uint64_t units = j->n_tokens, tile = (uint64_t)NR * rb;
    const char *next = (const char *)j->w.data + (r + (uint64_t)NR) * rb;
    pf.at = next + (tile * t / units & ~(uint64_t)63);
    pf.end = next + tile * (t + (uint64_t)NT) / units;
    const uint64_t lines = (uint64_t)(pf.end - pf.at + 63) / 64;
    pf.per = (lines + steps - 1) / steps;
    if (pf.per > NEXT_TILE_MAX_LINES) pf.per = NEXT_TILE_MAX_LINES;
    return pf;
}

/* One step of the k loop: the slice's next `per` lines, those that are left. */
COL_INLINE void next_tile_step(next_tile_prefetch *pf)
{
    for (uint64_t l = 0; l < pf->per && pf->at < pf->end; l++) {
        _mm_prefetch(pf->at, _MM_HINT_T1);
        pf->at += 64;
    }
}

/* A tile for float weights: one vector accumulator per output, walked left to right. */
COL_INLINE COL_T2 void tile_f_avx2(const col_matvec_job *j, uint64_t r, uint64_t step, int NR, int NT, uint32_t t,
                                   uint32_t dtype, uint32_t ahead, next_tile_prefetch pf_in)
{
    const col_weight *w = &j->w;
    uint64_t n = w->cols, rb = col_dtype_row_bytes(dtype, n), esize = dtype == COL_DTYPE_F32 ? 4 : 2;
    const uint8_t *row[MAX_TILE_ROWS];
    const float *x[MAX_TILE_TOKENS];
    __m256 acc[MAX_TILE];
    for (int a = 0; a < NR; a++) row[a] = (const uint8_t *)w->data + (r + (uint64_t)a * step) * rb;
    for (int b = 0; b < NT; b++) x[b] = j->x + (uint64_t)(t + b) * n;
#pragma GCC unroll 24
    for (int k = 0; k < NR * NT; k++) acc[k] = _mm256_setzero_ps();
    next_tile_prefetch pf = pf_in;
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        next_tile_step(&pf);
#pragma GCC unroll 8
        for (int a = 0; a < NR; a++) {
            if (NT == 1) _mm_prefetch((const char *)(row[a] + i * esize + ahead), _MM_HINT_T0);
            __m256 wv = load8(row[a], dtype, i);
#pragma GCC unroll 8
            for (int b = 0; b < NT; b++) acc[a * NT + b] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[b] + i), acc[a * NT + b]);
        }
    }
    float sums[(MAX_TILE + 7) / 8 * 8];
    hsum8_many(acc, NR * NT, sums);
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++)
            j->y[(uint64_t)(t + b) * w->rows + r + (uint64_t)a * step] = tail(sums[a * NT + b], row[a], dtype, x[b], i, n, 0);
}

/* Columns [k0, k1) of a tile (k0 a multiple of 16) whose weights are read from `w0`, row r's
 * column k0 in `dtype` with rows rb bytes apart (the job's own or a widened copy of them): the
 * lane sums start at zero for k0 = 0 and from `carry` (NR * NT vectors) otherwise; a block that
 * ends before the row does leaves them in `carry`, the last one sums them and writes the outputs.
 * carry may be NULL for a whole row. */
COL_INLINE COL_T512 void tile_f_avx512_cols(const col_matvec_job *j, uint64_t r, uint64_t step, int NR, int NT,
                                            uint32_t t, uint32_t dtype, const uint8_t *w0, uint64_t rb, uint64_t k0,
                                            uint64_t k1, __m512 *carry, next_tile_prefetch pf, uint32_t ahead)
{
    const col_weight *w = &j->w;
    uint64_t n = w->cols, esize = dtype == COL_DTYPE_F32 ? 4 : 2;
    const uint8_t *row[MAX_TILE_ROWS];
    const float *x[4];
    __m512 acc[MAX_TILE];
    for (int a = 0; a < NR; a++) row[a] = w0 + (uint64_t)a * step * rb;
    for (int b = 0; b < NT; b++) x[b] = j->x + (uint64_t)(t + b) * n;
#pragma GCC unroll 24
    for (int k = 0; k < NR * NT; k++) acc[k] = k0 == 0 || !carry ? _mm512_setzero_ps() : carry[k];
    uint64_t i = k0;
    for (; i + 16 <= k1; i += 16) {
        next_tile_step(&pf);
#pragma GCC unroll 8
        for (int a = 0; a < NR; a++) {
            /* decode reads each weight once: ask for lines ahead of the loads as well, which the
             * hardware prefetcher alone does not keep up with */
            if (NT == 1) _mm_prefetch((const char *)(row[a] + (i - k0) * esize + ahead), _MM_HINT_T0);
            __m512 wv = load16(row[a], dtype, i - k0);
#pragma GCC unroll 4
            for (int b = 0; b < NT; b++) acc[a * NT + b] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[b] + i), acc[a * NT + b]);
        }
    }
    if (k1 < n && carry) {
#pragma GCC unroll 24
        for (int k = 0; k < NR * NT; k++) carry[k] = acc[k];
        return;
    }
    if (step == 1 && i == n) {
        hsum16_store_rows(acc, NR, NT, j->y + (uint64_t)t * w->rows + r, w->rows);
        return;
    }
    float sums[MAX_TILE];
    hsum16_many(acc, NR * NT, sums);
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++)
            j->y[(uint64_t)(t + b) * w->rows + r + (uint64_t)a * step] = tail(sums[a * NT + b], row[a], dtype, x[b], i, n, k0);
}

COL_INLINE COL_T512 void tile_f_avx512(const col_matvec_job *j, uint64_t r, uint64_t step, int NR, int NT, uint32_t t,
                                       uint32_t dtype, uint32_t ahead)
{
    const uint64_t n = j->w.cols, rb = col_dtype_row_bytes(dtype, n);
    tile_f_avx512_cols(j, r, step, NR, NT, t, dtype, (const uint8_t *)j->w.data + r * rb, rb, 0, n, NULL,
                       next_tile_slice(j, r, step, NR, NT, t, rb, n / 16), ahead);
}

/* Columns [0, cols) of NR rows of 16-bit floats (rows rb bytes apart from `w0`) widened exactly to
 * f32 at `wide`, rows ws floats apart: a batch's token passes over a tile then load its weights
 * as f32, where widening them again in every pass took two vector operations a load on the
 * multiply-adds' two ports. */
COL_INLINE COL_T512 void widen_tile(const uint8_t *w0, uint64_t rb, int NR, uint32_t dtype, uint64_t cols, float *wide,
                                    uint64_t ws)
{
    for (int a = 0; a < NR; a++) {
        const uint8_t *row = w0 + (uint64_t)a * rb;
        float *out = wide + (uint64_t)a * ws;
        uint64_t i = 0;
        for (; i + 16 <= cols; i += 16) _mm512_storeu_ps(out + i, load16(row, dtype, i));
        for (; i < cols; i++) out[i] = col_load_elem(row, dtype, i);
    }
}

/* One token pass of a 6-row batch tile: NT of 4, 3, 2 or 1 tokens from t (a literal NT each). */
#define TILE_PASS_512(j, r, t, nt, dtype, w0, rb, k0, k1, carry, pf)                                               \
    do {                                                                                                          \
        switch (nt) {                                                                                             \
        case 4: tile_f_avx512_cols(j, r, 1, COL_BATCH_ROWS_512, 4, t, dtype, w0, rb, k0, k1, carry, pf, 0); break; \
        case 3: tile_f_avx512_cols(j, r, 1, COL_BATCH_ROWS_512, 3, t, dtype, w0, rb, k0, k1, carry, pf, 0); break; \
        case 2: tile_f_avx512_cols(j, r, 1, COL_BATCH_ROWS_512, 2, t, dtype, w0, rb, k0, k1, carry, pf, 0); break; \
        default: tile_f_avx512_cols(j, r, 1, COL_BATCH_ROWS_512, 1, t, dtype, w0, rb, k0, k1, carry, pf, 0); break; \
        }                                                                                                         \
    } while (0)

/* Walk rows [r0, r1) x all tokens in tiles. One token: NRD rows at a time from NRD streams, then
 * the rows left over one by one. Batches: NRB neighbouring rows x 4 tokens (then 3, 2, 1), then
 * the rows left over in tiles of 4 and 2 rows (where NRB is larger) and one by one, since a chunk
 * can end anywhere. TILE(NR, NT, r, step, t) must expand to a call with literal NR and NT. */
#define WALK_DECODE(TILE, NRD)                                                       \
    do {                                                                             \
        uint64_t q_ = (r1 - r0) / (NRD);                                             \
        for (uint64_t i_ = 0; i_ < q_; i_++) TILE(NRD, 1, r0 + i_, q_, 0);          \
        for (uint64_t r_ = r0 + q_ * (NRD); r_ < r1; r_++) TILE(1, 1, r_, 1, 0);     \
    } while (0)
#define WALK_TILES(TILE, NRD, NRB)                                                   \
    do {                                                                             \
        uint32_t nt_ = j->n_tokens;                                                  \
        if (nt_ == 1) {                                                              \
            WALK_DECODE(TILE, NRD);                                                  \
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

/* Batches on AVX2. Tiles of COL_BATCH_ROWS_AVX2 neighbouring rows x COL_BATCH_TOKENS_AVX2 tokens,
 * walked a block of rows at a time (about COL_ROWBLOCK_BYTES_AVX2 of weights, kept in L2): every
 * token pass runs over the block's tiles before the next pass, so the pass's tokens stay in L1 and
 * only the weights come from L2, where a tile walking all tokens before the next tile re-read every
 * token's row from L2 for each tile. */
#ifndef COL_BATCH_TOKENS_AVX2
#define COL_BATCH_TOKENS_AVX2 4
#endif
#ifndef COL_ROWBLOCK_BYTES_AVX2
#define COL_ROWBLOCK_BYTES_AVX2 (128 * 1024)
#endif

#define TILE_TOKENS_AVX2(NR, r, t, m, dtype, pf)                                                        \
    do {                                                                                                 \
        switch (m) {                                                                                     \
        case 8: if (8 <= COL_BATCH_TOKENS_AVX2) tile_f_avx2(j, r, 1, NR, 8, t, dtype, ahead, pf); break; \
        case 7: if (7 <= COL_BATCH_TOKENS_AVX2) tile_f_avx2(j, r, 1, NR, 7, t, dtype, ahead, pf); break; \
        case 6: if (6 <= COL_BATCH_TOKENS_AVX2) tile_f_avx2(j, r, 1, NR, 6, t, dtype, ahead, pf); break; \
        case 5: if (5 <= COL_BATCH_TOKENS_AVX2) tile_f_avx2(j, r, 1, NR, 5, t, dtype, ahead, pf); break; \
        case 4: tile_f_avx2(j, r, 1, NR, 4, t, dtype, ahead, pf); break;                                  \
        case 3: tile_f_avx2(j, r, 1, NR, 3, t, dtype, ahead, pf); break;                                  \
        case 2: tile_f_avx2(j, r, 1, NR, 2, t, dtype, ahead, pf); break;                                  \
        default: tile_f_avx2(j, r, 1, NR, 1, t, dtype, ahead, pf); break;                                 \
        }                                                                                                \
    } while (0)

/* Rows [r0, r1) of a batch: blocks of rows of about COL_ROWBLOCK_BYTES_AVX2, equal to a tile; each
 * tile pass of a block prefetches its share of the next block's bytes into L2 (one line per step at
 * most), so the next block's first pass finds its weights there. */
COL_INLINE COL_T2 void rows_batch_avx2(const col_matvec_job *j, uint64_t r0, uint64_t r1, uint32_t dtype, uint32_t ahead)
{
    enum { NR = COL_BATCH_ROWS_AVX2, NT = COL_BATCH_TOKENS_AVX2 };
    const uint32_t nt = j->n_tokens, passes = (nt + NT - 1) / NT;
    const uint64_t rb = col_dtype_row_bytes(dtype, j->w.cols);
    const next_tile_prefetch none = {NULL, NULL, 0};
    uint64_t block = COL_ROWBLOCK_BYTES_AVX2 / rb;
    block = block < NR ? NR : block;
    const uint64_t n_blocks = (r1 - r0 + block - 1) / block;
    block = ((r1 - r0 + n_blocks - 1) / n_blocks + NR - 1) / NR * NR;
    for (uint64_t b0 = r0; b0 < r1; b0 += block) {
        const uint64_t b1 = r1 - b0 < block ? r1 : b0 + block, tiles = (b1 - b0) / NR;
        const uint64_t n1 = r1 - b1 < block ? r1 : b1 + block;
        const char *next = (const char *)j->w.data + b1 * rb;
        const uint64_t next_bytes = (n1 - b1) * rb, shares = passes * tiles;
        for (uint32_t t = 0, p = 0; t < nt; t += NT, p++) {
            const uint32_t m = nt - t < NT ? nt - t : NT;
            uint64_t r = b0;
            for (uint64_t q = (uint64_t)p * tiles; r + NR <= b1; r += NR, q++) {
                next_tile_prefetch pf = {next + (next_bytes * q / shares & ~(uint64_t)63),
                                         next + next_bytes * (q + 1) / shares, 1};
                TILE_TOKENS_AVX2(NR, r, t, m, dtype, pf);
            }
            if (NR > 2 && r + 2 <= b1) { TILE_TOKENS_AVX2(2, r, t, m, dtype, none); r += 2; }
            for (; r < b1; r++) TILE_TOKENS_AVX2(1, r, t, m, dtype, none);
        }
    }
}


/* ---- bf16 panels (bf16x16, docs/format.md "bf16 panels") ------------------------------------ */

/* A panel keeps a pair of columns of its 16 rows in one 64-byte line, so a vector holds one pair of
 * 16 rows: tiles take NP panels x NT tokens with a row in each lane, and an output is one chain
 * over its row in column order, with no lane tree at its end. Decode tiles (one token) take NP
 * panels far apart in the thread's share (NP streams through memory), batch tiles neighbouring
 * ones, so each line loaded feeds NT tokens. */
#define PANEL_TILE_MAX 8

/* The panel tiles of rows [r0, r1) (whole panels): TILE(NP, NT, r, step, t), NPD panels for decode
 * and NPB x NTB for batches, the rest in smaller tiles. */
#define WALK_PANELS(TILE, NPD, NPB, NTB)                                                            \
    do {                                                                                            \
        const uint64_t P_ = COL_BF16_PANEL_ROWS, panels_ = (r1 - r0) / P_;                         \
        if (j->n_tokens == 1) {                                                                     \
            const uint64_t per_ = panels_ / (NPD);                                                  \
            for (uint64_t i_ = 0; i_ < per_; i_++) TILE(NPD, 1, r0 + i_ * P_, per_ * P_, 0);        \
            for (uint64_t r_ = r0 + per_ * (NPD) * P_; r_ < r1; r_ += P_) TILE(1, 1, r_, P_, 0);   \
        } else {                                                                                    \
            uint64_t r_ = r0;                                                                       \
            for (; r_ + (NPB) * P_ <= r1; r_ += (NPB) * P_) WALK_PANEL_TOKENS(TILE, NPB, NTB, r_);  \
            if ((NPB) > 2 && r_ + 2 * P_ <= r1) {                                                   \
                WALK_PANEL_TOKENS(TILE, 2, NTB, r_);                                                \
                r_ += 2 * P_;                                                                       \
            }                                                                                       \
            for (; r_ < r1; r_ += P_) WALK_PANEL_TOKENS(TILE, 1, NTB, r_);                          \
        }                                                                                           \
    } while (0)
#define WALK_PANEL_TOKENS(TILE, NP, NTB, r)                                                         \
    do {                                                                                            \
        const uint32_t nt_ = j->n_tokens;                                                           \
        uint32_t t_ = 0;                                                                            \
        for (; t_ + (NTB) <= nt_; t_ += (NTB)) TILE(NP, NTB, r, COL_BF16_PANEL_ROWS, t_);           \
        switch (nt_ - t_) {                                                                         \
        case 7: TILE(NP, 7, r, COL_BF16_PANEL_ROWS, t_); break;                                     \
        case 6: TILE(NP, 6, r, COL_BF16_PANEL_ROWS, t_); break;                                     \
        case 5: TILE(NP, 5, r, COL_BF16_PANEL_ROWS, t_); break;                                     \
        case 4: TILE(NP, 4, r, COL_BF16_PANEL_ROWS, t_); break;                                     \
        case 3: TILE(NP, 3, r, COL_BF16_PANEL_ROWS, t_); break;                                     \
        case 2: TILE(NP, 2, r, COL_BF16_PANEL_ROWS, t_); break;                                     \
        case 1: TILE(NP, 1, r, COL_BF16_PANEL_ROWS, t_); break;                                     \
        default: break;                                                                             \
        }                                                                                           \
    } while (0)

/* bf16 panels on AVX2: a panel's pair of 16 rows is two vectors (rows 0-7, 8-15). Exact: as the
 * AVX-512 tile, the same chain and so the same bits. */
COL_INLINE COL_T2 void tile_panel_f_avx2(const col_matvec_job *j, uint64_t r, uint64_t step, int NP, int NT, uint32_t t,
                                         uint32_t ahead)
{
    const uint64_t n = j->w.cols;
    const uint16_t *panel[PANEL_TILE_MAX];
    const float *x[MAX_TILE_TOKENS];
    __m256 acc[2 * PANEL_TILE_MAX * 4];
    for (int a = 0; a < NP; a++) panel[a] = (const uint16_t *)j->w.data + (r + (uint64_t)a * step) * n;
    for (int b = 0; b < NT; b++) x[b] = j->x + (uint64_t)(t + b) * n;
#pragma GCC unroll 16
    for (int k = 0; k < 2 * NP * NT; k++) acc[k] = _mm256_setzero_ps();
    const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
    for (uint64_t i = 0; i < n; i += 2) {
        __m256 even[2 * PANEL_TILE_MAX], odd[2 * PANEL_TILE_MAX];
#pragma GCC unroll 4
        for (int a = 0; a < NP; a++) {
            const uint16_t *line = panel[a] + COL_BF16_PANEL_ROWS * i;
            if (NT == 1) _mm_prefetch((const char *)line + ahead, _MM_HINT_T0);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(line + 16 * h));
                even[2 * a + h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                odd[2 * a + h] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
            }
        }
#pragma GCC unroll 4
        for (int b = 0; b < NT; b++) {
            const __m256 x0 = _mm256_set1_ps(x[b][i]), x1 = _mm256_set1_ps(x[b][i + 1]);
#pragma GCC unroll 8
            for (int h = 0; h < 2 * NP; h++) {
                acc[h * NT + b] = _mm256_fmadd_ps(even[h], x0, acc[h * NT + b]);
                acc[h * NT + b] = _mm256_fmadd_ps(odd[h], x1, acc[h * NT + b]);
            }
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < NT; b++)
#pragma GCC unroll 8
        for (int h = 0; h < 2 * NP; h++)
            _mm256_storeu_ps(j->y + (uint64_t)(t + b) * j->w.rows + r + (uint64_t)(h / 2) * step + 8 * (h % 2), acc[h * NT + b]);
}

COL_T2 void col_rows_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, col_decode_tuning tune, int form)
{
    const next_tile_prefetch none = {NULL, NULL, 0};
    const uint32_t dtype = j->w.dtype;
    if (is_bf16_panel(dtype)) {
#define T(NP, NT, r, step, t) tile_panel_f_avx2(j, r, step, NP, NT, t, tune.f)
        WALK_PANELS(T, 2, 1, 4);
#undef T
    } else if (is_panel_dtype(dtype)) {
        col_rows_int8_panels_avx2(j, qx, r0, r1, tune.q, form);
    } else if (is_block_dtype(dtype)) {
        col_rows_int8_avx2(j, qx, r0, r1, tune.q, form);
    } else if (j->n_tokens > 1) {
        switch (dtype) {
        case COL_DTYPE_F32: rows_batch_avx2(j, r0, r1, COL_DTYPE_F32, tune.f); break;
        case COL_DTYPE_F16: rows_batch_avx2(j, r0, r1, COL_DTYPE_F16, tune.f); break;
        case COL_DTYPE_BF16: rows_batch_avx2(j, r0, r1, COL_DTYPE_BF16, tune.f); break;
        default: break;
        }
    } else {
        switch (dtype) {
#define T(NR, NT, r, step, t) tile_f_avx2(j, r, step, NR, NT, t, COL_DTYPE_F32, tune.f, none)
        case COL_DTYPE_F32: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_AVX2); break;
#undef T
#define T(NR, NT, r, step, t) tile_f_avx2(j, r, step, NR, NT, t, COL_DTYPE_F16, tune.f, none)
        case COL_DTYPE_F16: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_AVX2); break;
#undef T
#define T(NR, NT, r, step, t) tile_f_avx2(j, r, step, NR, NT, t, COL_DTYPE_BF16, tune.f, none)
        case COL_DTYPE_BF16: WALK_TILES(T, COL_DECODE_STREAMS, COL_BATCH_ROWS_AVX2); break;
#undef T
        default: break;
        }
    }
}

/* Batches over long rows. A 6-row tile over all of a 2816-column row holds 66 KiB of weights,
 * more than L1, and would re-read them from L2 in every token pass. So rows of more than
 * COL_BATCH_KBLOCK columns are walked a block of that many columns at a time, the tiles' lane
 * accumulators carried from one block to the next (tile_f_avx512_cols), so every output gets
 * exactly the operations of a tile over the whole row. From COL_KBLOCK_GROUP_TOKENS tokens on, up
 * to COL_KBLOCK_TILES neighbouring tiles walk their blocks together (tiles_kblocked_avx512): each
 * column block of every tile runs before the next block, so the block's columns of the tokens,
 * read from L2, serve all of them instead of each tile streaming them again (from L3 once they
 * no longer fit L2). With fewer tokens the columns are small and a tile walks alone. */

/* Bytes of carried lane sums one tile of a batch of n_tokens needs: a 6 x 4 tile's 24 vectors
 * for each pass of 4 tokens of a chunk. */
uint64_t col_kblock_carry_bytes(uint32_t n_tokens)
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
    next_tile_prefetch pf = {NULL, NULL, 0};
    if (P < (uint32_t)NR || rn + (uint64_t)NR > j->w.rows) return pf;
    const uint32_t seg = p * (uint32_t)NR / P;
    const uint32_t q0 = (seg * P + (uint32_t)NR - 1) / (uint32_t)NR, q1 = ((seg + 1) * P + (uint32_t)NR - 1) / (uint32_t)NR;
    const uint64_t bytes = (k1 - k0) * esize;
    const char *base = (const char *)j->w.data + (rn + seg) * rb + k0 * esize;
    pf.at = base + (bytes * (p - q0) / (q1 - q0) & ~(uint64_t)63);
    pf.end = base + bytes * (p + 1 - q0) / (q1 - q0);
    pf.per = 1;
    if ((uint64_t)(pf.end - pf.at + 63) / 64 > steps) pf.at = pf.end;
    return pf;
}

/* Tiles r, r + NR, .. (n_tiles of them) over long rows: for each chunk of up to COL_KBLOCK_TOKENS
 * tokens, each column block of every tile before the next block. `carry` holds n_tiles *
 * col_kblock_carry_bytes(n_tokens) (64-byte aligned). Each tile-block's passes prefetch the next
 * tile-block's weights into L2 (next_block_slice): the next tile's in this block, else the first
 * tile's in the next block, else the next group's first. With `wide` (COL_WIDE_TILE_BYTES, 16-bit
 * weights only) each tile-block is widened to f32 there once for all its passes. */
COL_INLINE COL_T512 void tiles_kblocked_avx512(const col_matvec_job *j, uint64_t r, uint32_t n_tiles, uint32_t dtype,
                                               __m512 *carry, float *wide)
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
                const uint8_t *w0 = (const uint8_t *)j->w.data + rr * rb + k0 * esize;
                if (wide) widen_tile(w0, rb, NR, dtype, k1 - k0, wide, COL_BATCH_KBLOCK);
                for (uint32_t t = c0, p = 0; t < c1; t += 4, p++) {
                    const uint32_t m = c1 - t < 4 ? c1 - t : 4;
                    const next_tile_prefetch pf = next_block_slice(j, rn, NR, nk0, nk1, p, P, rb, esize, (k1 - k0) / 16);
                    __m512 *tile_carry = carry + ((uint64_t)g * P + p) * NR * 4;
                    if (wide)
                        TILE_PASS_512(j, rr, t, m, COL_DTYPE_F32, (const uint8_t *)wide, 4 * COL_BATCH_KBLOCK, k0, k1,
                                      tile_carry, pf);
                    else
                        TILE_PASS_512(j, rr, t, m, dtype, w0, rb, k0, k1, tile_carry, pf);
                }
            }
        }
    }
}

#define COL_KBLOCK_GROUP_TOKENS 24 /* fewer tokens: one tile at a time */

/* The whole tiles of rows [r0, r1) of a batch over long rows, in groups of as many tiles as the
 * thread's `carry` scratch (carry_bytes) holds, at most COL_KBLOCK_TILES. Returns the first row
 * not done: r0 when the scratch holds no tile (the caller's whole-row tiles give the same bits).
 * Not inlined: inlined into col_rows_avx512, it made gcc compile the short rows' tiles slower. */
static COL_T512 __attribute__((noinline)) uint64_t rows_kblocked_avx512(const col_matvec_job *j, uint64_t r0, uint64_t r1,
                                                                        uint32_t dtype, uint8_t *carry, uint64_t carry_bytes,
                                                                        float *wide)
{
    enum { NR = COL_BATCH_ROWS_512 };
    uint64_t fit = carry ? carry_bytes / col_kblock_carry_bytes(j->n_tokens) : 0;
    if (fit > COL_KBLOCK_TILES) fit = COL_KBLOCK_TILES;
    if (fit > 1 && j->n_tokens < COL_KBLOCK_GROUP_TOKENS) fit = 1;
    while (fit > 0 && r0 + NR <= r1) {
        const uint64_t tiles = (r1 - r0) / NR < fit ? (r1 - r0) / NR : fit;
        tiles_kblocked_avx512(j, r0, (uint32_t)tiles, dtype, (__m512 *)(void *)carry, wide);
        r0 += tiles * NR;
    }
    return r0;
}

/* The whole 6-row tiles of rows [r0, r1) of a batch of 16-bit floats over rows of at most
 * COL_BATCH_KBLOCK columns, each tile widened to f32 at `wide` once for all its token passes.
 * Returns the first row not done. */
static COL_T512 __attribute__((noinline)) uint64_t rows_widened_avx512(const col_matvec_job *j, uint64_t r0, uint64_t r1,
                                                                       uint32_t dtype, float *wide)
{
    enum { NR = COL_BATCH_ROWS_512 };
    const uint64_t n = j->w.cols, rb = col_dtype_row_bytes(dtype, n), ws = (n + 15) & ~(uint64_t)15;
    for (; r0 + NR <= r1; r0 += NR) {
        widen_tile((const uint8_t *)j->w.data + r0 * rb, rb, NR, dtype, n, wide, ws);
        for (uint32_t t = 0; t < j->n_tokens; t += 4) {
            const uint32_t m = j->n_tokens - t < 4 ? j->n_tokens - t : 4;
            TILE_PASS_512(j, r0, t, m, COL_DTYPE_F32, (const uint8_t *)wide, 4 * ws, 0, n, NULL,
                          next_tile_slice(j, r0, 1, NR, (int)m, t, rb, n / 16));
        }
    }
    return r0;
}

/* WALK_TILES on AVX-512, the decode tiles as tall as the CPU's tuning says (tune.f_streams). */
#define WALK_TILES_512(TILE)                                                                        \
    do {                                                                                            \
        if (j->n_tokens == 1 && tune.f_streams == 4)                                                \
            WALK_DECODE(TILE, 4);                                                                   \
        else                                                                                        \
            WALK_TILES(TILE, COL_DECODE_STREAMS, COL_BATCH_ROWS_512);                               \
    } while (0)

/* Float weights on AVX-512: batches over long rows in column blocks (rows_kblocked_avx512) for
 * whole 6-row tiles, 16-bit ones of tune.widen_tokens or more tokens widened a tile at a time
 * where the thread's scratch has room (`wide`), everything else (decode, the rows left over) by
 * WALK_TILES. */
#define WALK_FLOAT_512(TILE, dtype)                                                                 \
    do {                                                                                            \
        float *wide_ = (dtype) != COL_DTYPE_F32 && tune.widen_tokens && j->n_tokens >= tune.widen_tokens ? wide : NULL; \
        if (j->n_tokens > 1 && j->w.cols > COL_BATCH_KBLOCK)                                        \
            r0 = rows_kblocked_avx512(j, r0, r1, dtype, carry, float_carry, wide_);                 \
        else if (wide_)                                                                             \
            r0 = rows_widened_avx512(j, r0, r1, dtype, wide_);                                      \
        WALK_TILES_512(TILE);                                                                       \
    } while (0)

/* bf16 panels on AVX-512, exact: the pair split into its even and odd columns' f32 (a bf16 is an f32's high half), then
 * per token two fused multiply-adds with its two values broadcast, the even column's first. */
COL_INLINE COL_T512 void tile_panel_f_avx512(const col_matvec_job *j, uint64_t r, uint64_t step, int NP, int NT,
                                             uint32_t t, uint32_t ahead)
{
    const uint64_t n = j->w.cols;
    const uint16_t *panel[PANEL_TILE_MAX];
    const float *x[MAX_TILE_TOKENS];
    __m512 acc[MAX_TILE];
    for (int a = 0; a < NP; a++) panel[a] = (const uint16_t *)j->w.data + (r + (uint64_t)a * step) * n;
    for (int b = 0; b < NT; b++) x[b] = j->x + (uint64_t)(t + b) * n;
#pragma GCC unroll 24
    for (int k = 0; k < NP * NT; k++) acc[k] = _mm512_setzero_ps();
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    for (uint64_t i = 0; i < n; i += 2) {
        __m512 even[PANEL_TILE_MAX], odd[PANEL_TILE_MAX];
#pragma GCC unroll 8
        for (int a = 0; a < NP; a++) {
            const uint16_t *line = panel[a] + COL_BF16_PANEL_ROWS * i;
            if (NT == 1) _mm_prefetch((const char *)line + ahead, _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512((const void *)line);
            even[a] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            odd[a] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
        }
#pragma GCC unroll 8
        for (int b = 0; b < NT; b++) {
            const __m512 x0 = _mm512_set1_ps(x[b][i]), x1 = _mm512_set1_ps(x[b][i + 1]);
#pragma GCC unroll 8
            for (int a = 0; a < NP; a++) {
                acc[a * NT + b] = _mm512_fmadd_ps(even[a], x0, acc[a * NT + b]);
                acc[a * NT + b] = _mm512_fmadd_ps(odd[a], x1, acc[a * NT + b]);
            }
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NT; b++)
#pragma GCC unroll 8
        for (int a = 0; a < NP; a++)
            _mm512_storeu_ps(j->y + (uint64_t)(t + b) * j->w.rows + r + (uint64_t)a * step, acc[a * NT + b]);
}

/* bf16x16 rows [r0, r1) (whole panels) of job j, exact; one token in tiles of as many distant
 * panels as the CPU's float decode streams (tune.f_streams). */
static COL_T512 void rows_panels_f_avx512(const col_matvec_job *j, uint64_t r0, uint64_t r1, col_decode_tuning tune)
{
#define T(NP, NT, r, step, t) tile_panel_f_avx512(j, r, step, NP, NT, t, tune.f)
    if (j->n_tokens == 1 && tune.f_streams == 8)
        WALK_PANELS(T, 8, 3, 6);
    else
        WALK_PANELS(T, 4, 3, 6);
#undef T
}

/* Rows [r0, r1) of job j on AVX-512; `carry` (carry_bytes, may be NULL) is the thread's scratch
 * for batches over long rows. */
COL_T512 void col_rows_avx512(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint8_t *carry,
                             uint64_t carry_bytes, col_decode_tuning tune)
{
    /* float weights: the scratch's last COL_WIDE_TILE_BYTES for widened tiles, the rest for carried sums */
    uint64_t float_carry = carry_bytes;
    float *wide = NULL;
    if (carry && carry_bytes >= COL_WIDE_TILE_BYTES) {
        float_carry -= COL_WIDE_TILE_BYTES;
        wide = (float *)(void *)(carry + float_carry);
    }
    switch (j->w.dtype) {
#define T(NR, NT, r, step, t) tile_f_avx512(j, r, step, NR, NT, t, COL_DTYPE_F32, tune.f)
    case COL_DTYPE_F32: WALK_FLOAT_512(T, COL_DTYPE_F32); break;
#undef T
#define T(NR, NT, r, step, t) tile_f_avx512(j, r, step, NR, NT, t, COL_DTYPE_F16, tune.f)
    case COL_DTYPE_F16: WALK_FLOAT_512(T, COL_DTYPE_F16); break;
#undef T
#define T(NR, NT, r, step, t) tile_f_avx512(j, r, step, NR, NT, t, COL_DTYPE_BF16, tune.f)
    case COL_DTYPE_BF16: WALK_FLOAT_512(T, COL_DTYPE_BF16); break;
#undef T
    case COL_DTYPE_BF16X16: rows_panels_f_avx512(j, r0, r1, tune); break;
    case COL_DTYPE_Q8_0:
    case COL_DTYPE_Q4_0:
    case COL_DTYPE_Q8_0X8:
    case COL_DTYPE_Q4_0X8: col_rows_int8_avx512(j, qx, r0, r1, carry, carry_bytes, tune); break;
    default: break;
    }
}

/* ---- bf16 dot products (COL_REDUCTION_BF16_DOT) --------------------------------------------- */

#define COL_TBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,avx2,fma,f16c")))

/* With vdpbf16ps, where the CPU has AVX512-BF16. */
#define BF16DOT_TARGET COL_TBF16
#define BF16DOT_STEP(acc, w, x) _mm512_dpbf16_ps(acc, (__m512bh)(w), (__m512bh)(x))
#define BF16DOT_ROWS col_rows_bf16dot_avx512
#include "kernels_bf16dot_x86.h"

/* vdpbf16ps's DAZ on 32 bf16 values: one whose exponent field is zero becomes the zero of its sign. */
COL_INLINE COL_T512 __m512i flush_bf16x32(__m512i v)
{
    const __mmask32 tiny = _mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x7F80));
    return _mm512_mask_mov_epi16(v, tiny, _mm512_and_si512(v, _mm512_set1_epi16((short)0x8000)));
}

/* vdpbf16ps's FTZ on 16 sums. */
COL_INLINE COL_T512 __m512 flush16(__m512 v)
{
    const __m512i b = _mm512_castps_si512(v);
    const __mmask16 tiny = _mm512_testn_epi32_mask(b, _mm512_set1_epi32(0x7F800000));
    return _mm512_castsi512_ps(_mm512_mask_and_epi32(b, tiny, b, _mm512_set1_epi32((int)0x80000000u)));
}

/* vdpbf16ps in AVX-512 F/BW: per lane the odd pair's product added, then the even one's, each a
 * fused multiply-add (the product of two bf16 values is exact in f32), inputs and sums flushed as
 * the instruction does (dp8 on AVX2). A tile's repeated splits of one weight or activation vector
 * are the same expressions, which the compiler computes once. */
COL_INLINE COL_T512 __m512 dp16_flushed(__m512 acc, __m512i w, __m512i x)
{
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    w = flush_bf16x32(w);
    x = flush_bf16x32(x);
    acc = flush16(_mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, high)),
                                  _mm512_castsi512_ps(_mm512_and_si512(x, high)), acc));
    return flush16(_mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)),
                                   _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), acc));
}

/* The same tiles on AVX-512 CPUs without AVX512-BF16 (Skylake-SP to Ice Lake and Rocket Lake). */
#define BF16DOT_TARGET COL_T512
#define BF16DOT_STEP(acc, w, x) dp16_flushed(acc, w, x)
#define BF16DOT_ROWS col_rows_bf16dot_avx512f
#include "kernels_bf16dot_x86.h"

int col_has_avx512bf16(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
}

int col_has_avx_vnni(void)
{
    unsigned a, b, c, d;
    __builtin_cpu_init();
    /* CPUID leaf 7, sub-leaf 1: EAX bit 4 (clang 14's __builtin_cpu_supports does not know it) */
    return __builtin_cpu_supports("avx2") && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
}

/* vdpbf16ps's FTZ on 8 sums: one whose exponent field is zero becomes the zero of its sign (all
 * but the sign bit cleared where the field is zero). */
COL_INLINE COL_T2 __m256 flush8(__m256 v)
{
    const __m256i b = _mm256_castps_si256(v);
    const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7F800000)), _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_andnot_si256(_mm256_set1_epi32((int)0x80000000u), tiny), b));
}

/* vdpbf16ps's DAZ on 16 bf16 values, the same rule on 16-bit lanes. */
COL_INLINE COL_T2 __m256i flush_bf16x16(__m256i v)
{
    const __m256i tiny = _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7F80)), _mm256_setzero_si256());
    return _mm256_andnot_si256(_mm256_andnot_si256(_mm256_set1_epi16((short)0x8000), tiny), v);
}

/* Lanes 8h .. 8h + 7 of one step of a bf16 dot product on AVX2: 8 pairs of weights and
 * activations (32 bytes each), the odd product added, then the even one, each a fused
 * multiply-add and a flush, as vdpbf16ps does. A tile's repeated flushes and splits of one weight
 * or activation vector are the same expressions, which the compiler computes once. */
COL_INLINE COL_T2 __m256 dp8(__m256 acc, __m256i w, __m256i x)
{
    const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
    w = flush_bf16x16(w);
    x = flush_bf16x16(x);
    acc = flush8(_mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w, high)),
                                 _mm256_castsi256_ps(_mm256_and_si256(x, high)), acc));
    return flush8(_mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
                                  _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), acc));
}

/* bf16 dot products over panels on AVX2, NP panels x NT tokens: dp8 with a panel's rows in the
 * lanes and the token's pair broadcast, the chain col_dot_bf16_panel_portable defines. */
COL_INLINE COL_T2 void tile_panel_dp_avx2(const col_matvec_job *j, const uint16_t *xp, uint64_t r, uint64_t step, int NP,
                                          int NT, uint32_t t)
{
    const uint64_t n = j->w.cols;
    const uint16_t *panel[PANEL_TILE_MAX];
    const uint32_t *x[MAX_TILE_TOKENS];
    __m256 acc[2 * PANEL_TILE_MAX * 4];
    for (int a = 0; a < NP; a++) panel[a] = (const uint16_t *)j->w.data + (r + (uint64_t)a * step) * n;
    for (int b = 0; b < NT; b++) x[b] = (const uint32_t *)(const void *)(xp + (uint64_t)(t + b) * n);
#pragma GCC unroll 16
    for (int k = 0; k < 2 * NP * NT; k++) acc[k] = _mm256_setzero_ps();
    for (uint64_t q = 0; q < n / 2; q++) {
        __m256i w[2 * PANEL_TILE_MAX];
#pragma GCC unroll 8
        for (int h = 0; h < 2 * NP; h++)
            w[h] = _mm256_loadu_si256((const __m256i *)(const void *)(panel[h / 2] + 2 * COL_BF16_PANEL_ROWS * q + 16 * (h % 2)));
#pragma GCC unroll 4
        for (int b = 0; b < NT; b++) {
            const __m256i xv = _mm256_set1_epi32((int)x[b][q]);
#pragma GCC unroll 8
            for (int h = 0; h < 2 * NP; h++) acc[h * NT + b] = dp8(acc[h * NT + b], w[h], xv);
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < NT; b++)
#pragma GCC unroll 8
        for (int h = 0; h < 2 * NP; h++)
            _mm256_storeu_ps(j->y + (uint64_t)(t + b) * j->w.rows + r + (uint64_t)(h / 2) * step + 8 * (h % 2), acc[h * NT + b]);
}

/* One block of 32 columns of tile_dp_avx2: rows w[a] against tokens x[b]. */
COL_INLINE COL_T2 void block_dp_avx2(__m256 *lo, __m256 *hi, const uint16_t *const *w, const uint16_t *const *x, int NR,
                                     int NT)
{
#pragma GCC unroll 4
    for (int a = 0; a < NR; a++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)w[a]);
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(w[a] + 16));
#pragma GCC unroll 4
        for (int b = 0; b < NT; b++) {
            lo[a * NT + b] = dp8(lo[a * NT + b], w0, _mm256_loadu_si256((const __m256i *)(const void *)x[b]));
            hi[a * NT + b] = dp8(hi[a * NT + b], w1, _mm256_loadu_si256((const __m256i *)(const void *)(x[b] + 16)));
        }
    }
}

/* A tile of bf16 dot products on AVX2, NR rows x NT tokens (at most 4 outputs): per block of 32
 * columns a row's two 32-byte halves against each token's, lanes 0-7 and 8-15 of vdpbf16ps's 16
 * in two accumulators, their sum reduced by hsum8 (= the 16-lane tree); a last, partial block
 * from zero-padded copies. Decode tiles take NR distant rows, batch tiles one row x NT tokens, so
 * each weight vector's flush and split serves NT tokens, and each activation's NR rows. */
COL_INLINE COL_T2 void tile_dp_avx2(const col_matvec_job *j, const uint16_t *xp, uint64_t r, uint64_t step, int NR,
                                    int NT, uint32_t t)
{
    const uint64_t n = j->w.cols;
    const uint16_t *row[4], *x[4], *wi[4], *xi[4];
    __m256 lo[4], hi[4];
    for (int a = 0; a < NR; a++) row[a] = (const uint16_t *)j->w.data + (r + (uint64_t)a * step) * n;
    for (int b = 0; b < NT; b++) x[b] = xp + (uint64_t)(t + b) * n;
#pragma GCC unroll 4
    for (int k = 0; k < NR * NT; k++) lo[k] = hi[k] = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
#pragma GCC unroll 4
        for (int a = 0; a < NR; a++) wi[a] = row[a] + i;
#pragma GCC unroll 4
        for (int b = 0; b < NT; b++) xi[b] = x[b] + i;
        block_dp_avx2(lo, hi, wi, xi, NR, NT);
    }
    if (i < n) { /* a last, partial block: zero pairs past n */
        uint16_t wpad[4][32] = {{0}}, xpad[4][32] = {{0}};
        for (int a = 0; a < NR; a++) {
            memcpy(wpad[a], row[a] + i, (n - i) * sizeof(uint16_t));
            wi[a] = wpad[a];
        }
        for (int b = 0; b < NT; b++) {
            memcpy(xpad[b], x[b] + i, (n - i) * sizeof(uint16_t));
            xi[b] = xpad[b];
        }
        block_dp_avx2(lo, hi, wi, xi, NR, NT);
    }
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++)
            j->y[(uint64_t)(t + b) * j->w.rows + r + (uint64_t)a * step] = hsum8(_mm256_add_ps(lo[a * NT + b], hi[a * NT + b]));
}

COL_T2 void col_rows_bf16dot_avx2(const col_matvec_job *j, const uint16_t *xp, uint64_t r0, uint64_t r1)
{
    if (is_bf16_panel(j->w.dtype)) {
#define T(NP, NT, r, step, t) tile_panel_dp_avx2(j, xp, r, step, NP, NT, t)
        WALK_PANELS(T, 2, 1, 4);
#undef T
        return;
    }
#define T(NR, NT, r, step, t) tile_dp_avx2(j, xp, r, step, NR, NT, t)
    WALK_TILES(T, 4, 1);
#undef T
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
 * lines of the keys `prefetch` positions ahead into L2 (into L1, the misses in flight were capped
 * by L1's fill buffers) and for its values a chunk ahead (group_values). The tree's loops are
 * unrolled and a full set of keys loads without per-key masks (key_scores), so the 16
 * accumulators stay in registers.
 * The result is a fixed function of a head's inputs, so a step and a prefill block agree bit for
 * bit. */
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

/* A head job's cached rows (col_head_job.kv_f16, a constant here: f16 when set): the address of
 * element `at` from `base`, a row's lines asked for with `hint`, and 16 elements from `at` under
 * mask m as f32 (a half widens exactly, so the sums are those of the rounded values in f32). */
COL_INLINE const char *kv_at(const void *base, uint64_t at, const int f16)
{
    return (const char *)base + at * (f16 ? sizeof(uint16_t) : sizeof(float));
}

#define COL_KV_PREFETCH_ROW(row, d, f16, hint)                                                  \
    do {                                                                                          \
        for (uint64_t b_ = 0; b_ < (uint64_t)(d) * ((f16) ? 2u : 4u); b_ += 64)                 \
            _mm_prefetch((row) + b_, (hint));                                                     \
    } while (0)

COL_INLINE COL_T512 __m512 kv_load16(const void *base, uint64_t at, __mmask16 m, const int f16)
{
    if (f16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)base + at));
    return _mm512_maskz_loadu_ps(m, (const float *)base + at);
}

/* The scores of heads h0 .. h0 + HC - 1 against the KC = 16 / HC keys from `key`, of which the
 * first `here` exist (all of them when `full`, a constant, is set: the loads then need no per-key
 * mask), scaled, in lane j * KC + k. */
COL_INLINE COL_T512 __m512 key_scores(const col_head_job *h, uint32_t h0, const uint32_t HC, const void *key,
                                      uint64_t step, uint32_t here, const int full, const int f16)
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
            kb[k] = kv_load16(key, (uint64_t)k * step + i, full || k < here ? m : 0, f16);
#pragma GCC unroll 4
        for (uint32_t j = 0; j < HC; j++) {
            const __m512 qb = _mm512_maskz_loadu_ps(m, h->q + (uint64_t)(h0 + j) * h->d + i);
#pragma GCC unroll 16
            for (uint32_t k = 0; k < KC; k++) acc[j * KC + k] = _mm512_fmadd_ps(qb, kb[k], acc[j * KC + k]);
        }
    }
    return _mm512_mul_ps(sum16x16(acc), _mm512_set1_ps(h->scale));
}

/* A decode step's values pass walks its keys in chunks of this many bytes of rows (an even number
 * of rows): each strip of dimensions walks a chunk before the next strip does, so the chunk is read
 * from memory once, and while a chunk's strips run, the next chunk's rows are fetched into L2 a
 * few lines a step; the first chunk is fetched while the scores pass reads its last keys. The
 * strips' chains wait in memory between chunks, so the sums are the same. */
#define COL_VALUES_CHUNK_BYTES (64u << 10)
#define COL_VALUES_MAX_STRIPS 8

COL_INLINE uint32_t values_chunk_rows(const col_head_job *h)
{
    const uint64_t rows = COL_VALUES_CHUNK_BYTES / (h->stride * (h->kv_f16 ? 2u : 4u)) & ~(uint64_t)1;
    return rows < 2 ? 2 : rows > h->n_keys ? h->n_keys : (uint32_t)rows;
}

/* A decode step's scores in parts (the keys cut into KC parts of `part`, step i scoring key i of
 * each of the first `here` parts): step i asks for each part's key `prefetch` keys ahead of it
 * (within the part), and stores its scores, head j's of part k in lane j * KC + k of sc. */
COL_INLINE void part_keys_ahead(const col_head_job *h, uint32_t part, uint32_t i, uint32_t here, const int f16)
{
    for (uint32_t k = 0; k < here; k++) {
        const uint64_t t = (uint64_t)k * part + i;
        if (t + h->prefetch < (uint64_t)(k + 1) * part && t + h->prefetch < h->n_keys)
            COL_KV_PREFETCH_ROW(kv_at(h->k, (t + h->prefetch) * h->stride, f16), h->d, f16, _MM_HINT_T1);
    }
}

COL_INLINE void part_scores_store(const float *sc, uint32_t h0, uint32_t HC, uint32_t KC, uint32_t n, uint32_t part,
                                  uint32_t i, uint32_t here, float *scores)
{
    for (uint32_t j = 0; j < HC; j++)
        for (uint32_t k = 0; k < here; k++) scores[(uint64_t)(h0 + j) * n + (uint64_t)k * part + i] = sc[j * KC + k];
}

/* A decode step's scores over few keys (from memory, at most COL_SCORES_PARTS_BYTES of them): the
 * keys cut into KC parts, step i scoring key i of each part, so one thread reads KC streams of
 * keys at once where neighbouring keys made one and waited on memory; each score is the same sums
 * (a tree's lanes only ever meet each other). The values' first chunk is fetched into L2 across
 * the last steps. More keys stream faster in one run, the hardware prefetchers ahead of it. */
#ifndef COL_SCORES_PARTS_BYTES
#define COL_SCORES_PARTS_BYTES (96u << 10)
#endif
COL_INLINE COL_T512 void group_scores_parts(const col_head_job *h, uint32_t h0, const uint32_t HC, float *scores,
                                            const int f16)
{
    const uint32_t KC = 16 / HC, n = h->n_keys, part = (n + KC - 1) / KC;
    const uint32_t row_lines = (h->d * (f16 ? 2u : 4u) + 63) / 64, warm = values_chunk_rows(h);
    const uint64_t warm_lines = (uint64_t)(warm < n ? warm : n) * row_lines;
    const uint32_t late = (warm + KC - 1) / KC < part ? (warm + KC - 1) / KC : part; /* the steps that fetch them */
    uint64_t fetched = 0;
    for (uint32_t i = 0; i < part; i++) {
        const uint32_t here = (n - i + part - 1) / part < KC ? (n - i + part - 1) / part : KC; /* parts with a key i */
        part_keys_ahead(h, part, i, here, f16);
        for (const uint64_t upto = i + late < part ? 0 : warm_lines * (i + late + 1 - part) / late; fetched < upto; fetched++)
            _mm_prefetch(kv_at(h->v, fetched / row_lines * h->stride, f16) + 64 * (fetched % row_lines), _MM_HINT_T1);
        const void *key = kv_at(h->k, (uint64_t)i * h->stride, f16);
        const uint64_t step = (uint64_t)part * h->stride;
        float sc[16];
        _mm512_storeu_ps(sc, here == KC ? key_scores(h, h0, HC, key, step, KC, 1, f16)
                                        : key_scores(h, h0, HC, key, step, here, 0, f16));
        part_scores_store(sc, h0, HC, KC, n, part, i, here, scores);
    }
}

/* Scores of heads h0 .. h0 + HC - 1 (HC = 1, 2 or 4) against every key, 16 / HC keys per tree;
 * head j's scores go to scores + j * n_keys. */
COL_INLINE COL_T512 void group_scores(const col_head_job *h, uint32_t h0, const uint32_t HC, float *scores,
                                      const int decode, const int f16)
{
    const uint32_t KC = 16 / HC, n = h->n_keys;
    const uint32_t warm = decode ? values_chunk_rows(h) : 0;
    for (uint32_t t0 = 0; t0 < n; t0 += KC) {
        const uint32_t here = n - t0 < KC ? n - t0 : KC;
        const void *key = kv_at(h->k, (uint64_t)t0 * h->stride, f16);
        if (decode && t0 + h->prefetch < n) /* the lines of the keys that far ahead */
            for (uint32_t k = 0; k < KC && t0 + h->prefetch + k < n; k++)
                COL_KV_PREFETCH_ROW(kv_at(h->k, (uint64_t)(t0 + h->prefetch + k) * h->stride, f16), h->d, f16, _MM_HINT_T1);
        for (uint32_t k = 0; decode && k < here; k++) /* the values' first chunk beside the last `warm` keys */
            if (t0 + k + warm >= n)
                COL_KV_PREFETCH_ROW(kv_at(h->v, (uint64_t)(t0 + k + warm - n) * h->stride, f16), h->d, f16, _MM_HINT_T1);
        const __m512 sc = here == KC ? key_scores(h, h0, HC, key, h->stride, KC, 1, f16)
                                     : key_scores(h, h0, HC, key, h->stride, here, 0, f16);
        float *dst = scores + (uint64_t)h0 * n + t0;
        if (HC == 1) {
            _mm512_mask_storeu_ps(dst, lanes_below(here), sc);
        } else if (HC == 2) {
            const __mmask8 m8 = (__mmask8)lanes_below(here);
            _mm256_mask_storeu_ps(dst, m8, _mm512_castps512_ps256(sc));
            _mm256_mask_storeu_ps(dst + n, m8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sc), 1)));
        } else {
            const __mmask8 m4 = (__mmask8)lanes_below(here);
            _mm_mask_storeu_ps(dst, m4, _mm512_castps512_ps128(sc));
            _mm_mask_storeu_ps(dst + n, m4, _mm512_extractf32x4_ps(sc, 1));
            _mm_mask_storeu_ps(dst + 2 * (uint64_t)n, m4, _mm512_extractf32x4_ps(sc, 2));
            _mm_mask_storeu_ps(dst + 3 * (uint64_t)n, m4, _mm512_extractf32x4_ps(sc, 3));
        }
    }
}

/* col_softmax_in_place in 16 lanes; the sink's exponential (the same exp16) joins the lane sum
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
 * dimensions per strip: keys [t0, t1) of each strip, its chains started from zero when `first`
 * and from carry[strip] otherwise, and written out when `last` (t1 = n_keys) or left in carry.
 * Rows [pf0, pf1) of the values are fetched into L2 meanwhile, spread over the range's steps;
 * with `ahead`, each strip also asks for its own lines that many rows ahead. */
COL_INLINE COL_T512 void group_values_range(const col_head_job *h, uint32_t h0, const uint32_t HC, const float *p,
                                            uint32_t t0, uint32_t t1, int first, int last, uint32_t ahead,
                                            uint32_t pf0, uint32_t pf1, __m512 (*carry)[32], float *out, const int f16)
{
    const uint32_t BP = 8 / HC, n = h->n_keys, strips = (h->d + 16 * BP - 1) / (16 * BP);
    const uint32_t row_lines = (h->d * (f16 ? 2u : 4u) + 63) / 64, steps = strips * ((t1 - t0 + 1) / 2);
    const uint64_t pf_lines = (uint64_t)(pf1 - pf0) * row_lines;
    const uint32_t per_step = steps ? (uint32_t)((pf_lines + steps - 1) / steps) : 0;
    uint32_t pf_row = pf0, pf_line = 0;
    for (uint32_t i0 = 0, strip = 0; i0 < h->d; i0 += 16 * BP, strip++) {
        __mmask16 m[8];
        __m512 even[16], odd[16]; /* [j * BP + b] */
#pragma GCC unroll 8
        for (uint32_t b = 0; b < BP; b++) m[b] = i0 + 16 * b < h->d ? lanes_below(h->d - i0 - 16 * b) : 0;
#pragma GCC unroll 16
        for (uint32_t a = 0; a < 16; a++) {
            even[a] = first ? _mm512_setzero_ps() : carry[strip][a];
            odd[a] = first ? _mm512_setzero_ps() : carry[strip][16 + a];
        }
        uint32_t t = t0;
        for (; t + 2 <= t1; t += 2) {
            const uint64_t r0 = (uint64_t)t * h->stride + i0, r1 = r0 + h->stride;
            if (ahead && t + ahead + 1 < n)
#pragma GCC unroll 8
                for (uint32_t b = 0; b < BP; b += f16 ? 2 : 1) { /* a line holds 32 halves */
                    _mm_prefetch(kv_at(h->v, r0 + (uint64_t)ahead * h->stride + 16 * b, f16), _MM_HINT_T0);
                    _mm_prefetch(kv_at(h->v, r1 + (uint64_t)ahead * h->stride + 16 * b, f16), _MM_HINT_T0);
                }
            for (uint32_t q = 0; q < per_step && pf_row < pf1; q++) {
                _mm_prefetch(kv_at(h->v, (uint64_t)pf_row * h->stride, f16) + 64 * pf_line, _MM_HINT_T1);
                if (++pf_line == row_lines) pf_line = 0, pf_row++;
            }
            __m512 x0[8], x1[8];
#pragma GCC unroll 8
            for (uint32_t b = 0; b < BP; b++) {
                x0[b] = kv_load16(h->v, r0 + 16 * b, m[b], f16);
                x1[b] = kv_load16(h->v, r1 + 16 * b, m[b], f16);
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
        if (t < t1) { /* only the last range can end on an odd key */
            const uint64_t r0 = (uint64_t)t * h->stride + i0;
#pragma GCC unroll 4
            for (uint32_t j = 0; j < HC; j++) {
                const __m512 p0 = _mm512_set1_ps(p[(uint64_t)j * n + t]);
#pragma GCC unroll 8
                for (uint32_t b = 0; b < BP; b++)
                    even[j * BP + b] = _mm512_fmadd_ps(p0, kv_load16(h->v, r0 + 16 * b, m[b], f16), even[j * BP + b]);
            }
        }
        if (!last) {
#pragma GCC unroll 16
            for (uint32_t a = 0; a < 16; a++) {
                carry[strip][a] = even[a];
                carry[strip][16 + a] = odd[a];
            }
            continue;
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

/* Outputs of heads h0 .. h0 + HC - 1 from their probabilities p + j * n_keys: in one range, or,
 * for a decode step's values (from memory), in chunks (COL_VALUES_CHUNK_BYTES). */
COL_INLINE COL_T512 void group_values(const col_head_job *h, uint32_t h0, const uint32_t HC, const float *p,
                                      float *out, const int decode, const int f16)
{
    const uint32_t n = h->n_keys, strips = (h->d + 16 * (8 / HC) - 1) / (16 * (8 / HC));
    if (!decode) {
        group_values_range(h, h0, HC, p, 0, n, 1, 1, 0, 0, 0, NULL, out, f16);
        return;
    }
    if (strips > COL_VALUES_MAX_STRIPS) { /* too many chains to carry (latent attention's rows): one range */
        group_values_range(h, h0, HC, p, 0, n, 1, 1, h->prefetch, 0, 0, NULL, out, f16);
        return;
    }
    const uint32_t rows = values_chunk_rows(h);
    __m512 carry[COL_VALUES_MAX_STRIPS][32];
    for (uint32_t t0 = 0; t0 < n; t0 += rows) {
        const uint32_t t1 = n - t0 > rows ? t0 + rows : n, next = n - t1 > rows ? t1 + rows : n;
        group_values_range(h, h0, HC, p, t0, t1, t0 == 0, t1 == n, 0, t1, next, carry, out, f16);
    }
}

/* `decode` (a constant): h->prefetch is set, so the job's cache comes from memory. */
COL_INLINE COL_T512 void attend_heads(const col_head_job *h, uint32_t h0, const uint32_t HC, float *scores, float *out,
                                      const int decode, const int f16)
{
    if (decode && (uint64_t)h->n_keys * h->d * (f16 ? 2u : 4u) <= COL_SCORES_PARTS_BYTES)
        group_scores_parts(h, h0, HC, scores, f16);
    else
        group_scores(h, h0, HC, scores, decode, f16);
    for (uint32_t j = 0; j < HC; j++)
        softmax_avx512(scores + (uint64_t)(h0 + j) * h->n_keys, h->n_keys, h->sinks ? h->sinks + h0 + j : NULL);
    group_values(h, h0, HC, scores + (uint64_t)h0 * h->n_keys, out, decode, f16);
}

COL_INLINE COL_T512 void attend_group(const col_head_job *h, float *scores, float *out, const int decode, const int f16)
{
    for (uint32_t h0 = 0; h0 < h->n_q;) {
        const uint32_t left = h->n_q - h0;
        if (left >= 4) {
            attend_heads(h, h0, 4, scores, out, decode, f16);
            h0 += 4;
        } else if (left >= 2) {
            attend_heads(h, h0, 2, scores, out, decode, f16);
            h0 += 2;
        } else {
            attend_heads(h, h0, 1, scores, out, decode, f16);
            h0 += 1;
        }
    }
}

COL_T512 void col_attend_group_avx512(const col_head_job *h, float *scores, float *out)
{
    if (h->kv_f16) {
        if (h->prefetch)
            attend_group(h, scores, out, 1, 1);
        else
            attend_group(h, scores, out, 0, 1);
    } else if (h->prefetch) {
        attend_group(h, scores, out, 1, 0);
    } else {
        attend_group(h, scores, out, 0, 0);
    }
}

/* exp(x), 8 at a time, for the AVX2 SwiGLU gate and softmax: exp16's reduction and polynomial,
 * then the scale 2^n in two exact halves (2^(n >> 1), then 2^(n - (n >> 1)), each a normal
 * number), so the one rounding is the last multiply's and gives 0, subnormals and inf as vscalefps
 * does. The clamp and a NaN as in exp16. */
COL_INLINE COL_T2 __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_set1_ps(150.0f), _mm256_max_ps(_mm256_set1_ps(-150.0f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n), bias = _mm256_set1_epi32(127);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
}

/* The first min(n, 8) lanes, as a maskload/maskstore mask. */
COL_INLINE COL_T2 __m256i lanes_below8(uint64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n < 8 ? (int)n : 8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The query heads of one KV group (col_attend_head) on AVX2, in col_attend_group_avx512's three
 * passes with half its registers, up to four heads at a time:
 * - scores: each (head, key) product accumulates in one vector over the blocks of 8 of q and the
 *   key (the last block masked); 8 such vectors (4 heads x 2 keys, 2 x 4 or 1 x 8) are summed by
 *   hsum8x8, the same additions for every vector, so a score depends only on its query and key;
 * - softmax per head in 8 lanes with exp8;
 * - values: each (head, block of 8 dimensions) output has two chains, even and odd keys, added at
 *   the end; 8 chains at once (4 heads x 1 block, 2 x 2 or 1 x 4).
 * A head's result is a fixed function of its inputs, whatever its group or the prefetch. */
COL_INLINE COL_T2 __m256 kv_load8(const void *base, uint64_t at, const int f16)
{
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)base + at)));
    return _mm256_loadu_ps((const float *)base + at);
}

/* The first `count` (< 8) of the 8 elements from `at` (m: their lanes), zeros after them. */
COL_INLINE COL_T2 __m256 kv_load8_part(const void *base, uint64_t at, uint32_t count, __m256i m, const int f16)
{
    if (f16) {
        uint16_t part[8] = {0};
        memcpy(part, (const uint16_t *)base + at, count * sizeof(uint16_t));
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)part));
    }
    return _mm256_maskload_ps((const float *)base + at, m);
}

COL_INLINE COL_T2 __m256 key_scores8(const col_head_job *h, uint32_t h0, const uint32_t HC, const void *key,
                                     uint64_t step, uint32_t here, const int full, const int f16)
{
    const uint32_t KC = 8 / HC;
    __m256 acc[8];
#pragma GCC unroll 8
    for (uint32_t a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= h->d; i += 8) {
        __m256 kb[8];
#pragma GCC unroll 8
        for (uint32_t k = 0; k < KC; k++)
            kb[k] = full || k < here ? kv_load8(key, (uint64_t)k * step + i, f16) : _mm256_setzero_ps();
#pragma GCC unroll 4
        for (uint32_t j = 0; j < HC; j++) {
            const __m256 qb = _mm256_loadu_ps(h->q + (uint64_t)(h0 + j) * h->d + i);
#pragma GCC unroll 8
            for (uint32_t k = 0; k < KC; k++) acc[j * KC + k] = _mm256_fmadd_ps(qb, kb[k], acc[j * KC + k]);
        }
    }
    if (i < h->d) { /* the last, partial block: zeros past d */
        const __m256i m = lanes_below8(h->d - i);
        __m256 kb[8];
#pragma GCC unroll 8
        for (uint32_t k = 0; k < KC; k++)
            kb[k] = full || k < here ? kv_load8_part(key, (uint64_t)k * step + i, h->d - i, m, f16) : _mm256_setzero_ps();
#pragma GCC unroll 4
        for (uint32_t j = 0; j < HC; j++) {
            const __m256 qb = _mm256_maskload_ps(h->q + (uint64_t)(h0 + j) * h->d + i, m);
#pragma GCC unroll 8
            for (uint32_t k = 0; k < KC; k++) acc[j * KC + k] = _mm256_fmadd_ps(qb, kb[k], acc[j * KC + k]);
        }
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* lane a: the sum of acc[a] */
    return _mm256_mul_ps(_mm256_permutevar8x32_ps(hsum8x8(acc), order), _mm256_set1_ps(h->scale));
}

/* A decode step's scores (keys read from memory): the keys cut into KC parts, step i scoring key i
 * of each part, so one thread reads KC streams of keys (and fetches KC of values) at once where
 * neighbouring keys made one; each score is the same sums (key_scores8 lane by lane). */
COL_INLINE COL_T2 void group_scores8_parts(const col_head_job *h, uint32_t h0, const uint32_t HC, float *scores,
                                           const int f16)
{
    const uint32_t KC = 8 / HC, n = h->n_keys, part = (n + KC - 1) / KC;
    for (uint32_t i = 0; i < part; i++) {
        const uint32_t here = (n - i + part - 1) / part < KC ? (n - i + part - 1) / part : KC; /* parts with a key i */
        part_keys_ahead(h, part, i, here, f16);
        for (uint32_t k = 0; k < here; k++) /* the values of these keys, for the values pass's strips */
            COL_KV_PREFETCH_ROW(kv_at(h->v, ((uint64_t)k * part + i) * h->stride, f16), h->d, f16, _MM_HINT_T0);
        const void *key = kv_at(h->k, (uint64_t)i * h->stride, f16);
        const uint64_t step = (uint64_t)part * h->stride;
        float sc[8];
        _mm256_storeu_ps(sc, here == KC ? key_scores8(h, h0, HC, key, step, KC, 1, f16)
                                        : key_scores8(h, h0, HC, key, step, here, 0, f16));
        part_scores_store(sc, h0, HC, KC, n, part, i, here, scores);
    }
}

COL_INLINE COL_T2 void group_scores8(const col_head_job *h, uint32_t h0, const uint32_t HC, float *scores, const int f16)
{
    const uint32_t KC = 8 / HC;
    if (h->prefetch) { /* a decode step's keys come from memory */
        group_scores8_parts(h, h0, HC, scores, f16);
        return;
    }
    for (uint32_t t0 = 0; t0 < h->n_keys; t0 += KC) {
        const uint32_t here = h->n_keys - t0 < KC ? h->n_keys - t0 : KC;
        const void *key = kv_at(h->k, (uint64_t)t0 * h->stride, f16);
        const __m256 sc = here == KC ? key_scores8(h, h0, HC, key, h->stride, KC, 1, f16)
                                     : key_scores8(h, h0, HC, key, h->stride, here, 0, f16);
        float *dst = scores + (uint64_t)h0 * h->n_keys + t0;
        if (HC == 1) {
            _mm256_maskstore_ps(dst, lanes_below8(here), sc);
        } else if (HC == 2) {
            const __m128i m4 = _mm256_castsi256_si128(lanes_below8(here));
            _mm_maskstore_ps(dst, m4, _mm256_castps256_ps128(sc));
            _mm_maskstore_ps(dst + h->n_keys, m4, _mm256_extractf128_ps(sc, 1));
        } else { /* head j's two scores are lanes 2j and 2j + 1 */
            const __m128 lo = _mm256_castps256_ps128(sc), hi = _mm256_extractf128_ps(sc, 1);
            const uint64_t n = h->n_keys;
            if (here == 2) {
                _mm_storel_pi((__m64 *)(void *)dst, lo);
                _mm_storeh_pi((__m64 *)(void *)(dst + n), lo);
                _mm_storel_pi((__m64 *)(void *)(dst + 2 * n), hi);
                _mm_storeh_pi((__m64 *)(void *)(dst + 3 * n), hi);
            } else {
                _mm_store_ss(dst, lo);
                _mm_store_ss(dst + n, _mm_movehl_ps(lo, lo));
                _mm_store_ss(dst + 2 * n, hi);
                _mm_store_ss(dst + 3 * n, _mm_movehl_ps(hi, hi));
            }
        }
    }
}

/* col_softmax_in_place in 8 lanes; the sink's exponential (the same exp8) joins the lane sum last. */
static COL_T2 void softmax_avx2(float *scores, uint32_t n, const float *sink)
{
    __m256 max = _mm256_set1_ps(sink ? *sink : -INFINITY);
    uint32_t t = 0;
    for (; t + 8 <= n; t += 8) max = _mm256_max_ps(_mm256_loadu_ps(scores + t), max);
    if (t < n) max = _mm256_max_ps(_mm256_blendv_ps(max, _mm256_maskload_ps(scores + t, lanes_below8(n - t)),
                                                    _mm256_castsi256_ps(lanes_below8(n - t))), max);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps(max, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const __m256 top = _mm256_set1_ps(_mm_cvtss_f32(m4));
    __m256 sum = _mm256_setzero_ps();
    for (t = 0; t + 8 <= n; t += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + t), top));
        sum = _mm256_add_ps(sum, e);
        _mm256_storeu_ps(scores + t, e);
    }
    if (t < n) {
        const __m256i m = lanes_below8(n - t);
        __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(scores + t, m), top)), _mm256_castsi256_ps(m));
        sum = _mm256_add_ps(sum, e);
        _mm256_maskstore_ps(scores + t, m, e);
    }
    if (sink)
        sum = _mm256_add_ps(sum, _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_set1_ps(*sink), top)),
                                               _mm256_castsi256_ps(lanes_below8(1))));
    const __m256 inv = _mm256_set1_ps(1.0f / hsum8(sum));
    for (t = 0; t + 8 <= n; t += 8) _mm256_storeu_ps(scores + t, _mm256_mul_ps(_mm256_loadu_ps(scores + t), inv));
    for (; t < n; t++) scores[t] *= _mm256_cvtss_f32(inv);
}

/* Keys [t0, t1) of the outputs of heads h0 .. h0 + HC - 1, from their probabilities
 * p + j * n_keys, over the 4 / HC blocks of 8 dimensions from i0 (all inside d when `full`, a
 * constant: plain loads). Each (head, dimension) keeps two chains, even and odd keys, in
 * neighbouring lanes: the value rows of keys t and t + 1 are interleaved by dimension (unpacklo:
 * dimensions 0, 1, 4, 5 of the block; unpackhi: 2, 3, 6, 7) and multiplied by the pair p[t],
 * p[t + 1] in one broadcast; hadd adds each dimension's even and odd chain at the last key. The
 * chains come from `carry` (8 vectors) unless t0 = 0, and go back to it unless t1 = n_keys, so
 * the keys may be walked in chunks with the same operations. t0 is even. */
COL_INLINE COL_T2 void values_pass8(const col_head_job *h, uint32_t h0, const uint32_t HC, const float *p, float *out,
                                    uint32_t i0, const int full, uint32_t t0, uint32_t t1, __m256 *carry, const int f16)
{
    const uint32_t BP = 4 / HC, n = h->n_keys;
    __m256i m[4];
    __m256 lo[4], hi[4]; /* [j * BP + b]: even and odd chains of dimensions 0, 1, 4, 5 and 2, 3, 6, 7 */
#pragma GCC unroll 4
    for (uint32_t b = 0; b < BP; b++)
        m[b] = full || i0 + 8 * b < h->d ? lanes_below8(h->d - i0 - 8 * b) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (uint32_t a = 0; a < 4; a++) {
        lo[a] = t0 ? carry[2 * a] : _mm256_setzero_ps();
        hi[a] = t0 ? carry[2 * a + 1] : _mm256_setzero_ps();
    }
#define COL_LOAD8(at, b)                                                                                  \
    (full ? kv_load8(h->v, at, f16)                                                                       \
          : i0 + 8 * (b) < h->d ? kv_load8_part(h->v, at, h->d - i0 - 8 * (b) < 8 ? h->d - i0 - 8 * (b) : 8, m[b], f16) \
                                : _mm256_setzero_ps())
    uint32_t t = t0;
    for (; t + 2 <= t1; t += 2) {
        const uint64_t r0 = (uint64_t)t * h->stride + i0, r1 = r0 + h->stride;
        if (h->prefetch && t + h->prefetch + 1 < n)
#pragma GCC unroll 4
            for (uint32_t b = 0; b < BP; b += f16 ? 4 : 2) { /* a line: 16 floats, 32 halves */
                _mm_prefetch(kv_at(h->v, r0 + (uint64_t)h->prefetch * h->stride + 8 * b, f16), _MM_HINT_T0);
                _mm_prefetch(kv_at(h->v, r1 + (uint64_t)h->prefetch * h->stride + 8 * b, f16), _MM_HINT_T0);
            }
        __m256 xl[4], xh[4];
#pragma GCC unroll 4
        for (uint32_t b = 0; b < BP; b++) {
            const __m256 x0 = COL_LOAD8(r0 + 8 * b, b), x1 = COL_LOAD8(r1 + 8 * b, b);
            xl[b] = _mm256_unpacklo_ps(x0, x1);
            xh[b] = _mm256_unpackhi_ps(x0, x1);
        }
#pragma GCC unroll 4
        for (uint32_t j = 0; j < HC; j++) {
            const __m256 pp = broadcast_pair(p + (uint64_t)j * n + t);
#pragma GCC unroll 4
            for (uint32_t b = 0; b < BP; b++) {
                lo[j * BP + b] = _mm256_fmadd_ps(pp, xl[b], lo[j * BP + b]);
                hi[j * BP + b] = _mm256_fmadd_ps(pp, xh[b], hi[j * BP + b]);
            }
        }
    }
    if (t < t1) { /* the last key, an even one: its odd partner's probability and values are zeros,
                   * which leave the odd chains as they are (a chain from +0 never holds -0) */
        const uint64_t r0 = (uint64_t)t * h->stride + i0;
        __m256 xl[4], xh[4];
#pragma GCC unroll 4
        for (uint32_t b = 0; b < BP; b++) {
            const __m256 x0 = COL_LOAD8(r0 + 8 * b, b);
            xl[b] = _mm256_unpacklo_ps(x0, _mm256_setzero_ps());
            xh[b] = _mm256_unpackhi_ps(x0, _mm256_setzero_ps());
        }
#pragma GCC unroll 4
        for (uint32_t j = 0; j < HC; j++) {
            const __m256 pp = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(_mm_load_ss(p + (uint64_t)j * n + t))));
#pragma GCC unroll 4
            for (uint32_t b = 0; b < BP; b++) {
                lo[j * BP + b] = _mm256_fmadd_ps(pp, xl[b], lo[j * BP + b]);
                hi[j * BP + b] = _mm256_fmadd_ps(pp, xh[b], hi[j * BP + b]);
            }
        }
    }
#undef COL_LOAD8
    if (t1 < n) {
#pragma GCC unroll 4
        for (uint32_t a = 0; a < 4; a++) {
            carry[2 * a] = lo[a];
            carry[2 * a + 1] = hi[a];
        }
        return;
    }
#pragma GCC unroll 4
    for (uint32_t j = 0; j < HC; j++)
#pragma GCC unroll 4
        for (uint32_t b = 0; b < BP; b++) {
            float *dst = out + (uint64_t)(h0 + j) * h->d + i0 + 8 * b;
            const __m256 sum = _mm256_hadd_ps(lo[j * BP + b], hi[j * BP + b]); /* dimensions 0..7: even + odd */
            if (full)
                _mm256_storeu_ps(dst, sum);
            else if (i0 + 8 * b < h->d)
                _mm256_maskstore_ps(dst, m[b], sum);
        }
}

/* Value rows are read in strips of 8 dimensions a pass, and rows of 128 floats lie 512 bytes
 * apart, in 8 of L1's 64 sets (64 rows' lines at most): so with rows that long the keys are walked
 * in chunks of COL_VALUES_KEYS, whose strips of COL_VALUES_WINDOW dimensions stay in L1 for all
 * the passes over them, each pass's chains carried from chunk to chunk. Shorter rows spread over
 * more sets, and a prefill block's 128 keys ran faster unchunked at head_dim 64. */
#define COL_VALUES_KEYS 32
#define COL_VALUES_WINDOW 128

COL_INLINE COL_T2 void group_values8(const col_head_job *h, uint32_t h0, const uint32_t HC, const float *p, float *out,
                                     const int f16)
{
    const uint32_t span = 8 * (4 / HC);
    const uint32_t chunk = h->d >= COL_VALUES_WINDOW ? COL_VALUES_KEYS : h->n_keys + 1; /* one chunk: all the keys */
    __m256 carry[COL_VALUES_WINDOW / 8][8];
    for (uint32_t w0 = 0; w0 < h->d; w0 += COL_VALUES_WINDOW) {
        const uint32_t w1 = h->d - w0 < COL_VALUES_WINDOW ? h->d : w0 + COL_VALUES_WINDOW;
        for (uint32_t t0 = 0; t0 < h->n_keys; t0 += chunk) {
            const uint32_t t1 = h->n_keys - t0 < chunk ? h->n_keys : t0 + chunk;
            uint32_t i0 = w0;
            for (; i0 + span <= w1; i0 += span) values_pass8(h, h0, HC, p, out, i0, 1, t0, t1, carry[(i0 - w0) / span], f16);
            if (i0 < w1) values_pass8(h, h0, HC, p, out, i0, 0, t0, t1, carry[(i0 - w0) / span], f16);
        }
    }
}

COL_INLINE COL_T2 void attend_heads8(const col_head_job *h, uint32_t h0, const uint32_t HC, float *scores, float *out,
                                     const int f16)
{
    group_scores8(h, h0, HC, scores, f16);
    for (uint32_t j = 0; j < HC; j++)
        softmax_avx2(scores + (uint64_t)(h0 + j) * h->n_keys, h->n_keys, h->sinks ? h->sinks + h0 + j : NULL);
    group_values8(h, h0, HC, scores + (uint64_t)h0 * h->n_keys, out, f16);
}

COL_INLINE COL_T2 void attend_group8(const col_head_job *h, float *scores, float *out, const int f16)
{
    for (uint32_t h0 = 0; h0 < h->n_q;) {
        const uint32_t left = h->n_q - h0;
        if (left >= 4) {
            attend_heads8(h, h0, 4, scores, out, f16);
            h0 += 4;
        } else if (left >= 2) {
            attend_heads8(h, h0, 2, scores, out, f16);
            h0 += 2;
        } else {
            attend_heads8(h, h0, 1, scores, out, f16);
            h0 += 1;
        }
    }
}

COL_T2 void col_attend_group_avx2(const col_head_job *h, float *scores, float *out)
{
    if (h->kv_f16)
        attend_group8(h, scores, out, 1);
    else
        attend_group8(h, scores, out, 0);
}

/* The SwiGLU gate of 8 values z (h1) and b (h3): z / (1 + exp8(-z)) * b. */
COL_INLINE COL_T2 __m256 swiglu8(__m256 z, __m256 b)
{
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
    return _mm256_mul_ps(_mm256_div_ps(z, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), b);
}

/* The SwiGLU gate as col_swiglu_gate_avx512's, 8 at a time with exp8, the tail under a mask (only
 * the tail: a masked store costs a dozen cycles on Zen 3). */
COL_T2 void col_swiglu_gate_avx2(float *h1, const float *h3, uint64_t n)
{
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(h1 + i, swiglu8(_mm256_loadu_ps(h1 + i), _mm256_loadu_ps(h3 + i)));
    if (i < n) {
        const __m256i m = lanes_below8(n - i);
        _mm256_maskstore_ps(h1 + i, m, swiglu8(_mm256_maskload_ps(h1 + i, m), _mm256_maskload_ps(h3 + i, m)));
    }
}

/* RMSNorm's scaling: out[i] = w[i] * (x[i] * inv) in 8 lanes, only the tail masked (a masked
 * store costs a dozen cycles on Zen 3). */
COL_INLINE COL_T2 void rmsnorm_scale(const float *x, const float *w, float inv_f, uint64_t n, float *out)
{
    const __m256 inv = _mm256_set1_ps(inv_f);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), inv)));
    if (i < n) {
        const __m256i m = lanes_below8(n - i);
        const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv);
        _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(_mm256_maskload_ps(w + i, m), v));
    }
}

/* col_rmsnorm_row: the sum's one chain as the definition (col_rmsnorm_inv), the scaling in 8 lanes. */
COL_T2 void col_rmsnorm_row_avx2(const float *x, const float *w, float eps, uint64_t n, float *out)
{
    rmsnorm_scale(x, w, col_rmsnorm_inv(x, eps, n), n, out);
}

/* col_rmsnorm_inv of the rows x + j * n, j < m (1..8), in lane j (lanes from m up repeat row
 * m - 1): per block of 8 elements the 8 rows' squares are transposed, so lane j adds its row's
 * squares one after the other, the chain of col_rmsnorm_inv; the last block's rows masked. */
COL_INLINE COL_T2 __m256 rmsnorm_inv_lanes(const float *x, uint64_t n, uint32_t m, float eps)
{
    const float *row[8];
    for (uint32_t j = 0; j < 8; j++) row[j] = x + (uint64_t)(j < m ? j : m - 1) * n;
    __m256 ss = _mm256_setzero_ps(), sq[8];
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m256 v = _mm256_loadu_ps(row[j] + i);
            sq[j] = _mm256_mul_ps(v, v);
        }
        col_transpose8(sq, sq);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) ss = _mm256_add_ps(ss, sq[c]);
    }
    if (i < n) {
        const __m256i mask = lanes_below8(n - i);
        for (int j = 0; j < 8; j++) {
            const __m256 v = _mm256_maskload_ps(row[j] + i, mask);
            sq[j] = _mm256_mul_ps(v, v);
        }
        col_transpose8(sq, sq);
        for (uint64_t c = 0; c < n - i; c++) ss = _mm256_add_ps(ss, sq[c]);
    }
    const __m256 mean = _mm256_add_ps(_mm256_div_ps(ss, _mm256_set1_ps((float)n)), _mm256_set1_ps(eps));
    return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(mean));
}

/* col_rmsnorm_rows: up to 8 rows at a time in the lanes of one sum (rmsnorm_inv_lanes); a last
 * single row by col_rmsnorm_row_avx2. */
COL_T2 void col_rmsnorm_rows_avx2(const float *x, const float *w, float eps, uint64_t n, uint32_t rows, float *out)
{
    uint32_t r = 0;
    for (; r + 1 < rows; r += 8) {
        const uint32_t m = rows - r < 8 ? rows - r : 8;
        float inv[8];
        _mm256_storeu_ps(inv, rmsnorm_inv_lanes(x + (uint64_t)r * n, n, m, eps));
        for (uint32_t j = 0; j < m; j++) rmsnorm_scale(x + (uint64_t)(r + j) * n, w, inv[j], n, out + (uint64_t)(r + j) * n);
    }
    if (r < rows) col_rmsnorm_row_avx2(x + (uint64_t)r * n, w, eps, n, out + (uint64_t)r * n);
}

COL_T2 void col_add_scaled_avx2(float *acc, float w, const float *x, uint64_t n)
{
    const __m256 wv = _mm256_set1_ps(w);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(wv, _mm256_loadu_ps(x + i))));
    if (i < n) {
        const __m256i m = lanes_below8(n - i);
        const __m256 sum = _mm256_add_ps(_mm256_maskload_ps(acc + i, m), _mm256_mul_ps(wv, _mm256_maskload_ps(x + i, m)));
        _mm256_maskstore_ps(acc + i, m, sum);
    }
}

/* Two passes: the largest value (vmaxps returns its second operand when the first is NaN, so a
 * NaN never enters the running maximum), then the first element equal to it. */
COL_T2 uint32_t col_first_largest_avx2(const float *x, uint32_t n)
{
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) top8 = _mm256_max_ps(_mm256_loadu_ps(x + i), top8);
    __m128 top4 = _mm_max_ps(_mm256_castps256_ps128(top8), _mm256_extractf128_ps(top8, 1));
    top4 = _mm_max_ps(top4, _mm_movehl_ps(top4, top4));
    float top = _mm_cvtss_f32(_mm_max_ss(top4, _mm_shuffle_ps(top4, top4, 1)));
    for (; i < n; i++) top = x[i] > top ? x[i] : top;
    if (top == -INFINITY) return 0; /* every value NaN or -inf: all equal to -inf, the first wins */
    const __m256 want = _mm256_set1_ps(top);
    for (i = 0; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), want, _CMP_EQ_OQ));
        if (hit) return i + (uint32_t)__builtin_ctz((unsigned)hit);
    }
    while (x[i] != top) i++;
    return i;
}

COL_T2 void col_rotate_half_avx2(float *v, uint32_t half, const float *c, const float *s)
{
    float *hi = v + half;
    uint32_t i = 0;
    for (; i + 8 <= half; i += 8) {
        const __m256 x1 = _mm256_loadu_ps(v + i), x2 = _mm256_loadu_ps(hi + i);
        const __m256 ci = _mm256_loadu_ps(c + i), si = _mm256_loadu_ps(s + i);
        _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(x1, ci), _mm256_mul_ps(x2, si)));
        _mm256_storeu_ps(hi + i, _mm256_add_ps(_mm256_mul_ps(x2, ci), _mm256_mul_ps(x1, si)));
    }
    for (; i < half; i++) {
        const float x1 = v[i], x2 = hi[i];
        v[i] = x1 * c[i] - x2 * s[i];
        hi[i] = x2 * c[i] + x1 * s[i];
    }
}

/* col_round_bf16_avx512's rule in 8 lanes: the same bits as the portable rounding. */
COL_T2 void col_round_bf16_avx2(float *v, uint64_t n)
{
    const __m256i exp_mask = _mm256_set1_epi32(0x7F800000), half = _mm256_set1_epi32(0x7FFF);
    const __m256i one = _mm256_set1_epi32(1), keep = _mm256_set1_epi32((int)0xFFFF0000u);
    for (uint64_t i = 0; i < n; i += 8) {
        const __m256i m = lanes_below8(n - i);
        __m256i b = _mm256_castps_si256(_mm256_maskload_ps(v + i, m));
        __m256i r = _mm256_add_epi32(_mm256_add_epi32(b, half), _mm256_and_si256(_mm256_srli_epi32(b, 16), one));
        r = _mm256_and_si256(r, keep);
        __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(b, exp_mask), exp_mask);
        _mm256_maskstore_ps(v + i, m, _mm256_castsi256_ps(_mm256_blendv_epi8(r, b, special)));
    }
}

/* h1[i] = silu(h1[i]) * h3[i] = h1[i] / (1 + exp(-h1[i])) * h3[i], 16 at a time (a tail of
 * fewer under a mask, so every element goes through the same operations). */
COL_T512 void col_swiglu_gate_avx512(float *h1, const float *h3, uint64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (uint64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 z = _mm512_maskz_loadu_ps(m, h1 + i), b = _mm512_maskz_loadu_ps(m, h3 + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), z));
        _mm512_mask_storeu_ps(h1 + i, m, _mm512_mul_ps(_mm512_div_ps(z, _mm512_add_ps(one, e)), b));
    }
}

COL_T512 void col_round_bf16_avx512(float *v, uint64_t n)
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

/* The nearest f16 by F16C (vcvtps2ph rounds to nearest even, keeps subnormal halves and gives
 * Inf past the largest), back to f32 exactly; a NaN becomes the quiet NaN of its sign, as the
 * portable conversion gives, not its own payload cut to ten bits. */
COL_T512 void col_round_f16_avx512(float *v, uint64_t n)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u), quiet = _mm512_set1_epi32(0x7FC00000);
    for (uint64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(m, v + i);
        __m512 r = _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m512i nan = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(x), sign), quiet);
        r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, _mm512_castsi512_ps(nan));
        _mm512_mask_storeu_ps(v + i, m, r);
    }
}

COL_T2 void col_round_f16_avx2(float *v, uint64_t n)
{
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256 quiet = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000));
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        __m256 r = _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256 nan = _mm256_or_ps(_mm256_and_ps(x, sign), quiet);
        _mm256_storeu_ps(v + i, _mm256_blendv_ps(r, nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    }
    if (i < n) col_round_f16_portable(v + i, n - i);
}

/* col_f16_row by F16C, a NaN made the quiet NaN of its sign as col_round_f16_avx512 does. */
COL_T512 void col_f16_row_avx512(const float *x, uint64_t n, uint16_t *out)
{
    const __m256i quiet = _mm256_set1_epi16(0x7E00), sign = _mm256_set1_epi16((short)0x8000);
    for (uint64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i nan = _mm256_or_si256(_mm256_and_si256(h, sign), quiet);
        h = _mm256_mask_blend_epi16(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), h, nan);
        _mm256_mask_storeu_epi16(out + i, m, h);
    }
}

COL_T2 void col_f16_row_avx2(const float *x, uint64_t n, uint16_t *out)
{
    const __m128i quiet = _mm_set1_epi16(0x7E00), sign = _mm_set1_epi16((short)0x8000);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m128i nan = _mm_or_si128(_mm_and_si128(h, sign), quiet);
        const __m256i unord = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        const __m128i wide = _mm_packs_epi32(_mm256_castsi256_si128(unord), _mm256_extracti128_si256(unord, 1));
        _mm_storeu_si128((__m128i *)(void *)(out + i), _mm_blendv_epi8(h, nan, wide));
    }
    if (i < n) col_f16_row_portable(x + i, n - i, out + i);
}

/* By vendor and generation, as measured (performance.md): on AMD (Zen 4) AVX-512 float decode tiles
 * of 4 rows, the stored-panel tiles without software prefetch and one token of q4_0 panels on
 * them; on Intel with AMX (Emerald Rapids) tiles of 8 rows, 1 KiB ahead and the AVX2 tile for that
 * token; on Intel without AMX (Ice Lake) the same but 8 stored panels a one-token tile, q4_0's on
 * the AVX-512 tiles. Batches of 16-bit floats widened once a tile on Intel, whose widening shares
 * the multiply-adds' two ports; AMD (Zen 4) widens in every pass, where widening once was slower. */
col_decode_tuning col_decode_tuning_here(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd"))
        return (col_decode_tuning){COL_PREFETCH_AHEAD_AMD, COL_PREFETCH_AHEAD_AMD, COL_STORED_AHEAD_AMD,
                                   COL_FLOAT_STREAMS_AMD, COL_STORED_STREAMS, COL_Q4_ZMM_DECODE_AMD,
                                   COL_WIDEN_MIN_TOKENS_AMD};
    unsigned a, b, c, d;
    const int amx_tile = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 24) & 1);
    if (!amx_tile)
        return (col_decode_tuning){COL_PREFETCH_AHEAD, COL_PREFETCH_AHEAD_Q, COL_STORED_AHEAD, COL_DECODE_STREAMS,
                                   COL_STORED_STREAMS_NO_AMX, COL_Q4_ZMM_DECODE_NO_AMX, COL_WIDEN_MIN_TOKENS};
    return (col_decode_tuning){COL_PREFETCH_AHEAD, COL_PREFETCH_AHEAD_Q, COL_STORED_AHEAD, COL_DECODE_STREAMS,
                               COL_STORED_STREAMS, 0, COL_WIDEN_MIN_TOKENS};
}

col_isa col_detect_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return __builtin_cpu_supports("avx512vnni") ? COL_ISA_AVX512 : COL_ISA_AVX512F;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return COL_ISA_AVX2;
    return COL_ISA_PORTABLE;
}
#else
col_isa col_detect_isa(void)
{
    return COL_ISA_PORTABLE;
}
#endif
