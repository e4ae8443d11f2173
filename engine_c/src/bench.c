/*
 * bench.c - the read-bandwidth probe behind `colibri bench`.
 *
 * Decode is bound by memory bandwidth, so a benchmark states its tokens/s against the machine's
 * own limit measured in the same process and moment (a shared machine's bandwidth changes from
 * minute to minute). The probe allocates a buffer much larger than the caches, touches it, then
 * lets each thread sum its contiguous share with wide loads; the best of several passes counts.
 * The sum is returned through a volatile sink so the reads cannot be optimised away.
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct probe_share {
    const uint64_t *data;
    uint64_t n;               /* u64 words */
    uint64_t sum;
} probe_share;

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, uint64_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    uint64_t out[4];
    memcpy(out, &a, sizeof out);
    uint64_t s = out[0] ^ out[1] ^ out[2] ^ out[3];
    for (; i < n; i++) s ^= p[i];
    return s;
}
#endif

static void *probe_main(void *arg)
{
    probe_share *sh = arg;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        sh->sum = sum_avx2(sh->data, sh->n);
        return NULL;
    }
#endif
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    uint64_t i = 0;
    for (; i + 4 <= sh->n; i += 4) {
        s0 ^= sh->data[i];
        s1 ^= sh->data[i + 1];
        s2 ^= sh->data[i + 2];
        s3 ^= sh->data[i + 3];
    }
    for (; i < sh->n; i++) s0 ^= sh->data[i];
    sh->sum = s0 ^ s1 ^ s2 ^ s3;
    return NULL;
}

double col_measure_read_bandwidth(uint64_t bytes, uint32_t n_threads, uint32_t repeats)
{
    if (n_threads < 1 || n_threads > 256 || bytes < 4096 || repeats < 1) return 0.0;
    uint64_t words = bytes / 8 / 64 * 64; /* whole 512-byte chunks per thread split */
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
            uint64_t w0 = words * t / n_threads / 4 * 4, w1 = t + 1 == n_threads ? words : words * (t + 1) / n_threads / 4 * 4;
            shares[t].data = data + w0;
            shares[t].n = w1 - w0;
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
