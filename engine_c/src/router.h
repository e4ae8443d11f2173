/*
 * router.h - top-k selection and combination weights for one routing decision (internal).
 */
#ifndef COLIBRI_ROUTER_H
#define COLIBRI_ROUTER_H

#include "internal.h"

typedef struct col_router_params {
    uint32_t mode;          /* col_routing_mode */
    uint32_t n_experts;
    uint32_t k;             /* experts to select (ignored by soft routing, which uses all) */
    int renormalize;        /* divide the k selected probabilities by their sum */
    double epsilon;         /* stable routing: select on logit[j] + j*epsilon */
    uint64_t seed;          /* Gumbel routing: noise is a pure function of (seed, position, layer, j) */
    uint32_t position;
    uint32_t layer;
} col_router_params;

/* Caller-owned scratch for one decision, each [n_experts]. */
typedef struct col_router_scratch {
    float *probs;
    double *scores;
    uint8_t *taken;
} col_router_scratch;

/* Route one token. logits: [n_experts] raw router logits. Writes the chosen expert ids in
 * selection order (best first) and their combination weights to ids/weights, which must hold
 * n_experts entries for soft routing and k otherwise. Returns the number of slots written.
 * Exact score ties go to the lower expert index. Pure: no allocation, no global state. */
uint32_t col_route(const col_router_params *params, const float *logits, int32_t *ids,
                   float *weights, const col_router_scratch *scratch);

/* softmax over n values in f32, max-subtracted (the families' router math). */
void col_softmax(const float *in, float *out, uint32_t n);

/* The Gumbel noise -log(-log(u)) used for (seed, position, layer, expert). */
double col_gumbel_noise(uint64_t seed, uint32_t position, uint32_t layer, uint32_t expert);

#endif
