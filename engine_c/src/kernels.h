/*
 * kernels.h - the numeric kernel layer: the narrow interface between the forward pass and the
 * code that touches weights. The forward pass calls only these functions; which loop, SIMD width
 * or thread split runs behind them is this layer's business (issue: multithreaded SIMD kernels
 * land here without touching forward.c).
 *
 * Determinism contract: every output element is reduced by exactly one thread in a fixed order
 * that does not depend on the thread count, so results are bit-identical for any n_threads.
 */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include "internal.h"

typedef struct col_pool col_pool;

/* Create a pool of n_threads - 1 workers (the caller is the n-th). n_threads >= 1.
 * Returns NULL on allocation or thread-creation failure. */
col_pool *col_pool_create(uint32_t n_threads);

/* Join the workers and free. NULL is a no-op. */
void col_pool_free(col_pool *pool);

/* Scalar conversions of stored elements to f32. */
float col_f16_to_f32(uint16_t h);
float col_bf16_to_f32(uint16_t b);

/* Element `i` of a stored vector of `dtype`, as f32. */
float col_load_elem(const void *data, uint32_t dtype, uint64_t i);

/* out[0..n) = stored[0..n) as f32. */
void col_load_row(const void *data, uint32_t dtype, uint64_t n, float *out);

/* y[r] = dot(W[r, :], x) for r in [0, w->rows); W rows are w->cols long. x: [cols], y: [rows].
 * Splits rows among the pool's threads (pool may be NULL: single-threaded). */
void col_matvec(col_pool *pool, const col_weight *w, const float *x, float *y);

/* Weight view of a 2-D tensor [rows, cols]. */
col_weight col_weight_of(const col_tensor_info *t);

/* Weight view of expert `e` of a stacked 3-D tensor [E, rows, cols]. */
col_weight col_weight_expert(const col_tensor_info *t, uint32_t e);

#endif /* COLIBRI_KERNELS_H */
