/*
 * router.c - turns one token's router logits into the experts it visits and their weights.
 *
 * All four v1 families score with a softmax over every expert and take the top-k probabilities
 * (Mixtral always renormalises the k weights, the others when norm_topk_prob is set). Selection
 * here ranks the logits, not the probabilities: softmax is monotonic, so the chosen set is the
 * same, but distinct logits can round to equal probabilities and the logits keep them apart.
 * The routing modes only change *selection*; weights always come from the unperturbed logits
 * (stable and Gumbel), except soft routing, which weighs every expert by the full softmax.
 * Selection is a k-pass arg-max (k is small; no sort, no allocation) with a documented tie rule:
 * on exactly equal scores the lower expert index wins, in every mode.
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

uint32_t col_route(const col_router_params *p, const float *logits, int32_t *ids, float *weights,
                   const col_router_scratch *s)
{
    uint32_t n = p->n_experts;
    col_softmax(logits, s->probs, n);

    if (p->mode == COL_ROUTING_SOFT) {
        /* every expert, listed by descending weight */
        for (uint32_t j = 0; j < n; j++) {
            s->scores[j] = logits[j];
            s->taken[j] = 0;
        }
        for (uint32_t slot = 0; slot < n; slot++) {
            int32_t best = -1;
            for (uint32_t j = 0; j < n; j++)
                if (!s->taken[j] && (best < 0 || s->scores[j] > s->scores[best])) best = (int32_t)j;
            s->taken[best] = 1;
            ids[slot] = best;
            weights[slot] = s->probs[best];
        }
        return n;
    }

    for (uint32_t j = 0; j < n; j++) {
        double score = logits[j];
        if (p->mode == COL_ROUTING_STABLE) score += (double)j * p->epsilon;
        else if (p->mode == COL_ROUTING_GUMBEL) score += col_gumbel_noise(p->seed, p->position, p->layer, j);
        s->scores[j] = score;
        s->taken[j] = 0;
    }
    uint32_t k = p->k < n ? p->k : n;
    float sum = 0.0f;
    for (uint32_t slot = 0; slot < k; slot++) {
        int32_t best = -1;
        for (uint32_t j = 0; j < n; j++)
            if (!s->taken[j] && (best < 0 || s->scores[j] > s->scores[best])) best = (int32_t)j;
        s->taken[best] = 1;
        ids[slot] = best;
        weights[slot] = s->probs[best];
        sum += weights[slot];
    }
    if (p->renormalize)
        for (uint32_t slot = 0; slot < k; slot++) weights[slot] /= sum;
    return k;
}
