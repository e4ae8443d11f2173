/*
 * router.h - one routing decision: a MoE layer's rule (col_routing_info) applied to one token's
 * router logits, under the session's routing mode (internal).
 */
#ifndef COLIBRI_ROUTER_H
#define COLIBRI_ROUTER_H

#include "internal.h"

/* The session's routing mode for one decision at (position, layer). */
typedef struct col_router_params {
    uint32_t mode;          /* col_routing_mode */
    double epsilon;         /* stable routing: select on selection_score[j] + j*epsilon */
    uint64_t seed;          /* Gumbel routing: noise is a pure function of (seed, position, layer, j) */
    uint32_t position;
    uint32_t layer;
    /* a decision's interventions (intervene.c); all zero = none */
    const uint8_t *forbidden; /* [n_experts] 1 = may not be chosen (its group scores without it); NULL = none */
    const int32_t *forced;  /* [n_forced] the choice itself, in selection order; NULL = the rule chooses */
    uint32_t n_forced;
} col_router_params;

/* Caller-owned scratch for one decision, each [n_experts]. */
typedef struct col_router_scratch {
    float *scores;          /* the rule's scores (softmax probabilities or sigmoids) */
    double *keys;           /* selection scores as perturbed by the mode: what is ranked */
    uint8_t *taken;         /* chosen, or excluded by the group limit */
    double *group_keys;     /* [n_groups <= n_experts] */
    uint8_t *group_taken;   /* [n_groups] kept */
    int32_t *alt_ids;       /* [n_experts] the choice without the correction bias */
} col_router_scratch;

/* Where one decision goes. */
typedef struct col_route_out {
    int32_t *ids;           /* [n_experts] chosen experts in selection order (best first) */
    float *weights;         /* [n_experts] their combination weights */
    float *selection;       /* [n_experts] every expert's unperturbed selection score */
    int32_t *groups;        /* [n_groups_kept] kept groups, best first (-1 in soft routing); NULL when
                             * the caller does not want them; untouched when the rule has no groups */
    uint8_t *bias_changed;  /* 1 when the rule without its correction bias would have chosen another
                             * set (0 without a bias and in soft routing); NULL: not computed */
} col_route_out;

/* Route one token. rule: a MoE layer's decoded routing entry; correction_bias: its
 * [n_experts] correction bias as f32, NULL when it has none; logits: [n_experts] router logits
 * (the router bias already added). Writes the chosen experts, their weights and every expert's
 * selection score; returns the number of experts chosen (top_k, or n_experts in soft routing;
 * fewer when params forbid so many that fewer are eligible; n_forced when params force the
 * choice, whose weights are then the rule's, or soft routing's, for that set). Exact ties go to
 * the lower expert index, and between groups to the lower group index, in every mode. Pure: no
 * allocation, no global state. */
uint32_t col_route(const col_routing_info *rule, const float *correction_bias, const col_router_params *params,
                   const float *logits, const col_route_out *out, const col_router_scratch *scratch);

/* Cached routing (COL_ROUTING_CACHED) of one decision: the set its layer used at the previous
 * position in, what the decision did with it out. */
typedef struct col_cache_route {
    const int32_t *previous; /* [k] the set used at the previous position (-1 past its size when
                              * interventions made it short); NULL at the first */
    double threshold;        /* keep `previous` while the fresh set's margin over it is below this */
    int32_t *fresh;          /* [k] out: the rule's own top-k (COL_ROUTING_TOPK's choice under the
                              * same interventions: a forced set, or top-k of the experts allowed) */
    float margin;            /* out: the fresh set's margin over `previous` (0 when equal; NaN
                              * without a previous set or with a NaN score, and when the previous
                              * set cannot be kept: a force, a forbidden expert in it, a short set) */
    uint8_t kept;            /* out: 1 when `previous` was used instead of a different fresh set */
} col_cache_route;

/* Route one token under cached routing (docs/interface-spec.md, "Routing modes"): the fresh
 * choice is col_route's under COL_ROUTING_TOPK; when c->previous differs from it and the margin
 * = max(0, sum of fresh-only selection scores - sum of previous-only ones) (double, slot order)
 * is below c->threshold, the previous experts are used again, listed by descending selection
 * score (ties: lower index first) and weighted by the rule from this token's values. Under
 * interventions (params' forced and forbidden) the fresh choice is col_route's under them, and
 * the previous set is not kept when the choice is forced, when it holds a forbidden expert, or
 * when either set is shorter than top-k. Writes what col_route writes (groups and bias_changed
 * are the fresh choice's); returns k. Pure. */
uint32_t col_route_cached(const col_routing_info *rule, const float *correction_bias, const col_router_params *params,
                          const float *logits, col_cache_route *c, const col_route_out *out,
                          const col_router_scratch *scratch);

/* softmax over n values in f32, max-subtracted (the families' router math). */
void col_softmax(const float *in, float *out, uint32_t n);

/* The Gumbel noise -log(-log(u)) used for (seed, position, layer, expert). */
double col_gumbel_noise(uint64_t seed, uint32_t position, uint32_t layer, uint32_t expert);

#endif
