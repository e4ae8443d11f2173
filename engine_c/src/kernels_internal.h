/*
 * kernels_internal.h - what the kernel files declare to each other, and the forward pass does not
 * see (kernels.h is its interface): the int8 blocks of quantised weights and activations
 * (kernels_quant.c), each path's row walker, head kernel and element-wise kernels
 * (kernels_portable.c, kernels_x86.c), and the batch tile sizes the pool (pool.c) cuts chunks on.
 * Every function here is a pure function of its arguments, safe on any thread; the caller owns
 * every buffer.
 */
#ifndef COLIBRI_KERNELS_INTERNAL_H
#define COLIBRI_KERNELS_INTERNAL_H

#include "kernels.h"
#include <math.h>

#define QK 32 /* elements per quantised block */

static inline uint16_t rd16u(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* The row dtype whose blocks a quantised dtype holds (q8_0 for q8_0 and q8_0x8, likewise q4_0):
 * what the activations' quantisation and the product's definition depend on. Others unchanged. */
static inline uint32_t col_block_kind(uint32_t dtype)
{
    return dtype == COL_DTYPE_Q8_0X8 ? COL_DTYPE_Q8_0 : dtype == COL_DTYPE_Q4_0X8 ? COL_DTYPE_Q4_0 : dtype;
}

/* Quantised weights, in rows or in panels: products against int8 activations. */
static inline int is_block_dtype(uint32_t dtype)
{
    const uint32_t kind = col_block_kind(dtype);
    return kind == COL_DTYPE_Q8_0 || kind == COL_DTYPE_Q4_0;
}

/* ---- kernels_quant.c: int8 blocks ----------------------------------------------------------- */

/* Bytes of one quantised activation row of `cols` elements (col_quantize_row's layout). */
uint64_t col_qrow_bytes(uint64_t cols);

/* Quantise the activation row x[0..cols) (cols % 32 == 0) for weights of `wdtype` (q8_0 or q4_0)
 * into `out` (col_qrow_bytes(cols) bytes), the same bytes on every path `isa`. */
void col_quantize_row(const float *x, uint64_t cols, uint32_t wdtype, col_isa isa, uint8_t *out);

/* Where element j of block b sits among the int8 values of an activation row of nb blocks
 * (col_quantize_row). q8_0 kernels read element order. q4_0 kernels read groups of four blocks as
 * the four low halves then the four high halves, the order of the nibbles of 64 payload bytes (a
 * last group of fewer blocks is arranged the same way with its own count). */
static inline uint64_t col_xq_pos(uint32_t wdtype, uint64_t nb, uint64_t b, uint32_t j)
{
    if (wdtype != COL_DTYPE_Q4_0) return b * QK + j;
    uint64_t g = b / 4, in_group = nb - g * 4 < 4 ? nb - g * 4 : 4, k = b % 4;
    return g * 128 + (j < 16 ? k * 16 + j : in_group * 16 + k * 16 + (j - 16));
}

/* Byte offset, in an activation row of `cols`, of its nb int32 block corrections (-128 * the sum
 * of block b's int8 values for q8_0 weights, -8 * that sum for q4_0). */
uint64_t col_qrow_block_corrections(uint64_t cols);

/* The q8_0/q4_0 row `row` (n elements) against the quantised activation row `qx`: the definition
 * of a quantised product every path gives the bits of. In block order b = 0 .. n/32 - 1,
 * acc = fmaf((float)isum_b, d_w[b] * d_x[b], acc) from acc = 0, isum_b the exact int32 sum of the
 * block's 32 products w_q * x_q (q4_0: w_q = nibble - 8), d_w the row's f16 scale widened exactly,
 * d_w * d_x one f32 multiply. */
float col_dotq_blocks(const uint8_t *row, uint32_t dtype, const uint8_t *qx, uint64_t n);
/* The same product for row r of a quantised matrix `matrix` of n columns, stored in rows or in
 * panels (q8_0x8, q4_0x8: the row's blocks gathered from its panel): the same bits as its row in
 * row order. */
float col_dotq_stored(const uint8_t *matrix, uint32_t dtype, uint64_t r, const uint8_t *qx, uint64_t n);

/* ---- bf16 dot products (numerics.c's COL_REDUCTION_BF16_DOT) ----------------------------------- */

/* x[0..n) rounded to bf16 (nearest even, as col_round_bf16; a NaN becomes the quiet NaN of its
 * sign) as bf16 bits: the activations of a bf16 dot product, the same bytes on every path
 * (kernels_quant.c). */
void col_pack_bf16(const float *x, uint64_t n, col_isa isa, uint16_t *out);

/* One output of a bf16 dot product, the definition every path gives the bits of
 * (kernels_portable.c): the bf16 row w[0..n) against x rounded to bf16, in 16 lanes; lane l takes
 * elements 32k + 2l + 1, then 32k + 2l, of every block k of 32 (past n: zeros), each added to the
 * lane's sum as one fused multiply-add (the product of two bf16 values is exact) with bf16
 * subnormals read as zero and a subnormal sum flushed to zero: what AVX512-BF16's vdpbf16ps
 * computes. The 16 sums are then added as the vector tiles' tree (lane i + lane i+8, ...). */
float col_dot_bf16_portable(const uint16_t *w, const float *x, uint64_t n);

/* Row `lane` of a bf16x16 panel (panel: its first element; n even) against x as bf16 dot products:
 * one chain over the row's pairs in order, each pair the lane step col_dot_bf16_portable makes
 * (odd product, then even, subnormals flushed), with no lane tree: one vdpbf16ps lane per row. */
float col_dot_bf16_panel_portable(const uint16_t *panel, uint64_t lane, const float *x, uint64_t n);

/* Rows [r0, r1) of job j (bf16 weights), every token, by col_dot_bf16_portable (bf16x16: by
 * col_dot_bf16_panel_portable). */
void col_rows_bf16dot_portable(const col_matvec_job *j, uint64_t r0, uint64_t r1);

/* ---- kernels_portable.c: the portable path ---------------------------------------------------- */

/* Rows [r0, r1) of job j, every token; qx: its quantised activations (block dtypes), else NULL. */
void col_rows_portable(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1);
void col_round_bf16_portable(float *v, uint64_t n);
void col_round_f16_portable(float *v, uint64_t n);
void col_f16_row_portable(const float *x, uint64_t n, uint16_t *out);
void col_swiglu_gate_portable(float *h1, const float *h3, uint64_t n);
/* RMSNorm's 1 / sqrtf(ss / n + eps), ss the sum of squares as one chain of adds from element 0 up
 * (each square rounded to f32 first): the order every path keeps, so files compute what they did
 * before the norm was vectorised (tests/test_format_v1.py). */
static inline float col_rmsnorm_inv(const float *x, float eps, uint64_t n)
{
    float ss = 0.0f;
    for (uint64_t i = 0; i < n; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)n + eps);
}
void col_rmsnorm_row_portable(const float *x, const float *w, float eps, uint64_t n, float *out);
/* One head (n_q = 1) of col_attend_head, and the softmax and value sums the AVX2 head shares. */
void col_attend_head_portable(const col_head_job *h, float *scores, float *out);
void col_softmax_in_place(float *scores, uint32_t n, const float *sink);
float col_weighted_value(const col_head_job *h, const float *p, uint32_t i);

/* ---- kernels_x86.c: AVX2 and AVX-512 ---------------------------------------------------------- */

/* The best vector path CPUID finds (COL_ISA_PORTABLE off x86-64); never AMX (kernels_amx.c). */
col_isa col_detect_isa(void);

#if defined(__x86_64__)
/* What the x86 paths' functions are compiled for (function attributes, so the build flags stay
 * portable); the pool runs them only where CPUID found the instructions. */
#define COL_T2 __attribute__((target("avx2,fma,f16c")))
#define COL_T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
/* AVX-512's int8 kernels (kernels_int8_avx512.c): only pools with VNNI run them (col_isa_int8). */
#define COL_T512Q __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define COL_INLINE static inline __attribute__((always_inline))

/* Neighbouring rows per batch tile on AVX-512, for every weight dtype: 6 rows x 4 tokens keep 24
 * accumulators, 4 token vectors and a weight vector in the 32 registers, so each token vector
 * (from L2) is loaded once per 6 rows. */
#ifndef COL_BATCH_ROWS_512
#define COL_BATCH_ROWS_512 6
#endif
#ifndef COL_BATCH_ROWS_AVX2
/* Rows per batch tile on AVX2: 3 rows x 4 tokens keep 12 accumulators, the 3 rows' weight vectors and
 * a token vector in the 16 registers, 7 loads for 12 FMAs (2 x 4 made 6 for 8). */
#define COL_BATCH_ROWS_AVX2 3
#endif
#define COL_BATCH_ROWS_Q_AVX2 8 /* q8_0/q4_0 on AVX2: a row per lane */
#define COL_BATCH_KBLOCK 1024
#define COL_KBLOCK_TOKENS 128 /* tokens walked together; a batch with more walks them in chunks */
#define COL_KBLOCK_TILES 8
/* An AVX-512 batch of 16-bit float weights with col_decode_tuning.widen_tokens tokens or more widens each
 * 6-row tile (or tile-block) to f32 in the thread's scratch once for all its token passes: the
 * scratch's last COL_WIDE_TILE_BYTES. Intel's tuning widens from COL_WIDEN_MIN_TOKENS, AMD's from
 * COL_WIDEN_MIN_TOKENS_AMD (0: never). */
#ifndef COL_WIDEN_MIN_TOKENS
#define COL_WIDEN_MIN_TOKENS 8
#endif
#ifndef COL_WIDEN_MIN_TOKENS_AMD
#define COL_WIDEN_MIN_TOKENS_AMD 0
#endif
#define COL_WIDE_TILE_BYTES (COL_BATCH_ROWS_512 * COL_BATCH_KBLOCK * 4)

/* Bytes of carried lane sums one batch tile over long rows needs for n_tokens (per-thread staging). */
uint64_t col_kblock_carry_bytes(uint32_t n_tokens);

/* How the decode tiles run on this CPU: the bytes ahead of its loads that a tile prefetches each
 * row, float rows (f) and q8_0/q4_0 payloads (q), and each panel in the AVX-512 stored-panel
 * tiles (stored; 0: none, the hardware prefetchers alone); the distant rows an AVX-512 float or
 * bf16 dot-product tile reads at once (f_streams: 4, else COL_DECODE_STREAMS), and an exact
 * one-token tile of bf16x16 panels (8 where f_streams is, else 4); the distant stored
 * panels an AVX-512 one-token tile reads at once (stored_streams: 4 or 8); and whether one token
 * of q4_0 panels takes the AVX-512 tile (q4_zmm, 1) or the AVX2 one (0); and from how many tokens an
 * AVX-512 batch of 16-bit float weights widens its tiles to f32 once (widen_tokens; 0: never). None
 * of it changes a bit. */
typedef struct col_decode_tuning {
    uint32_t f, q, stored, f_streams, stored_streams;
    int q4_zmm;
    uint32_t widen_tokens;
} col_decode_tuning;

/* The tuning for this machine's CPU (measured per vendor; kernels_x86.c). */
col_decode_tuning col_decode_tuning_here(void);

/* 1 when the CPU has AVX512-BF16 (vdpbf16ps), which the AVX-512 path then uses for bf16 dot products. */
int col_has_avx512bf16(void);
/* 1 when the CPU has AVX-VNNI (VEX vpdpbusd), which the AVX2 path's q8_0/q4_0 products then use.
 * Asks CPUID (slow in a VM): call it once per pool, not per product. */
int col_has_avx_vnni(void);

/* Rows [r0, r1) of job j (bf16 weights), every token, by bf16 dot products with the bits of
 * col_dot_bf16_portable; xp: the job's activations packed by col_pack_bf16, [n_tokens][cols]. With
 * vdpbf16ps in register tiles (AVX512-BF16, where col_has_avx512bf16), or its arithmetic in the
 * same tiles on any AVX-512 F/BW CPU (_avx512f), or in AVX2 tiles of their own. */
void col_rows_bf16dot_avx512(const col_matvec_job *j, const uint16_t *xp, uint64_t r0, uint64_t r1, col_decode_tuning tune);
void col_rows_bf16dot_avx512f(const col_matvec_job *j, const uint16_t *xp, uint64_t r0, uint64_t r1, col_decode_tuning tune);
void col_rows_bf16dot_avx2(const col_matvec_job *j, const uint16_t *xp, uint64_t r0, uint64_t r1);

/* The instructions the AVX2 path's q8_0/q4_0 kernels form block sums with (the same exact sums). */
typedef enum col_int8_form {
    COL_INT8_MADDUBS = 0,     /* vpsignb + vpmaddubsw + vpmaddwd (AVX2) */
    COL_INT8_AVX_VNNI = 1,    /* vpdpbusd on 256 bits, only where col_has_avx_vnni */
    COL_INT8_MADDUBS_512 = 2  /* AVX-512 F/BW/VL without VNNI (the avx512f path): q8_0 batches over stored
                               * panels take two panels a zmm, the rest as COL_INT8_MADDUBS */
} col_int8_form;

/* Rows [r0, r1) of job j, every token, on AVX2 / AVX-512 (only where CPUID found them); `carry`
 * (carry_bytes, may be NULL) is the thread's scratch for batches over long rows, `tune` the
 * decode tiles' tuning (col_decode_tuning_here), `form` a col_int8_form the CPU has. */
void col_rows_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, col_decode_tuning tune, int form);
void col_rows_avx512(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint8_t *carry,
                     uint64_t carry_bytes, col_decode_tuning tune);

/* ---- kernels_int8_avx2.c: q8_0/q4_0 on AVX2 -------------------------------------------------- */

/* Rows [r0, r1) of job j (q8_0 or q4_0 weights), every token, against its activations qx
 * (col_quantize_row), with col_dotq_blocks's bits; `ahead`: the decode prefetch distance; `form`: a
 * col_int8_form the CPU has (the same bits in each). Batches take rows in tiles of
 * COL_BATCH_ROWS_Q_AVX2 from r0. */
void col_rows_int8_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint32_t ahead, int form);
/* The same products from weights stored in panels of 8 rows (j->w.dtype q8_0 or q4_0 says the
 * blocks; j->w.rows % 8 == 0, r0 and r1 multiples of 8), the same bits. Panel p (rows 8p .. 8p + 7,
 * at byte 8p * col_dtype_row_bytes) holds first the nb = cols / 32 blocks' scales, 8 f16 per block
 * (row r's at 16b + 2r), then per block the payload with lane r of each 32-byte vector holding row
 * r's 4-byte group g: q8_0 8 vectors (g = 0..7: elements 4g .. 4g + 3), q4_0 4 vectors of the
 * stored bytes (g = 0..3: low nibbles elements 4g .., high nibbles 16 + 4g ..). A panel has its 8
 * rows' bytes: a matrix's size is that of its rows. `form`: a col_int8_form the CPU has. */
void col_rows_int8_panels_avx2(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint32_t ahead,
                               int form);
/* q8_0/q4_0 rows [r0, r1) of job j on AVX-512 VNNI, every token, in block order with rows in the
 * lanes (kernels_int8_avx512.c): the bits of col_dotq_blocks. qx: the job's activations
 * (col_quantize_row); `stage` (stage_bytes, 64-byte aligned, may be NULL) the thread's scratch, where
 * batches pack 16-row panels when it holds col_int8_stage_bytes() (else every token runs the
 * decode kernel, the same bits); tune: the decode tiles' tuning (its q4_zmm picks
 * the tile for one token of q4_0 panels). */
void col_rows_int8_avx512(const col_matvec_job *j, const uint8_t *qx, uint64_t r0, uint64_t r1, uint8_t *stage,
                          uint64_t stage_bytes, col_decode_tuning tune);
uint64_t col_int8_stage_bytes(void);
#define COL_PANEL_ROWS 16 /* rows of a batch's panel: a chunk of a quantised batch ends on a multiple */
/* All n_q heads of h, as col_attend_head (scores: n_q * n_keys floats). */
void col_attend_group_avx512(const col_head_job *h, float *scores, float *out);
void col_attend_group_avx2(const col_head_job *h, float *scores, float *out);
void col_swiglu_gate_avx512(float *h1, const float *h3, uint64_t n);
void col_swiglu_gate_avx2(float *h1, const float *h3, uint64_t n);
void col_rmsnorm_row_avx2(const float *x, const float *w, float eps, uint64_t n, float *out);
void col_rmsnorm_rows_avx2(const float *x, const float *w, float eps, uint64_t n, uint32_t rows, float *out);
void col_add_scaled_avx2(float *acc, float w, const float *x, uint64_t n);
uint32_t col_first_largest_avx2(const float *x, uint32_t n);
void col_rotate_half_avx2(float *v, uint32_t half, const float *c, const float *s);
void col_round_bf16_avx512(float *v, uint64_t n);
void col_round_bf16_avx2(float *v, uint64_t n);
void col_round_f16_avx512(float *v, uint64_t n);
void col_round_f16_avx2(float *v, uint64_t n);
void col_f16_row_avx512(const float *x, uint64_t n, uint16_t *out);
void col_f16_row_avx2(const float *x, uint64_t n, uint16_t *out);
#endif

#endif /* COLIBRI_KERNELS_INTERNAL_H */
