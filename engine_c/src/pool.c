/*
 * pool.c - a session's thread pool, and the products it splits over its threads.
 *
 * A pool is created with its session: n_threads - 1 workers (the caller is the n-th), no thread
 * created per token. A forward pass issues tens of products per token, too many for a condvar
 * wake-up each, so between products the workers spin on an atomic generation counter for a short
 * while, then sleep on a condvar so an idle session costs no CPU.
 *
 * A batch of products (col_matmul_many) is laid end to end by rows and cut into chunks of work
 * (multiply-adds, not rows: a prefill block's experts see different token counts), long first and
 * short last, each edge on a whole tile of the path; the threads take the chunks from a shared
 * counter and run each on the path's row walker. The activations a path reads prepared (int8
 * blocks, AMX packing) are prepared first, on the pool when the batch is large. Which thread
 * computes a row never changes its bits. col_pool_run's items are cut the same way, long pieces
 * first and short ones last, and taken from the same counter. A worker joins a batch through a
 * gate the caller closes once it has run out of work to take, so the caller never waits for a
 * worker that has not started (descheduled on a busy machine, or still waking), only for the
 * sub-piece of a chunk a worker is running: a thread out of chunks takes the sub-pieces of begun
 * chunks no one has taken yet. A chain (col_matmul_chain) is two such batches in one, the second
 * stage's rows of a group waiting only for that group's first-stage rows and step. The pool's
 * scratch (prepared activations, per-thread staging) is the session's, sized by
 * col_pool_scratch_size; the pool allocates only its own bookkeeping.
 */
#include "kernels_amx.h"
#include "kernels_internal.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Products smaller than this many multiply-adds are not worth waking the workers. */
#ifndef COL_PARALLEL_MIN_MACS
#define COL_PARALLEL_MIN_MACS (1u << 14)
#endif
/* Products are cut into chunks of decreasing size (plan_chunks), each of at least
 * COL_GUIDED_MIN_MACS multiply-adds (a chunk's rows are read as up to 8 streams, which need some
 * length to pay off: a decode step's products of a few hundred KiB each were cut into sub-pieces
 * whose streams were a few panels long) and at most COL_MAX_CHUNKS of them. */
#ifndef COL_GUIDED_MIN_MACS
#define COL_GUIDED_MIN_MACS (1u << 19)
#endif
#define COL_MAX_CHUNKS 256
/* The least chunk as a part of the batch: a 256th when some product has several tokens (a
 * prefill's, whose last chunks then end within about 0.1 ms of each other), a 32nd for single
 * tokens (a decode step's, whose chunks' rows make the decode tiles' streams). */
#define COL_GUIDED_PARTS_BATCH COL_MAX_CHUNKS
#define COL_GUIDED_PARTS_STEP 32
/* A chunk is run as up to this many sub-pieces (none under the batch's least chunk), taken from the
 * chunk's own counter, so a thread out of chunks takes over the rest of one a preempted thread
 * began (run_share). 1: chunks whole. */
#ifndef COL_CHUNK_PARTS
#define COL_CHUNK_PARTS 4
#endif
/* Activations of a batch are prepared on the pool from this many elements (prepare_activations). */
#define COL_PREPARE_PARALLEL_ELEMS (1u << 16)
/* Spins of a worker waiting for the next product before it sleeps: 2000 pauses (about 50 us on a
 * Zen 3), then sched_yield (about 10 ms in all when no other thread wants the core). */
#define COL_SPIN_LIMIT 20000u
/* The gate's bit the caller sets when the batch takes no more workers; the bits below it count
 * the workers inside. */
#define COL_GATE_CLOSED (1ull << 31)
#define COL_GATE_INSIDE (COL_GATE_CLOSED - 1)

/* ---- thread pool ------------------------------------------------------------------------- */

typedef struct worker_arg {
    col_pool *pool;
    uint32_t index;           /* 1..n_threads-1; the caller is 0 */
} worker_arg;

/* A thread's counts, each written only by its own thread; 128 bytes apart, so no two threads'
 * counts share a cache line wherever the array starts. */
typedef struct thread_counts {
    col_thread_stats stats;
    uint8_t pad[128 - sizeof(col_thread_stats)];
} thread_counts;

struct col_pool {
    uint32_t n_threads;
    col_isa isa;
    pthread_t *threads;       /* [n_threads - 1] */
    worker_arg *args;         /* [n_threads - 1], what each worker was started with */
    col_allocator alloc;      /* what the pool, threads and args were allocated with */
    uint32_t n_started;
    pthread_mutex_t mutex;
    pthread_cond_t work_ready;
    _Atomic uint64_t generation;   /* bumped for each batch */
    _Atomic uint64_t gate;         /* the batch's generation << 32 | COL_GATE_CLOSED | workers inside */
    _Atomic uint32_t n_sleeping;   /* workers blocked on work_ready */
    _Atomic int stopping;
    /* the current batch, written before generation is bumped: products, or a task */
    col_pool_task task;
    void *task_ctx;
    uint64_t n_items;
    const col_matvec_job *jobs;
    uint32_t n_jobs;
    int x_bf16;                /* every activation of the batch is a bf16 value (col_matmul_kernels) */
    int bf16_dot;              /* bf16 weights by bf16 dot products (col_matmul_bf16_dot) */
    int has_bf16_dot;          /* the path has vdpbf16ps (AVX512-BF16) */
    int int8_form;             /* col_int8_form of the AVX2 path's q8_0/q4_0 kernels */
    col_rows_walker walk;      /* products: run by this instead of the path's kernels (col_matmul_walk) */
    const void *walk_ctx;
    uint32_t walk_align;       /* rows a walker's chunk edges fall on */
    uint64_t total_work;       /* sum over jobs of rows * row_work */
    uint32_t n_chunks;         /* pieces the threads take in turn (products' chunks, a task's items) */
    uint64_t chunk_end[COL_MAX_CHUNKS]; /* work (or item) at which chunk c ends (it starts where c - 1 ends) */
    _Atomic uint32_t next_chunk;
    uint64_t least_chunk;      /* the least chunk plan_chunks cut, the least sub-piece */
    _Atomic uint16_t next_part[COL_MAX_CHUNKS]; /* chunk c's sub-pieces taken so far (<= parts + threads) */
    /* a chain (col_matmul_chain): NULL chain_group for a plain batch */
    const uint32_t *chain_group;   /* [n_jobs] each job's group or COL_CHAIN_NONE */
    uint32_t chain_first;          /* jobs [0, chain_first) are the first stage */
    uint32_t first_chunks;         /* chunks [0, first_chunks) hold the first stage's rows, the rest the second's */
    col_chain_step chain_step;
    void *chain_ctx;
    _Atomic uint64_t *group_left;  /* [max_jobs] a group's first-stage work not yet done */
    _Atomic uint32_t *group_ready; /* [max_jobs] 1 once a group's step has run and its activations are prepared */
    /* scratch (caller-owned): per-job prepared activations, per-thread AMX staging */
    uint32_t max_jobs;
    uint64_t act_capacity;         /* bytes at act_buf */
    uint8_t **act;                 /* [max_jobs]; a job sharing the previous one's holds the same pointer */
    uint8_t *act_buf;              /* quantised rows or AMX-packed activations */
    uint8_t *stage;                /* [n_threads][stage_bytes] */
    uint64_t stage_bytes;
    const col_numerics *numerics;  /* a session's numerics variant (numerics.c), NULL = none */
#if defined(__x86_64__)
    col_decode_tuning tune;        /* the decode tiles' tuning on this CPU */
#endif
    thread_counts *counts;         /* [n_threads]: what each thread did (col_pool_thread_stats) */
};


/* The path whose row kernels run products of `dtype` on this pool (col_isa_int8). */
static col_isa row_isa(const col_pool *pool, uint32_t dtype)
{
    return is_block_dtype(dtype) ? col_isa_int8(pool->isa) : pool->isa;
}

/* Whether job j of the current batch runs as bf16 dot products. */
static int dot_job(const col_pool *pool, const col_matvec_job *j)
{
    return pool->bf16_dot && holds_bf16(j->w.dtype);
}

/* Rows [r0, r1) of job j on thread t; `act` is the job's prepared activations (quantised for int8
 * weights, packed for AMX tiles or bf16 dot products, NULL otherwise). */
static void job_rows(const col_pool *pool, const col_matvec_job *j, const uint8_t *act, uint32_t t, uint64_t r0,
                     uint64_t r1)
{
    if (dot_job(pool, j)) {
#if defined(__x86_64__)
        if (pool->has_bf16_dot) {
            col_rows_bf16dot_avx512(j, (const uint16_t *)(const void *)act, r0, r1, pool->tune);
            return;
        }
        if (pool->isa >= COL_ISA_AVX512F) {
            col_rows_bf16dot_avx512f(j, (const uint16_t *)(const void *)act, r0, r1, pool->tune);
            return;
        }
        if (pool->isa >= COL_ISA_AVX2) {
            col_rows_bf16dot_avx2(j, (const uint16_t *)(const void *)act, r0, r1);
            return;
        }
#endif
        col_rows_bf16dot_portable(j, r0, r1);
        return;
    }
#if defined(__x86_64__)
    if (pool->isa == COL_ISA_AMX && col_amx_handles(j->w.dtype)) {
        col_amx_rows(j, pool->x_bf16, act, pool->stage + (uint64_t)t * pool->stage_bytes, pool->stage_bytes, r0, r1);
        return;
    }
    if (pool->isa == COL_ISA_AMX && col_amx_int8_runs(j, pool->stage_bytes)) {
        col_amx_int8_rows(j, act, pool->stage + (uint64_t)t * pool->stage_bytes, r0, r1);
        return;
    }
    const col_isa isa = row_isa(pool, j->w.dtype);
    if (isa >= COL_ISA_AVX512F) {
        col_rows_avx512(j, act, r0, r1, pool->stage ? pool->stage + (uint64_t)t * pool->stage_bytes : NULL, pool->stage_bytes,
                        pool->tune);
        return;
    }
    if (isa == COL_ISA_AVX2) {
        col_rows_avx2(j, act, r0, r1, pool->tune, pool->int8_form);
        return;
    }
#endif
    (void)pool, (void)t;
    col_rows_portable(j, act, r0, r1);
}

static void dispatch(col_pool *pool, int worth_sharing);

/* Work of one output row of a job: its multiply-adds. Shares are cut by work, not rows, because
 * the products of a batch differ in width and token count (a prefill block's experts see from one
 * to all of its tokens), and equal rows left one thread waiting for the other. */
static uint64_t row_work(const col_matvec_job *j)
{
    return j->w.cols * j->n_tokens;
}

/* The parts plan_chunks cuts a batch of products into at the least (COL_GUIDED_PARTS_*). */
static uint64_t guided_parts(const col_matvec_job *jobs, uint32_t n_jobs)
{
    for (uint32_t k = 0; k < n_jobs; k++)
        if (jobs[k].n_tokens > 1) return COL_GUIDED_PARTS_BATCH;
    return COL_GUIDED_PARTS_STEP;
}

/* Rows per tile of a batch (more than one token) on the pool's path: a chunk of a batch starts and
 * ends on a multiple of it, so that no chunk ends in a short tile, which does less with each
 * weight or token vector it loads (a vector tile of one row loads 4 token vectors per 4
 * multiply-adds instead of 10 per 24; an AMX block of a few rows costs the tile multiplies of 32).
 * Decode tiles take distant rows and need no such edge, except that a chunk of weights stored in
 * panels takes whole panels on every path. */
static uint64_t batch_tile_rows(const col_pool *pool, const col_matvec_job *j)
{
    if (is_bf16_panel(j->w.dtype)) return COL_BF16_PANEL_ROWS; /* every path walks whole panels */
    if (j->n_tokens == 1) return is_panel_dtype(j->w.dtype) ? COL_STORED_PANEL_ROWS : 1;
#if defined(__x86_64__)
    if (dot_job(pool, j)) return pool->isa >= COL_ISA_AVX512F ? COL_BATCH_ROWS_512 : 1;
    if (pool->isa == COL_ISA_AMX && col_amx_handles(j->w.dtype)) return col_amx_tile_rows(j->n_tokens, pool->x_bf16);
    const col_isa isa = row_isa(pool, j->w.dtype);
    if (isa >= COL_ISA_AVX512F) return is_block_dtype(j->w.dtype) ? COL_PANEL_ROWS : COL_BATCH_ROWS_512;
    if (isa == COL_ISA_AVX2 && pool->int8_form == COL_INT8_MADDUBS_512 && is_panel_dtype(j->w.dtype))
        return 2 * COL_STORED_PANEL_ROWS; /* two panels a zmm pass */
    if (isa == COL_ISA_AVX2) return is_block_dtype(j->w.dtype) ? COL_BATCH_ROWS_Q_AVX2 : COL_BATCH_ROWS_AVX2;
#endif
    (void)pool;
    return is_panel_dtype(j->w.dtype) ? COL_STORED_PANEL_ROWS : 1;
}

/* The first row of job j whose work starts at or after `g` (the batch's work, rows laid end to
 * end, the job's rows starting at `base`), moved down to a multiple of `align` rows. */
static uint64_t chunk_edge(const col_matvec_job *j, uint64_t g, uint64_t base, uint64_t align)
{
    const uint64_t c = row_work(j);
    if (g <= base) return 0;
    uint64_t r = (g - base + c - 1) / c;
    return r >= j->w.rows ? j->w.rows : r - r % align;
}

static void await_group(col_pool *pool, uint32_t t, uint32_t g);
static void finish_group_rows(col_pool *pool, uint32_t t, uint32_t g, uint64_t work);

/* The rows of a batch of products whose work starts in [g0, g1) of the batch's work, rows laid end
 * to end, each edge moved down to a whole batch tile. In a chain, a second-stage job's rows wait
 * for their group's step, and a first-stage job's rows count down their group's work. */
static void run_work(col_pool *pool, uint32_t t, uint64_t g0, uint64_t g1)
{
    pool->counts[t].stats.multiply_adds += g1 - g0;
    uint64_t base = 0;
    for (uint32_t k = 0; k < pool->n_jobs && base < g1; k++) {
        const col_matvec_job *j = &pool->jobs[k];
        const uint64_t align = pool->walk ? pool->walk_align : batch_tile_rows(pool, j);
        uint64_t lo = chunk_edge(j, g0, base, align), hi = chunk_edge(j, g1, base, align);
        if (lo < hi && pool->walk) {
            pool->walk(pool->walk_ctx, j, lo, hi);
        } else if (lo < hi) {
            const uint32_t g = pool->chain_group ? pool->chain_group[k] : COL_CHAIN_NONE;
            if (g != COL_CHAIN_NONE && k >= pool->chain_first) await_group(pool, t, g);
            job_rows(pool, j, k < pool->max_jobs ? pool->act[k] : NULL, t, lo, hi);
            if (g != COL_CHAIN_NONE && k < pool->chain_first) finish_group_rows(pool, t, g, (hi - lo) * row_work(j));
        }
        base += j->w.rows * row_work(j);
    }
}

/* Cut `work` (multiply-adds, or a task's items) of a batch, from `start` on, into chunks *c.. (at
 * most max_chunks of them, *c moved past them) for the pool's n threads, and return the least,
 * guided: each chunk is the work left divided by 2n, but at least `least_work` and a `parts`-th
 * of the work (and at most an n-th of it, so each thread gets one), so the first chunks are long
 * (a product's rows make long streams) and the last ones short, so neither thread waits long for
 * the other's last chunk. Up to 128 threads the chunks stop shrinking before COL_MAX_CHUNKS of
 * them (about 20 for 2 threads and 256 parts). Products of less than two least chunks a thread
 * are cut into n equal chunks instead: three least chunks left one thread streaming the third
 * alone. Each chunk is run as up to COL_CHUNK_PARTS sub-pieces of at least the least chunk. */
static uint64_t plan_range(col_pool *pool, uint32_t *c, uint32_t max_chunks, uint64_t start, uint64_t work,
                           uint64_t least_work, uint64_t parts)
{
    const uint64_t n = pool->n_threads, least_by_work = work / parts;
    uint64_t least = least_by_work > least_work ? least_by_work : least_work;
    if (least > (work + n - 1) / n) least = (work + n - 1) / n; /* a small product: one chunk per thread */
    const uint32_t c0 = *c;
    if (least_work > 1 && work < 2 * n * least && max_chunks >= n) {
        for (uint64_t i = 1; i <= n; i++) pool->chunk_end[(*c)++] = start + work * i / n;
        return work / n ? work / n : 1;
    }
    uint64_t done = 0;
    while (done < work && *c + 1 < c0 + max_chunks) {
        uint64_t size = (work - done) / (2 * n);
        size = size > least ? size : least;
        done = work - done > size ? done + size : work;
        pool->chunk_end[(*c)++] = start + done;
    }
    if (done < work || *c == c0) pool->chunk_end[(*c)++] = start + work;
    return least ? least : 1; /* 0 only for an empty batch */
}

/* A plain batch's chunks (plan_range), the chunks' sub-pieces reset. */
static void plan_chunks(col_pool *pool, uint64_t work, uint64_t least_work, uint64_t parts)
{
    uint32_t c = 0;
    pool->least_chunk = plan_range(pool, &c, COL_MAX_CHUNKS, 0, work, least_work, parts);
    pool->n_chunks = c;
    pool->first_chunks = 0;
    for (uint32_t k = 0; k < c; k++) atomic_store_explicit(&pool->next_part[k], 0, memory_order_relaxed); /* published by the generation */
}

/* The sub-pieces chunk c of the current batch is run as: up to COL_CHUNK_PARTS, none under the
 * least chunk. */
static uint32_t chunk_parts(const col_pool *pool, uint32_t c)
{
    const uint64_t cut = (pool->chunk_end[c] - (c ? pool->chunk_end[c - 1] : 0)) / pool->least_chunk;
    return cut < 1 ? 1 : cut > COL_CHUNK_PARTS ? COL_CHUNK_PARTS : (uint32_t)cut;
}

/* The sub-pieces of chunk c no thread has taken yet, on thread t, each taken by exactly one
 * thread: a product's rows, or a task's items, [g0, g1) of the chunk cut in equal parts of work. */
static void run_piece(col_pool *pool, uint32_t t, uint32_t c)
{
    const uint64_t start = c ? pool->chunk_end[c - 1] : 0, size = pool->chunk_end[c] - start;
    const uint32_t n = chunk_parts(pool, c);
    for (uint32_t p; (p = atomic_fetch_add(&pool->next_part[c], 1)) < n;) {
        const uint64_t g0 = start + size * p / n, g1 = start + size * (p + 1) / n;
        if (pool->task)
            pool->task(pool->task_ctx, t, g0, g1);
        else
            run_work(pool, t, g0, g1);
    }
}

/* Thread `t` of `n`'s part of the current batch. Products and a task's items are cut into chunks
 * that the threads take in turn from a shared counter, so a thread that the memory system (or the
 * scheduler) serves more slowly for a while does less instead of holding the other up at the end.
 * Which thread computes a row or an item never changes its bits. */
static void run_share(col_pool *pool, uint32_t t, uint32_t n)
{
    if (n == 1 && pool->task) {
        pool->task(pool->task_ctx, t, 0, pool->n_items);
        return;
    }
    if (n == 1) {
        for (uint32_t c = 0; c < pool->n_chunks; c++) run_work(pool, t, c ? pool->chunk_end[c - 1] : 0, pool->chunk_end[c]);
        return;
    }
    for (uint32_t c; (c = atomic_fetch_add(&pool->next_chunk, 1)) < pool->n_chunks;) run_piece(pool, t, c);
    /* out of chunks: the sub-pieces left of those other threads began (one may be preempted) */
    for (uint32_t c = 0; c < pool->n_chunks; c++)
        if (atomic_load_explicit(&pool->next_part[c], memory_order_relaxed) < chunk_parts(pool, c)) run_piece(pool, t, c);
}

/* One step of a spin-wait: pause, and after a while yield the core, because on an oversubscribed
 * machine the thread being waited for may be the one that needs it. */
static void cpu_relax(uint32_t spins)
{
    if (spins > 2000u) {
        sched_yield();
        return;
    }
#if defined(__x86_64__)
    _mm_pause();
#endif
}

/* Whether job k of the current batch prepares its own activations into pool->act[k] (not the
 * caller's quantised rows, not the previous job's). */
static int prepares_own(const col_pool *pool, const col_matvec_job *jobs, uint32_t k)
{
    const uint8_t *act = pool->act[k];
    return act && !jobs[k].xq && !(k > 0 && act == pool->act[k - 1]);
}

static void prepare_token(const col_pool *pool, const col_matvec_job *j, uint8_t *act, uint32_t t);

/* A chain's group g whose first-stage rows are all done, on the thread that did the last of them:
 * its step, its second-stage jobs' activations, then the group is ready (the release publishes
 * both to the threads that wait for it). */
static void complete_group(col_pool *pool, uint32_t t, uint32_t g)
{
    pool->chain_step(pool->chain_ctx, t, g);
    for (uint32_t k = pool->chain_first; k < pool->n_jobs; k++)
        if (pool->chain_group[k] == g && prepares_own(pool, pool->jobs, k))
            for (uint32_t tok = 0; tok < pool->jobs[k].n_tokens; tok++) prepare_token(pool, &pool->jobs[k], pool->act[k], tok);
    atomic_store_explicit(&pool->group_ready[g], 1, memory_order_release);
}

/* `work` of group g's first-stage rows done on thread t; the thread that does the group's last
 * completes it (acq_rel: it sees the other threads' rows of the group). */
static void finish_group_rows(col_pool *pool, uint32_t t, uint32_t g, uint64_t work)
{
    if (atomic_fetch_sub_explicit(&pool->group_left[g], work, memory_order_acq_rel) == work) complete_group(pool, t, g);
}

/* Wait on thread t until group g is ready, running meanwhile the first-stage sub-pieces no thread
 * has taken (the group's rows may be among them). Every first-stage chunk was taken before any
 * second-stage one, and a thread runs a first-stage piece without waiting, so the wait ends. */
static void await_group(col_pool *pool, uint32_t t, uint32_t g)
{
    for (uint32_t spins = 0; !atomic_load_explicit(&pool->group_ready[g], memory_order_acquire);) {
        uint32_t c = 0;
        while (c < pool->first_chunks && atomic_load_explicit(&pool->next_part[c], memory_order_relaxed) >= chunk_parts(pool, c))
            c++;
        if (c < pool->first_chunks)
            run_piece(pool, t, c);
        else
            cpu_relax(spins++);
    }
}

/* Enter the batch of generation g, unless the caller has closed it (it took all the work itself)
 * or moved on to a later one. */
static int enter_batch(col_pool *pool, uint64_t g)
{
    uint64_t cur = atomic_load(&pool->gate);
    for (;;) {
        if (cur >> 32 != (g & 0xFFFFFFFFu) || (cur & COL_GATE_CLOSED)) return 0;
        if (atomic_compare_exchange_weak(&pool->gate, &cur, cur + 1)) return 1;
    }
}

static void *worker_main(void *p)
{
    worker_arg arg = *(worker_arg *)p;
    col_pool *pool = arg.pool;
    uint64_t seen = 0;
    for (;;) {
        uint32_t spins = 0;
        uint64_t g;
        while ((g = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stopping)) {
            if (++spins < COL_SPIN_LIMIT) {
                cpu_relax(spins);
                continue;
            }
            pthread_mutex_lock(&pool->mutex);
            atomic_fetch_add(&pool->n_sleeping, 1);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stopping))
                pthread_cond_wait(&pool->work_ready, &pool->mutex);
            atomic_fetch_sub(&pool->n_sleeping, 1);
            pthread_mutex_unlock(&pool->mutex);
            spins = 0;
        }
        if (atomic_load(&pool->stopping)) break;
        seen = g;
        if (!enter_batch(pool, g)) continue;
        pool->counts[arg.index].stats.batches++;
        run_share(pool, arg.index, pool->n_threads);
        atomic_fetch_sub(&pool->gate, 1);
    }
    return NULL;
}

/* Scratch layout: [max_jobs] activation pointers | activations | [n_threads] AMX staging. The
 * activations of a batch take, per job, n_tokens quantised rows, or AMX-packed tokens, which
 * need at most ceil(nt / 5) * ceil(cols / 32) * 1024 <= 32 (nt + 4) (cols + 31) / 5 bytes
 * = 6.4 nt cols + 198.4 nt + 25.6 cols + 793.6 (col_amx_packed_bytes), plus 64 of slack and 64
 * of alignment. */
static uint64_t pointers_bytes(uint32_t max_jobs)
{
    return ((uint64_t)max_jobs * sizeof(uint8_t *) + 63) & ~(uint64_t)63;
}
static uint64_t act_bytes(col_isa isa, const col_pool_limits *l)
{
    uint64_t q = col_qrow_bytes(l->max_act_cols) + 64 * (uint64_t)l->max_jobs;
    const uint64_t bf16 = 2 * l->max_act_cols + 64 * (uint64_t)l->max_jobs; /* bf16 dot products' activations */
    if (bf16 > q) q = bf16;
    uint64_t amx = 32 * (uint64_t)l->max_act_cols / 5 + 1 +
                   (uint64_t)l->max_jobs * (199 * (uint64_t)l->max_tokens + 26 * (uint64_t)l->max_cols + 794 + 128);
    uint64_t bytes = isa == COL_ISA_AMX && amx > q ? amx : q;
    return (bytes + 63) & ~(uint64_t)63; /* the staging after it is 64-byte aligned */
}
/* Per-thread staging: the AMX path's, and on AVX-512 (which the AMX path runs for other dtypes)
 * the carried lane sums of a group of tiles over long rows (rows_kblocked_avx512) or, with VNNI,
 * the panel a quantised batch packs (kernels_int8_avx512.c). */
static uint64_t stage_bytes(col_isa isa, const col_pool_limits *l)
{
    uint64_t amx = isa == COL_ISA_AMX ? (col_amx_stage_bytes(l->max_cols, l->max_tokens) + 63) & ~(uint64_t)63 : 0, carry = 0;
#if defined(__x86_64__)
    if (isa >= COL_ISA_AVX512F && l->max_tokens > 1)
        carry = (l->max_cols > COL_BATCH_KBLOCK ? COL_KBLOCK_TILES * col_kblock_carry_bytes(l->max_tokens) : 0) +
                COL_WIDE_TILE_BYTES;
    if (isa >= COL_ISA_AVX512 && l->max_tokens > 1 && carry < col_int8_stage_bytes())
        carry = col_int8_stage_bytes(); /* or the quantised batches' panels */
#endif
    return amx > carry ? amx : carry;
}
static uint64_t scratch_bytes_for(col_isa isa, uint32_t n_threads, const col_pool_limits *l)
{
    return pointers_bytes(l->max_jobs) + act_bytes(isa, l) + n_threads * stage_bytes(isa, l);
}

uint64_t col_pool_scratch_size(col_isa isa, uint32_t n_threads, const col_pool_limits *limits)
{
    return scratch_bytes_for(isa, n_threads, limits);
}

col_pool *col_pool_create(col_isa isa, uint32_t n_threads, void *scratch, uint64_t scratch_bytes,
                          const col_pool_limits *limits, const col_allocator *alloc)
{
    if (n_threads == 0 || !limits || !alloc) return NULL;
    if (!scratch && scratch_bytes_for(COL_ISA_PORTABLE, n_threads, limits) > 0) return NULL;
    col_pool *pool = col_alloc_zeroed(alloc, 1, sizeof *pool);
    if (!pool) return NULL;
    pool->alloc = *alloc;
    pool->n_threads = n_threads;
    const col_isa can = col_choose_isa(isa); /* never a path this machine lacks */
    pool->isa = can < isa ? can : isa;
    if (pool->isa == COL_ISA_AMX &&
        (limits->max_jobs == 0 || scratch_bytes_for(COL_ISA_AMX, n_threads, limits) > scratch_bytes))
        pool->isa = COL_ISA_AVX512; /* no room to pack activations: the vector path needs none */
    pool->max_jobs = limits->max_jobs;
#if defined(__x86_64__)
    pool->tune = col_decode_tuning_here();
    pool->has_bf16_dot = pool->isa >= COL_ISA_AVX512 && col_has_avx512bf16();
    pool->int8_form = pool->isa == COL_ISA_AVX512F                  ? COL_INT8_MADDUBS_512
                    : pool->isa == COL_ISA_AVX2 && col_has_avx_vnni() ? COL_INT8_AVX_VNNI
                                                                      : COL_INT8_MADDUBS;
#endif
    if (scratch) {
        pool->act = scratch;
        pool->act_buf = (uint8_t *)scratch + pointers_bytes(limits->max_jobs);
        pool->act_capacity = act_bytes(pool->isa, limits);
        pool->stage = pool->act_buf + pool->act_capacity;
        pool->stage_bytes = stage_bytes(pool->isa, limits);
        if (scratch_bytes_for(pool->isa, n_threads, limits) > scratch_bytes)
            pool->stage_bytes = 0; /* no room for carried sums: long rows run as whole-row tiles, same bits */
    }
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->gate, 0);
    atomic_init(&pool->next_chunk, 0);
    atomic_init(&pool->n_sleeping, 0);
    atomic_init(&pool->stopping, 0);
    if (pthread_mutex_init(&pool->mutex, NULL) != 0) {
        col_dealloc(alloc, pool);
        return NULL;
    }
    pthread_cond_init(&pool->work_ready, NULL);
    pool->counts = col_alloc_zeroed(alloc, n_threads, sizeof *pool->counts);
    if (limits->max_jobs) {
        pool->group_left = col_alloc_zeroed(alloc, limits->max_jobs, sizeof *pool->group_left);
        pool->group_ready = col_alloc_zeroed(alloc, limits->max_jobs, sizeof *pool->group_ready);
    }
    if (!pool->counts || (limits->max_jobs && (!pool->group_left || !pool->group_ready))) {
        col_pool_free(pool);
        return NULL;
    }
    if (n_threads > 1) {
        pool->threads = col_alloc_zeroed(alloc, n_threads - 1, sizeof *pool->threads);
        pool->args = col_alloc_zeroed(alloc, n_threads - 1, sizeof *pool->args);
        if (!pool->threads || !pool->args) {
            col_pool_free(pool);
            return NULL;
        }
        for (uint32_t i = 1; i < n_threads; i++) {
            worker_arg *arg = &pool->args[i - 1];
            arg->pool = pool;
            arg->index = i;
            if (pthread_create(&pool->threads[i - 1], NULL, worker_main, arg) != 0) {
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
    atomic_store(&pool->stopping, 1);
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    for (uint32_t i = 0; i < pool->n_started; i++) pthread_join(pool->threads[i], NULL);
    const col_allocator alloc = pool->alloc;
    col_dealloc(&alloc, pool->threads);
    col_dealloc(&alloc, pool->args);
    col_dealloc(&alloc, pool->counts);
    col_dealloc(&alloc, (void *)pool->group_left);
    col_dealloc(&alloc, (void *)pool->group_ready);
    pthread_cond_destroy(&pool->work_ready);
    pthread_mutex_destroy(&pool->mutex);
    col_dealloc(&alloc, pool);
}

void col_pool_thread_stats(const col_pool *pool, uint32_t t, col_thread_stats *out)
{
    *out = pool && t < pool->n_threads ? pool->counts[t].stats : (col_thread_stats){0, 0};
}

void col_pool_clear_stats(col_pool *pool)
{
    if (!pool) return;
    for (uint32_t t = 0; t < pool->n_threads; t++) pool->counts[t].stats = (col_thread_stats){0, 0};
}

col_isa col_pool_isa(const col_pool *pool)
{
    return pool ? pool->isa : COL_ISA_PORTABLE;
}

void col_pool_set_numerics(col_pool *pool, const col_numerics *numerics)
{
    if (pool) pool->numerics = numerics;
}

void col_matmul_many(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs)
{
    if (pool && pool->numerics) { /* numerics variant: numerics.c runs it (and calls back below) */
        col_numerics_matmul(pool->numerics, pool, jobs, n_jobs);
        return;
    }
    col_matmul_kernels(pool, jobs, n_jobs, 0);
}

/* Token t of job j's activations into the place the job's kernels read them from. */
static void prepare_token(const col_pool *pool, const col_matvec_job *j, uint8_t *act, uint32_t t)
{
    if (dot_job(pool, j))
        col_pack_bf16(j->x + (uint64_t)t * j->w.cols, j->w.cols, pool->isa,
                      (uint16_t *)(void *)act + (uint64_t)t * j->w.cols);
    else if (pool->isa == COL_ISA_AMX && col_amx_handles(j->w.dtype))
        col_amx_pack(j->x, j->n_tokens, j->w.cols, pool->x_bf16, t, t + 1, act);
    else
        col_quantize_row(j->x + (uint64_t)t * j->w.cols, j->w.cols, j->w.dtype, pool->isa, act + t * col_qrow_bytes(j->w.cols));
}

typedef struct prepare_ctx {
    const col_pool *pool;
    const col_matvec_job *jobs;
    uint32_t n_jobs;
} prepare_ctx;

/* Items [i0, i1) of the tokens of every job that prepares its own activations, jobs in order. */
static void prepare_items(void *ctx, uint32_t thread, uint64_t i0, uint64_t i1)
{
    const prepare_ctx *c = ctx;
    (void)thread;
    uint64_t base = 0;
    for (uint32_t k = 0; k < c->n_jobs && base < i1; k++) {
        const col_matvec_job *j = &c->jobs[k];
        if (!prepares_own(c->pool, c->jobs, k)) continue;
        for (uint64_t i = i0 > base ? i0 : base; i < i1 && i < base + j->n_tokens; i++)
            prepare_token(c->pool, j, c->pool->act[k], (uint32_t)(i - base));
        base += j->n_tokens;
    }
}

/* Quantise or pack the activations of a batch: on the calling thread when small (a decode step),
 * else split by tokens over the pool. Every token's bytes are the same either way. */
static void prepare_activations(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, uint64_t n_tokens,
                                uint64_t n_elems)
{
    prepare_ctx ctx = {pool, jobs, n_jobs};
    if (n_elems < COL_PREPARE_PARALLEL_ELEMS || pool->n_threads == 1)
        prepare_items(&ctx, 0, 0, n_tokens);
    else
        col_pool_run(pool, prepare_items, &ctx, n_tokens);
}

/* Where each job of a batch reads its prepared activations (pool->act[k]): the caller's quantised
 * rows, the previous job's (the same x, tokens and preparation: w1 and w3, or every expert's of a
 * decode step; q, k and v; in a chain's second stage, [n_counted, n_jobs), only of the same group,
 * which prepares them), or a place of its own in the scratch; NULL when its path reads x itself.
 * Adds to *tokens and *elems those of jobs [0, n_counted) that prepare their own. Returns 0 when
 * the jobs or their activations do not fit the pool's scratch. */
static int place_activations(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, const uint32_t *group,
                             uint32_t n_counted, uint64_t *tokens, uint64_t *elems)
{
    uint64_t used = 0;
    for (uint32_t k = 0; k < n_jobs; k++) {
        const col_matvec_job *j = &jobs[k];
        const int dot = dot_job(pool, j), packs = dot && pool->isa >= COL_ISA_AVX2; /* portable reads x itself */
        const int amx = !dot && pool->isa == COL_ISA_AMX && col_amx_handles(j->w.dtype);
        uint8_t *act = NULL;
        if (j->xq) {
            assert(col_pool_qrow_bytes(pool, j->w.dtype, j->w.cols));
            act = (uint8_t *)(uintptr_t)j->xq; /* quantised by the caller; the kernels only read it */
        } else if (packs || amx || is_block_dtype(j->w.dtype)) {
            const col_matvec_job *prev = k > 0 ? &jobs[k - 1] : NULL;
            if (prev && !prev->xq && prev->x == j->x && prev->n_tokens == j->n_tokens && prev->w.cols == j->w.cols &&
                (dot ? dot_job(pool, prev) : amx ? !dot_job(pool, prev) && col_amx_handles(prev->w.dtype)
                                                 : prev->w.dtype == j->w.dtype) &&
                (k < n_counted ? k - 1 < n_counted : k - 1 >= n_counted && group[k] == group[k - 1]) &&
                pool->act[k - 1]) {
                act = pool->act[k - 1];
            } else {
                uint64_t need = dot ? 2 * (uint64_t)j->n_tokens * j->w.cols
                              : amx ? col_amx_packed_bytes(j->n_tokens, j->w.cols, pool->x_bf16)
                                    : j->n_tokens * col_qrow_bytes(j->w.cols);
                need = (need + 63) & ~(uint64_t)63;
                if (k >= pool->max_jobs || used + need > pool->act_capacity) return 0;
                act = pool->act_buf + used;
                used += need;
                if (k < n_counted) {
                    *tokens += j->n_tokens;
                    *elems += (uint64_t)j->n_tokens * j->w.cols;
                }
            }
        }
        if (k < pool->max_jobs) pool->act[k] = act;
    }
    return 1;
}

/* Rows and multiply-adds of jobs [0, n_jobs). */
static uint64_t batch_work(const col_matvec_job *jobs, uint32_t n_jobs, uint64_t *rows)
{
    uint64_t macs = 0;
    for (uint32_t k = 0; k < n_jobs; k++) {
        *rows += jobs[k].w.rows;
        macs += jobs[k].w.rows * row_work(&jobs[k]);
    }
    return macs;
}

/* The products of a batch: x_bf16 as col_matmul_kernels', bf16_dot as col_matmul_bf16_dot's. */
static void matmul(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, int x_bf16, int bf16_dot)
{
    if (n_jobs == 0) return;
    if (!pool) { /* single-threaded portable path; float weights only (no scratch for int8 rows) */
        for (uint32_t k = 0; k < n_jobs; k++) {
            assert(!is_block_dtype(jobs[k].w.dtype));
            if (bf16_dot && holds_bf16(jobs[k].w.dtype))
                col_rows_bf16dot_portable(&jobs[k], 0, jobs[k].w.rows);
            else if (!is_block_dtype(jobs[k].w.dtype))
                col_rows_portable(&jobs[k], NULL, 0, jobs[k].w.rows);
        }
        return;
    }
    assert(n_jobs <= pool->max_jobs || pool->max_jobs == 0);
    pool->bf16_dot = bf16_dot;
    pool->x_bf16 = x_bf16;
    uint64_t rows = 0, own_tokens = 0, own_elems = 0;
    const uint64_t macs = batch_work(jobs, n_jobs, &rows);
    if (!place_activations(pool, jobs, n_jobs, NULL, n_jobs, &own_tokens, &own_elems)) {
        assert(!"a batch beyond the pool's limits"); /* sized by the session */
        return;
    }
    prepare_activations(pool, jobs, n_jobs, own_tokens, own_elems);
    pool->task = NULL;
    pool->walk = NULL;
    pool->jobs = jobs;
    pool->n_jobs = n_jobs;
    pool->total_work = macs;
    plan_chunks(pool, macs, COL_GUIDED_MIN_MACS, guided_parts(jobs, n_jobs));
    atomic_store(&pool->next_chunk, 0);
    dispatch(pool, rows >= pool->n_threads && macs >= COL_PARALLEL_MIN_MACS);
}

void col_matmul_chain(col_pool *pool, const col_matvec_job *jobs, uint32_t n_first, uint32_t n_jobs,
                      const uint32_t *group, uint32_t n_groups, col_chain_step step, void *ctx)
{
    uint64_t own_tokens = 0, own_elems = 0;
    if (pool) {
        pool->bf16_dot = 0;
        pool->x_bf16 = 0;
    }
    if (!pool || pool->numerics || n_jobs > pool->max_jobs || n_groups > pool->max_jobs ||
        !place_activations(pool, jobs, n_jobs, group, n_first, &own_tokens, &own_elems)) {
        col_matmul_many(pool, jobs, n_first);
        for (uint32_t g = 0; g < n_groups; g++) step(ctx, 0, g);
        col_matmul_many(pool, jobs + n_first, n_jobs - n_first);
        return;
    }
    prepare_activations(pool, jobs, n_first, own_tokens, own_elems);
    uint64_t rows = 0;
    const uint64_t first_work = batch_work(jobs, n_first, &rows);
    const uint64_t second_work = batch_work(jobs + n_first, n_jobs - n_first, &rows);
    for (uint32_t g = 0; g < n_groups; g++) {
        atomic_store_explicit(&pool->group_left[g], 0, memory_order_relaxed); /* published by the generation */
        atomic_store_explicit(&pool->group_ready[g], 0, memory_order_relaxed);
    }
    for (uint32_t k = 0; k < n_first; k++)
        if (group[k] != COL_CHAIN_NONE)
            atomic_fetch_add_explicit(&pool->group_left[group[k]], jobs[k].w.rows * row_work(&jobs[k]), memory_order_relaxed);
    pool->task = NULL;
    pool->walk = NULL;
    pool->jobs = jobs;
    pool->n_jobs = n_jobs;
    pool->total_work = first_work + second_work;
    pool->chain_group = group;
    pool->chain_first = n_first;
    pool->chain_step = step;
    pool->chain_ctx = ctx;
    for (uint32_t g = 0; g < n_groups; g++) /* a group with no first-stage rows is ready at once */
        if (!atomic_load_explicit(&pool->group_left[g], memory_order_relaxed)) complete_group(pool, 0, g);
    uint32_t c = 0;
    const uint64_t least1 = plan_range(pool, &c, COL_MAX_CHUNKS / 2, 0, first_work, COL_GUIDED_MIN_MACS,
                                       guided_parts(jobs, n_first));
    pool->first_chunks = c;
    const uint64_t least2 = plan_range(pool, &c, COL_MAX_CHUNKS / 2, first_work, second_work, COL_GUIDED_MIN_MACS,
                                       guided_parts(jobs + n_first, n_jobs - n_first));
    pool->n_chunks = c;
    pool->least_chunk = !first_work ? least2 : !second_work || least1 < least2 ? least1 : least2;
    for (uint32_t k = 0; k < c; k++) atomic_store_explicit(&pool->next_part[k], 0, memory_order_relaxed);
    atomic_store(&pool->next_chunk, 0);
    dispatch(pool, rows >= pool->n_threads && first_work + second_work >= COL_PARALLEL_MIN_MACS);
    pool->chain_group = NULL;
}

uint64_t col_pool_qrow_bytes(const col_pool *pool, uint32_t dtype, uint64_t cols)
{
    if (!pool) return 0;
    if (holds_bf16(dtype)) /* bf16 dot products' packed rows; the portable loop reads x itself */
        return pool->isa >= COL_ISA_AVX2 && col_numerics_packs_bf16(pool->numerics) ? 2 * cols : 0;
    return !pool->numerics && is_block_dtype(dtype) ? col_qrow_bytes(cols) : 0;
}

void col_pool_quantize_row(const col_pool *pool, const float *x, uint64_t cols, uint32_t dtype, uint8_t *out)
{
    if (holds_bf16(dtype))
        col_pack_bf16(x, cols, pool->isa, (uint16_t *)(void *)out);
    else
        col_quantize_row(x, cols, dtype, pool->isa, out);
}

int col_pool_runs_here(const col_pool *pool, uint32_t dtype)
{
    if (!pool || pool->numerics || pool->bf16_dot || is_block_dtype(dtype)) return 0;
#if defined(__x86_64__)
    if (pool->isa == COL_ISA_AMX && col_amx_handles(dtype)) return 0;
#endif
    return 1;
}

void col_matmul_here(const col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, uint32_t thread)
{
    for (uint32_t k = 0; k < n_jobs; k++) {
        assert(col_pool_runs_here(pool, jobs[k].w.dtype));
        job_rows(pool, &jobs[k], NULL, thread, 0, jobs[k].w.rows);
        pool->counts[thread].stats.multiply_adds += jobs[k].w.rows * row_work(&jobs[k]);
    }
}

void col_matmul_kernels(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, int x_bf16)
{
    matmul(pool, jobs, n_jobs, x_bf16, 0);
}

void col_matmul_bf16_dot(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs)
{
    matmul(pool, jobs, n_jobs, 0, 1);
}

void col_matmul_walk(col_pool *pool, const col_matvec_job *jobs, uint32_t n_jobs, col_rows_walker walk,
                     const void *ctx, uint32_t align)
{
    if (!pool) {
        for (uint32_t k = 0; k < n_jobs; k++) walk(ctx, &jobs[k], 0, jobs[k].w.rows);
        return;
    }
    uint64_t rows = 0, macs = 0;
    for (uint32_t k = 0; k < n_jobs; k++) {
        rows += jobs[k].w.rows;
        macs += jobs[k].w.rows * row_work(&jobs[k]);
    }
    if (macs == 0) { /* nothing to multiply; the walker still writes the (empty) sums */
        for (uint32_t k = 0; k < n_jobs; k++) walk(ctx, &jobs[k], 0, jobs[k].w.rows);
        return;
    }
    pool->task = NULL;
    pool->walk = walk;
    pool->walk_ctx = ctx;
    pool->walk_align = align ? align : 1;
    pool->jobs = jobs;
    pool->n_jobs = n_jobs;
    pool->total_work = macs;
    plan_chunks(pool, macs, COL_GUIDED_MIN_MACS, guided_parts(jobs, n_jobs));
    atomic_store(&pool->next_chunk, 0);
    dispatch(pool, rows >= pool->n_threads && macs >= COL_PARALLEL_MIN_MACS);
    pool->walk = NULL;
}

void col_pool_run(col_pool *pool, col_pool_task fn, void *ctx, uint64_t n_items)
{
    if (n_items == 0) return;
    if (!pool) {
        fn(ctx, 0, 0, n_items);
        return;
    }
    pool->task = fn;
    pool->task_ctx = ctx;
    pool->n_items = n_items;
    plan_chunks(pool, n_items, 1, COL_GUIDED_PARTS_BATCH);
    atomic_store(&pool->next_chunk, 0);
    dispatch(pool, n_items >= pool->n_threads);
    pool->task = NULL;
}

uint32_t col_pool_threads(const col_pool *pool)
{
    return pool ? pool->n_threads : 1;
}

/* Run the batch just described in the pool: on all threads, or on the caller alone when it is not
 * worth waking the workers (or they are not all running). Returns when every share is done. */
static void dispatch(col_pool *pool, int worth_sharing)
{
    if (pool->n_threads == 1 || pool->n_started + 1 < pool->n_threads || !worth_sharing) {
        run_share(pool, 0, 1);
        return;
    }
    pool->counts[0].stats.batches++;
    const uint64_t g = atomic_load(&pool->generation) + 1;
    atomic_store(&pool->gate, (g & 0xFFFFFFFFu) << 32);
    atomic_store(&pool->generation, g);
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->work_ready);
        pthread_mutex_unlock(&pool->mutex);
    }
    run_share(pool, 0, pool->n_threads);
    /* all the work is taken: no worker may join now; wait for those that did */
    atomic_fetch_or(&pool->gate, COL_GATE_CLOSED);
    for (uint32_t spins = 0; atomic_load(&pool->gate) & COL_GATE_INSIDE; spins++) cpu_relax(spins);
}
