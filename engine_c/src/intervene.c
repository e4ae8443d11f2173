/*
 * intervene.c - interventions: a user's edits of routing decisions, applied while the forward
 * pass routes (experts.c asks at each decision; docs/interventions.md states the semantics).
 *
 * An intervention has a kind, a scope (positions first..last, one MoE layer or all of them) and
 * its operands. At one decision (position, MoE layer) the matching ones act in this order:
 *   1. LOGITS edits (add or set one expert's router logit), in list order, on the logits the
 *      rule reads (after the router bias and a numerics variant's noise); the trace keeps them;
 *   2. BIAS edits (add or set one expert's correction bias: a layer without one starts from
 *      zeros), in list order, on a copy of the layer's bias;
 *   3. FORBID and ABLATE: the union of their experts may not be chosen (the rule chooses among
 *      the others; a group is scored without them);
 *   4. FORCE: the last matching one is the choice itself, in its order, weighted by the rule;
 *   5. WEIGHTS: the last matching one replaces the first chosen slots' combine weights;
 *   6. SWAP: each matching one exchanges which of its two experts' weights a chosen slot runs
 *      (the decision, its weight and the trace stay the router's).
 * Everything here runs on the session's calling thread, decision by decision, so results do
 * not depend on the thread count or on how positions are grouped into blocks. The session
 * borrows the caller's array; nothing here allocates.
 */
#include "session.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int in_scope(const col_intervention *it, uint32_t position, uint32_t layer)
{
    return position >= it->first_position && position <= it->last_position &&
           (it->layer < 0 || (uint32_t)it->layer == layer);
}

static const char *kind_name(uint32_t kind)
{
    static const char *const names[] = {"force", "forbid", "weights", "logits", "bias", "ablate", "swap"};
    return kind <= COL_INTERVENE_SWAP ? names[kind] : "?";
}

/* How many experts and values each kind takes: [min, max] (max 0 = the session's slots). */
static void operand_counts(uint32_t kind, uint32_t k_slots, uint32_t n_experts, uint32_t *e_min, uint32_t *e_max,
                           uint32_t *v_min, uint32_t *v_max)
{
    *e_min = *e_max = *v_min = *v_max = 0;
    switch (kind) {
    case COL_INTERVENE_FORCE: *e_min = 1; *e_max = k_slots; break;
    case COL_INTERVENE_FORBID:
    case COL_INTERVENE_ABLATE: *e_min = 1; *e_max = n_experts; break;
    case COL_INTERVENE_WEIGHTS: *v_min = 1; *v_max = k_slots; break;
    case COL_INTERVENE_LOGITS:
    case COL_INTERVENE_BIAS: *e_min = 1; *e_max = n_experts; *v_min = *v_max = 1; break;
    case COL_INTERVENE_SWAP: *e_min = *e_max = 2; break;
    default: break;
    }
}

/* The checks of one intervention against the model and the session's slots. */
static int32_t check_one(const col_model *m, uint32_t k_slots, const col_intervention *it, char *err, size_t errlen)
{
    const col_hparams *hp = &m->hp;
    if (it->kind > COL_INTERVENE_SWAP)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "kind: unknown kind %u (0..%d)", it->kind,
                             COL_INTERVENE_SWAP);
    if (it->first_position > it->last_position)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "pos: first position %u after last %u",
                             it->first_position, it->last_position);
    if (it->layer < -1 || (it->layer >= 0 && (uint32_t)it->layer >= hp->n_layers))
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "layer: %d outside 0..%u", it->layer, hp->n_layers - 1);
    if (it->layer >= 0 && m->layers[it->layer].kind != COL_LAYER_MOE)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "layer: layer %d is dense (it routes nothing)",
                             it->layer);
    uint32_t e_min, e_max, v_min, v_max;
    operand_counts(it->kind, k_slots, hp->n_experts, &e_min, &e_max, &v_min, &v_max);
    if (it->n_experts < e_min || it->n_experts > e_max) {
        if (e_max == 0)
            return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "experts: %s takes no experts", kind_name(it->kind));
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "experts: %u given, %s takes %u..%u%s", it->n_experts,
                             kind_name(it->kind), e_min, e_max,
                             it->kind == COL_INTERVENE_FORCE ? " (the session's experts per decision)" : "");
    }
    if (it->n_experts && !it->experts)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "experts: NULL array for %u experts", it->n_experts);
    for (uint32_t i = 0; i < it->n_experts; i++) {
        int32_t e = it->experts[i];
        if (e < 0 || (uint32_t)e >= hp->n_experts)
            return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "experts: expert %d outside 0..%u", e,
                                 hp->n_experts - 1);
        for (uint32_t j = 0; j < i; j++)
            if (it->experts[j] == e)
                return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "experts: expert %d given twice", e);
    }
    if (it->n_values < v_min || it->n_values > v_max) {
        if (v_max == 0)
            return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "values: %s takes no values", kind_name(it->kind));
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "values: %u given, %s takes %u..%u", it->n_values,
                             kind_name(it->kind), v_min, v_max);
    }
    if (it->n_values && !it->values)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "values: NULL array for %u values", it->n_values);
    for (uint32_t i = 0; i < it->n_values; i++)
        if (!isfinite(it->values[i]))
            return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "values: value %u is not finite", i);
    if ((it->kind == COL_INTERVENE_LOGITS || it->kind == COL_INTERVENE_BIAS) ? it->op > COL_INTERVENE_SET : it->op != 0)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "op: %u is not an operation of %s", it->op,
                             kind_name(it->kind));
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const col_layer *layer = &m->layers[l];
        if (layer->kind != COL_LAYER_MOE || (it->layer >= 0 && (uint32_t)it->layer != l)) continue;
        if (it->kind == COL_INTERVENE_BIAS && layer->route->select_on != COL_SELECT_SCORES)
            return col_set_error(err, errlen, COL_ERR_INVALID_ARG,
                                 "layer: layer %u selects on its logits; a correction bias has no part in its rule", l);
        if (it->kind == COL_INTERVENE_FORCE && layer->route->scoring == COL_SCORING_SPARSEMIXER && it->n_experts != 2)
            return col_set_error(err, errlen, COL_ERR_INVALID_ARG,
                                 "experts: layer %u's sparsemixer rule weighs exactly 2 experts", l);
    }
    return COL_OK;
}

int32_t col_interventions_check(const col_model *m, uint32_t k_slots, const col_intervention *items, uint32_t n,
                                uint32_t *bad, char *err, size_t errlen)
{
    if (n && !items) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "items: NULL array for %u interventions", n);
    for (uint32_t i = 0; i < n; i++) {
        int32_t status = check_one(m, k_slots, &items[i], err, errlen);
        if (status != COL_OK) {
            if (bad) *bad = i;
            return status;
        }
    }
    return COL_OK;
}

uint32_t col_intervene_route(col_session *s, uint32_t layer_index, uint32_t position, float *logits,
                             const float **bias, col_router_params *params)
{
    uint32_t applied = 0, n_experts = s->model->hp.n_experts;
    int forbidding = 0, biased = 0;
    for (uint32_t i = 0; i < s->n_interventions; i++) {
        const col_intervention *it = &s->interventions[i];
        if (!in_scope(it, position, layer_index)) continue;
        switch (it->kind) {
        case COL_INTERVENE_LOGITS:
            for (uint32_t e = 0; e < it->n_experts; e++) {
                float *v = &logits[it->experts[e]];
                *v = it->op == COL_INTERVENE_SET ? it->values[0] : *v + it->values[0];
            }
            break;
        case COL_INTERVENE_BIAS:
            if (!biased) {
                for (uint32_t j = 0; j < n_experts; j++) s->edit_bias[j] = *bias ? (*bias)[j] : 0.0f;
                biased = 1;
            }
            for (uint32_t e = 0; e < it->n_experts; e++) {
                float *v = &s->edit_bias[it->experts[e]];
                *v = it->op == COL_INTERVENE_SET ? it->values[0] : *v + it->values[0];
            }
            break;
        case COL_INTERVENE_FORBID:
        case COL_INTERVENE_ABLATE:
            if (!forbidding) {
                memset(s->edit_forbidden, 0, n_experts);
                forbidding = 1;
            }
            for (uint32_t e = 0; e < it->n_experts; e++) s->edit_forbidden[it->experts[e]] = 1;
            break;
        case COL_INTERVENE_FORCE:
            params->forced = it->experts;
            params->n_forced = it->n_experts;
            break;
        default: /* WEIGHTS and SWAP act after the choice */
            continue;
        }
        applied |= 1u << it->kind;
    }
    if (biased) *bias = s->edit_bias;
    if (forbidding) params->forbidden = s->edit_forbidden;
    return applied;
}

uint32_t col_intervene_weights(const col_session *s, uint32_t layer_index, uint32_t position, float *weights,
                               uint32_t n)
{
    const col_intervention *last = NULL;
    for (uint32_t i = 0; i < s->n_interventions; i++) {
        const col_intervention *it = &s->interventions[i];
        if (it->kind == COL_INTERVENE_WEIGHTS && in_scope(it, position, layer_index)) last = it;
    }
    if (!last) return 0;
    for (uint32_t slot = 0; slot < n && slot < last->n_values; slot++) weights[slot] = last->values[slot];
    return 1u << COL_INTERVENE_WEIGHTS;
}

int32_t col_intervene_run_expert(const col_session *s, uint32_t layer_index, uint32_t position, int32_t expert,
                                 uint32_t *applied)
{
    int32_t e = expert;
    for (uint32_t i = 0; i < s->n_interventions; i++) {
        const col_intervention *it = &s->interventions[i];
        if (it->kind != COL_INTERVENE_SWAP || !in_scope(it, position, layer_index)) continue;
        if (e == it->experts[0] || e == it->experts[1]) {
            e = e == it->experts[0] ? it->experts[1] : it->experts[0];
            *applied |= 1u << COL_INTERVENE_SWAP;
        }
    }
    return e;
}
