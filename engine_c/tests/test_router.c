/* test_router.c - the routing contract: tie rule, stable-top-k order, soft weights, Gumbel
 * determinism, renormalisation. */
#include "harness.h"
#include "router.h"

#include <math.h>
#include <string.h>

#define N 8

typedef struct fixture {
    float probs[N];
    double scores[N];
    uint8_t taken[N];
    int32_t ids[N];
    float weights[N];
    col_router_scratch scratch;
} fixture;

static void setup(fixture *f)
{
    memset(f, 0, sizeof *f);
    f->scratch.probs = f->probs;
    f->scratch.scores = f->scores;
    f->scratch.taken = f->taken;
}

static col_router_params params(uint32_t mode, uint32_t k, int renorm)
{
    col_router_params p = {mode, N, k, renorm, 0.0, 0, 0, 0};
    return p;
}

static void test_topk_picks_largest_in_order(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 0.0f, 1.0f, -2.0f};
    col_router_params p = params(COL_ROUTING_TOPK, 2, 0);
    CHECK(col_route(&p, logits, f.ids, f.weights, &f.scratch) == 2);
    CHECK(f.ids[0] == 3 && f.ids[1] == 1);
    CHECK(f.weights[0] > f.weights[1]);
}

static void test_exact_tie_goes_to_lower_index(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0, 1.5f, 0, 0, 0, 1.5f, 0, 0};
    col_router_params p = params(COL_ROUTING_TOPK, 1, 0);
    col_route(&p, logits, f.ids, f.weights, &f.scratch);
    CHECK(f.ids[0] == 1);
}

static void test_stable_epsilon_breaks_tie_toward_higher_index(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0, 1.5f, 0, 0, 0, 1.5f, 0, 0};
    col_router_params p = params(COL_ROUTING_STABLE, 1, 0);
    p.epsilon = 1e-8;
    col_route(&p, logits, f.ids, f.weights, &f.scratch);
    CHECK(f.ids[0] == 5);
    /* weights come from the unperturbed logits: both tied experts have the same probability */
    CHECK(f.weights[0] == f.probs[1]);
}

static void test_stable_epsilon_can_change_a_near_tie(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {1.0f, 0, 0, 0, 0, 0, 0, 0};
    logits[7] = nextafterf(1.0f, 0.0f); /* one ULP below expert 0 */
    col_router_params p = params(COL_ROUTING_STABLE, 1, 0);
    p.epsilon = 0.0;
    col_route(&p, logits, f.ids, f.weights, &f.scratch);
    CHECK(f.ids[0] == 0);
    p.epsilon = 1e-6; /* 7 * 1e-6 is far more than one ULP at 1.0 */
    col_route(&p, logits, f.ids, f.weights, &f.scratch);
    CHECK(f.ids[0] == 7);
}

static void test_soft_weights_sum_to_one_over_all_experts(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.3f, -1.2f, 2.2f, 0.0f, 0.7f, -0.1f, 1.1f, 0.4f};
    col_router_params p = params(COL_ROUTING_SOFT, 2, 0);
    CHECK(col_route(&p, logits, f.ids, f.weights, &f.scratch) == N);
    double sum = 0;
    int seen[N] = {0};
    for (int i = 0; i < N; i++) {
        sum += f.weights[i];
        seen[f.ids[i]]++;
    }
    CHECK(fabs(sum - 1.0) < 1e-6);
    for (int i = 0; i < N; i++) CHECK(seen[i] == 1);
    CHECK(f.ids[0] == 2);
}

static void test_renormalised_weights_sum_to_one(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.3f, -1.2f, 2.2f, 0.0f, 0.7f, -0.1f, 1.1f, 0.4f};
    col_router_params p = params(COL_ROUTING_TOPK, 3, 1);
    col_route(&p, logits, f.ids, f.weights, &f.scratch);
    CHECK(fabsf(f.weights[0] + f.weights[1] + f.weights[2] - 1.0f) < 1e-6f);
}

static void test_gumbel_same_seed_same_choice(void)
{
    float logits[N] = {0.1f, 0.2f, 0.15f, 0.05f, 0.12f, 0.18f, 0.11f, 0.09f};
    int differs = 0;
    for (uint32_t pos = 0; pos < 64; pos++) {
        fixture a, b, c;
        setup(&a);
        setup(&b);
        setup(&c);
        col_router_params p = params(COL_ROUTING_GUMBEL, 2, 1);
        p.position = pos;
        p.layer = 3;
        p.seed = 42;
        col_route(&p, logits, a.ids, a.weights, &a.scratch);
        col_route(&p, logits, b.ids, b.weights, &b.scratch);
        CHECK(a.ids[0] == b.ids[0] && a.ids[1] == b.ids[1]);
        CHECK(a.weights[0] == b.weights[0]);
        p.seed = 43;
        col_route(&p, logits, c.ids, c.weights, &c.scratch);
        differs += a.ids[0] != c.ids[0] || a.ids[1] != c.ids[1];
    }
    CHECK(differs > 0); /* another seed is another draw */
}

static void test_gumbel_noise_is_finite(void)
{
    for (uint32_t j = 0; j < 1000; j++) CHECK(isfinite(col_gumbel_noise(7, j, j % 5, j % 13)));
}

int main(void)
{
    test_topk_picks_largest_in_order();
    test_exact_tie_goes_to_lower_index();
    test_stable_epsilon_breaks_tie_toward_higher_index();
    test_stable_epsilon_can_change_a_near_tie();
    test_soft_weights_sum_to_one_over_all_experts();
    test_renormalised_weights_sum_to_one();
    test_gumbel_same_seed_same_choice();
    test_gumbel_noise_is_finite();
    return TEST_REPORT();
}
