/*
 * kernels.c - matrix-vector products over stored weights (f32, f16, bf16) and the thread pool
 * that splits them by output rows.
 *
 * This is the portable C path. Each output row is one dot product accumulated left to right in
 * f32 by a single thread, so the result never depends on how rows were split among threads.
 * The pool is created with the session (no per-token thread creation) and hands out row ranges
 * with a generation counter under one mutex; work below a size threshold runs on the caller's
 * thread because waking workers would cost more than the product itself.
 */
#include "kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Products smaller than this many weight elements are not worth a wake-up of the workers. */
#define COL_PARALLEL_MIN_ELEMS (1u << 15)

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

void col_load_row(const void *data, uint32_t dtype, uint64_t n, float *out)
{
    if (dtype == COL_DTYPE_F32) {
        memcpy(out, data, n * sizeof(float));
        return;
    }
    for (uint64_t i = 0; i < n; i++) out[i] = col_load_elem(data, dtype, i);
}

/* ---- dot products ------------------------------------------------------------------------ */

static float dot_f32(const float *w, const float *x, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; i++) acc += w[i] * x[i];
    return acc;
}

static float dot_f16(const uint16_t *w, const float *x, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; i++) acc += col_f16_to_f32(w[i]) * x[i];
    return acc;
}

static float dot_bf16(const uint16_t *w, const float *x, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; i++) acc += col_bf16_to_f32(w[i]) * x[i];
    return acc;
}

static void matvec_rows(const col_weight *w, const float *x, float *y, uint64_t r0, uint64_t r1)
{
    uint64_t n = w->cols;
    switch (w->dtype) {
    case COL_DTYPE_F16: {
        const uint16_t *base = w->data;
        for (uint64_t r = r0; r < r1; r++) y[r] = dot_f16(base + r * n, x, n);
        break;
    }
    case COL_DTYPE_BF16: {
        const uint16_t *base = w->data;
        for (uint64_t r = r0; r < r1; r++) y[r] = dot_bf16(base + r * n, x, n);
        break;
    }
    default: {
        const float *base = w->data;
        for (uint64_t r = r0; r < r1; r++) y[r] = dot_f32(base + r * n, x, n);
        break;
    }
    }
}

/* ---- thread pool ------------------------------------------------------------------------- */

typedef struct pool_job {
    const col_weight *w;
    const float *x;
    float *y;
} pool_job;

struct col_pool {
    uint32_t n_threads;
    pthread_t *threads;
    uint32_t n_started;
    pthread_mutex_t mutex;
    pthread_cond_t work_ready;
    pthread_cond_t work_done;
    uint64_t generation;      /* bumped for each job */
    uint32_t n_pending;       /* workers still busy with the current job */
    int stopping;
    pool_job job;
};

typedef struct worker_arg {
    col_pool *pool;
    uint32_t index;           /* 1..n_threads-1; the caller is 0 */
} worker_arg;

/* Thread `t` of `n` owns rows [rows*t/n, rows*(t+1)/n). */
static void run_share(const pool_job *job, uint32_t t, uint32_t n)
{
    uint64_t rows = job->w->rows;
    uint64_t r0 = rows * t / n, r1 = rows * (t + 1) / n;
    matvec_rows(job->w, job->x, job->y, r0, r1);
}

static void *worker_main(void *p)
{
    worker_arg arg = *(worker_arg *)p;
    free(p);
    col_pool *pool = arg.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mutex);
    for (;;) {
        while (!pool->stopping && pool->generation == seen) pthread_cond_wait(&pool->work_ready, &pool->mutex);
        if (pool->stopping) break;
        seen = pool->generation;
        pool_job job = pool->job;
        pthread_mutex_unlock(&pool->mutex);
        run_share(&job, arg.index, pool->n_threads);
        pthread_mutex_lock(&pool->mutex);
        if (--pool->n_pending == 0) pthread_cond_signal(&pool->work_done);
    }
    pthread_mutex_unlock(&pool->mutex);
    return NULL;
}

col_pool *col_pool_create(uint32_t n_threads)
{
    if (n_threads == 0) return NULL;
    col_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    if (pthread_mutex_init(&pool->mutex, NULL) != 0) {
        free(pool);
        return NULL;
    }
    pthread_cond_init(&pool->work_ready, NULL);
    pthread_cond_init(&pool->work_done, NULL);
    if (n_threads > 1) {
        pool->threads = calloc(n_threads - 1, sizeof *pool->threads);
        if (!pool->threads) {
            col_pool_free(pool);
            return NULL;
        }
        for (uint32_t i = 1; i < n_threads; i++) {
            worker_arg *arg = malloc(sizeof *arg);
            if (!arg) {
                col_pool_free(pool);
                return NULL;
            }
            arg->pool = pool;
            arg->index = i;
            if (pthread_create(&pool->threads[i - 1], NULL, worker_main, arg) != 0) {
                free(arg);
                col_pool_free(pool);
                return NULL;
            }
            pool->n_started++;
        }
    }
    return pool;
}

void col_pool_free(col_pool *pool)
{
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    for (uint32_t i = 0; i < pool->n_started; i++) pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    pthread_cond_destroy(&pool->work_ready);
    pthread_cond_destroy(&pool->work_done);
    pthread_mutex_destroy(&pool->mutex);
    free(pool);
}

void col_matvec(col_pool *pool, const col_weight *w, const float *x, float *y)
{
    if (!pool || pool->n_started + 1 < pool->n_threads || pool->n_threads == 1 ||
        w->rows < pool->n_threads || w->rows * w->cols < COL_PARALLEL_MIN_ELEMS) {
        matvec_rows(w, x, y, 0, w->rows);
        return;
    }
    pool_job job = {w, x, y};
    pthread_mutex_lock(&pool->mutex);
    pool->job = job;
    pool->n_pending = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    run_share(&job, 0, pool->n_threads);
    pthread_mutex_lock(&pool->mutex);
    while (pool->n_pending > 0) pthread_cond_wait(&pool->work_done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}

/* ---- weight views ------------------------------------------------------------------------ */

col_weight col_weight_of(const col_tensor_info *t)
{
    col_weight w = {t->data, t->dtype, t->shape[0], t->ndim > 1 ? t->shape[1] : 1, 0};
    return w;
}

col_weight col_weight_expert(const col_tensor_info *t, uint32_t e)
{
    uint64_t stride = t->shape[1] * t->shape[2] * col_dtype_size(t->dtype);
    col_weight w = {(const uint8_t *)t->data + stride * e, t->dtype, t->shape[1], t->shape[2], stride};
    return w;
}
