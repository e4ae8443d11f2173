/*
 * router.c - turns one token's router logits into the experts it visits and their weights, by
 * the layer's routing rule (col_routing_info; docs/format.md, "The routing rule").
 *
 * A rule is the same five steps for every family:
 *   1. scores: a softmax over every expert or a sigmoid of each logit (rules that select on the
 *      logits score only the chosen, in step 4);
 *   2. selection scores, the values whose order decides: score + correction bias (DeepSeek-V3's
 *      sigmoid + e_score_correction_bias, ERNIE's softmax + moe_statics), the sigmoid itself, or
 *      the logit (softmax without a bias, which keeps the order of the logits and keeps apart
 *      logits whose probabilities round to the same float; and rules that select on logits);
 *   3. the group limit: experts in n_groups groups of consecutive indices, each group scored by
 *      its best selection score (DeepSeek-V2) or the sum of its best two (DeepSeek-V3), only the
 *      n_groups_kept best groups eligible;
 *   4. top-k of the eligible selection scores; weights = the chosen experts' scores, or a softmax
 *      over the chosen logits (GPT-OSS, Granite), their sigmoids (Llama 4), PhiMoE's sparsemixer;
 *   5. normalisation (sum, sum clamped below, p-norm), then the scaling factor.
 * The routing modes change only step 3's and 4's *choice*: stable routing ranks
 * (double)selection_score[j] + j*epsilon, Gumbel routing adds noise from (seed, position, layer, j),
 * and soft routing takes every expert with no group limit, weighted by the rule's scores of all
 * of them (normalised as the rule says, except a softmax over every expert, which needs none);
 * cached routing makes plain top-k's choice and then may use the previous position's set
 * instead (col_route_cached). Weights always come from the unperturbed values. When asked, a decision also says whether its
 * correction bias changed the outcome: whether the same ranking (same mode, same group rule) of
 * the scores without the bias chooses another set.
 * Selection is an arg-max per slot (k and the group count are small; no sort, no allocation)
 * with one tie rule: on exactly equal keys the lower expert index wins, and the lower group
 * index between groups, in every mode.
 */
#include "router.h"

#include <math.h>

void col_softmax(const float *in, float *out, uint32_t n)
{
    float max = in[0];
    for (uint32_t i = 1; i < n; i++)
        if (in[i] > max) max = in[i];
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        out[i] = expf(in[i] - max);
        sum += out[i];
    }
    for (uint32_t i = 0; i < n; i++) out[i] /= sum;
}

static float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* Step 1 over every expert: each logit's sigmoid, or a softmax over all of them (softmax and
 * sparsemixer rules; what soft routing weighs by). */
static void score_all(uint32_t scoring, const float *logits, float *scores, uint32_t n)
{
    if (scoring == COL_SCORING_SIGMOID) {
        for (uint32_t j = 0; j < n; j++) scores[j] = sigmoid(logits[j]);
    } else {
        col_softmax(logits, scores, n);
    }
}

int32_t col_routing_scores(const col_routing_info *rule, const float *logits, float *scores)
{
    if (!rule || !logits || !scores || rule->kind != COL_LAYER_MOE || rule->n_experts == 0 ||
        rule->scoring > COL_SCORING_SPARSEMIXER)
        return COL_ERR_INVALID_ARG;
    score_all(rule->scoring, logits, scores, rule->n_experts);
    return COL_OK;
}

/* splitmix64 finaliser: a well-mixed 64-bit hash, so noise needs no generator state and a
 * decision's noise does not depend on which decisions were made before it. */
static uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double col_gumbel_noise(uint64_t seed, uint32_t position, uint32_t layer, uint32_t expert)
{
    uint64_t h = mix64(seed ^ mix64(((uint64_t)position << 32) ^ ((uint64_t)layer << 16) ^ expert));
    double u = ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* strictly inside (0,1) */
    return -log(-log(u));
}

/* The index of the largest key among the n not taken (the lower index on ties), -1 if none. */
static int32_t best_untaken(const double *keys, const uint8_t *taken, uint32_t n)
{
    int32_t best = -1;
    for (uint32_t j = 0; j < n; j++)
        if (!taken[j] && (best < 0 || keys[j] > keys[best])) best = (int32_t)j;
    return best;
}

/* Step 3: keep the rule's n_groups_kept best groups by their keys; every expert of another group
 * is marked taken. The kept groups go to `groups` (may be NULL) best first. */
static void limit_groups(const col_routing_info *r, const double *keys, const col_router_scratch *s,
                         int32_t *groups)
{
    uint32_t n_groups = r->n_groups, size = r->n_experts / n_groups;
    for (uint32_t g = 0; g < n_groups; g++) {
        const double *k = keys + (uint64_t)g * size;
        double first = k[0], second = -INFINITY;
        for (uint32_t j = 1; j < size; j++) {
            if (k[j] > first) {
                second = first;
                first = k[j];
            } else if (k[j] > second) {
                second = k[j];
            }
        }
        s->group_keys[g] = r->group_score == COL_GROUP_TOP2_SUM ? first + second : first;
        s->group_taken[g] = 0;
    }
    for (uint32_t slot = 0; slot < r->n_groups_kept; slot++) {
        int32_t best = best_untaken(s->group_keys, s->group_taken, n_groups);
        s->group_taken[best] = 1;
        if (groups) groups[slot] = best;
    }
    for (uint32_t g = 0; g < n_groups; g++)
        if (!s->group_taken[g])
            for (uint32_t j = 0; j < size; j++) s->taken[(uint64_t)g * size + j] = 1;
}

/* Step 4, PhiMoE's sparsemixer weights of the two chosen experts (transformers' eval path):
 * expert e of the pair gets a softmax over the logits not masked out, where logit j is masked
 * when (m - l_j) / max(|l_j|, m) > 2 eps, m being e's logit, and the second softmax also
 * leaves out the first expert. */
static void sparsemixer_weights(const float *l, uint32_t n, float eps, const int32_t *ids, uint32_t k,
                                float *weights)
{
    const float threshold = 2.0f * eps;
    for (uint32_t slot = 0; slot < k; slot++) {
        float m = l[ids[slot]], sum = 0.0f;
        for (uint32_t j = 0; j < n; j++) {
            if (slot == 1 && (int32_t)j == ids[0]) continue;
            float factor = fabsf(l[j]) > m ? fabsf(l[j]) : m;
            if ((m - l[j]) / factor > threshold) continue;
            sum += expf(l[j] - m);
        }
        weights[slot] = 1.0f / sum; /* exp(m - m) / sum */
    }
}

/* Step 5 over the k weights. */
static void normalize(const col_routing_info *r, float *w, uint32_t k)
{
    if (r->normalize == COL_NORM_NONE) return;
    float d = 0.0f;
    if (r->normalize == COL_NORM_P) {
        if (r->norm_p == 1.0f) {
            for (uint32_t i = 0; i < k; i++) d += fabsf(w[i]);
        } else if (r->norm_p == 2.0f) {
            for (uint32_t i = 0; i < k; i++) d += w[i] * w[i];
            d = sqrtf(d);
        } else {
            for (uint32_t i = 0; i < k; i++) d += powf(fabsf(w[i]), r->norm_p);
            d = powf(d, 1.0f / r->norm_p);
        }
    } else {
        for (uint32_t i = 0; i < k; i++) d += w[i];
        d = r->normalize == COL_NORM_SUM ? d + r->norm_eps : (d > r->norm_eps ? d : r->norm_eps);
    }
    for (uint32_t i = 0; i < k; i++) w[i] /= d;
}

/* Steps 1-2 over every expert: each one's selection score into `selection` and the key the
 * mode ranks into s->keys; with selection NULL the keys rank the scores alone (no correction
 * bias: what bias_changed compares with). Forbidden experts are taken and rank below every
 * other, so a group is scored without its forbidden experts. */
static void selection_keys(const col_routing_info *r, const col_router_params *p, const float *logits,
                           const float *bias, float *selection, const col_router_scratch *s)
{
    const int on_scores = r->select_on == COL_SELECT_SCORES;
    for (uint32_t j = 0; j < r->n_experts; j++) {
        double key = s->scores[j];
        if (selection) {
            float sel = logits[j];
            if (on_scores && (r->scoring == COL_SCORING_SIGMOID || bias))
                sel = s->scores[j] + (bias ? bias[j] : 0.0f);
            selection[j] = sel;
            key = sel;
        }
        if (p->mode == COL_ROUTING_STABLE) key += (double)j * p->epsilon;
        else if (p->mode == COL_ROUTING_GUMBEL) key += col_gumbel_noise(p->seed, p->position, p->layer, j);
        s->keys[j] = key;
        s->taken[j] = 0;
        if (p->forbidden && p->forbidden[j]) {
            s->taken[j] = 1;
            s->keys[j] = -INFINITY;
        }
    }
}

/* Step 4's choice: the best untaken key per slot, at most k of them; returns how many there were. */
static uint32_t choose(const double *keys, uint8_t *taken, uint32_t n, uint32_t k, int32_t *ids)
{
    uint32_t count = 0;
    for (; count < k; count++) {
        int32_t best = best_untaken(keys, taken, n);
        if (best < 0) break;
        taken[best] = 1;
        ids[count] = best;
    }
    return count;
}

/* Steps 4 (the chosen experts' weights) and 5 for the k experts `ids`, in their order (k may be
 * below the rule's top-k when interventions forbid experts, 0 included). scores:
 * step 1's scores of every expert, read when the rule selects on scores or scores by sigmoid. */
static void weigh(const col_routing_info *r, const float *logits, const float *scores, const int32_t *ids,
                  uint32_t k, float *weights)
{
    if (r->scoring == COL_SCORING_SPARSEMIXER) {
        sparsemixer_weights(logits, r->n_experts, r->sparsemixer_eps, ids, k < 2 ? k : 2, weights);
    } else if (r->select_on == COL_SELECT_SCORES || r->scoring == COL_SCORING_SIGMOID) {
        for (uint32_t slot = 0; slot < k; slot++)
            weights[slot] = r->select_on == COL_SELECT_SCORES ? scores[ids[slot]] : sigmoid(logits[ids[slot]]);
    } else if (k) { /* a softmax over the chosen logits (none when interventions forbid every expert) */
        for (uint32_t slot = 0; slot < k; slot++) weights[slot] = logits[ids[slot]];
        col_softmax(weights, weights, k);
    }
    normalize(r, weights, k);
    for (uint32_t slot = 0; slot < k; slot++) weights[slot] *= r->scale;
}

uint32_t col_route(const col_routing_info *r, const float *bias, const col_router_params *p, const float *logits,
                   const col_route_out *out, const col_router_scratch *s)
{
    const uint32_t n = r->n_experts;
    const int soft = p->mode == COL_ROUTING_SOFT;
    const int on_scores = r->select_on == COL_SELECT_SCORES;

    /* steps 1 and 2 */
    if (r->scoring == COL_SCORING_SIGMOID || on_scores || soft)
        score_all(r->scoring, logits, s->scores, n);
    selection_keys(r, p, logits, bias, out->selection, s);

    uint32_t k;
    if (soft) { /* every expert by its unperturbed selection score, no group limit */
        for (uint32_t j = 0; j < n; j++)
            if (!s->taken[j]) s->keys[j] = out->selection[j];
        k = p->forced ? p->n_forced : choose(s->keys, s->taken, n, n, out->ids);
        for (uint32_t slot = 0; slot < k; slot++) {
            if (p->forced) out->ids[slot] = p->forced[slot];
            out->weights[slot] = s->scores[out->ids[slot]]; /* sparsemixer: the softmax over every logit */
        }
        if (out->groups && r->n_groups > 1)
            for (uint32_t g = 0; g < r->n_groups_kept; g++) out->groups[g] = -1;
        if (out->bias_changed) *out->bias_changed = 0;
        if (r->scoring != COL_SCORING_SOFTMAX && r->scoring != COL_SCORING_SPARSEMIXER) normalize(r, out->weights, k);
        for (uint32_t slot = 0; slot < k; slot++) out->weights[slot] *= r->scale;
        return k;
    }

    /* steps 3 and 4 (a forced choice keeps the group limit's kept groups for the trace) */
    if (r->n_groups > 1) limit_groups(r, s->keys, s, out->groups);
    if (p->forced) {
        k = p->n_forced;
        for (uint32_t slot = 0; slot < k; slot++) out->ids[slot] = p->forced[slot];
    } else {
        k = choose(s->keys, s->taken, n, r->top_k < n ? r->top_k : n, out->ids);
    }
    weigh(r, logits, s->scores, out->ids, k, out->weights);

    if (out->bias_changed) {
        *out->bias_changed = 0;
        if (bias && on_scores && !p->forced) { /* the same choice on the scores alone */
            selection_keys(r, p, logits, NULL, NULL, s);
            if (r->n_groups > 1) limit_groups(r, s->keys, s, NULL);
            uint32_t alt = choose(s->keys, s->taken, n, k, s->alt_ids);
            for (uint32_t a = 0; a < alt && !*out->bias_changed; a++) {
                int found = 0;
                for (uint32_t b = 0; b < k; b++) found |= s->alt_ids[a] == out->ids[b];
                *out->bias_changed = !found;
            }
        }
    }
    return k;
}

/* Cached routing. The fresh choice is plain top-k's; `c->previous` (the set the layer used at the
 * previous position) stays when it differs from the fresh set by a margin below the threshold:
 * margin = sum of the selection scores the fresh set gains minus the sum of those it drops
 * (experts in both cancel), in double, never below 0 (a previous set outside the groups the limit
 * now keeps can outscore the fresh one), NaN when a score is NaN (then the fresh set is used). */
uint32_t col_route_cached(const col_routing_info *r, const float *bias, const col_router_params *p,
                          const float *logits, col_cache_route *c, const col_route_out *out,
                          const col_router_scratch *s)
{
    col_router_params plain = *p;
    plain.mode = COL_ROUTING_TOPK;
    uint32_t k = col_route(r, bias, &plain, logits, out, s);
    for (uint32_t slot = 0; slot < k; slot++) c->fresh[slot] = out->ids[slot];
    c->kept = 0;
    c->margin = NAN;
    /* A forced choice is not the cache's to override. The previous set may be kept only when it
     * is a full set of experts none of which is forbidden now, and the fresh choice is full too
     * (forbidding can leave fewer than top-k eligible). */
    if (!c->previous || p->forced || k != (r->top_k < r->n_experts ? r->top_k : r->n_experts)) return k;
    for (uint32_t a = 0; a < k; a++)
        if (c->previous[a] < 0 || (p->forbidden && p->forbidden[c->previous[a]])) return k;

    double gained = 0.0, dropped = 0.0;
    int differ = 0;
    for (uint32_t a = 0; a < k; a++) {
        int in_previous = 0, in_fresh = 0;
        for (uint32_t b = 0; b < k; b++) {
            in_previous |= c->previous[b] == out->ids[a];
            in_fresh |= c->fresh[b] == c->previous[a];
        }
        if (!in_previous) gained += out->selection[out->ids[a]];
        if (!in_fresh) dropped += out->selection[c->previous[a]];
        differ |= !in_previous;
    }
    double margin = gained - dropped;
    if (margin < 0.0) margin = 0.0; /* NaN stays NaN */
    c->margin = (float)margin;
    if (!differ || !(margin < c->threshold)) return k;

    /* keep the previous set, listed by descending selection score (ties: lower index first) */
    for (uint32_t slot = 0; slot < k; slot++) {
        int32_t e = c->previous[slot];
        uint32_t at = slot;
        while (at > 0 && (out->selection[out->ids[at - 1]] < out->selection[e] ||
                          (out->selection[out->ids[at - 1]] == out->selection[e] && out->ids[at - 1] > e))) {
            out->ids[at] = out->ids[at - 1];
            at--;
        }
        out->ids[at] = e;
    }
    weigh(r, logits, s->scores, out->ids, k, out->weights);
    c->kept = 1;
    return k;
}
