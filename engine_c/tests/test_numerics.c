/* test_numerics.c - the numerics variants' building blocks (numerics.c): f16/bf16 rounding to
 * nearest even, ULP noise bounded and deterministic, the reductions on exactly known sums, and
 * config checks. */
#include "harness.h"
#include "kernels.h"
#include "numerics.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint32_t bits_of(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static float round_with(uint32_t activation, float v)
{
    col_numerics nx = {0};
    nx.activation = activation;
    col_numerics_round(&nx, NULL, &v, 1);
    return v;
}

static void test_rounding(void)
{
    /* bf16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1) */
    CHECK(round_with(COL_ACTIVATION_BF16, 1.0f + 0x1p-8f) == 1.0f);
    CHECK(round_with(COL_ACTIVATION_BF16, 1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
    CHECK((bits_of(round_with(COL_ACTIVATION_BF16, 3.14159f)) & 0xFFFFu) == 0);
    CHECK(isnan(round_with(COL_ACTIVATION_BF16, NAN)));
    /* f16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even */
    CHECK(round_with(COL_ACTIVATION_F16, 1.0f + 0x1p-11f) == 1.0f);
    CHECK(round_with(COL_ACTIVATION_F16, 1.0f + 0x1p-10f + 0x1p-11f) == 1.0f + 0x1p-9f);
    CHECK(round_with(COL_ACTIVATION_F16, 65504.0f) == 65504.0f);
    CHECK(isinf(round_with(COL_ACTIVATION_F16, 65520.0f)));        /* halfway to 2^16: to Inf */
    CHECK(round_with(COL_ACTIVATION_F16, 65519.0f) == 65504.0f);
    CHECK(round_with(COL_ACTIVATION_F16, 0x1p-24f) == 0x1p-24f);  /* smallest subnormal half */
    CHECK(round_with(COL_ACTIVATION_F16, 0x1p-26f) == 0.0f);
    CHECK(round_with(COL_ACTIVATION_F16, -0x1.8p-24f) == -0x1p-23f); /* 1.5 units: to even (2) */
    CHECK(round_with(COL_ACTIVATION_F32, 1.0f + 0x1p-20f) == 1.0f + 0x1p-20f);
}

static void test_noise(void)
{
    col_numerics nx = {0};
    nx.noise_ulps = 3;
    nx.noise_seed = 42;
    int seen_nonzero = 0;
    for (uint32_t p = 0; p < 50; p++) {
        float v[8], w[8];
        for (int j = 0; j < 8; j++) v[j] = w[j] = (float)j - 3.5f;
        col_numerics_perturb(&nx, v, 8, p, 1);
        for (int j = 0; j < 8; j++) {
            int32_t k = col_numerics_noise_ulps(42, 3, p, 1, (uint32_t)j);
            CHECK(k >= -3 && k <= 3);
            float expect = w[j];
            for (int32_t s = 0; s < (k < 0 ? -k : k); s++) expect = nextafterf(expect, k < 0 ? -INFINITY : INFINITY);
            CHECK(bits_of(v[j]) == bits_of(expect));
            seen_nonzero |= k != 0;
        }
    }
    CHECK(seen_nonzero);
    /* N = 0 is a no-op, bit for bit */
    nx.noise_ulps = 0;
    float z = 0.0f;
    col_numerics_perturb(&nx, &z, 1, 0, 0);
    CHECK(bits_of(z) == 0);
}

static void test_reductions(void)
{
    /* x = 1, w = [1e8, 1, -1e8, 1] (exact sum 2): each order gives its own rounding */
    float w[4] = {1e8f, 1.0f, -1e8f, 1.0f}, x[4] = {1, 1, 1, 1}, y = -1;
    col_weight cw = {w, COL_DTYPE_F32, 1, 4, 0};
    col_matvec_job job = {cw, x, &y, 1};
    col_numerics nx = {0};
    nx.reduction = COL_REDUCTION_SEQUENTIAL;
    col_numerics_matmul(&nx, NULL, &job, 1);
    CHECK(y == ((1e8f + 1.0f) + -1e8f) + 1.0f);
    nx.reduction = COL_REDUCTION_BLOCKED;
    nx.lanes = 2; /* lanes: (1e8 - 1e8), (1 + 1) -> 0 + 2 */
    col_numerics_matmul(&nx, NULL, &job, 1);
    CHECK(y == 2.0f);
    nx.reduction = COL_REDUCTION_SEQUENTIAL;
    nx.lanes = 0;
    nx.split = 2; /* parts [1e8, 1] and [-1e8, 1], combined last first: (-1e8 + 1) + (1e8 + 1) */
    col_numerics_matmul(&nx, NULL, &job, 1);
    CHECK(y == (-1e8f + 1.0f) + (1e8f + 1.0f));
}

/* rows longer than the 16384-element buffer take the 32-at-a-time reader: same bits */
static void test_long_rows(void)
{
    enum { N = 16384 + 96 };
    static uint16_t w[N];
    static float x[N];
    for (int i = 0; i < N; i++) {
        w[i] = (uint16_t)(0x3C00u + (uint32_t)(i * 37) % 1024u); /* f16 values in [1, 2) */
        x[i] = (float)((i * 7919) % 101 - 50) / 64.0f;
    }
    float y = 0.0f, expect = 0.0f;
    for (int i = 0; i < N; i++) expect = fmaf(col_f16_to_f32(w[i]), x[i], expect);
    col_weight cw = {w, COL_DTYPE_F16, 1, N, 0};
    col_matvec_job job = {cw, x, &y, 1};
    col_numerics nx = {0};
    nx.reduction = COL_REDUCTION_SEQUENTIAL;
    nx.fma = 1;
    col_numerics_matmul(&nx, NULL, &job, 1);
    CHECK(bits_of(y) == bits_of(expect));
}

static void test_config_checks(void)
{
    col_session_config c;
    memset(&c, 0, sizeof c);
    CHECK(col_numerics_check(&c, NULL, 0) == COL_OK);
    c.reduction = COL_REDUCTION_BLOCKED;
    CHECK(col_numerics_check(&c, NULL, 0) == COL_ERR_INVALID_ARG); /* lanes 0 */
    c.lanes = 8;
    CHECK(col_numerics_check(&c, NULL, 0) == COL_OK);
    c.activation = 9;
    CHECK(col_numerics_check(&c, NULL, 0) == COL_ERR_INVALID_ARG);
    memset(&c, 0, sizeof c);
    c.fma = 1;
    col_numerics nx = col_numerics_of(&c);
    CHECK(nx.reduction == COL_REDUCTION_SEQUENTIAL && col_numerics_hooks_products(&nx));
    memset(&c, 0, sizeof c);
    c.router_noise_ulps = 2;
    nx = col_numerics_of(&c);
    CHECK(!col_numerics_hooks_products(&nx)); /* noise alone keeps the default kernels */
}

int main(void)
{
    test_rounding();
    test_noise();
    test_reductions();
    test_long_rows();
    test_config_checks();
    return TEST_REPORT();
}
