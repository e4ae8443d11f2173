/*
 * kernels_amx.h - products on Intel AMX tiles, for the kernel layer (pool.c, kernels.c) only: bf16
 * weights (AMX-BF16), and batches of q8_0/q4_0 weights (AMX-INT8, the last section). The forward
 * pass never sees this: the pool picks it when the CPU has the tiles and the OS grants this process
 * the tile state.
 *
 * Arithmetic: each activation x is split into three bf16 parts, x = hi + mid + lo, each rounded to
 * nearest from what the earlier parts left (24 significant bits, all an f32 has). A product of a
 * bf16 weight and a bf16 part is exact in f32, and the tile unit accumulates in f32, so an output
 * carries the rounding of an f32 accumulation, like the vector paths, while the multiply-adds run
 * on the tile unit. (f32 and f16 weights would need splitting too, three and two parts, which
 * costs more than the AVX-512 path's products, so they stay there.)
 *
 * When every activation is a bf16 value already (the `act-bf16` numerics variant rounds a
 * product's inputs before it runs), hi is the activation and mid and lo are zero: such products
 * (`x_bf16`) pack one part per token, 16 tokens per activation tile instead of 5, a third of the
 * tile multiplies, and give the same bits as three parts would (tested).
 *
 * Determinism: an output (row r, token t) is one tile element, accumulated block of 32 columns by
 * block in order, then its three activation parts summed as (hi + mid) + lo. Which rows share a
 * tile, which tokens share the activation tile and which thread runs it change nothing, so
 * batches equal steps and any thread count gives the same bits. (q8_0/q4_0: the definition's bits,
 * below.)
 */
#ifndef COLIBRI_KERNELS_AMX_H
#define COLIBRI_KERNELS_AMX_H

#include "kernels.h"

/* 1 when the CPU has AMX-TILE, AMX-BF16 and AVX512-BF16 and the OS lets this process use the tile
 * state (on Linux, after asking for it once with arch_prctl; the permission is per process and
 * asking again is harmless). 0 otherwise, and on every other system. Thread-safe. */
int col_amx_enable(void);

/* Weight dtypes the AMX path computes with bf16 tiles (bf16); q8_0/q4_0: col_amx_int8_runs. */
int col_amx_handles(uint32_t dtype);

/* Bytes of the packed activations of n_tokens x cols (col_amx_pack), including the 64 bytes past
 * the end that the tile loads may read. x_bf16: 1 when every activation is a bf16 value (one part
 * per token), 0 otherwise (three). At most ceil(n_tokens / 5) * ceil(cols / 32) * 1024 + 64. */
uint64_t col_amx_packed_bytes(uint32_t n_tokens, uint64_t cols, int x_bf16);

/* Split tokens [t0, t1) of x ([n_tokens][cols] f32) into bf16 parts and lay them out as the tile
 * unit reads them: groups of 5 tokens (16 with x_bf16), blocks of 32 columns, 16 column pairs,
 * each token's three parts (one with x_bf16, when x holds bf16 values only; other values would be
 * rounded). The call that packs the last token also zeroes the 64 bytes of slack. Calls for
 * disjoint token ranges may run concurrently. */
void col_amx_pack(const float *x, uint32_t n_tokens, uint64_t cols, int x_bf16, uint32_t t0, uint32_t t1,
                  uint8_t *out);

/* Neighbouring rows col_amx_rows computes together for n_tokens tokens (32 for a batch of more
 * than one token group, 16 for a few tokens, 1 for one token, whose tiles take distant rows): a
 * range of rows that is a multiple of it has no short tile. Thread-safe. */
uint64_t col_amx_tile_rows(uint32_t n_tokens, int x_bf16);

/* Bytes of per-thread staging for products of at most max_cols columns and max_tokens tokens
 * (64-byte aligned use): tiles of rows staged, or the C tiles saved between chunks of long rows;
 * at least col_amx_int8_stage_bytes(max_cols). */
uint64_t col_amx_stage_bytes(uint64_t max_cols, uint32_t max_tokens);

/* y[t][r] for rows [r0, r1) and every token of j (see col_matvec_job), from activations packed by
 * col_amx_pack with the same x_bf16. `stage`: this thread's col_amx_stage_bytes scratch, 64-byte
 * aligned. Loads the tile configuration on entry and releases the tiles on return. Only call when
 * col_amx_enable() returned 1 and col_amx_handles(j->w.dtype). */
void col_amx_rows(const col_matvec_job *j, int x_bf16, const uint8_t *packed, uint8_t *stage, uint64_t stage_bytes,
                  uint64_t r0, uint64_t r1);

/* ---- q8_0 and q4_0 batches on AMX-INT8 ------------------------------------------------------------
 * Arithmetic: a block's exact int32 sum of weight x activation bytes (TDPBSSD, signed x signed:
 * q8_0 values as stored, q4_0 nibbles minus 8, against the activations col_quantize_row made; the
 * sum is exact whatever adds it), then acc = fma((float)isum, d_w * d_x, acc) block by block in
 * order from 0: col_dotq_blocks's definition, so the bits of every other path, whatever the rows,
 * tokens or threads (decode, which stays on the vector kernels, included). */

/* Batches of at least this many tokens run on the tiles, fewer (decode) stay on the AVX-512 and
 * AVX2 kernels: below it the tiles' floor, staging the weights, costs more than the vector
 * kernels' products (measured per dtype: performance.md, "AMX-INT8 token floors"). */
#ifndef COL_AMX_INT8_MIN_TOKENS_Q8
#define COL_AMX_INT8_MIN_TOKENS_Q8 4
#endif
#ifndef COL_AMX_INT8_MIN_TOKENS_Q8_ROWS
#define COL_AMX_INT8_MIN_TOKENS_Q8_ROWS 8
#endif
#ifndef COL_AMX_INT8_MIN_TOKENS_Q4
#define COL_AMX_INT8_MIN_TOKENS_Q4 6
#endif

/* Bytes of per-thread staging col_amx_int8_rows needs for rows of `cols` (64-byte aligned use);
 * col_amx_stage_bytes covers it for max_cols. */
uint64_t col_amx_int8_stage_bytes(uint64_t cols);

/* 1 when job j (q8_0, q4_0, q8_0x8 or q4_0x8 weights) runs on AMX-INT8 tiles on a pool whose path
 * is AMX: enough tokens, `stage_bytes` of staging a thread, and a CPU with AMX-INT8. Thread-safe. */
int col_amx_int8_runs(const col_matvec_job *j, uint64_t stage_bytes);

/* y[t][r] for rows [r0, r1) and every token of j, from its activations qx (col_quantize_row, one
 * row per token). r0 a multiple of 16 (COL_PANEL_ROWS), r1 too or the matrix's end; `stage`: this
 * thread's staging (col_amx_int8_stage_bytes, 64-byte aligned). Loads its tile configuration and
 * releases the tiles on return. Only when col_amx_enable() returned 1 and col_amx_int8_runs(j). */
void col_amx_int8_rows(const col_matvec_job *j, const uint8_t *qx, uint8_t *stage, uint64_t r0, uint64_t r1);

#endif /* COLIBRI_KERNELS_AMX_H */
