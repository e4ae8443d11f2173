/*
 * session.c - the col_session_* API: configuration checks, the arena, prefill and step.
 *
 * A session's memory is planned once (plan_arena walks every buffer, 64-byte aligned) and the
 * same walk serves col_session_memory_estimate, so the estimate is the allocation, not a guess.
 * After col_session_create returns, processing tokens never allocates.
 */
#include "session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define COL_MAX_THREADS 256
#define COL_DEFAULT_CONTEXT 4096

static uint32_t default_capacity(const col_hparams *hp, const col_session_config *c)
{
    if (c->max_context) return c->max_context;
    return hp->max_context < COL_DEFAULT_CONTEXT ? hp->max_context : COL_DEFAULT_CONTEXT;
}

static uint32_t max_u32(uint32_t a, uint32_t b)
{
    return a > b ? a : b;
}

static int is_mla(const col_hparams *hp) { return hp->attention == COL_ATTENTION_MLA; }

/* Most products the forward pass batches into one kernel dispatch: w1, w3 and w2 of every
 * selected expert plus the shared expert's down-projection (the experts' chain); MLA's per-head
 * up-projections. */
static uint32_t kernel_jobs(const col_hparams *hp, uint64_t k_slots)
{
    uint32_t jobs = (uint32_t)(3 * (k_slots > hp->n_experts ? k_slots : hp->n_experts) + 4);
    return is_mla(hp) ? max_u32(jobs, hp->n_heads) : jobs;
}

/* The largest products the forward pass runs. Activation columns of one dispatch: one input per
 * selected expert and the shared expert (or the router's dispatch: the shared expert's, the
 * router's and the shared gate's, when their dtypes differ), each at most the widest of d_model, q_dim, d_ff and
 * (MLA) the attention output and the latent; MLA's per-head dispatch has n_heads inputs of at
 * most max(nope, c). */
static col_pool_limits kernel_limits(const col_hparams *hp, uint64_t k_slots)
{
    uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t widest = max_u32(max_u32(hp->d_model, (uint32_t)q_dim),
                              max_u32(hp->d_ff_expert, max_u32(hp->d_ff_dense, hp->d_ff_shared)));
    uint64_t act = (k_slots > 2 ? k_slots + 1 : 3) * widest;
    if (is_mla(hp)) {
        uint64_t o = (uint64_t)hp->n_heads * hp->v_head_dim;
        widest = widest > o ? widest : o;
        widest = max_u32((uint32_t)widest, max_u32(hp->kv_lora_rank, hp->q_lora_rank));
        uint64_t heads = (uint64_t)hp->n_heads * max_u32(hp->qk_nope_head_dim, hp->kv_lora_rank);
        act = act > heads ? act : heads;
        act = act > 2 * widest ? act : 2 * widest;
    }
    col_pool_limits limits = {kernel_jobs(hp, k_slots), act * COL_BATCH, COL_BATCH, widest};
    return limits;
}

/* The kernel path of a session with this config (col_kernels ceiling, CPU, COLIBRI_KERNELS). */
static col_isa session_isa(const col_session_config *c)
{
    return col_choose_isa(c->kernels == COL_KERNELS_BEST ? COL_ISA_AMX : (col_isa)(c->kernels - 1));
}

uint32_t col_best_kernels(void)
{
    return (uint32_t)col_choose_isa(COL_ISA_AMX) + 1;
}

/* Expert slots per MoE layer: every expert in soft routing, else the family's top-k. */
static uint32_t slots_of(const col_hparams *hp, const col_session_config *c)
{
    return c->routing == COL_ROUTING_SOFT ? hp->n_experts : hp->n_experts_active;
}

/* Bytes of the pool's scratch on path `isa`, asked once per session so sizing and binding agree. */
static uint64_t kernel_scratch_bytes(const col_model *m, const col_session_config *c, col_isa isa)
{
    const col_pool_limits limits = kernel_limits(&m->hp, slots_of(&m->hp, c));
    return col_pool_scratch_size(isa, c->n_threads, &limits);
}

/* Reserve `count` elements of `size` bytes at the 64-aligned arena cursor; return their offset. */
static uint64_t reserve(uint64_t *cursor, uint64_t count, uint64_t size)
{
    uint64_t at = (*cursor + 63) & ~(uint64_t)63;
    *cursor = at + count * size;
    return at;
}

/* Bytes of a cached key or value element (col_session_config.kv_precision). */
static uint32_t kv_element_bytes(const col_session_config *c)
{
    return c->kv_precision == COL_KV_F16 ? sizeof(uint16_t) : sizeof(float);
}

/* Walk every session buffer. With base == NULL only sizes are computed. Returns the total. */
static uint64_t plan_arena(const col_model *m, const col_session_config *c, uint64_t scratch_bytes, col_session *s,
                           uint8_t *base)
{
    const col_hparams *hp = &m->hp;
    uint64_t cap = default_capacity(hp, c);
    const int mla = is_mla(hp);
    uint64_t kv_dim = (uint64_t)hp->n_kv_heads * hp->head_dim;
    uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t lat = (uint64_t)hp->kv_lora_rank + hp->qk_rope_head_dim;          /* MLA: a cached row */
    uint64_t cache_row = mla ? lat : kv_dim, group = mla ? hp->n_heads : hp->n_heads / hp->n_kv_heads;
    uint64_t n_e = hp->n_experts;
    uint64_t k_slots = slots_of(hp, c);
    uint64_t n_moe = hp->n_moe_layers;
    uint64_t cur = 0;
/* Bind a buffer: its offset is always reserved; the pointer is set only when building. */
#define BIND(field, count, size)                                 \
    do {                                                         \
        uint64_t at_ = reserve(&cur, (count), (size));           \
        if (s && base) s->field = (void *)(base + at_);          \
    } while (0)
    BIND(k_cache, (uint64_t)hp->n_layers * cap * cache_row, kv_element_bytes(c));
    BIND(v_cache, mla ? 0 : (uint64_t)hp->n_layers * cap * kv_dim, kv_element_bytes(c)); /* MLA: k_cache */
    BIND(inv_freq, hp->rotary_dim / 2 + 1, sizeof(float));
    uint64_t B = COL_BATCH, gff = max_u32((uint32_t)(k_slots * hp->d_ff_expert), max_u32(hp->d_ff_dense, hp->d_ff_shared));
    BIND(x, B * hp->d_model, sizeof(float));
    BIND(xn, B * hp->d_model, sizeof(float));
    BIND(q, B * q_dim, sizeof(float));
    BIND(k, B * kv_dim, sizeof(float));
    BIND(v, B * kv_dim, sizeof(float));
    BIND(att, B * q_dim, sizeof(float));
    BIND(scores, (uint64_t)c->n_threads * group * cap, sizeof(float)); /* per thread: a KV group's heads */
    BIND(tmp, B * hp->d_model, sizeof(float));
    BIND(norm_weight, max_u32(max_u32(hp->d_model, (uint32_t)(q_dim + kv_dim)), max_u32(hp->kv_lora_rank, hp->q_lora_rank)),
         sizeof(float));
    BIND(router_logits, B * n_e, sizeof(float));
    BIND(route_ids, B * k_slots, sizeof(int32_t));
    BIND(route_weights, B * k_slots, sizeof(float));
    uint64_t n_groups = m->n_chosen_groups ? m->n_chosen_groups : 1;
    BIND(route_selection, B * n_e, sizeof(float));
    BIND(route_groups, B * n_groups, sizeof(int32_t));
    BIND(route_bias_changed, B, 1);
    BIND(route_count, B, sizeof(uint32_t));
    BIND(route_run, B * k_slots, sizeof(int32_t));
    BIND(route_edits, B, 1);
    BIND(edit_forbidden, n_e, 1);
    BIND(edit_bias, n_e, sizeof(float));
    BIND(layer_input, hp->d_model, sizeof(float));
    BIND(router_scratch.scores, n_e, sizeof(float));
    BIND(router_scratch.keys, n_e, sizeof(double));
    BIND(router_scratch.taken, n_e, 1);
    BIND(router_scratch.group_keys, n_e, sizeof(double));
    BIND(router_scratch.group_taken, n_e, 1);
    BIND(router_scratch.alt_ids, n_e, sizeof(int32_t));
    BIND(route_rows, B * k_slots, sizeof(uint32_t));
    BIND(expert_count, n_e, sizeof(uint32_t));
    BIND(expert_offset, n_e, sizeof(uint32_t));
    BIND(shared_gate, B, sizeof(float));
    BIND(expert_x, B * k_slots * hp->d_model, sizeof(float));
    BIND(h1, B * gff, sizeof(float));
    BIND(h3, B * gff, sizeof(float));
    BIND(expert_out, B * k_slots * hp->d_model, sizeof(float));
    BIND(shared_h1, B * hp->d_ff_shared, sizeof(float));
    BIND(shared_h3, B * hp->d_ff_shared, sizeof(float));
    BIND(shared_out, hp->d_ff_shared ? B * hp->d_model : 0, sizeof(float));
    BIND(logits, hp->vocab_size, sizeof(float));
    BIND(jobs, 3 * n_e + 4, sizeof(col_matvec_job));
    BIND(job_group, 3 * n_e + 4, sizeof(uint32_t));
    BIND(group_expert, n_e, sizeof(uint32_t));
    if (mla) {
        uint64_t nh = hp->n_heads, part = max_u32(max_u32(hp->qk_nope_head_dim, hp->qk_rope_head_dim), hp->v_head_dim);
        BIND(mla_qa, B * hp->q_lora_rank, sizeof(float));
        BIND(mla_kv, B * lat, sizeof(float));
        BIND(mla_q, B * q_dim, sizeof(float));
        BIND(mla_heads, nh * B * part, sizeof(float));
        BIND(mla_lat, nh * B * hp->kv_lora_rank, sizeof(float));
        BIND(mla_qatt, B * nh * lat, sizeof(float));
        BIND(mla_att, B * nh * lat, sizeof(float));
        BIND(mla_o, B * nh * hp->v_head_dim, sizeof(float));
        BIND(mla_jobs, nh, sizeof(col_matvec_job));
    }
    const int cached = c->routing == COL_ROUTING_CACHED;
    uint64_t cache_bytes = cached || c->expert_cache ? col_cache_bytes((uint32_t)n_moe, (uint32_t)k_slots, hp->n_experts,
                                                                       c->expert_cache) : 0;
    BIND(cache_block, cache_bytes, 1);
    BIND(cache_saved, cache_bytes, 1);
    BIND(route_fresh, cached ? k_slots : 0, sizeof(int32_t));
    BIND(cache_log_ids, cache_bytes ? cap * n_moe * k_slots : 0, sizeof(int32_t));
    BIND(cache_log_kept, cached ? cap * n_moe : 0, 1);
    BIND(kernel_scratch, scratch_bytes, 1);
    if (c->trace) {
        BIND(trace_tokens, cap, sizeof(int32_t));
        BIND(trace_ids, cap * n_moe * k_slots, sizeof(int32_t));
        BIND(trace_weights, cap * n_moe * k_slots, sizeof(float));
        BIND(trace_logits, cap * n_moe * n_e, sizeof(float));
        BIND(trace_selection, cap * n_moe * n_e, sizeof(float));
        if (m->n_chosen_groups) BIND(trace_groups, cap * n_moe * m->n_chosen_groups, sizeof(int32_t));
        BIND(trace_bias_changed, cap * n_moe, 1);
        BIND(trace_shared_gate, cap * n_moe, sizeof(float));
        BIND(trace_hidden_norm, cap * n_moe, sizeof(float));
        BIND(trace_phase_ns, cap * hp->n_layers * COL_PHASE_COUNT, sizeof(uint64_t));
        BIND(trace_token_ns, cap, sizeof(uint64_t));
        BIND(trace_intervened, cap * n_moe, 1);
        if (cached) {
            BIND(trace_cache_kept, cap * n_moe, 1);
            BIND(trace_cache_margin, cap * n_moe, sizeof(float));
            BIND(trace_fresh_ids, cap * n_moe * k_slots, sizeof(int32_t));
        }
        if (c->expert_cache) BIND(trace_cache_hits, cap * n_moe * k_slots, 1);
    }
    if (c->capture_hidden) BIND(capture_own, cap * hp->n_layers * hp->d_model, sizeof(float));
#undef BIND
    return (cur + 63) & ~(uint64_t)63;
}

static int32_t check_config(const col_model *m, const col_session_config *c, char *err, size_t errlen)
{
    if (!m || !c) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "model and config are required");
    if (c->routing > COL_ROUTING_CACHED)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "unknown routing mode %u", c->routing);
    if (c->n_threads < 1 || c->n_threads > COL_MAX_THREADS)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "n_threads %u outside 1..%d", c->n_threads, COL_MAX_THREADS);
    if (c->max_context > m->hp.max_context)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "max_context %u exceeds the model's %u",
                             c->max_context, m->hp.max_context);
    if (!isfinite(c->epsilon) || c->epsilon < 0.0)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "epsilon must be finite and >= 0");
    if (!isfinite(c->cache_threshold) || c->cache_threshold < 0.0)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "cache_threshold must be finite and >= 0");
    uint32_t slots = slots_of(&m->hp, c);
    if (c->expert_cache && (c->expert_cache < slots || c->expert_cache > m->hp.n_experts))
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG,
                             "expert_cache %u outside %u..%u (the experts one decision takes, up to every expert)",
                             c->expert_cache, slots, m->hp.n_experts);
    if (c->trace > 1) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "trace must be 0 or 1");
    if (c->capture_hidden > 1)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "capture_hidden must be 0 or 1");
    if (c->kernels > COL_KERNELS_AMX)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "unknown kernel path %u (0..%d)", c->kernels, COL_KERNELS_AMX);
    return col_numerics_check(c, err, errlen);
}

int32_t col_session_config_check(const col_model *model, const col_session_config *config, char *err,
                                 size_t errlen)
{
    return check_config(model, config, err, errlen);
}

uint64_t col_session_memory_estimate(const col_model *model, const col_session_config *config)
{
    if (check_config(model, config, NULL, 0) != COL_OK) return 0;
    return plan_arena(model, config, kernel_scratch_bytes(model, config, session_isa(config)), NULL, NULL) +
           sizeof(col_session);
}

int32_t col_session_create(const col_model *model, const col_session_config *config, col_session **out,
                           char *err, size_t errlen)
{
    return col_session_create_ex(model, config, NULL, out, err, errlen);
}

int32_t col_session_create_ex(const col_model *model, const col_session_config *config,
                              const col_allocator *allocator, col_session **out, char *err, size_t errlen)
{
    if (!out) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    int32_t status = check_config(model, config, err, errlen);
    if (status != COL_OK) return status;

    col_allocator alloc;
    col_allocator_or_default(allocator, &alloc);
    col_session *s = col_alloc_zeroed(&alloc, 1, sizeof *s);
    if (!s) return col_set_error(err, errlen, COL_ERR_NOMEM, "cannot allocate the session");
    s->alloc = alloc;
    s->model = model;
    s->config = *config;
    s->capacity = default_capacity(&model->hp, config);
    s->k_slots = slots_of(&model->hp, config);
    const col_hparams *hp = &model->hp;
    s->kv_heads = is_mla(hp) ? 1 : hp->n_kv_heads;
    s->att_dim = is_mla(hp) ? hp->kv_lora_rank + hp->qk_rope_head_dim : hp->head_dim;
    s->att_group = hp->n_heads / s->kv_heads;
    s->kv_bytes = kv_element_bytes(config);
    const col_isa isa = session_isa(config);
    s->kernel_scratch_bytes = kernel_scratch_bytes(model, config, isa);
    s->arena_size = plan_arena(model, config, s->kernel_scratch_bytes, NULL, NULL);
    s->arena = col_alloc_zeroed(&alloc, s->arena_size, 1);
    if (!s->arena) {
        unsigned long long wanted = (unsigned long long)s->arena_size;
        col_dealloc(&alloc, s);
        return col_set_error(err, errlen, COL_ERR_NOMEM, "cannot allocate %llu bytes of session memory", wanted);
    }
    plan_arena(model, config, s->kernel_scratch_bytes, s, s->arena);
    if (config->routing == COL_ROUTING_CACHED || config->expert_cache) {
        col_cache_bind(&s->cache, s->cache_block, hp->n_moe_layers, s->k_slots, hp->n_experts, config->expert_cache);
        col_cache_bind_log(&s->cache, s->cache_log_ids, config->routing == COL_ROUTING_CACHED ? s->cache_log_kept : NULL,
                           s->capacity);
    }
    if (is_mla(hp)) s->v_cache = s->k_cache; /* the latent rows are the keys and the values */
    const col_pool_limits limits = kernel_limits(&model->hp, s->k_slots);
    s->pool = col_pool_create(isa, config->n_threads, s->kernel_scratch, s->kernel_scratch_bytes, &limits, &alloc);
    if (!s->pool) {
        col_dealloc(&alloc, s->arena);
        col_dealloc(&alloc, s);
        return col_set_error(err, errlen, COL_ERR_NOMEM, "cannot allocate or start the thread pool of %u threads",
                             config->n_threads);
    }
    s->numerics = col_numerics_of(config);
    if (col_numerics_hooks_products(&s->numerics)) col_pool_set_numerics(s->pool, &s->numerics);
    col_rope_init(&model->hp, model->rope_freq_factors ? (const float *)model->rope_freq_factors->data : NULL,
                  s->inv_freq);
    s->layers_done = COL_NO_LAYER;
    col_session_capture(s, NULL, 0, 0, NULL, 0);
    *out = s;
    return COL_OK;
}

void col_session_free(col_session *session)
{
    if (!session) return;
    col_pool_free(session->pool);
    const col_allocator a = session->alloc;
    col_dealloc(&a, session->arena);
    col_dealloc(&a, session);
}

int32_t col_session_reset(col_session *session)
{
    if (!session) return COL_ERR_INVALID_ARG;
    session->position = 0;
    session->layers_done = COL_NO_LAYER;
    col_cache_clear(&session->cache);
    col_pool_clear_stats(session->pool);
    return COL_OK;
}

int32_t col_session_truncate(col_session *session, uint32_t position, char *err, size_t errlen)
{
    if (!session) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session is NULL");
    if (position > session->position)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "position %u is beyond the %u processed", position,
                             session->position);
    session->position = position;
    session->layers_done = COL_NO_LAYER;
    if (session->cache.block) col_cache_rebuild(&session->cache, position); /* the state the kept positions left */
    return COL_OK;
}

int32_t col_session_set_interventions(col_session *session, const col_intervention *items, uint32_t n, uint32_t *bad,
                                      char *err, size_t errlen)
{
    if (!session) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session is NULL");
    int32_t status = col_interventions_check(session->model, session->k_slots, items, n, bad, err, errlen);
    if (status != COL_OK) return status;
    session->interventions = n ? items : NULL;
    session->n_interventions = n;
    return COL_OK;
}

/* Whole-position calls wait for a position stepped layer by layer to complete. */
static int32_t check_idle(const col_session *s, char *err, size_t errlen)
{
    if (s->layers_done != COL_NO_LAYER)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG,
                             "position %u is in progress (%u of %u layers run): step its layers, or truncate",
                             s->position, s->layers_done, s->model->hp.n_layers);
    return COL_OK;
}

/* Routing modes whose decisions are a pure function of a decision's router logits, position and
 * layer, so the trace's logits decide them again; the same slots per decision in each. */
static int reroutable(uint32_t mode)
{
    return mode == COL_ROUTING_TOPK || mode == COL_ROUTING_STABLE || mode == COL_ROUTING_GUMBEL;
}

/* Whether `params` decide (position, MoE layer `layer_index`) from its recorded router logits
 * exactly as the trace records it: the same experts in the same order, the same weights' bits,
 * kept groups and bias flag. A decision an intervention acted on counts as different. The
 * per-call routing buffers serve as scratch (no call is in progress). */
static int decision_stands(col_session *s, uint32_t layer_index, uint32_t position, col_router_params params)
{
    const col_model *m = s->model;
    const col_layer *layer = &m->layers[layer_index];
    uint32_t n_experts = m->hp.n_experts, ks = s->k_slots, g = m->n_chosen_groups;
    uint64_t row = (uint64_t)position * m->hp.n_moe_layers + layer->moe_index;
    if (s->trace_intervened[row]) return 0;
    const float *bias = layer->moe_correction_bias ? (const float *)layer->moe_correction_bias->data : NULL;
    params.position = position;
    params.layer = layer_index;
    uint8_t bias_changed = 0;
    col_route_out out = {s->route_ids, s->route_weights, s->route_selection, s->route_groups,
                         bias ? &bias_changed : NULL};
    uint32_t n = col_route(layer->route, bias, &params, s->trace_logits + row * n_experts, &out, &s->router_scratch);
    for (uint32_t slot = 0; slot < ks; slot++) {
        int32_t id = slot < n ? out.ids[slot] : -1;
        float weight = slot < n ? out.weights[slot] : 0.0f;
        if (id != s->trace_ids[row * ks + slot] || memcmp(&weight, &s->trace_weights[row * ks + slot], sizeof weight))
            return 0;
    }
    uint32_t kept = layer->route->n_groups > 1 ? layer->route->n_groups_kept : 0;
    for (uint32_t i = 0; i < g; i++)
        if ((i < kept ? out.groups[i] : -1) != s->trace_groups[row * g + i]) return 0;
    return bias_changed == s->trace_bias_changed[row];
}

int32_t col_session_set_routing(col_session *session, uint32_t routing, double epsilon, uint64_t seed,
                                uint32_t *first_changed, char *err, size_t errlen)
{
    if (!session) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session is NULL");
    int32_t status = check_idle(session, err, errlen);
    if (status != COL_OK) return status;
    col_session_config next = session->config;
    next.routing = routing;
    next.epsilon = epsilon;
    next.seed = seed;
    status = check_config(session->model, &next, err, errlen);
    if (status != COL_OK) return status;
    if (!reroutable(session->config.routing) || !reroutable(routing))
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG,
                             "routing changes only among top-k, stable and Gumbel routing (mode %u to %u)",
                             session->config.routing, routing);
    uint32_t first = session->trace_ids ? session->position : 0;
    col_router_params params = {routing, epsilon, seed, 0, 0, NULL, NULL, 0};
    for (uint32_t p = 0; p < first; p++)
        for (uint32_t l = 0; l < session->model->hp.n_layers && first > p; l++)
            if (session->model->layers[l].kind == COL_LAYER_MOE && !decision_stands(session, l, p, params)) first = p;
    session->config = next;
    if (first_changed) *first_changed = first;
    return COL_OK;
}

static int32_t check_tokens(const col_session *s, const int32_t *tokens, uint32_t n, char *err, size_t errlen)
{
    int32_t status = check_idle(s, err, errlen);
    if (status != COL_OK) return status;
    if (n > s->capacity - s->position)
        return col_set_error(err, errlen, COL_ERR_CONTEXT_FULL, "%u tokens at position %u exceed the context of %u",
                             n, s->position, s->capacity);
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= s->model->hp.vocab_size)
            return col_set_error(err, errlen, COL_ERR_BAD_TOKEN, "token %d at index %u outside [0, %u)", tokens[i], i,
                                 s->model->hp.vocab_size);
    return COL_OK;
}

/* Embedding rows must be finite: a NaN fed in would come out as NaN logits with nothing to say
 * where it came from. */
static int32_t check_embeddings(const col_session *s, const float *x, uint32_t n, char *err, size_t errlen)
{
    int32_t status = check_idle(s, err, errlen);
    if (status != COL_OK) return status;
    if (n > s->capacity - s->position)
        return col_set_error(err, errlen, COL_ERR_CONTEXT_FULL, "%u embeddings at position %u exceed the context of %u",
                             n, s->position, s->capacity);
    uint64_t d = s->model->hp.d_model;
    for (uint64_t i = 0; i < (uint64_t)n * d; i++)
        if (!isfinite(x[i]))
            return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "embedding row %llu, element %llu is %s",
                                 (unsigned long long)(i / d), (unsigned long long)(i % d), isnan(x[i]) ? "NaN" : "infinite");
    return COL_OK;
}

/* The forward pass over checked inputs (token ids, or embedding rows when `x` is not NULL). */
static int32_t run_inputs(col_session *session, const int32_t *tokens, const float *x, uint32_t n, float *logits,
                          char *err, size_t errlen)
{
    int32_t status = x ? check_embeddings(session, x, n, err, errlen) : check_tokens(session, tokens, n, err, errlen);
    if (status != COL_OK) return status;
    uint32_t vocab = session->model->hp.vocab_size, d_model = session->model->hp.d_model;
    for (uint32_t i = 0; i < n; i += COL_BATCH) { /* a step is the block of one */
        uint32_t m = n - i < COL_BATCH ? n - i : COL_BATCH;
        col_forward(session, x ? NULL : tokens + i, x ? x + (uint64_t)i * d_model : NULL, m,
                    logits ? logits + (uint64_t)i * vocab : NULL);
    }
    return COL_OK;
}

/* The mapped file may be truncated or rewritten under us (guard.c): refuse to read a file that
 * changed, and when a truncation lands during the pass (the SIGBUS guard served zeros), throw the
 * result away and put the position (and expert caching's state) back, so the session is as it
 * was before the call. */
static int32_t process(col_session *session, const int32_t *tokens, const float *x, uint32_t n, float *logits,
                       char *err, size_t errlen)
{
    int32_t status = col_model_check_file(session->model, NULL, err, errlen);
    if (status == COL_OK) status = check_idle(session, err, errlen); /* before cache_saved is overwritten */
    if (status != COL_OK) return status;
    uint32_t start = session->position;
    if (session->cache.block) memcpy(session->cache_saved, session->cache.block, session->cache.bytes);
    status = run_inputs(session, tokens, x, n, logits, err, errlen);
    if (status == COL_OK && col_guard_faulted(session->model->guard)) {
        session->position = start;
        if (session->cache.block) memcpy(session->cache.block, session->cache_saved, session->cache.bytes);
        return col_model_check_file(session->model, NULL, err, errlen);
    }
    return status;
}

int32_t col_session_prefill(col_session *session, const int32_t *tokens, uint32_t n, float *logits, char *err,
                            size_t errlen)
{
    if (!session || (n > 0 && !tokens))
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session and tokens are required");
    return process(session, tokens, NULL, n, logits, err, errlen);
}

int32_t col_session_prefill_embeddings(col_session *session, const float *embeddings, uint32_t n, float *logits,
                                       char *err, size_t errlen)
{
    if (!session || (n > 0 && !embeddings))
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session and embeddings are required");
    return process(session, NULL, embeddings, n, logits, err, errlen);
}

int32_t col_session_step(col_session *session, int32_t token, float *logits, char *err, size_t errlen)
{
    return col_session_prefill(session, &token, 1, logits, err, errlen);
}

int32_t col_session_generate(col_session *session, int32_t token, uint32_t n, int32_t eos, int32_t *out,
                             uint32_t *steps, char *err, size_t errlen)
{
    if (steps) *steps = 0;
    if (!session || !steps || (n > 0 && !out))
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session, steps and out are required");
    const uint32_t vocab = session->model->hp.vocab_size;
    if (n > 0 && (token < 0 || (uint32_t)token >= vocab)) /* the step would name it "index 0" */
        return col_set_error(err, errlen, COL_ERR_BAD_TOKEN, "token %d outside [0, %u)", token, vocab);
    for (uint32_t i = 0; i < n; i++) {
        int32_t status = col_session_step(session, i ? out[i - 1] : token, NULL, err, errlen);
        if (status != COL_OK) return status;
        out[i] = (int32_t)col_first_largest(col_pool_isa(session->pool), session->logits, vocab);
        *steps = i + 1;
        if (out[i] == eos) break;
    }
    return COL_OK;
}

/* Stepping one layer at a time: col_forward's pieces with n = 1, the position's state kept in
 * the session between calls (the residual stream stays in s->x; expert caching's state before
 * the position in cache_saved). */

/* Forget the position in progress: expert caching's state goes back to what it was before it. */
static void abandon_position(col_session *s)
{
    s->layers_done = COL_NO_LAYER;
    if (s->cache.block) memcpy(s->cache.block, s->cache_saved, s->cache.bytes);
}

/* A position in progress from its input: a token id, or an embedding row when `row` is not NULL. */
static int32_t begin_position(col_session *session, int32_t token, const float *row, char *err, size_t errlen)
{
    int32_t status = col_model_check_file(session->model, NULL, err, errlen);
    if (status == COL_OK)
        status = row ? check_embeddings(session, row, 1, err, errlen) : check_tokens(session, &token, 1, err, errlen);
    if (status != COL_OK) return status;
    if (session->cache.block) memcpy(session->cache_saved, session->cache.block, session->cache.bytes);
    session->layer_ns = col_forward_embed(session, row ? NULL : &token, row, 1);
    session->layer_token = row ? -1 : token;
    session->layers_done = 0;
    session->layer_undo = 0;
    return COL_OK;
}

int32_t col_session_begin_token(col_session *session, int32_t token, char *err, size_t errlen)
{
    if (!session) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session is NULL");
    return begin_position(session, token, NULL, err, errlen);
}

int32_t col_session_begin_embedding(col_session *session, const float *row, char *err, size_t errlen)
{
    if (!session || !row) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session and row are required");
    return begin_position(session, -1, row, err, errlen);
}

int32_t col_session_step_layer(col_session *session, float *logits, uint32_t *layers_done, char *err, size_t errlen)
{
    if (!session) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session is NULL");
    if (session->layers_done == COL_NO_LAYER)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "no position in progress: begin one with a token");
    int32_t status = col_model_check_file(session->model, NULL, err, errlen);
    if (status != COL_OK) {
        abandon_position(session);
        return status;
    }
    uint32_t l = session->layers_done, d_model = session->model->hp.d_model;
    memcpy(session->layer_input, session->x, (uint64_t)d_model * sizeof(float));
    session->layer_ns += col_forward_layer(session, l, 1);
    session->layers_done = l + 1;
    session->layer_undo = 1;
    if (session->layers_done == session->model->hp.n_layers) {
        col_forward_head(session, &session->layer_token, 1, NULL, session->layer_ns);
        session->layers_done = COL_NO_LAYER;
        if (logits) memcpy(logits, session->logits, (uint64_t)session->model->hp.vocab_size * sizeof(float));
    }
    if (col_guard_faulted(session->model->guard)) { /* a truncation during the layer: as col_session_prefill */
        session->position -= session->layers_done == COL_NO_LAYER ? 1 : 0;
        abandon_position(session);
        return col_model_check_file(session->model, NULL, err, errlen);
    }
    if (layers_done) *layers_done = session->layers_done == COL_NO_LAYER ? session->model->hp.n_layers : session->layers_done;
    return COL_OK;
}

int32_t col_session_rewind_layer(col_session *session, char *err, size_t errlen)
{
    if (!session) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session is NULL");
    if (session->layers_done == COL_NO_LAYER || !session->layer_undo)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "no layer of a position in progress to run again");
    memcpy(session->x, session->layer_input, (uint64_t)session->model->hp.d_model * sizeof(float));
    session->layers_done--;
    /* the layer's decision is made again: its expert-caching state as before the position (no
     * other position or layer touched it since) */
    const col_layer *layer = &session->model->layers[session->layers_done];
    if (layer->kind == COL_LAYER_MOE) col_cache_restore_layer(&session->cache, session->cache_saved, layer->moe_index);
    session->layer_undo = 0;
    return COL_OK;
}

uint32_t col_session_layers_done(const col_session *session)
{
    return session ? session->layers_done : COL_NO_LAYER;
}

const char *col_session_kernels(const col_session *session)
{
    return col_isa_name(session ? col_pool_isa(session->pool) : COL_ISA_PORTABLE);
}

const float *col_session_logits(const col_session *session)
{
    return session ? session->logits : NULL;
}

uint32_t col_session_position(const col_session *session)
{
    return session ? session->position : 0;
}

int32_t col_session_trace(const col_session *session, col_trace_view *out)
{
    if (!session || !out) return COL_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (!session->trace_ids) return COL_OK;
    const col_hparams *hp = &session->model->hp;
    out->n_positions = session->position;
    out->capacity = session->capacity;
    out->n_layers = hp->n_layers;
    out->n_moe_layers = hp->n_moe_layers;
    out->k = session->k_slots;
    out->n_experts = hp->n_experts;
    out->moe_layers = session->model->moe_layers;
    out->tokens = session->trace_tokens;
    out->expert_ids = session->trace_ids;
    out->expert_weights = session->trace_weights;
    out->router_logits = session->trace_logits;
    out->selection_scores = session->trace_selection;
    out->n_chosen_groups = session->model->n_chosen_groups;
    out->chosen_groups = session->trace_groups;
    out->bias_changed = session->trace_bias_changed;
    out->shared_gate = session->trace_shared_gate;
    out->hidden_norm = session->trace_hidden_norm;
    out->phase_ns = session->trace_phase_ns;
    out->token_ns = session->trace_token_ns;
    out->cache_kept = session->trace_cache_kept;
    out->cache_margin = session->trace_cache_margin;
    out->fresh_ids = session->trace_fresh_ids;
    out->expert_cache = session->config.expert_cache;
    out->cache_hits = session->trace_cache_hits;
    out->intervened = session->trace_intervened;
    return COL_OK;
}

int32_t col_session_cache_stats(const col_session *session, int32_t moe_index, col_cache_stats *out)
{
    if (!session || !out) return COL_ERR_INVALID_ARG;
    uint32_t n_moe = session->model->hp.n_moe_layers;
    if (moe_index < -1 || (moe_index >= 0 && (uint32_t)moe_index >= n_moe)) return COL_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    out->expert_cache = session->config.expert_cache;
    if (!session->cache.block) return COL_OK;
    uint32_t first = moe_index < 0 ? 0 : (uint32_t)moe_index, last = moe_index < 0 ? n_moe : first + 1;
    for (uint32_t m = first; m < last; m++) {
        const col_cache_layer *layer = &session->cache.layers[m];
        out->resident += layer->resident;
        out->hits += layer->hits;
        out->misses += layer->misses;
        out->decisions += layer->decisions;
        out->kept += layer->kept;
    }
    return COL_OK;
}

uint32_t col_session_thread_stats(const col_session *session, col_thread_stats *out, uint32_t capacity)
{
    if (!session) return 0;
    const uint32_t threads = col_pool_threads(session->pool);
    for (uint32_t t = 0; out && t < capacity && t < threads; t++) col_pool_thread_stats(session->pool, t, &out[t]);
    return threads;
}

int32_t col_session_capture(col_session *session, float *buffer, uint32_t first_position, uint32_t n_rows, char *err,
                            size_t errlen)
{
    if (!session) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "session is NULL");
    if (buffer && n_rows == 0) return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "a capture buffer of 0 rows");
    if (!buffer) { /* back to the session's own buffer, or off */
        session->capture = session->capture_own;
        session->capture_first = 0;
        session->capture_rows = session->capture_own ? session->capacity : 0;
        return COL_OK;
    }
    session->capture = buffer;
    session->capture_first = first_position;
    session->capture_rows = n_rows;
    return COL_OK;
}

int32_t col_session_hidden(const col_session *session, col_hidden_view *out)
{
    if (!session || !out) return COL_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    out->n_layers = session->model->hp.n_layers;
    out->d_model = session->model->hp.d_model;
    if (!session->capture) return COL_OK;
    out->data = session->capture;
    out->first_position = session->capture_first;
    out->n_rows = session->capture_rows;
    return COL_OK;
}
