/*
 * bench.c - the read-bandwidth probe behind `colibri bench`.
 *
 * Decode is bound by memory bandwidth, so a benchmark states its tokens/s against the machine's
 * own limit measured in the same process and moment (a shared machine's bandwidth changes from
 * minute to minute). The probe allocates a buffer much larger than the caches, touches it, then
 * lets each thread read its contiguous share with wide loads; the best of several passes counts.
 * The sum is returned through a volatile sink so the reads cannot be optimised away.
 *
 * Each thread reads its share as PROBE_STREAMS interleaved streams (eight places at once), as the
 * decode tiles do: one stream per core leaves memory-level parallelism unused, and the limit a
 * kernel is measured against must be the most the machine delivers (docs/performance.md).
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define PROBE_STREAMS 8
#define PROBE_LINE_WORDS 8 /* 64 bytes */

typedef struct probe_share {
    const uint64_t *data;
    uint64_t n;               /* u64 words, a multiple of PROBE_STREAMS * PROBE_LINE_WORDS */
    uint64_t sum;
} probe_share;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t sum_avx512(const uint64_t *p, uint64_t n)
{
    uint64_t len = n / PROBE_STREAMS; /* words per stream, a multiple of a line */
    __m512i acc[PROBE_STREAMS];
    for (int s = 0; s < PROBE_STREAMS; s++) acc[s] = _mm512_setzero_si512();
    for (uint64_t i = 0; i < len; i += PROBE_LINE_WORDS)
#pragma GCC unroll 8
        for (int s = 0; s < PROBE_STREAMS; s++)
            acc[s] = _mm512_xor_si512(acc[s], _mm512_load_si512((const void *)(p + (uint64_t)s * len + i)));
    for (int s = 1; s < PROBE_STREAMS; s++) acc[0] = _mm512_xor_si512(acc[0], acc[s]);
    uint64_t out[8];
    memcpy(out, &acc[0], sizeof out);
    return out[0] ^ out[1] ^ out[2] ^ out[3] ^ out[4] ^ out[5] ^ out[6] ^ out[7];
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, uint64_t n)
{
    uint64_t len = n / PROBE_STREAMS;
    __m256i acc[PROBE_STREAMS];
    for (int s = 0; s < PROBE_STREAMS; s++) acc[s] = _mm256_setzero_si256();
    for (uint64_t i = 0; i < len; i += PROBE_LINE_WORDS)
#pragma GCC unroll 8
        for (int s = 0; s < PROBE_STREAMS; s++) {
            const uint64_t *line = p + (uint64_t)s * len + i;
            acc[s] = _mm256_xor_si256(acc[s], _mm256_load_si256((const __m256i *)line));
            acc[s] = _mm256_xor_si256(acc[s], _mm256_load_si256((const __m256i *)(line + 4)));
        }
    for (int s = 1; s < PROBE_STREAMS; s++) acc[0] = _mm256_xor_si256(acc[0], acc[s]);
    uint64_t out[4];
    memcpy(out, &acc[0], sizeof out);
    return out[0] ^ out[1] ^ out[2] ^ out[3];
}
#endif

static uint64_t sum_portable(const uint64_t *p, uint64_t n)
{
    uint64_t len = n / PROBE_STREAMS, acc[PROBE_STREAMS] = {0};
    for (uint64_t i = 0; i < len; i++)
        for (int s = 0; s < PROBE_STREAMS; s++) acc[s] ^= p[(uint64_t)s * len + i];
    uint64_t sum = 0;
    for (int s = 0; s < PROBE_STREAMS; s++) sum ^= acc[s];
    return sum;
}

static void *probe_main(void *arg)
{
    probe_share *sh = arg;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        sh->sum = sum_avx512(sh->data, sh->n);
        return NULL;
    }
    if (__builtin_cpu_supports("avx2")) {
        sh->sum = sum_avx2(sh->data, sh->n);
        return NULL;
    }
#endif
    sh->sum = sum_portable(sh->data, sh->n);
    return NULL;
}

double col_measure_read_bandwidth(uint64_t bytes, uint32_t n_threads, uint32_t repeats)
{
    if (n_threads < 1 || n_threads > 256 || bytes < 4096 || repeats < 1) return 0.0;
    const uint64_t unit = PROBE_STREAMS * PROBE_LINE_WORDS; /* words: one line of every stream */
    uint64_t words = bytes / 8 / (unit * n_threads) * (unit * n_threads);
    if (words == 0) return 0.0;
    void *mem = NULL;
    if (posix_memalign(&mem, 64, words * 8) != 0) return 0.0;
    uint64_t *data = mem;
    for (uint64_t i = 0; i < words; i++) data[i] = i * 0x9E3779B97F4A7C15ull;
    probe_share shares[256];
    pthread_t threads[256];
    double best = 0.0;
    volatile uint64_t sink = 0;
    for (uint32_t rep = 0; rep < repeats; rep++) {
        uint64_t t0 = col_now_ns();
        uint32_t started = 0;
        for (uint32_t t = 0; t < n_threads; t++) {
            shares[t].data = data + words / n_threads * t;
            shares[t].n = words / n_threads;
            shares[t].sum = 0;
            if (t == 0) continue;
            if (pthread_create(&threads[t], NULL, probe_main, &shares[t]) != 0) break;
            started++;
        }
        probe_main(&shares[0]);
        for (uint32_t t = 1; t <= started; t++) pthread_join(threads[t], NULL);
        uint64_t dt = col_now_ns() - t0;
        if (started + 1 != n_threads) {
            free(mem);
            return 0.0;
        }
        for (uint32_t t = 0; t < n_threads; t++) sink ^= shares[t].sum;
        double bw = dt ? (double)(words * 8) / ((double)dt * 1e-9) : 0.0;
        if (bw > best) best = bw;
    }
    (void)sink;
    free(mem);
    return best;
}
