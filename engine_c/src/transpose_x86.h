/*
 * transpose_x86.h - register transposes of 32-bit elements (AVX-512: 16 x 16, AVX2: 8 x 8), the
 * one copy the kernels that put rows in the lanes share (kernels_int8_*.c, numerics_x86.c). Pure
 * data movement: no bits change whichever kernel calls them.
 */
#ifndef COLIBRI_TRANSPOSE_X86_H
#define COLIBRI_TRANSPOSE_X86_H

#include "kernels_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* o[c] lane r = lane c of v[r]: a 16 x 16 transpose of 32-bit elements. o may be v (v is read
 * before o is written). */
COL_INLINE COL_T512 void col_transpose16(const __m512i *v, __m512i *o)
{
    __m512i t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    /* u[4i + j], 128-bit quarter k: rows 4i .. 4i + 3 of dword 4k + j */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) { /* the quarters k of u[j], u[4 + j], u[8 + j], u[12 + j] */
        const __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i x2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i x3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], _MM_SHUFFLE(3, 2, 3, 2));
        o[j] = _mm512_shuffle_i32x4(x0, x2, _MM_SHUFFLE(2, 0, 2, 0));
        o[4 + j] = _mm512_shuffle_i32x4(x0, x2, _MM_SHUFFLE(3, 1, 3, 1));
        o[8 + j] = _mm512_shuffle_i32x4(x1, x3, _MM_SHUFFLE(2, 0, 2, 0));
        o[12 + j] = _mm512_shuffle_i32x4(x1, x3, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* out[c] lane r = lane c of r[r]: the 8 x 8 transpose of 32-bit elements. out may be r. */
COL_INLINE COL_T2 void col_transpose8(const __m256 *r, __m256 *out)
{
    __m256 a[8], b[8];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        a[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        a[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) {
        const __m256d a0 = _mm256_castps_pd(a[4 * k]), a1 = _mm256_castps_pd(a[4 * k + 1]);
        const __m256d a2 = _mm256_castps_pd(a[4 * k + 2]), a3 = _mm256_castps_pd(a[4 * k + 3]);
        b[4 * k] = _mm256_castpd_ps(_mm256_unpacklo_pd(a0, a2));
        b[4 * k + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a0, a2));
        b[4 * k + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(a1, a3));
        b[4 * k + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(a1, a3));
    }
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) {
        out[e] = _mm256_permute2f128_ps(b[e], b[4 + e], 0x20);
        out[4 + e] = _mm256_permute2f128_ps(b[e], b[4 + e], 0x31);
    }
}
#endif

#endif /* COLIBRI_TRANSPOSE_X86_H */
