/*
 * numerics.h - numerics variants of a session (routing-jitter lab): other reduction orders of
 * the dot products, a split of each reduction into partial sums, activations rounded to
 * bf16/f16 between operations, and seeded ULP noise on router logits (internal).
 *
 * Hooks, and nothing else, connect it to the forward pass:
 *   kernels.c  col_matmul_many -> col_numerics_matmul when the pool carries a variant
 *              (col_pool_set_numerics), which rounds the product's inputs and outputs and runs
 *              either the kernels (reduction DEFAULT) or the reference loops below;
 *   forward.c  col_numerics_round on the residual stream (embedding row, after each add);
 *   experts.c  col_numerics_perturb on the router logits right after the gate product, so the
 *              trace records the logits routing used.
 * A default config (all numerics fields 0) installs no hook: the default path is untouched.
 */
#ifndef COLIBRI_NUMERICS_H
#define COLIBRI_NUMERICS_H

#include "internal.h"

struct col_pool;
struct col_matvec_job;

#define COL_MAX_LANES 256u     /* BLOCKED lanes at most */
#define COL_MAX_SPLIT 256u     /* parts of a split at most */
#define COL_PAIRWISE_LEAF 8u   /* PAIRWISE: ranges of at most this many elements are summed in order */

typedef struct col_numerics {
    uint32_t reduction;   /* col_reduction; DEFAULT with fma or split set runs SEQUENTIAL */
    uint32_t lanes;       /* BLOCKED lanes */
    uint32_t fma;         /* fmaf() instead of a rounded multiply then a rounded add */
    uint32_t split;       /* partial sums per dot product (0/1 = one) */
    uint32_t activation;  /* col_activation_precision */
    uint32_t noise_ulps;  /* router-logit noise bound N */
    uint64_t noise_seed;
} col_numerics;

/* Check the numerics fields of a config: COL_OK or COL_ERR_INVALID_ARG with the reason. */
int32_t col_numerics_check(const col_session_config *c, char *err, size_t errlen);

/* The numerics of a (checked) config. */
col_numerics col_numerics_of(const col_session_config *c);

/* 1 when products must go through col_numerics_matmul (another reduction, fma, split, or
 * rounded activations); 0 when the kernels run unchanged. */
int col_numerics_hooks_products(const col_numerics *nx);

/* 1 when bf16 weights' products under nx read their activations packed to bf16 by col_pack_bf16
 * and nothing else (the dot-bf16 reduction, activations f32 or rounded to bf16: packing a rounded
 * value gives the same bits), so a caller may pack a row once for many products; nx may be NULL. */
int col_numerics_packs_bf16(const col_numerics *nx);

/* Every job of the batch under numerics `nx`: inputs rounded in place to the activation
 * precision (they are session scratch, never the mapping), the products by the variant's
 * reduction (or by col_matmul_kernels on `pool` for DEFAULT), outputs rounded. */
void col_numerics_matmul(const col_numerics *nx, struct col_pool *pool, const struct col_matvec_job *jobs,
                         uint32_t n_jobs);

#if defined(__x86_64__)
/* Rows [r0, r1) of job j, every token, by the variant's reduction (not DEFAULT) on AVX-512 (16 rows
 * at a time) or AVX2 (8), with the bits of numerics.c's reference loops (numerics_x86.c). Only
 * where CPUID found the instructions. */
void col_numerics_rows_avx512(const col_numerics *nx, const struct col_matvec_job *j, uint64_t r0, uint64_t r1);
void col_numerics_rows_avx2(const col_numerics *nx, const struct col_matvec_job *j, uint64_t r0, uint64_t r1);
#define COL_NUMERICS_ROWS_AVX512 16u /* rows a group of the AVX-512 loops takes (one per lane) */
#define COL_NUMERICS_ROWS_AVX2 8u
#endif

/* Round v[0..n) to the activation precision in place; no-op for F32 (and a NULL nx). bf16 runs on
 * `pool`'s threads when n is large (pool may be NULL). */
void col_numerics_round(const col_numerics *nx, struct col_pool *pool, float *v, uint64_t n);

/* Move each of logits[0..n) by k ULPs, k uniform in [-N, N] from (seed, position, layer, j);
 * no-op when N == 0 (and a NULL nx). Steps walk the ordered float line (through zero, never past
 * the largest finite value); non-finite logits are left alone. */
void col_numerics_perturb(const col_numerics *nx, float *logits, uint32_t n, uint32_t position,
                          uint32_t layer);

/* The noise offset in ULPs of one logit (exposed for tests). */
int32_t col_numerics_noise_ulps(uint64_t seed, uint32_t n_ulps, uint32_t position, uint32_t layer,
                                uint32_t expert);

#endif /* COLIBRI_NUMERICS_H */
