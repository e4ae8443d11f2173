/* What the developer benchmarks in this folder share: a monotonic clock and a deterministic
 * noise source for their weights. Header-only, so bench_session.c still builds against any
 * revision's library (tools/bench_builds.py). */
#ifndef COLIBRI_BENCH_COMMON_H
#define COLIBRI_BENCH_COMMON_H

#include <stdint.h>
#include <time.h>

static inline double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A deterministic pseudo-random value in [-0.5, 0.5). */
static inline float noise(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(*state >> 40) / (float)(1u << 24) - 0.5f;
}

#endif
