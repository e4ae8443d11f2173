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
 *
 * A decode step is also a chain of short reads (a layer's norms, its routing, the first lines of
 * each product before the prefetchers take over), each waiting on memory's latency, which moves
 * with the machine's state independently of its bandwidth. The latency probe follows one chain of
 * dependent loads over lines spread across a buffer in random order, so each load waits for the last.
 *
 * Prefill is bound by arithmetic instead, so a second probe measures the multiply-adds per second
 * the machine's threads make with the instructions a kernel path multiplies with: f32 FMA, bf16
 * dot products (vdpbf16ps) and int8 dot products (vpdpbusd, or AVX2's vpmaddubsw + vpmaddwd).
 * Each thread runs COMPUTE_CHAINS independent accumulators on register operands, more than any of
 * these instructions' latency times its throughput, so nothing but the execution units limits it.
 */
#if defined(__linux__)
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#endif
#include "internal.h"
#include "kernels.h"
#include "kernels_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define PROBE_STREAMS 8
#define COMPUTE_CHAINS 12
#define COMPUTE_STEPS (1u << 20) /* per thread and pass: 12 M instructions, a few ms */
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

/* ---- The latency probe ------------------------------------------------------------------- */

#define LATENCY_LOADS (1u << 19) /* dependent loads per pass: about 0.1 s from memory */
#define HUGE_PAGE_BYTES (2u << 20)

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The line of part `slot` (parts of `per` lines) the latency chain reads: a fixed random one. */
static uint8_t *chosen_line(uint8_t *mem, uint64_t per, uint32_t slot)
{
    uint64_t state = slot;
    return mem + ((uint64_t)slot * per + splitmix64(&state) % per) * 64;
}

/* The buffer's `lines` 64-byte lines cut into `slots` equal parts, one line of each (at random)
 * holding the address of the chosen line of the next part in one random cycle through all the
 * parts (Sattolo's shuffle, a fixed seed): a chain started at the returned line reads each
 * chosen line once before it repeats, every load a random distance from the last. NULL when the
 * index array cannot be allocated. */
static const void *link_random_cycle(uint8_t *mem, uint64_t lines, uint32_t slots)
{
    uint32_t *next = malloc((uint64_t)slots * sizeof *next);
    if (!next) return NULL;
    for (uint32_t i = 0; i < slots; i++) next[i] = i;
    uint64_t seed = 0x436F6C696272ull;
    for (uint32_t i = slots - 1; i > 0; i--) {
        const uint32_t j = (uint32_t)(splitmix64(&seed) % i); /* j < i: one cycle, not any permutation */
        const uint32_t t = next[i];
        next[i] = next[j], next[j] = t;
    }
    const uint64_t per = lines / slots;
    for (uint32_t i = 0; i < slots; i++) {
        const uint8_t *to = chosen_line(mem, per, next[i]);
        memcpy(chosen_line(mem, per, i), &to, sizeof to);
    }
    free(next);
    return chosen_line(mem, per, 0);
}

double col_measure_read_latency(uint64_t bytes, uint32_t repeats)
{
    const uint64_t lines = bytes / 64;
    if (lines < 2 || repeats < 1) return 0.0;
    const uint64_t align = bytes >= HUGE_PAGE_BYTES ? HUGE_PAGE_BYTES : 64;
    void *mem = NULL;
    if (posix_memalign(&mem, align, lines * 64) != 0) return 0.0;
#if defined(MADV_HUGEPAGE)
    if (align == HUGE_PAGE_BYTES) (void)madvise(mem, lines * 64, MADV_HUGEPAGE); /* before the first touch */
#endif
    const void *p = link_random_cycle(mem, lines, lines < LATENCY_LOADS ? (uint32_t)lines : LATENCY_LOADS);
    if (!p) {
        free(mem);
        return 0.0;
    }
    double best = 0.0;
    for (uint32_t rep = 0; rep < repeats; rep++) {
        const uint64_t t0 = col_now_ns();
        for (uint32_t i = 0; i < LATENCY_LOADS; i++) memcpy(&p, p, sizeof p);
        const double ns = (double)(col_now_ns() - t0) / LATENCY_LOADS;
        if (rep == 0 || ns < best) best = ns;
    }
    volatile uintptr_t sink = (uintptr_t)p; /* the chain's end, so the loads cannot be left out */
    (void)sink;
    free(mem);
    return best > 0.0 ? best : 0.0;
}

/* ---- The compute probe ------------------------------------------------------------------- */

typedef struct compute_share {
    uint32_t arith;   /* col_arith */
    col_isa isa;
    uint64_t macs;    /* multiply-adds made */
    float sink;
} compute_share;

#if defined(__x86_64__)
/* Each function runs COMPUTE_STEPS rounds of COMPUTE_CHAINS independent instructions and returns
 * a value depending on every accumulator, so none of them can be left out. */
__attribute__((target("avx512f"))) static float fma_avx512(void)
{
    __m512 acc[COMPUTE_CHAINS];
    const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1.001f);
    for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (uint32_t i = 0; i < COMPUTE_STEPS; i++)
#pragma GCC unroll 12
        for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm512_fmadd_ps(a, b, acc[c]);
    for (int c = 1; c < COMPUTE_CHAINS; c++) acc[0] = _mm512_add_ps(acc[0], acc[c]);
    return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"))) static float fma_avx2(void)
{
    __m256 acc[COMPUTE_CHAINS];
    const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1.001f);
    for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm256_set1_ps((float)c);
    for (uint32_t i = 0; i < COMPUTE_STEPS; i++)
#pragma GCC unroll 12
        for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm256_fmadd_ps(a, b, acc[c]);
    for (int c = 1; c < COMPUTE_CHAINS; c++) acc[0] = _mm256_add_ps(acc[0], acc[c]);
    float out[8];
    _mm256_storeu_ps(out, acc[0]);
    return out[0] + out[7];
}

__attribute__((target("avx512f,avx512bf16"))) static float dpbf16_avx512(void)
{
    __m512 acc[COMPUTE_CHAINS];
    const __m512i a = _mm512_set1_epi32(0x3F803F80), b = _mm512_set1_epi32(0x3F7F3F7F); /* pairs of 1.0, 0.996 */
    for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (uint32_t i = 0; i < COMPUTE_STEPS; i++)
#pragma GCC unroll 12
        for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], (__m512bh)a, (__m512bh)b);
    for (int c = 1; c < COMPUTE_CHAINS; c++) acc[0] = _mm512_add_ps(acc[0], acc[c]);
    return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx512f,avx512vnni"))) static float dpbusd_avx512(void)
{
    __m512i acc[COMPUTE_CHAINS];
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm512_set1_epi32(c);
    for (uint32_t i = 0; i < COMPUTE_STEPS; i++)
#pragma GCC unroll 12
        for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
    for (int c = 1; c < COMPUTE_CHAINS; c++) acc[0] = _mm512_add_epi32(acc[0], acc[c]);
    return (float)_mm512_reduce_add_epi32(acc[0]);
}

/* AVX-VNNI's vpdpbusd on 256 bits, as the AVX2 kernels' batches form block sums where the CPU
 * has it: 32 multiply-adds per instruction. */
__attribute__((target("avx2,avxvnni"))) static float dpbusd_avx2(void)
{
    __m256i acc[COMPUTE_CHAINS];
    const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
    for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm256_set1_epi32(c);
    for (uint32_t i = 0; i < COMPUTE_STEPS; i++)
#pragma GCC unroll 12
        for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm256_dpbusd_avx_epi32(acc[c], a, b);
    for (int c = 1; c < COMPUTE_CHAINS; c++) acc[0] = _mm256_add_epi32(acc[0], acc[c]);
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, acc[0]);
    return (float)(out[0] + out[7]);
}

/* AVX2's int8 block sum, as its kernels form it: 32 byte products summed in pairs to 16 bits,
 * then in pairs to 32 bits, then added: 32 multiply-adds per three instructions. The bytes are
 * loaded anew each time, as the kernels broadcast a token's group: from constant operands the
 * compiler lifted the products out of the loop, and the probe timed the additions. */
__attribute__((target("avx2"))) static float maddubs_avx2(void)
{
    __m256i acc[COMPUTE_CHAINS];
    static const int8_t bytes[32] = {3, 5, 7, 9};
    const __m256i b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm256_set1_epi32(c);
    for (uint32_t i = 0; i < COMPUTE_STEPS; i++)
#pragma GCC unroll 12
        for (int c = 0; c < COMPUTE_CHAINS; c++) {
            const int8_t *at = bytes;
            __asm__ volatile("" : "+r"(at)); /* a new address for all the compiler knows: a new load */
            const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)at);
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
        }
    for (int c = 1; c < COMPUTE_CHAINS; c++) acc[0] = _mm256_add_epi32(acc[0], acc[c]);
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, acc[0]);
    return (float)out[0];
}

/* The same on 512 bits (AVX512BW), as the avx512f path's batch passes form q8_0/q4_0 block sums:
 * 64 multiply-adds per three instructions. */
__attribute__((target("avx512f,avx512bw"))) static float maddubs_avx512(void)
{
    __m512i acc[COMPUTE_CHAINS];
    static const int8_t bytes[64] = {3, 5, 7, 9};
    const __m512i b = _mm512_set1_epi8(-2), ones = _mm512_set1_epi16(1);
    for (int c = 0; c < COMPUTE_CHAINS; c++) acc[c] = _mm512_set1_epi32(c);
    for (uint32_t i = 0; i < COMPUTE_STEPS; i++)
#pragma GCC unroll 12
        for (int c = 0; c < COMPUTE_CHAINS; c++) {
            const int8_t *at = bytes;
            __asm__ volatile("" : "+r"(at));
            const __m512i a = _mm512_loadu_si512((const void *)at);
            acc[c] = _mm512_add_epi32(acc[c], _mm512_madd_epi16(_mm512_maddubs_epi16(a, b), ones));
        }
    for (int c = 1; c < COMPUTE_CHAINS; c++) acc[0] = _mm512_add_epi32(acc[0], acc[c]);
    return (float)_mm512_reduce_add_epi32(acc[0]);
}

/* Multiply-adds per instruction of `arith` on path `isa` (0: the path has no instruction for it). */
static uint64_t compute_width(uint32_t arith, col_isa isa)
{
    __builtin_cpu_init();
    switch (arith) {
    case COL_ARITH_F32_FMA: return isa >= COL_ISA_AVX512F ? 16 : isa == COL_ISA_AVX2 ? 8 : 0;
    case COL_ARITH_BF16_DOT: return isa >= COL_ISA_AVX512 && __builtin_cpu_supports("avx512bf16") ? 32 : 0;
    case COL_ARITH_INT8_DOT: return isa >= COL_ISA_AVX512F ? 64 : isa == COL_ISA_AVX2 ? 32 : 0;
    default: return 0;
    }
}

static void *compute_main(void *arg)
{
    compute_share *sh = arg;
    const uint64_t rounds = (uint64_t)COMPUTE_STEPS * COMPUTE_CHAINS;
    switch (sh->arith) {
    case COL_ARITH_F32_FMA: sh->sink = sh->isa >= COL_ISA_AVX512F ? fma_avx512() : fma_avx2(); break;
    case COL_ARITH_BF16_DOT: sh->sink = dpbf16_avx512(); break;
    default: /* the instructions the path's int8 kernels use (col_isa_int8; AVX-VNNI only on the AVX2 pools) */
        sh->sink = sh->isa >= COL_ISA_AVX512                 ? dpbusd_avx512()
                 : sh->isa == COL_ISA_AVX512F                ? maddubs_avx512()
                 : sh->isa == COL_ISA_AVX2 && col_has_avx_vnni() ? dpbusd_avx2()
                                                              : maddubs_avx2();
        break;
    }
    sh->macs = rounds * compute_width(sh->arith, sh->isa);
    return NULL;
}
#endif

double col_measure_compute(uint32_t arith, uint32_t kernels, uint32_t n_threads, uint32_t repeats)
{
    if (n_threads < 1 || n_threads > 256 || repeats < 1 || arith > COL_ARITH_INT8_DOT ||
        kernels > COL_KERNELS_AMX)
        return 0.0;
#if defined(__x86_64__)
    const col_isa isa = col_choose_isa(kernels == COL_KERNELS_BEST ? COL_ISA_AMX : (col_isa)(kernels - 1));
    if (compute_width(arith, isa) == 0) return 0.0;
    compute_share shares[256];
    pthread_t threads[256];
    double best = 0.0;
    volatile float sink = 0.0f;
    for (uint32_t rep = 0; rep < repeats; rep++) {
        uint64_t t0 = col_now_ns();
        uint32_t started = 0;
        for (uint32_t t = 0; t < n_threads; t++) {
            shares[t] = (compute_share){arith, isa, 0, 0.0f};
            if (t == 0) continue;
            if (pthread_create(&threads[t], NULL, compute_main, &shares[t]) != 0) break;
            started++;
        }
        compute_main(&shares[0]);
        for (uint32_t t = 1; t <= started; t++) pthread_join(threads[t], NULL);
        uint64_t dt = col_now_ns() - t0;
        if (started + 1 != n_threads) return 0.0;
        uint64_t macs = 0;
        for (uint32_t t = 0; t < n_threads; t++) {
            macs += shares[t].macs;
            sink += shares[t].sink;
        }
        double rate = dt ? (double)macs / ((double)dt * 1e-9) : 0.0;
        if (rate > best) best = rate;
    }
    (void)sink;
    return best;
#else
    (void)arith;
    (void)kernels;
    return 0.0;
#endif
}
