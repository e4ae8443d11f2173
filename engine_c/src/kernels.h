/*
 * kernels.h - the numeric kernel layer: the narrow interface between the forward pass and the
 * code that touches weights. The forward pass calls only these functions; which loop, SIMD width
 * or thread split runs behind them is this layer's business (kernels.c, pool.c and the path files
 * they name), so kernels change without touching forward.c.
 *
 * Determinism contract: every output element is reduced by exactly one thread in a fixed order
 * that does not depend on the thread count, so results are bit-identical for any n_threads.
 */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include "internal.h"
#include "numerics.h"

typedef struct col_pool col_pool;

/* Instruction-set paths, chosen once per pool from CPUID (or COLIBRI_KERNELS=portable|avx2|avx512f|avx512|amx,
 * which can only lower the choice). Every path computes every output element in one fixed order,
 * so a given path is bit-identical for any thread count; paths differ from each other in the
 * last bits (different lane order), never in the tested tolerance, except q8_0/q4_0 products,
 * which AVX-512 computes with the portable path's bits (block order, col_dotq_blocks). */
typedef enum col_isa {
    COL_ISA_PORTABLE = 0,
    COL_ISA_AVX2 = 1,       /* AVX2 + FMA + F16C */
    COL_ISA_AVX512F = 2,    /* AVX-512 F/BW/VL without VNNI (Skylake-SP/X): AVX-512's float kernels, and the
                             * AVX2 path's q8_0/q4_0 products without any vpdpbusd (col_isa_int8) */
    COL_ISA_AVX512 = 3,     /* AVX-512 F/BW/VL + VNNI (int8 dot products of quantised blocks) */
    COL_ISA_AMX = 4         /* AVX-512, and AMX tiles for bf16 weights and q8_0/q4_0 batches (kernels_amx.h) */
} col_isa;

/* The path whose kernels run q8_0/q4_0 products (and quantise their activations) on `isa`:
 * AVX-512 without VNNI runs them on AVX2's (same bits on every path). */
static inline col_isa col_isa_int8(col_isa isa)
{
    return isa == COL_ISA_AVX512F ? COL_ISA_AVX2 : isa;
}

/* One product of a batch: y[t][r] = dot(W[r, :], x[t]) for t < n_tokens, r < w.rows.
 * x: [n_tokens][w.cols] f32, y: [n_tokens][w.rows] f32. xq (NULL unless col_pool_qrow_bytes says
 * the pool quantises w's dtype): x already quantised, n_tokens rows of col_pool_qrow_bytes each
 * (col_pool_quantize_row), which the pool then uses instead of quantising x (x may be NULL). */
typedef struct col_matvec_job {
    col_weight w;
    const float *x;
    float *y;
    uint32_t n_tokens;
    const uint8_t *xq;
} col_matvec_job;

/* What the products a pool runs can be at most: they size the pool's scratch. */
typedef struct col_pool_limits {
    uint32_t max_jobs;      /* products in one col_matmul_many batch */
    uint64_t max_act_cols;  /* sum over a batch's jobs of n_tokens * cols */
    uint32_t max_tokens;    /* n_tokens of one product */
    uint64_t max_cols;      /* cols of one product */
} col_pool_limits;

/* The path a pool created now with this ceiling would run: the best the CPU has (AMX only when
 * the OS grants the tile state), at most `ceiling`, lowered further by COLIBRI_KERNELS. */
col_isa col_choose_isa(col_isa ceiling);

/* Bytes of scratch a pool of n_threads needs for products within `limits` on path `isa`
 * (col_choose_isa): activations quantised for int8 weights or packed for AMX tiles, and
 * per-thread staging (AMX tiles; on AVX-512 the lane sums a group of batch tiles carries across
 * the column blocks of long rows, or the panel of 16 rows a quantised batch packs). */
uint64_t col_pool_scratch_size(col_isa isa, uint32_t n_threads, const col_pool_limits *limits);

/* Create a pool of n_threads - 1 workers (the caller is the n-th) running path `isa` (from
 * col_choose_isa, so one the CPU has); `scratch` (64-byte aligned, scratch_bytes long, owned by
 * the caller, may be NULL when every limit is 0) is sized by col_pool_scratch_size; if it is too
 * small for the AMX path, the pool runs AVX-512 instead. n_threads >= 1. Returns NULL on
 * allocation or thread-creation failure. The pool struct, thread handles and worker arguments
 * come from `alloc` (the session's allocator). Workers spin briefly between products, then sleep
 * on a condvar. */
col_pool *col_pool_create(col_isa isa, uint32_t n_threads, void *scratch, uint64_t scratch_bytes,
                          const col_pool_limits *limits, const col_allocator *alloc);

/* Join the workers and free. NULL is a no-op. */
void col_pool_free(col_pool *pool);

/* Bytes of one activation row of `cols` as the pool's products of `dtype` weights read it when the
 * caller may quantise it itself (col_matvec_job.xq): q8_0/q4_0 weights on a pool without a
 * numerics variant (whose products read x as it rounds it), and bf16 weights on a vector path
 * under a numerics variant that packs them (col_numerics_packs_bf16: bf16 dot products); 0
 * otherwise (pool may be NULL). */
uint64_t col_pool_qrow_bytes(const col_pool *pool, uint32_t dtype, uint64_t cols);

/* x [cols] quantised (or packed to bf16) for the pool's products of `dtype` weights into out
 * [col_pool_qrow_bytes]: the bytes the pool would make of x itself. Pure: safe on any thread. */
void col_pool_quantize_row(const col_pool *pool, const float *x, uint64_t cols, uint32_t dtype, uint8_t *out);

/* Work that is not a product, split over the pool: thread t (0 = the caller) runs
 * fn(ctx, t, i0, i1) on pieces [i0, i1) of items 0..N-1 it takes in turn, and col_pool_run returns
 * when all shares are done. As with products, an item's result must not depend on the thread that
 * computes it; `t` is for per-thread scratch. Not reentrant: fn must not use the pool. */
typedef void (*col_pool_task)(void *ctx, uint32_t thread, uint64_t i0, uint64_t i1);
void col_pool_run(col_pool *pool, col_pool_task fn, void *ctx, uint64_t n_items);

/* The query heads of one KV group at one position: for each head j < n_q, with its query
 * q + j * d, out[j * d .. (j + 1) * d) = sum_t p[t] * v[t], p = softmax(scale * q.k[t]) over n_keys
 * cached keys k[t] = k + t * stride (values likewise), in f32 on the pool's kernel path. With
 * sinks, head j's softmax has one more logit, sinks[j], whose probability is dropped (GPT-OSS):
 * p[t] = exp(s[t] - m) / (sum_u exp(s[u] - m) + exp(sinks[j] - m)), m the largest of them all.
 * scores: [n_q][n_keys] scratch. A head's result depends only on its own inputs and the path (not
 * on n_q, the thread count or the position of the call), so a step equals a prefill block. */
typedef struct col_head_job {
    const float *q;
    const void *k;     /* f32, or IEEE half when kv_f16 (widened exactly: the heads compute in f32) */
    const void *v;
    uint32_t kv_f16;   /* 1: k and v hold halves (col_session_config.kv_precision) */
    uint64_t stride;   /* elements between consecutive positions of k and v */
    uint32_t n_keys;
    uint32_t d;
    float scale;
    uint32_t n_q;      /* query heads sharing k and v (>= 1) */
    uint32_t prefetch; /* a decode step: positions ahead to prefetch k (and v) from (0: none); no effect on results */
    const float *sinks; /* [n_q] each head's sink logit; NULL: none */
} col_head_job;
void col_attend_head(const col_pool *pool, const col_head_job *head, float *scores, float *out);

/* Threads of the pool including the caller (1 for NULL). */
uint32_t col_pool_threads(const col_pool *pool);

/* Thread t's counts since the pool's creation or the last col_pool_clear_stats (t 0 = the caller;
 * zeros for a NULL pool or t out of range): the products' multiply-adds it ran, and the batches
 * handed to every thread that it entered. Read and clear between batches, on the calling thread. */
void col_pool_thread_stats(const col_pool *pool, uint32_t t, col_thread_stats *out);
void col_pool_clear_stats(col_pool *pool);

/* The path this pool runs ("portable", "avx2", "avx512", "amx"). */
col_isa col_pool_isa(const col_pool *pool);
const char *col_isa_name(col_isa isa);

/* The SwiGLU gate: h1[i] = silu(h1[i]) * h3[i] = h1[i] / (1 + exp(-h1[i])) * h3[i] for i < n.
 * On the pool's threads when n is large (pool may be NULL: the portable path). Each element's
 * result depends only on its inputs and the pool's path (AVX2, AVX-512 and AMX pools use a vector
 * exp within 2 ulp of expf, the portable path expf), so a prefill block and a step give the same
 * bits. */
void col_swiglu_gate(col_pool *pool, float *h1, const float *h3, uint64_t n);

/* col_swiglu_gate on the calling thread alone, with the pool's path and so the same bits: for a
 * pool thread inside a task or a chain's step, which must not use the pool. Pure. */
void col_swiglu_gate_here(const col_pool *pool, float *h1, const float *h3, uint64_t n);

/* RMSNorm of one row: out[i] = w[i] * (x[i] * inv) for i < n, inv = 1 / sqrtf(ss / n + eps), where
 * ss, the sum of squares, has one order on every path: x[i] * x[i] (one f32 multiply) added to
 * one f32 sum from i = 0 up. x and out [n] may be the same array; w [n] is f32. Pure: safe
 * on any thread; isa only chooses the code (col_pool_isa), never the bits. */
void col_rmsnorm_row(col_isa isa, const float *x, const float *w, float eps, uint64_t n, float *out);

/* RMSNorm of `rows` rows of one weight: row r of x [rows][n] into row r of out [rows][n] (out may
 * be x; otherwise they do not overlap), each with col_rmsnorm_row's bits. On AVX2 and AVX-512
 * pools up to 8 rows share a vector, each lane its row's chain of squares. Pure: safe on any
 * thread. */
void col_rmsnorm_rows(col_isa isa, const float *x, const float *w, float eps, uint64_t n, uint32_t rows, float *out);

/* The first index of the largest of x[0..n) (n >= 1), a NaN counted as -inf (so 0 when every
 * value is NaN or -inf): the greedy choice of a token from its logits. Pure: safe on any thread;
 * isa only chooses the code, never the index. */
uint32_t col_first_largest(col_isa isa, const float *x, uint32_t n);

/* acc[i] += w * x[i] for i < n, the product rounded to f32 before the add (no fused multiply-add):
 * the same bits on every path. acc and x [n] do not overlap. Pure: safe on any thread. */
void col_add_scaled(col_isa isa, float *acc, float w, const float *x, uint64_t n);

/* RoPE's rotation of one vector whose dimensions pair as halves (rotate_half), in place:
 * v[i] = v[i] * c[i] - v[i + half] * s[i] and v[i + half] = v[i + half] * c[i] + v[i] * s[i] for
 * i < half, each product rounded to f32 before the add: the same bits on every path. v [2 * half];
 * c and s [half]. Pure: safe on any thread. */
void col_rotate_half(col_isa isa, float *v, uint32_t half, const float *c, const float *s);

/* v[i] rounded to the nearest bf16 in place (ties to even; Inf and NaN unchanged), for i < n; on
 * the pool's threads when n is large (pool may be NULL). The same bits on every path. */
void col_round_bf16(col_pool *pool, float *v, uint64_t n);

/* v[i] rounded to the nearest f16 value in place (ties to even; past the largest half to Inf;
 * subnormal halves kept; Inf unchanged; NaN to the quiet NaN of its sign), as f32, for i < n; on
 * the pool's threads when n is large (pool may be NULL). The same bits on every path. */
void col_round_f16(col_pool *pool, float *v, uint64_t n);

/* out[i] = the IEEE half nearest x[i] (round to nearest even, Inf past the largest, a NaN the
 * quiet NaN of its sign): col_round_f16's values as bits, on any path. Pure. */
void col_f16_row(col_isa isa, const float *x, uint64_t n, uint16_t *out);

/* Scalar conversions of stored elements to f32. */
float col_f16_to_f32(uint16_t h);
float col_bf16_to_f32(uint16_t b);

/* Element `i` of a stored vector of `dtype` (f32/f16/bf16 only), as f32. */
float col_load_elem(const void *data, uint32_t dtype, uint64_t i);

/* out[0..n) = stored[0..n) as f32 (any dtype; a block dtype needs n % 32 == 0 and `data` at the
 * start of a row of exactly n elements, since its scales precede its payload). */
void col_load_row(const void *data, uint32_t dtype, uint64_t n, float *out);

/* out[0..count) = elements [first, first + count) of the stored row `row` of `cols` elements (a
 * row dtype: not q8_0x8 / q4_0x8, whose rows are spread over their panel). */
void col_load_range(const void *row, uint32_t dtype, uint64_t cols, uint64_t first, uint64_t count, float *out);

/* out[0..count) = elements [first, first + count) of row r of the stored matrix `matrix` (rows of
 * `cols` elements, any dtype; a panel dtype's row gathered from its panel of 8 rows). Exact. */
void col_load_matrix_range(const void *matrix, uint32_t dtype, uint64_t cols, uint64_t r, uint64_t first,
                           uint64_t count, float *out);

/* Every job of the batch in one dispatch: the rows of all jobs are split among the threads as
 * one range (pool may be NULL: single-threaded portable path, float weights only, since int8
 * blocks need the pool's scratch). Each output y[t][r] has the bits of the same row and token
 * computed alone (a job of one token), whatever the batch, the job's n_tokens or the thread
 * count; a job of one token runs the decode tiles. */
void col_matmul_many(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs);

/* A first-stage job of a chain that belongs to no group (col_matmul_chain). */
#define COL_CHAIN_NONE UINT32_MAX

/* What a chain runs for group g between its two stages (col_matmul_chain), on the pool thread
 * `thread` that finished the group's last first-stage rows while others run other rows: it must
 * touch only the group's data and must not use the pool. */
typedef void (*col_chain_step)(void *ctx, uint32_t thread, uint32_t group);

/* Two dependent batches in one dispatch: the products jobs[0, n_first) (the first stage), then for
 * each group g < n_groups step(ctx, thread, g) once every first-stage job of group g is done, then
 * the products jobs[n_first, n_jobs) (the second stage), a job of group g once step has run for g.
 * group[k] is job k's group (< n_groups), or COL_CHAIN_NONE for a first-stage job of none; every
 * second-stage job has one. A thread out of first-stage rows starts the second-stage rows of a
 * group whose step has run instead of waiting for the last first-stage row (an expert's
 * down-projection after its own up-projections, not everyone's). The same bits as
 * col_matmul_many(first stage), step for every group in order, col_matmul_many(second stage), which
 * it runs instead when the pool cannot chain them (NULL, a numerics variant, jobs or activations
 * beyond its limits). Not reentrant, like col_pool_run. */
void col_matmul_chain(col_pool *pool, const col_matvec_job *jobs, uint32_t n_first, uint32_t n_jobs,
                      const uint32_t *group, uint32_t n_groups, col_chain_step step, void *ctx);

/* col_matmul_many on the kernels alone, ignoring a numerics variant (numerics.c calls it).
 * x_bf16: 1 when every activation of every job is a bf16 value (numerics.c rounded them), which
 * lets the AMX path pack one bf16 part per activation instead of three (the same bits; other
 * paths ignore it); 0 otherwise. */
void col_matmul_kernels(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, int x_bf16);

/* Whether products of weights of this dtype can run whole on one thread inside a col_pool_run task
 * (col_matmul_here): weights the pool's path reads with the activations as they are (no int8
 * blocks, AMX packing or bf16 dot products) and no numerics variant. 0 for a NULL pool. */
int col_pool_runs_here(const col_pool *pool, uint32_t dtype);

/* Every row of the jobs on the calling pool thread `thread` (the task's), with its staging; the
 * same bits as col_matmul_many. Only for dtypes col_pool_runs_here accepts. */
void col_matmul_here(const col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, uint32_t thread);

/* A row walker that runs products instead of the pool's kernels (numerics.c's variant loops):
 * rows [r0, r1) of job j, every token. An output's bits must not depend on r0, r1 or the thread. */
typedef void (*col_rows_walker)(const void *ctx, const col_matvec_job *j, uint64_t r0, uint64_t r1);

/* Every job of the batch through `walk`, split over the pool's threads as col_matmul_many splits
 * products (chunks of multiply-adds taken from a shared counter, each edge on a multiple of
 * `align` rows); no activations are prepared. pool may be NULL: every row on the calling thread. */
void col_matmul_walk(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, col_rows_walker walk,
                     const void *ctx, uint32_t align);

/* col_matmul_kernels with the bf16 weights multiplied by bf16 dot products (numerics.c's
 * COL_REDUCTION_BF16_DOT): the activations rounded to bf16 for the product, pairs added per lane as
 * vdpbf16ps adds them (col_dot_bf16_portable defines the bits; over bf16x16 panels one chain a row,
 * col_dot_bf16_panel_portable), on the AVX512-BF16 instruction
 * where the CPU has it and in AVX2 or plain C with the same bits elsewhere, never on AMX tiles;
 * other weights as col_matmul_kernels(..., 0). Bit-identical for any thread count and batch. */
void col_matmul_bf16_dot(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs);

/* Route every product of this pool through col_numerics_matmul(numerics) (NULL = the kernels).
 * `numerics` must outlive the pool's use (it lives in the session). */
void col_pool_set_numerics(col_pool *pool, const col_numerics *numerics);

/* Weight view of a 2-D tensor [rows, cols]. */
col_weight col_weight_of(const col_tensor_info *t);

/* Weight view of expert `e` of a stacked 3-D tensor [E, rows, cols]. */
col_weight col_weight_expert(const col_tensor_info *t, uint32_t e);

#endif /* COLIBRI_KERNELS_H */
