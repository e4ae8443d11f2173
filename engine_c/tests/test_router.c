/* test_router.c - the routing contract (router.c): every rule the format can state, computed
 * by hand here from transformers' formulas; the tie rule between experts and between groups;
 * the routing modes acting on the selection score; Gumbel determinism. */
#include "harness.h"
#include "router.h"

#include <math.h>
#include <string.h>

#define N 8

typedef struct fixture {
    float scores[N];
    double keys[N], group_keys[N];
    uint8_t taken[N], group_taken[N], bias_changed;
    int32_t ids[N], groups[N], alt[N];
    float weights[N], selection[N];
    col_router_scratch scratch;
    col_route_out out;
} fixture;

static void setup(fixture *f)
{
    memset(f, 0, sizeof *f);
    f->scratch = (col_router_scratch){f->scores, f->keys, f->taken, f->group_keys, f->group_taken, f->alt};
    f->out = (col_route_out){f->ids, f->weights, f->selection, f->groups, &f->bias_changed};
}

/* Mixtral's rule (format version 1's): softmax over every expert, top-k of the scores. */
static col_routing_info softmax_rule(uint32_t k, int renorm)
{
    col_routing_info r;
    memset(&r, 0, sizeof r);
    r.kind = COL_LAYER_MOE;
    r.gate_bias_tensor = r.correction_bias_tensor = COL_NO_TENSOR;
    r.n_experts = N;
    r.top_k = k;
    r.scoring = COL_SCORING_SOFTMAX;
    r.n_groups = r.n_groups_kept = 1;
    r.normalize = renorm ? COL_NORM_SUM : COL_NORM_NONE;
    r.scale = 1.0f;
    return r;
}

/* DeepSeek-V3's rule: sigmoid, correction bias, groups scored by their best two, renormalised
 * with +1e-20, then scaled. */
static col_routing_info deepseek_v3_rule(uint32_t k, uint32_t groups, uint32_t kept, float scale)
{
    col_routing_info r = softmax_rule(k, 1);
    r.scoring = COL_SCORING_SIGMOID;
    r.correction_bias_tensor = 0;
    r.n_groups = groups;
    r.n_groups_kept = kept;
    r.group_score = groups > 1 ? COL_GROUP_TOP2_SUM : COL_GROUP_NONE;
    r.norm_eps = 1e-20f;
    r.scale = scale;
    return r;
}

static col_router_params mode(uint32_t m)
{
    col_router_params p = {m, 0.0, 0, 0, 0, NULL, NULL, 0};
    return p;
}

static float sig(float x) { return 1.0f / (1.0f + expf(-x)); }

static void test_topk_picks_largest_in_order(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 0.0f, 1.0f, -2.0f};
    col_routing_info r = softmax_rule(2, 0);
    col_router_params p = mode(COL_ROUTING_TOPK);
    CHECK(col_route(&r, NULL, &p, logits, &f.out, &f.scratch) == 2);
    CHECK(f.ids[0] == 3 && f.ids[1] == 1);
    CHECK(f.weights[0] > f.weights[1]);
    /* softmax without a correction bias selects on the logits themselves */
    for (int j = 0; j < N; j++) CHECK(f.selection[j] == logits[j]);
}

static void test_exact_tie_goes_to_lower_index(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0, 1.5f, 0, 0, 0, 1.5f, 0, 0};
    col_routing_info r = softmax_rule(1, 0);
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 1);
}

static void test_stable_epsilon_breaks_tie_toward_higher_index(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0, 1.5f, 0, 0, 0, 1.5f, 0, 0};
    col_routing_info r = softmax_rule(1, 0);
    col_router_params p = mode(COL_ROUTING_STABLE);
    p.epsilon = 1e-8;
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 5);
    /* weights come from the unperturbed logits: both tied experts have the same probability */
    CHECK(f.weights[0] == f.scores[1]);
    CHECK(f.selection[5] == 1.5f); /* the trace keeps the unperturbed selection score */
}

static void test_stable_epsilon_can_change_a_near_tie(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {1.0f, 0, 0, 0, 0, 0, 0, 0};
    logits[7] = nextafterf(1.0f, 0.0f); /* one ULP below expert 0 */
    col_routing_info r = softmax_rule(1, 0);
    col_router_params p = mode(COL_ROUTING_STABLE);
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 0);
    p.epsilon = 1e-6; /* 7 * 1e-6 is far more than one ULP at 1.0 */
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 7);
}

static void test_soft_softmax_weights_are_the_probabilities(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.3f, -1.2f, 2.2f, 0.0f, 0.7f, -0.1f, 1.1f, 0.4f};
    col_routing_info r = softmax_rule(2, 1);
    col_router_params p = mode(COL_ROUTING_SOFT);
    CHECK(col_route(&r, NULL, &p, logits, &f.out, &f.scratch) == N);
    float probs[N];
    col_softmax(logits, probs, N);
    double sum = 0;
    int seen[N] = {0};
    for (int i = 0; i < N; i++) {
        sum += f.weights[i];
        seen[f.ids[i]]++;
        CHECK(f.weights[i] == probs[f.ids[i]]); /* no renormalisation of a softmax over all */
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
    col_routing_info r = softmax_rule(3, 1);
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(fabsf(f.weights[0] + f.weights[1] + f.weights[2] - 1.0f) < 1e-6f);
}

/* DeepSeek-V3 without groups: the bias moves expert 5 above expert 1 for the choice, but the
 * weights are the unbiased sigmoids, renormalised and scaled. */
static void test_correction_bias_changes_selection_not_weights(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.5f, 2.0f, -1.0f, 3.0f, 0.1f, 1.0f, -0.5f, 0.0f};
    float bias[N] = {0, 0, 0, 0, 0, 0.4f, 0, 0};
    col_routing_info r = deepseek_v3_rule(2, 1, 1, 2.5f);
    col_router_params p = mode(COL_ROUTING_TOPK);
    CHECK(col_route(&r, bias, &p, logits, &f.out, &f.scratch) == 2);
    /* sigmoid(1.0) + 0.4 = 1.131 ranks first, then sigmoid(3.0) = 0.953; sigmoid(2.0) = 0.881 loses */
    CHECK(f.ids[0] == 5 && f.ids[1] == 3);
    CHECK(f.selection[5] == sig(1.0f) + 0.4f);
    CHECK(f.selection[1] == sig(2.0f));
    float sum = sig(1.0f) + sig(3.0f) + 1e-20f;
    CHECK(f.weights[0] == sig(1.0f) / sum * 2.5f);
    CHECK(f.weights[1] == sig(3.0f) / sum * 2.5f);
    CHECK(f.bias_changed == 1); /* the scores alone choose {3, 1} */
    /* without the bias the same logits choose expert 1 */
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 3 && f.ids[1] == 1 && f.bias_changed == 0);
    /* a bias too small to move the choice */
    bias[5] = 0.1f;
    col_route(&r, bias, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 3 && f.ids[1] == 1 && f.bias_changed == 0);
}

/* DeepSeek-V3's groups: expert 0 has the best single score but group 0's two best sum lower
 * than group 1's, so only group 1 (experts 4..7) is eligible. */
static void test_groups_by_top2_sum_exclude_the_best_expert(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {4.0f, -3.0f, -3.0f, -3.0f, 1.0f, 1.2f, 0.8f, -1.0f};
    float bias[N] = {0};
    col_routing_info r = deepseek_v3_rule(2, 2, 1, 1.0f);
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, bias, &p, logits, &f.out, &f.scratch);
    CHECK(f.groups[0] == 1);
    CHECK(f.ids[0] == 5 && f.ids[1] == 4);
    /* scored by its best alone (DeepSeek-V2's max), group 0 wins instead */
    r.group_score = COL_GROUP_MAX;
    col_route(&r, bias, &p, logits, &f.out, &f.scratch);
    CHECK(f.groups[0] == 0);
    CHECK(f.ids[0] == 0 && f.ids[1] == 1); /* 1, 2, 3 tie: the lower index */
}

static void test_tied_groups_go_to_the_lower_group(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {1.0f, 0.5f, 0, 0, 1.0f, 0.5f, 0, 0};
    col_routing_info r = deepseek_v3_rule(2, 2, 1, 1.0f);
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.groups[0] == 0);
    CHECK(f.ids[0] == 0 && f.ids[1] == 1);
}

/* DeepSeek-V2's group-limited greedy: softmax probabilities, groups by their best, scaled, not
 * renormalised. */
static void test_deepseek_v2_group_limited_greedy(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 0.2f, 2.0f, 0.3f, 1.9f, 1.8f, 0.0f, -0.2f};
    col_routing_info r = softmax_rule(2, 0);
    r.n_groups = 4;
    r.n_groups_kept = 2;
    r.group_score = COL_GROUP_MAX;
    r.scale = 16.0f;
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.groups[0] == 1 && f.groups[1] == 2); /* groups' best: 0.2, 2.0, 1.9, 0.0 */
    CHECK(f.ids[0] == 2 && f.ids[1] == 4);
    float probs[N];
    col_softmax(logits, probs, N);
    CHECK(f.weights[0] == probs[2] * 16.0f && f.weights[1] == probs[4] * 16.0f);
}

/* ERNIE 4.5: softmax plus moe_statics for the choice; weights divided by max(sum, norm_min). */
static void test_softmax_bias_and_clamped_sum(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {2.0f, 1.9f, 0.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
    float bias[N] = {0, 0, 0.5f, 0, 0, 0, 0, 0};
    col_routing_info r = softmax_rule(2, 0);
    r.correction_bias_tensor = 0;
    r.normalize = COL_NORM_SUM_CLAMPED;
    r.norm_eps = 1e-12f;
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, bias, &p, logits, &f.out, &f.scratch);
    float probs[N];
    col_softmax(logits, probs, N);
    CHECK(f.selection[2] == probs[2] + 0.5f);
    CHECK(f.ids[0] == 2 && f.ids[1] == 0);
    float sum = probs[2] + probs[0];
    CHECK(f.weights[0] == probs[2] / sum && f.weights[1] == probs[0] / sum);
    /* a clamp larger than the sum divides by the clamp */
    r.norm_eps = 4.0f;
    col_route(&r, bias, &p, logits, &f.out, &f.scratch);
    CHECK(f.weights[0] == probs[2] / 4.0f);
}

/* GPT-OSS and Granite: top-k of the logits, then a softmax over the k chosen. */
static void test_select_on_logits_then_softmax_of_the_chosen(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 0.0f, 1.0f, -2.0f};
    col_routing_info r = softmax_rule(2, 0);
    r.select_on = COL_SELECT_LOGITS;
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 3 && f.ids[1] == 1);
    float e = expf(2.0f - 3.0f);
    CHECK(f.weights[0] == 1.0f / (1.0f + e) && f.weights[1] == e / (1.0f + e));
}

/* Llama 4: top-1 of the logits, weighted by its sigmoid, no normalisation. */
static void test_select_on_logits_then_sigmoid(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 0.0f, 1.0f, -2.0f};
    col_routing_info r = softmax_rule(1, 0);
    r.scoring = COL_SCORING_SIGMOID;
    r.select_on = COL_SELECT_LOGITS;
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 3 && f.weights[0] == sig(3.0f));
    CHECK(f.selection[1] == 2.0f);
}

/* PhiMoE's sparsemixer, against transformers' formula written out in double: each chosen expert's
 * weight is a softmax over the logits within 2 eps (relative) of its own, the second leaving out
 * the first. */
static void test_sparsemixer_weights(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {1.00f, 0.99f, 0.50f, 0.985f, -1.0f, 0.2f, 0.98f, 0.0f};
    col_routing_info r = softmax_rule(2, 0);
    r.scoring = COL_SCORING_SPARSEMIXER;
    r.select_on = COL_SELECT_LOGITS;
    r.sparsemixer_eps = 0.01f;
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 0 && f.ids[1] == 1);
    /* expert 0 (m = 1.0): 0.99, 0.985 and 0.98 are within 2%; expert 1 (m = 0.99): 0.985 and 0.98 */
    double w0 = 1.0 / (1.0 + exp(0.99 - 1.0) + exp(0.985 - 1.0) + exp(0.98 - 1.0));
    double w1 = 1.0 / (1.0 + exp(0.985 - 0.99) + exp(0.98 - 0.99));
    CHECK(fabs(f.weights[0] - w0) < 1e-6 && fabs(f.weights[1] - w1) < 1e-6);
}

/* DBRX: the k weights divided by their p-norm. */
static void test_p_norm(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.3f, -1.2f, 2.2f, 0.0f, 0.7f, -0.1f, 1.1f, 0.4f};
    col_routing_info r = softmax_rule(2, 0);
    r.normalize = COL_NORM_P;
    r.norm_p = 2.0f;
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    float a = f.scores[2], b = f.scores[6], n2 = sqrtf(a * a + b * b);
    CHECK(f.weights[0] == a / n2 && f.weights[1] == b / n2);
    r.norm_p = 1.0f;
    col_route(&r, NULL, &p, logits, &f.out, &f.scratch);
    CHECK(f.weights[0] == a / (a + b));
}

/* The routing modes act on the selection score: with a correction bias that ties experts 1 and
 * 5 exactly, plain top-k keeps the lower index and stable routing's epsilon prefers the higher. */
static void test_stable_acts_on_the_selection_score(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {-4, 0.0f, -4, -4, -4, 0.0f, -4, -4};
    float bias[N] = {0, 0.25f, 0, 0, 0, 0.25f, 0, 0};
    col_routing_info r = deepseek_v3_rule(1, 1, 1, 1.0f);
    col_router_params p = mode(COL_ROUTING_TOPK);
    col_route(&r, bias, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 1);
    p = mode(COL_ROUTING_STABLE);
    p.epsilon = 1e-8;
    col_route(&r, bias, &p, logits, &f.out, &f.scratch);
    CHECK(f.ids[0] == 5);
    CHECK(f.weights[0] == 1.0f); /* sigmoid(0) renormalised over one expert */
}

/* Soft routing takes every expert, ignores the group limit and normalises by the rule. */
static void test_soft_sigmoid_rule_normalises_over_every_expert(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {4.0f, -3.0f, -3.0f, -3.0f, 1.0f, 1.2f, 0.8f, -1.0f};
    col_routing_info r = deepseek_v3_rule(2, 2, 1, 2.0f);
    col_router_params p = mode(COL_ROUTING_SOFT);
    CHECK(col_route(&r, NULL, &p, logits, &f.out, &f.scratch) == N);
    CHECK(f.ids[0] == 0);
    CHECK(f.groups[0] == -1);
    double sum = 0;
    for (int i = 0; i < N; i++) sum += f.weights[i];
    CHECK(fabs(sum - 2.0) < 1e-5);
}

static void test_gumbel_same_seed_same_choice(void)
{
    float logits[N] = {0.1f, 0.2f, 0.15f, 0.05f, 0.12f, 0.18f, 0.11f, 0.09f};
    col_routing_info r = softmax_rule(2, 1);
    int differs = 0;
    for (uint32_t pos = 0; pos < 64; pos++) {
        fixture a, b, c;
        setup(&a);
        setup(&b);
        setup(&c);
        col_router_params p = mode(COL_ROUTING_GUMBEL);
        p.position = pos;
        p.layer = 3;
        p.seed = 42;
        col_route(&r, NULL, &p, logits, &a.out, &a.scratch);
        col_route(&r, NULL, &p, logits, &b.out, &b.scratch);
        CHECK(a.ids[0] == b.ids[0] && a.ids[1] == b.ids[1]);
        CHECK(a.weights[0] == b.weights[0]);
        p.seed = 43;
        col_route(&r, NULL, &p, logits, &c.out, &c.scratch);
        differs += a.ids[0] != c.ids[0] || a.ids[1] != c.ids[1];
    }
    CHECK(differs > 0); /* another seed is another draw */
}

/* col_routing_scores gives the scores the router itself weighs by: the chosen weights of a
 * sigmoid rule before normalisation, and every soft-routing weight of a softmax rule. */
static void test_routing_scores_are_the_routers(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.5f, 2.0f, -1.0f, 3.0f, 0.1f, 1.0f, -0.5f, 0.0f};
    float bias[N] = {0, 0, 0, 0, 0, 0.4f, 0, 0}, scores[N];
    col_routing_info r = deepseek_v3_rule(2, 1, 1, 1.0f);
    r.normalize = COL_NORM_NONE;
    col_router_params p = mode(COL_ROUTING_TOPK);
    CHECK(col_routing_scores(&r, logits, scores) == COL_OK);
    col_route(&r, bias, &p, logits, &f.out, &f.scratch);
    for (int j = 0; j < N; j++) CHECK(scores[j] == sig(logits[j]));
    CHECK(f.weights[0] == scores[f.ids[0]] && f.weights[1] == scores[f.ids[1]]);
    CHECK(f.selection[5] == scores[5] + bias[5]);

    col_routing_info soft = softmax_rule(2, 0);
    p = mode(COL_ROUTING_SOFT);
    CHECK(col_routing_scores(&soft, logits, scores) == COL_OK);
    col_route(&soft, NULL, &p, logits, &f.out, &f.scratch);
    for (int i = 0; i < N; i++) CHECK(f.weights[i] == scores[f.ids[i]]);

    col_routing_info dense = softmax_rule(2, 0);
    dense.kind = COL_LAYER_DENSE;
    CHECK(col_routing_scores(&dense, logits, scores) == COL_ERR_INVALID_ARG);
    CHECK(col_routing_scores(&soft, NULL, scores) == COL_ERR_INVALID_ARG);
    soft.scoring = 9;
    CHECK(col_routing_scores(&soft, logits, scores) == COL_ERR_INVALID_ARG);
}

static void test_gumbel_noise_is_finite(void)
{
    for (uint32_t j = 0; j < 1000; j++) CHECK(isfinite(col_gumbel_noise(7, j, j % 5, j % 13)));
}

/* ---- cached routing ------------------------------------------------------------------------ */

static col_cache_route cache_of(const int32_t *previous, double threshold, int32_t *fresh)
{
    col_cache_route c = {previous, threshold, fresh, 0.0f, 0};
    return c;
}

/* Mixtral's rule, the previous position chose {3, 1}. Now expert 5 edges out expert 1 by
 * 1.0 - 0.99 on the logits (the selection scores of a softmax without bias): below a threshold
 * of 0.05 the previous set stays, weighted by its own probabilities renormalised; above 0.005
 * the fresh top-k wins. */
static void test_cached_keeps_the_previous_set_below_the_threshold(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 0.99f, -1.0f, 3.0f, 0.5f, 1.0f, 0.2f, -2.0f};
    const int32_t previous[2] = {3, 1};
    int32_t fresh[N];
    col_routing_info r = softmax_rule(2, 1);
    col_router_params p = mode(COL_ROUTING_CACHED);
    col_cache_route c = cache_of(previous, 0.05, fresh);
    CHECK(col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch) == 2);
    CHECK(c.kept == 1);
    CHECK(c.margin == (float)((double)1.0f - (double)0.99f));
    CHECK(fresh[0] == 3 && fresh[1] == 5);
    CHECK(f.ids[0] == 3 && f.ids[1] == 1);
    float probs[N];
    col_softmax(logits, probs, N);
    float d = probs[3] + probs[1];
    CHECK(f.weights[0] == probs[3] / d && f.weights[1] == probs[1] / d);

    c = cache_of(previous, 0.005, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && f.ids[0] == 3 && f.ids[1] == 5);
    CHECK(c.margin == (float)((double)1.0f - (double)0.99f));
    d = probs[3] + probs[5];
    CHECK(f.weights[0] == probs[3] / d && f.weights[1] == probs[5] / d);
}

/* The same set in another order is no change (margin 0, the fresh order); at the first position
 * there is no previous set (margin NaN). */
static void test_cached_same_set_and_first_position(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 0.0f, 1.0f, -2.0f};
    const int32_t previous[2] = {1, 3};
    int32_t fresh[N];
    col_routing_info r = softmax_rule(2, 0);
    col_router_params p = mode(COL_ROUTING_CACHED);
    col_cache_route c = cache_of(previous, 10.0, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && c.margin == 0.0f && f.ids[0] == 3 && f.ids[1] == 1);
    c = cache_of(NULL, 10.0, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && isnan(c.margin) && f.ids[0] == 3 && f.ids[1] == 1);
}

/* An exact tie between expert 1 and 5 goes to the lower index in plain top-k; cached routing
 * with any threshold above 0 keeps the previous position's 5 instead, and threshold 0 is plain
 * top-k. */
static void test_cached_tie_keeps_the_previous_expert(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0, 1.5f, 0, 0, 0, 1.5f, 0, 0};
    const int32_t previous[1] = {5};
    int32_t fresh[N];
    col_routing_info r = softmax_rule(1, 1);
    col_router_params p = mode(COL_ROUTING_CACHED);
    col_cache_route c = cache_of(previous, 1e-30, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 1 && c.margin == 0.0f && fresh[0] == 1 && f.ids[0] == 5 && f.weights[0] == 1.0f);
    c = cache_of(previous, 0.0, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && f.ids[0] == 1);
}

/* Two experts swapped at once: the margin is what the fresh set gains minus what it drops,
 * (2.0 + 1.9) - (1.8 + 1.7) = 0.4 (within float rounding of the four values). */
static void test_cached_margin_sums_every_swap(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {1.8f, 1.7f, 2.0f, 1.9f, 0.0f, 0.0f, 0.0f, 0.0f};
    const int32_t previous[2] = {1, 0};
    int32_t fresh[N];
    col_routing_info r = softmax_rule(2, 1);
    col_router_params p = mode(COL_ROUTING_CACHED);
    col_cache_route c = cache_of(previous, 0.41, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    double want = ((double)2.0f + (double)1.9f) - ((double)1.7f + (double)1.8f);
    CHECK(c.margin == (float)want && fabs(want - 0.4) < 1e-6);
    CHECK(c.kept == 1 && f.ids[0] == 0 && f.ids[1] == 1); /* 1.8 before 1.7 */
    CHECK(fabsf(f.weights[0] + f.weights[1] - 1.0f) < 1e-6f); /* renormalised over the kept two */
    c = cache_of(previous, 0.39, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && f.ids[0] == 2 && f.ids[1] == 3);
}

/* DeepSeek-V2's group limit (groups scored by their best) with two groups of four, one kept:
 * group 1's best (2.1) beats group 0's (2.0), so the fresh set is {4, 5}, yet the previous set
 * {0, 1} of group 0 outscores it (2.0 + 1.9 against 2.1 - 5). The margin is then 0, not
 * negative: any positive threshold keeps the previous set, threshold 0 does not. The kept set
 * is weighted by its own probabilities, scaled. */
static void test_cached_group_limit_margin_is_never_negative(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {2.0f, 1.9f, -5.0f, -5.0f, 2.1f, -5.0f, -5.0f, -5.0f};
    const int32_t previous[2] = {1, 0};
    int32_t fresh[N];
    col_routing_info r = softmax_rule(2, 0);
    r.n_groups = 2;
    r.n_groups_kept = 1;
    r.group_score = COL_GROUP_MAX;
    r.scale = 16.0f;
    col_router_params p = mode(COL_ROUTING_CACHED);
    col_cache_route c = cache_of(previous, 1e-9, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(f.groups[0] == 1 && fresh[0] == 4 && fresh[1] == 5);
    CHECK(c.margin == 0.0f && c.kept == 1);
    CHECK(f.ids[0] == 0 && f.ids[1] == 1);
    float probs[N];
    col_softmax(logits, probs, N);
    CHECK(f.weights[0] == probs[0] * 16.0f && f.weights[1] == probs[1] * 16.0f);
    c = cache_of(previous, 0.0, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && f.ids[0] == 4 && f.ids[1] == 5);
}

/* DeepSeek-V3: the margin is on the selection score (sigmoid + correction bias), the kept
 * set's weights on the sigmoids alone. Fresh {0, 1}; the previous {0, 2} loses
 * sig(0.9) - (sig(0) + 0.2) = 0.0109 on the selection score. */
static void test_cached_margin_on_the_biased_score_weights_without(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {1.0f, 0.9f, 0.0f, -3.0f, -3.0f, -3.0f, -3.0f, -3.0f};
    float bias[N] = {0, 0, 0.2f, 0, 0, 0, 0, 0};
    const int32_t previous[2] = {2, 0};
    int32_t fresh[N];
    col_routing_info r = deepseek_v3_rule(2, 1, 1, 2.5f);
    col_router_params p = mode(COL_ROUTING_CACHED);
    col_cache_route c = cache_of(previous, 0.02, fresh);
    col_route_cached(&r, bias, &p, logits, &c, &f.out, &f.scratch);
    CHECK(fresh[0] == 0 && fresh[1] == 1);
    double want = (double)sig(0.9f) - (double)(sig(0.0f) + 0.2f);
    CHECK(c.margin == (float)want && fabs(want - 0.0109) < 1e-4);
    CHECK(c.kept == 1 && f.ids[0] == 0 && f.ids[1] == 2);
    float d = sig(1.0f) + sig(0.0f) + 1e-20f;
    CHECK(f.weights[0] == sig(1.0f) / d * 2.5f && f.weights[1] == sig(0.0f) / d * 2.5f);
    c = cache_of(previous, 0.01, fresh);
    col_route_cached(&r, bias, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && f.ids[1] == 1);
}

/* A NaN score makes the margin NaN: the fresh set is used. */
static void test_cached_nan_uses_the_fresh_set(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 0.0f, 1.0f, -2.0f};
    logits[7] = NAN;
    const int32_t previous[2] = {7, 3};
    int32_t fresh[N];
    col_routing_info r = softmax_rule(2, 0);
    col_router_params p = mode(COL_ROUTING_CACHED);
    col_cache_route c = cache_of(previous, 1e30, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && isnan(c.margin) && f.ids[0] == 3 && f.ids[1] == 1);
}

/* A rule that selects on the logits and weighs by a softmax over the chosen (GPT-OSS): the kept
 * set's weights are that softmax over its own logits. */
static void test_cached_select_on_logits_weights(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 1.95f, 1.0f, -2.0f};
    const int32_t previous[2] = {5, 3};
    int32_t fresh[N];
    col_routing_info r = softmax_rule(2, 0);
    r.select_on = COL_SELECT_LOGITS;
    col_router_params p = mode(COL_ROUTING_CACHED);
    col_cache_route c = cache_of(previous, 0.1, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 1 && f.ids[0] == 3 && f.ids[1] == 5);
    float e = expf(1.95f - 3.0f);
    CHECK(f.weights[0] == 1.0f / (1.0f + e) && f.weights[1] == e / (1.0f + e));
}

/* Interventions' two hooks in the rule: a forbidden set the choice skips, a forced choice. */
static void test_forbidden_experts_are_skipped(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 0.0f, 1.0f, -2.0f};
    uint8_t forbidden[N] = {0, 0, 0, 1, 0, 0, 0, 0};
    col_routing_info r = softmax_rule(2, 1);
    col_router_params p = mode(COL_ROUTING_TOPK);
    p.forbidden = forbidden;
    CHECK(col_route(&r, NULL, &p, logits, &f.out, &f.scratch) == 2);
    /* expert 3 (logit 3.0) is out: 1 (2.0) and 6 (1.0) are the best of the rest */
    CHECK(f.ids[0] == 1 && f.ids[1] == 6);
    float probs[N];
    col_softmax(logits, probs, N);
    float sum = probs[1] + probs[6];
    CHECK(f.weights[0] == probs[1] / sum && f.weights[1] == probs[6] / sum);
    CHECK(f.selection[3] == 3.0f); /* the trace keeps every selection score */
    /* all but one forbidden: one expert chosen, its renormalised weight 1 */
    memset(forbidden, 1, sizeof forbidden);
    forbidden[4] = 0;
    CHECK(col_route(&r, NULL, &p, logits, &f.out, &f.scratch) == 1);
    CHECK(f.ids[0] == 4 && f.weights[0] == 1.0f);
    /* soft routing: every expert but the forbidden */
    memset(forbidden, 0, sizeof forbidden);
    forbidden[2] = forbidden[5] = 1;
    p.mode = COL_ROUTING_SOFT;
    CHECK(col_route(&r, NULL, &p, logits, &f.out, &f.scratch) == N - 2);
    for (int i = 0; i < N - 2; i++) CHECK(f.ids[i] != 2 && f.ids[i] != 5 && f.weights[i] == probs[f.ids[i]]);
}

static void test_forced_choice_is_weighted_by_the_rule(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 0.0f, 1.0f, -2.0f};
    int32_t forced[2] = {7, 0};
    col_routing_info r = softmax_rule(2, 1);
    col_router_params p = mode(COL_ROUTING_TOPK);
    p.forced = forced;
    p.n_forced = 2;
    CHECK(col_route(&r, NULL, &p, logits, &f.out, &f.scratch) == 2);
    CHECK(f.ids[0] == 7 && f.ids[1] == 0);
    float probs[N];
    col_softmax(logits, probs, N);
    float sum = probs[7] + probs[0];
    CHECK(f.weights[0] == probs[7] / sum && f.weights[1] == probs[0] / sum);
    /* a forced set of one: weight 1 after renormalisation */
    p.n_forced = 1;
    CHECK(col_route(&r, NULL, &p, logits, &f.out, &f.scratch) == 1 && f.ids[0] == 7 && f.weights[0] == 1.0f);
    /* DeepSeek-V3: weights are the sigmoids of the forced experts, scaled; a forced choice is
     * never one the bias changed */
    float bias[N] = {0, 0, 0, 0, 0, 0.4f, 0, 0};
    col_routing_info v3 = deepseek_v3_rule(2, 1, 1, 2.5f);
    p.n_forced = 2;
    CHECK(col_route(&v3, bias, &p, logits, &f.out, &f.scratch) == 2);
    float s = sig(-2.0f) + sig(0.1f) + 1e-20f;
    CHECK(f.weights[0] == sig(-2.0f) / s * 2.5f && f.weights[1] == sig(0.1f) / s * 2.5f);
    CHECK(f.bias_changed == 0);
}

/* Group-limited routing scores a group without its forbidden experts: forbidding experts 4
 * and 5 leaves group 1 with sigmoid(0.8) + sigmoid(-1.0) = 0.958, below group 0's
 * sigmoid(4.0) + sigmoid(-3.0) = 1.029, so group 0 is kept this time. */
static void test_forbidden_experts_leave_their_group_weaker(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {4.0f, -3.0f, -3.0f, -3.0f, 1.0f, 1.2f, 0.8f, -1.0f};
    float bias[N] = {0};
    uint8_t forbidden[N] = {0, 0, 0, 0, 1, 1, 0, 0};
    col_routing_info r = deepseek_v3_rule(2, 2, 1, 1.0f);
    col_router_params p = mode(COL_ROUTING_TOPK);
    p.forbidden = forbidden;
    CHECK(col_route(&r, bias, &p, logits, &f.out, &f.scratch) == 2);
    CHECK(f.groups[0] == 0);
    CHECK(f.ids[0] == 0 && f.ids[1] == 1); /* the three -3.0 logits tie: the lower index */
}

/* Cached routing under interventions (the first cached test's values: the previous {3, 1} would
 * be kept at threshold 0.05). A forced choice is used as it is; a previous set holding a
 * forbidden expert cannot be kept (the fresh choice skips it), one whose experts are all allowed
 * still can; a short previous set (a decision that had fewer than k eligible) is never kept. */
static void test_cached_under_interventions(void)
{
    fixture f;
    setup(&f);
    float logits[N] = {0.1f, 0.99f, -1.0f, 3.0f, 0.5f, 1.0f, 0.2f, -2.0f};
    const int32_t previous[2] = {3, 1}, short_previous[2] = {3, -1};
    int32_t fresh[N], forced[2] = {7, 0};
    uint8_t forbidden[N] = {0};
    col_routing_info r = softmax_rule(2, 1);
    col_router_params p = mode(COL_ROUTING_CACHED);
    p.forced = forced;
    p.n_forced = 2;
    col_cache_route c = cache_of(previous, 1e30, fresh);
    CHECK(col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch) == 2);
    CHECK(c.kept == 0 && isnan(c.margin) && f.ids[0] == 7 && f.ids[1] == 0 && fresh[0] == 7 && fresh[1] == 0);

    p.forced = NULL;
    p.n_forced = 0;
    p.forbidden = forbidden;
    forbidden[1] = 1;
    c = cache_of(previous, 0.05, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && isnan(c.margin) && f.ids[0] == 3 && f.ids[1] == 5 && fresh[1] == 5);
    forbidden[1] = 0;
    forbidden[7] = 1;
    c = cache_of(previous, 0.05, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 1 && f.ids[0] == 3 && f.ids[1] == 1);

    forbidden[7] = 0;
    c = cache_of(short_previous, 1e30, fresh);
    col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch);
    CHECK(c.kept == 0 && isnan(c.margin) && f.ids[0] == 3 && f.ids[1] == 5);
    /* every expert but one forbidden: a short fresh choice, the previous set not kept */
    memset(forbidden, 1, sizeof forbidden);
    forbidden[3] = 0;
    c = cache_of(previous, 1e30, fresh);
    CHECK(col_route_cached(&r, NULL, &p, logits, &c, &f.out, &f.scratch) == 1);
    CHECK(c.kept == 0 && f.ids[0] == 3 && f.weights[0] == 1.0f);
}

int main(void)
{
    test_topk_picks_largest_in_order();
    test_exact_tie_goes_to_lower_index();
    test_stable_epsilon_breaks_tie_toward_higher_index();
    test_stable_epsilon_can_change_a_near_tie();
    test_soft_softmax_weights_are_the_probabilities();
    test_renormalised_weights_sum_to_one();
    test_correction_bias_changes_selection_not_weights();
    test_groups_by_top2_sum_exclude_the_best_expert();
    test_tied_groups_go_to_the_lower_group();
    test_deepseek_v2_group_limited_greedy();
    test_softmax_bias_and_clamped_sum();
    test_select_on_logits_then_softmax_of_the_chosen();
    test_select_on_logits_then_sigmoid();
    test_sparsemixer_weights();
    test_p_norm();
    test_stable_acts_on_the_selection_score();
    test_soft_sigmoid_rule_normalises_over_every_expert();
    test_gumbel_same_seed_same_choice();
    test_gumbel_noise_is_finite();
    test_routing_scores_are_the_routers();
    test_cached_keeps_the_previous_set_below_the_threshold();
    test_cached_same_set_and_first_position();
    test_cached_tie_keeps_the_previous_expert();
    test_cached_margin_sums_every_swap();
    test_cached_group_limit_margin_is_never_negative();
    test_cached_margin_on_the_biased_score_weights_without();
    test_cached_nan_uses_the_fresh_set();
    test_cached_select_on_logits_weights();
    test_forbidden_experts_are_skipped();
    test_forced_choice_is_weighted_by_the_rule();
    test_forbidden_experts_leave_their_group_weaker();
    test_cached_under_interventions();
    return TEST_REPORT();
}
