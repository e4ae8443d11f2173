/*
 * bench_panels.c - q8_0/q4_0 products from rows as stored today against the same weights stored in
 * 8-row panels, in turns, from memory: on AVX2 (col_rows_int8_avx2 against
 * col_rows_int8_panels_avx2; the default), on AVX-512 (`--pair avx512`: col_rows_int8_avx512 on
 * either layout), or the panels alone on both paths (`--pair stored`: AVX2's kernel as "rows",
 * AVX-512's as "panels").
 *
 *   bench_panels q8_0|q4_0 ROWS COLS TOKENS [--threads T] [--turns N] [--megabytes M] [--pair avx2|avx512|stored]
 *
 * ROWS % 8 == 0, COLS % 32 == 0. The weights are copies of one random matrix, at least M MiB (256)
 * in each layout, multiplied in turn on T threads (each a contiguous share of the panels, a
 * rendezvous after every product as the pool has); a turn is a pass over the copies in each
 * layout. Checks first that both layouts give the same bits. Prints one line: the best pass's G
 * multiply-adds/s and GB/s of weights for each, and the median and quartiles of the turns' speed
 * ratios (panels / rows). A developer's benchmark of the internal kernel interface (AVX2 CPUs).
 */
#include "internal.h"
#include "kernels_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_common.h"

#if defined(__x86_64__)
#define MAX_THREADS 16
#define MAX_TURNS 64

/* The rows of w as panels (the layout kernels_internal.h states for col_rows_int8_panels_avx2). */
static void to_panels(const uint8_t *w, uint64_t rows, uint64_t cols, int q4, uint8_t *out)
{
    const uint64_t nb = cols / 32, pb = q4 ? 16 : 32, rb = nb * (2 + pb);
    for (uint64_t p = 0; p < rows / 8; p++) {
        uint8_t *panel = out + 8 * p * rb, *payload = panel + 16 * nb;
        for (uint64_t r = 0; r < 8; r++) {
            const uint8_t *row = w + (8 * p + r) * rb;
            for (uint64_t b = 0; b < nb; b++) {
                memcpy(panel + 16 * b + 2 * r, row + 2 * b, 2);
                for (uint64_t g = 0; g < pb / 4; g++) memcpy(payload + 8 * pb * b + 32 * g + 4 * r, row + 2 * nb + pb * b + 4 * g, 4);
            }
        }
    }
}

typedef struct shared {
    pthread_barrier_t start, each;
    int layout; /* 0 rows, 1 panels, -1 stop */
    uint64_t copies, stride;
    const uint8_t *w[2];
    const uint8_t *qx;
    col_matvec_job job;
    uint32_t ahead;
    int vnni; /* the AVX2 kernels on AVX-VNNI (col_has_avx_vnni) */
    int threads;
    int pair; /* 0 avx2, 1 avx512, 2 stored */
} shared;

typedef struct worker {
    shared *s;
    int id;
} worker;

/* One share of the product on the kernel that `pair` names for `layout` (0 "rows", 1 "panels"). */
static void run(int pair, int layout, col_matvec_job *job, const uint8_t *qx, uint64_t r0, uint64_t r1, uint8_t *stage,
                uint32_t ahead, int vnni)
{
    const uint32_t rows_dtype = col_block_kind(job->w.dtype), panel_dtype = rows_dtype == COL_DTYPE_Q8_0 ? COL_DTYPE_Q8_0X8 : COL_DTYPE_Q4_0X8;
    job->w.dtype = layout || pair == 2 ? panel_dtype : rows_dtype;
    col_decode_tuning a = col_decode_tuning_here();
    a.q4_zmm = 1; /* AVX-512's own tiles, for one token of q4_0 too */
    if (pair == 0 || (pair == 2 && layout == 0)) {
        if (is_panel_dtype(job->w.dtype)) col_rows_int8_panels_avx2(job, qx, r0, r1, ahead, vnni);
        else col_rows_int8_avx2(job, qx, r0, r1, ahead, vnni);
    } else {
        col_rows_int8_avx512(job, qx, r0, r1, stage, stage ? col_int8_stage_bytes() : 0, a);
    }
}

static void *work(void *arg)
{
    const worker *me = arg;
    shared *s = me->s;
    const uint64_t panels = s->job.w.rows / 8;
    const uint64_t r0 = 8 * (panels * (uint64_t)me->id / (uint64_t)s->threads);
    const uint64_t r1 = 8 * (panels * (uint64_t)(me->id + 1) / (uint64_t)s->threads);
    uint8_t *stage = NULL;
    if (s->pair && posix_memalign((void **)&stage, 64, col_int8_stage_bytes()) != 0) return NULL;
    for (;;) {
        pthread_barrier_wait(&s->start);
        const int layout = s->layout;
        if (layout < 0) {
            free(stage);
            return NULL;
        }
        col_matvec_job job = s->job;
        for (uint64_t c = 0; c < s->copies; c++) {
            job.w.data = s->w[s->pair == 2 ? 1 : layout] + c * s->stride;
            run(s->pair, layout, &job, s->qx, r0, r1, stage, s->ahead, s->vnni);
            pthread_barrier_wait(&s->each);
        }
        pthread_barrier_wait(&s->start);
    }
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int usage(void)
{
    fputs("usage: bench_panels q8_0|q4_0 ROWS COLS TOKENS [--threads T] [--turns N] [--megabytes M] [--pair avx2|avx512|stored]\n"
          "  ROWS a multiple of 8, COLS of 32; an AVX2 CPU (AVX-512 VNNI for the avx512 and stored pairs)\n", stderr);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 5 || (strcmp(argv[1], "q8_0") != 0 && strcmp(argv[1], "q4_0") != 0)) return usage();
    const int q4 = strcmp(argv[1], "q4_0") == 0;
    const uint32_t dtype = q4 ? COL_DTYPE_Q4_0 : COL_DTYPE_Q8_0;
    const uint64_t rows = strtoull(argv[2], NULL, 10), cols = strtoull(argv[3], NULL, 10);
    const unsigned long tokens = strtoul(argv[4], NULL, 10);
    unsigned long threads = 1, turns = 6, megabytes = 256;
    int pair = 0;
    for (int i = 5; i < argc; i += 2) {
        if (i + 1 >= argc) return usage();
        if (strcmp(argv[i], "--pair") == 0) {
            pair = strcmp(argv[i + 1], "avx2") == 0 ? 0 : strcmp(argv[i + 1], "avx512") == 0 ? 1 : strcmp(argv[i + 1], "stored") == 0 ? 2 : -1;
            if (pair < 0) return usage();
            continue;
        }
        const unsigned long v = strtoul(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--threads") == 0) threads = v;
        else if (strcmp(argv[i], "--turns") == 0) turns = v;
        else if (strcmp(argv[i], "--megabytes") == 0) megabytes = v;
        else return usage();
    }
    if (rows == 0 || rows % 8 || rows > (1u << 24) || cols == 0 || cols % 32 || cols > (1u << 24) || tokens == 0 ||
        tokens > 4096 || threads < 1 || threads > MAX_THREADS || turns < 1 || turns > MAX_TURNS || megabytes > (1u << 16))
        return usage();
    if (col_choose_isa(COL_ISA_AVX2) != COL_ISA_AVX2 || (pair && col_choose_isa(COL_ISA_AVX512) < COL_ISA_AVX512)) {
        fputs(pair ? "bench_panels: needs AVX-512 VNNI\n" : "bench_panels: needs AVX2, FMA and F16C\n", stderr);
        return 1;
    }

    const uint64_t rb = col_dtype_row_bytes(dtype, cols), matrix = rows * rb, stride = (matrix + 63) / 64 * 64;
    const uint64_t copies = (megabytes << 20) / matrix + 1, qb = col_qrow_bytes(cols);
    void *mem[5] = {NULL, NULL, NULL, NULL, NULL};
    const uint64_t sizes[5] = {copies * stride, copies * stride, tokens * cols * sizeof(float), tokens * rows * sizeof(float),
                               tokens * qb};
    for (int i = 0; i < 5; i++)
        if (posix_memalign(&mem[i], 64, sizes[i]) != 0) {
            fputs("bench_panels: out of memory\n", stderr);
            return 1;
        }
    uint8_t *wr = mem[0], *wp = mem[1], *qx = mem[4];
    float *x = mem[2], *y = mem[3];
    uint64_t state = 42;
    const uint64_t nb = cols / 32;
    for (uint64_t r = 0; r < rows; r++) {
        uint8_t *row = wr + r * rb;
        for (uint64_t b = 0; b < nb; b++) {
            noise(&state);
            const uint16_t scale = (uint16_t)(0x2000u | ((state >> 30) & 0x3FFu)); /* 2^-7 .. 2^-6 */
            memcpy(row + 2 * b, &scale, 2);
        }
        for (uint64_t i = 2 * nb; i < rb; i++) {
            noise(&state);
            row[i] = (uint8_t)(state >> 33);
        }
    }
    to_panels(wr, rows, cols, q4, wp);
    for (uint64_t c = 1; c < copies; c++) memcpy(wr + c * stride, wr, matrix), memcpy(wp + c * stride, wp, matrix);
    for (uint64_t i = 0; i < tokens * cols; i++) x[i] = noise(&state);
    for (uint64_t t = 0; t < tokens; t++) col_quantize_row(x + t * cols, cols, dtype, COL_ISA_AVX2, qx + t * qb);

    shared s = {.copies = copies, .stride = stride, .w = {wr, wp}, .qx = qx, .ahead = col_decode_tuning_here().q,
                .vnni = col_has_avx_vnni(), .threads = (int)threads, .pair = pair};
    s.job = (col_matvec_job){{wr, dtype, rows, cols, 0}, x, y, (uint32_t)tokens, NULL};
    float *want = malloc(tokens * rows * sizeof *want);
    if (!want) return 1;
    col_matvec_job check = s.job;
    check.w.data = pair == 2 ? wp : wr;
    run(pair, 0, &check, qx, 0, rows, NULL, s.ahead, s.vnni);
    memcpy(want, y, tokens * rows * sizeof *y);
    check.w.data = wp;
    run(pair, 1, &check, qx, 0, rows, NULL, s.ahead, s.vnni);
    if (memcmp(want, y, tokens * rows * sizeof *y) != 0) {
        fputs("bench_panels: the panels' outputs differ from the rows'\n", stderr);
        return 1;
    }
    free(want);

    pthread_barrier_init(&s.start, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&s.each, NULL, (unsigned)threads);
    pthread_t tid[MAX_THREADS];
    worker ws[MAX_THREADS];
    for (unsigned long i = 0; i < threads; i++) {
        ws[i] = (worker){&s, (int)i};
        pthread_create(&tid[i], NULL, work, &ws[i]);
    }
    double secs[2][MAX_TURNS + 1], ratio[MAX_TURNS];
    for (unsigned long turn = 0; turn <= turns; turn++) /* turn 0 warms up */
        for (int layout = 0; layout < 2; layout++) {
            s.layout = layout;
            const double t0 = now_s();
            pthread_barrier_wait(&s.start);
            pthread_barrier_wait(&s.start);
            secs[layout][turn] = (now_s() - t0) / (double)copies;
        }
    s.layout = -1;
    pthread_barrier_wait(&s.start);
    for (unsigned long i = 0; i < threads; i++) pthread_join(tid[i], NULL);
    double best[2] = {1e30, 1e30};
    for (unsigned long turn = 1; turn <= turns; turn++) {
        ratio[turn - 1] = secs[0][turn] / secs[1][turn];
        for (int l = 0; l < 2; l++)
            if (secs[l][turn] < best[l]) best[l] = secs[l][turn];
    }
    qsort(ratio, turns, sizeof *ratio, by_value);
    const double macs = (double)rows * (double)cols * (double)tokens * 1e-9, gb = (double)matrix * 1e-9;
    printf("%s %llu x %llu, %lu tokens, %lu threads: rows %.1f G/s %.1f GB/s, panels %.1f G/s %.1f GB/s, "
           "panels/rows %.3fx (quartiles %.3f-%.3f)\n",
           argv[1], (unsigned long long)rows, (unsigned long long)cols, tokens, threads, macs / best[0], gb / best[0],
           macs / best[1], gb / best[1], ratio[turns / 2], ratio[turns / 4], ratio[(3 * turns) / 4]);
    for (int i = 0; i < 5; i++) free(mem[i]);
    return 0;
}
#else
int main(void)
{
    fputs("bench_panels: an x86-64 benchmark\n", stderr);
    return 1;
}
#endif
