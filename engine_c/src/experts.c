/*
 * experts.c - the feed-forward half of a layer: router, routed experts, shared expert, or a
 * dense SwiGLU MLP; plus the norms every block uses (RMSNorm, LayerNorm).
 *
 * Expert e computes w2 . (silu(w1 . x) * (w3 . x)) from its slice of the stacked tensors
 * (one contiguous range per matrix), or GPT-OSS's form: biases after each projection and the
 * clamped SwiGLU between them. The routed outputs are summed with their weights in selection
 * order (Llama 4: the weights scale the experts' inputs instead, and the outputs are summed); a
 * shared expert is added last (Qwen2-MoE's scaled by sigmoid(shared_gate . x)).
 */
#include "session.h"

#include <math.h>
#include <string.h>

void col_rmsnorm(col_isa isa, const float *x, const col_tensor_info *w, float eps, uint64_t n, float *out,
                 float *w_scratch)
{
    col_load_row(w->data, w->dtype, n, w_scratch);
    col_rmsnorm_row(isa, x, w_scratch, eps, n, out);
}

/* out = weight * (x - mean) / sqrt(var + eps) (+ bias), nn.LayerNorm's math: the mean, then the
 * variance of the centred values (two passes), both over n. */
static void layernorm_loaded(const float *x, const float *weight, const float *bias, float eps, uint64_t n,
                             float *out)
{
    float sum = 0.0f;
    for (uint64_t i = 0; i < n; i++) sum += x[i];
    float mean = sum / (float)n, var = 0.0f;
    for (uint64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    float inv = 1.0f / sqrtf(var / (float)n + eps);
    for (uint64_t i = 0; i < n; i++) out[i] = (x[i] - mean) * inv * weight[i] + (bias ? bias[i] : 0.0f);
}

typedef struct norm_task {
    const float *x, *weight, *bias;
    float eps;
    uint64_t n;
    uint32_t kind;  /* col_norm_kind */
    col_isa isa;
    float *out;
} norm_task;

static void norm_rows(void *ctx, uint32_t thread, uint64_t r0, uint64_t r1)
{
    const norm_task *task = ctx;
    (void)thread;
    if (task->kind == COL_NORM_KIND_RMS) {
        col_rmsnorm_rows(task->isa, task->x + r0 * task->n, task->weight, task->eps, task->n, (uint32_t)(r1 - r0),
                         task->out + r0 * task->n);
        return;
    }
    for (uint64_t r = r0; r < r1; r++)
        layernorm_loaded(task->x + r * task->n, task->weight, task->bias, task->eps, task->n, task->out + r * task->n);
}

/* A block's rows normalised on the pool, the weight loaded once, so the other thread does not
 * wait for the calling thread's serial loop. */
void col_norm_rows(col_session *s, const float *x, const col_tensor_info *w, const col_tensor_info *b, uint32_t rows,
                   float *out)
{
    const uint64_t n = s->model->hp.d_model;
    col_load_row(w->data, w->dtype, n, s->norm_weight);
    /* a bias is 1-D and so f32 (format.c checks) */
    norm_task task = {x, s->norm_weight, b ? (const float *)b->data : NULL, s->model->hp.norm_eps, n,
                      s->model->hp.norm_kind, col_pool_isa(s->pool), out};
    col_pool_run(s->pool, norm_rows, &task, rows);
}

/* The router bias (GPT-OSS's router.bias) is part of the logits: added before anything reads them. */
static void add_gate_bias(const col_layer *layer, float *logits, uint32_t n)
{
    if (!layer->moe_gate_bias) return;
    const float *b = (const float *)layer->moe_gate_bias->data; /* f32 (format.c checks) */
    for (uint32_t j = 0; j < n; j++) logits[j] += b[j];
}

/* One routing decision of `layer` at `position` by the layer's rule and the session's mode,
 * under the session's interventions (intervene.c; `logits` is edited in place). *edits gets the
 * bits of the intervention kinds that acted. Decisions are made on the calling thread in
 * position order, so expert caching's state flows from each position to the next at every layer
 * (cache.c); it sees the decision the interventions made. */
static uint32_t route(col_session *s, const col_layer *layer, uint32_t layer_index, uint32_t position,
                      float *logits, int32_t *ids, float *weights, float *selection, int32_t *groups,
                      uint8_t *bias_changed, uint8_t *edits)
{
    col_router_params params = {s->config.routing, s->config.epsilon, s->config.seed, position, layer_index,
                                NULL, NULL, 0};
    const float *bias = layer->moe_correction_bias ? (const float *)layer->moe_correction_bias->data : NULL;
    uint32_t applied = s->n_interventions ? col_intervene_route(s, layer_index, position, logits, &bias, &params) : 0;
    /* whether the bias changed the choice: a second ranking, asked only for the trace */
    col_route_out out = {ids, weights, selection, groups, s->trace_ids && bias ? bias_changed : NULL};
    *bias_changed = 0;
    uint32_t n;
    if (!s->cache.block) {
        n = col_route(layer->route, bias, &params, logits, &out, &s->router_scratch);
    } else {
        uint32_t moe = layer->moe_index, ks = s->k_slots;
        uint64_t row = (uint64_t)position * s->model->hp.n_moe_layers + moe;
        uint8_t kept = 0;
        if (s->config.routing == COL_ROUTING_CACHED) {
            int32_t *fresh = s->trace_fresh_ids ? s->trace_fresh_ids + row * ks : s->route_fresh;
            col_cache_route c = {position ? s->cache.previous + (uint64_t)moe * ks : NULL, s->config.cache_threshold,
                                 fresh, 0.0f, 0};
            n = col_route_cached(layer->route, bias, &params, logits, &c, &out, &s->router_scratch);
            for (uint32_t slot = n; slot < ks; slot++) fresh[slot] = -1;
            kept = c.kept;
            if (s->trace_cache_kept) {
                s->trace_cache_kept[row] = c.kept;
                s->trace_cache_margin[row] = c.margin;
            }
        } else {
            n = col_route(layer->route, bias, &params, logits, &out, &s->router_scratch);
        }
        uint8_t *hits = s->trace_cache_hits ? s->trace_cache_hits + row * ks : NULL;
        col_cache_record(&s->cache, moe, position, ids, n, kept, hits);
        for (uint32_t slot = n; hits && slot < ks; slot++) hits[slot] = 0; /* empty slots (a rerun may shorten) */
    }
    if (s->n_interventions) applied |= col_intervene_weights(s, layer_index, position, weights, n);
    *edits = (uint8_t)applied;
    return n;
}

/* The trace's rows of one decision (position, MoE layer): ids and weights padded to k_slots,
 * logits, selection scores, kept groups, shared gate and the router input's norm. */
static void trace_decision(col_session *s, const col_layer *layer, uint32_t position, uint32_t n_slots,
                           const int32_t *ids, const float *weights, const float *logits, const float *selection,
                           const int32_t *groups, uint8_t bias_changed, uint8_t edits, float shared_gate,
                           const float *xn)
{
    const col_model *m = s->model;
    uint32_t n_experts = m->hp.n_experts, d_model = m->hp.d_model, g = m->n_chosen_groups;
    uint64_t row = (uint64_t)position * m->hp.n_moe_layers + layer->moe_index;
    for (uint32_t slot = 0; slot < s->k_slots; slot++) {
        s->trace_ids[row * s->k_slots + slot] = slot < n_slots ? ids[slot] : -1;
        s->trace_weights[row * s->k_slots + slot] = slot < n_slots ? weights[slot] : 0.0f;
    }
    memcpy(s->trace_logits + row * n_experts, logits, n_experts * sizeof(float));
    memcpy(s->trace_selection + row * n_experts, selection, n_experts * sizeof(float));
    if (g) {
        uint32_t kept = layer->route->n_groups > 1 ? layer->route->n_groups_kept : 0;
        for (uint32_t i = 0; i < g; i++) s->trace_groups[row * g + i] = i < kept ? groups[i] : -1;
    }
    s->trace_shared_gate[row] = shared_gate;
    s->trace_bias_changed[row] = bias_changed;
    s->trace_intervened[row] = edits;
    float norm = 0.0f;
    for (uint32_t i = 0; i < d_model; i++) norm += xn[i] * xn[i];
    s->trace_hidden_norm[row] = sqrtf(norm);
}

/* out[t] = w2 . (silu(w1 . x[t]) * (w3 . x[t])) for t < n, as matrix-matrix products. */
static void swiglu(col_session *s, const col_tensor_info *t1, const col_tensor_info *t3, const col_tensor_info *t2,
                   const float *x, uint32_t n, float *out)
{
    col_weight w1 = col_weight_of(t1), w3 = col_weight_of(t3), w2 = col_weight_of(t2);
    col_matvec_job up[2] = {{w1, x, s->h1, n, NULL}, {w3, x, s->h3, n, NULL}};
    col_matmul_many(s->pool, up, 2);
    col_swiglu_gate(s->pool, s->h1, s->h3, (uint64_t)n * w1.rows);
    col_matvec_job down = {w2, s->h1, out, n, NULL};
    col_matmul_many(s->pool, &down, 1);
}

/* Rows [o, o + count) of h [rows][width] belong to expert e: each gets row e of `bias` [E][width]
 * (f32, format.c checks) added (GPT-OSS's expert biases). */
static void add_expert_bias(float *h, const col_tensor_info *bias, uint32_t e, uint64_t o, uint32_t count,
                            uint64_t width)
{
    const float *b = (const float *)bias->data + (uint64_t)e * width;
    for (uint64_t r = o; r < o + count; r++)
        for (uint64_t i = 0; i < width; i++) h[r * width + i] += b[i];
}

typedef struct clamped_task {
    float *h1;
    const float *h3;
    float alpha, limit;
} clamped_task;

/* GPT-OSS's clamped SwiGLU on elements [i0, i1): h1 = (clamp(h3, -limit, limit) + 1) * g *
 * sigmoid(alpha g), g = min(h1, limit), as transformers' GptOssExperts._apply_gate computes it. */
static void clamped_swiglu(void *ctx, uint32_t thread, uint64_t i0, uint64_t i1)
{
    const clamped_task *c = ctx;
    (void)thread;
    for (uint64_t i = i0; i < i1; i++) {
        float g = c->h1[i] < c->limit ? c->h1[i] : c->limit;
        float u = c->h3[i] < -c->limit ? -c->limit : (c->h3[i] > c->limit ? c->limit : c->h3[i]);
        float glu = g * (1.0f / (1.0f + expf(-(g * c->alpha))));
        c->h1[i] = (u + 1.0f) * glu;
    }
}

/* The experts' chain (col_matmul_chain): a group is an expert, its up-projections the first stage,
 * its down-projection the second. */
typedef struct expert_step {
    col_session *s;
    const col_layer *layer;
    uint64_t d_ff;
} expert_step;

/* Between an expert's up and down projections, on its rows [o, o + count) of h1 [rows][d_ff] and
 * h3: the expert's biases, then the layer's activation into h1. */
static void expert_activation(void *ctx, uint32_t thread, uint32_t group)
{
    const expert_step *c = ctx;
    col_session *s = c->s;
    const uint32_t e = s->group_expert[group];
    const uint64_t o = s->expert_offset[e], count = s->expert_count[e], d_ff = c->d_ff;
    if (c->layer->moe_w1_bias) {
        add_expert_bias(s->h1, c->layer->moe_w1_bias, e, o, (uint32_t)count, d_ff);
        add_expert_bias(s->h3, c->layer->moe_w3_bias, e, o, (uint32_t)count, d_ff);
    }
    if (c->layer->route->activation == COL_EXPERT_SWIGLU_CLAMPED) {
        clamped_task task = {s->h1, s->h3, c->layer->route->act_alpha, c->layer->route->act_limit};
        clamped_swiglu(&task, thread, o * d_ff, (o + count) * d_ff);
    } else {
        col_swiglu_gate_here(s->pool, s->h1 + o * d_ff, s->h3 + o * d_ff, count * d_ff);
    }
}

/* A block's tokens between the routing and the products, or after them, as pool items: each
 * token's rows copied to their places in the expert-grouped batch (scaled by their weights when
 * the weights scale the inputs; or quantised once for the experts' products and the bytes
 * copied), or its routed outputs summed in its selection order, then the shared expert's output
 * added. Each token's result is the same on any thread. */
typedef struct tokens_task {
    col_session *s;
    uint32_t d_model, ks;
    uint32_t dtype;         /* group: the experts' up-projections' weights */
    uint64_t qrow;          /* group: bytes of a quantised row (col_pool_qrow_bytes), 0 = copy f32 rows */
    int weight_inputs;      /* Llama 4: the weights scale the experts' inputs */
    int shared;             /* combine: a shared expert's output to add */
    int shared_gate;        /* combine: scaled by sigmoid(s->shared_gate[t]) */
} tokens_task;

static void group_tokens(void *ctx, uint32_t thread, uint64_t t0, uint64_t t1)
{
    const tokens_task *c = ctx;
    col_session *s = c->s;
    const uint32_t d_model = c->d_model, ks = c->ks;
    (void)thread;
    for (uint64_t t = t0; t < t1; t++) {
        if (c->qrow && s->route_count[t]) {
            uint8_t *rows = (uint8_t *)s->expert_x, *first = rows + (uint64_t)s->route_rows[t * ks] * c->qrow;
            col_pool_quantize_row(s->pool, s->xn + t * d_model, d_model, c->dtype, first);
            for (uint32_t slot = 1; slot < s->route_count[t]; slot++)
                memcpy(rows + (uint64_t)s->route_rows[t * ks + slot] * c->qrow, first, c->qrow);
        }
        if (c->qrow) continue;
        for (uint32_t slot = 0; slot < s->route_count[t]; slot++) {
            float *dst = s->expert_x + (uint64_t)s->route_rows[t * ks + slot] * d_model;
            const float *src = s->xn + t * d_model;
            if (c->weight_inputs) {
                float w = s->route_weights[t * ks + slot];
                for (uint32_t i = 0; i < d_model; i++) dst[i] = src[i] * w;
            } else {
                memcpy(dst, src, d_model * sizeof(float));
            }
        }
    }
}

static void combine_tokens(void *ctx, uint32_t thread, uint64_t t0, uint64_t t1)
{
    const tokens_task *c = ctx;
    col_session *s = c->s;
    const uint32_t d_model = c->d_model, ks = c->ks;
    const col_isa isa = col_pool_isa(s->pool);
    (void)thread;
    for (uint64_t t = t0; t < t1; t++) {
        float *acc = s->tmp + t * d_model;
        for (uint32_t i = 0; i < d_model; i++) acc[i] = 0.0f;
        for (uint32_t slot = 0; slot < s->route_count[t]; slot++) {
            const float *out = s->expert_out + (uint64_t)s->route_rows[t * ks + slot] * d_model;
            col_add_scaled(isa, acc, c->weight_inputs ? 1.0f : s->route_weights[t * ks + slot], out, d_model);
        }
        if (!c->shared_gate) s->shared_gate[t] = NAN;
        if (!c->shared) continue;
        float scale = 1.0f;
        if (c->shared_gate) {
            scale = 1.0f / (1.0f + expf(-s->shared_gate[t]));
            s->shared_gate[t] = scale;
        }
        col_add_scaled(isa, acc, scale, s->shared_out + t * d_model, d_model);
    }
}

/* The feed-forward block for n positions starting at s->position: reads s->xn [n][d_model],
 * writes s->tmp. Tokens are grouped by expert (count, prefix-sum offsets, one contiguous batch
 * per expert), each expert runs once as a matrix-matrix product over its tokens, and each
 * token's outputs are combined in its own selection order, so a position's result does not
 * depend on the block it is in. `phase_ns` (may be NULL) receives the block's timings: the router's
 * includes the shared expert's up-projections, the experts' its down-projection (they share those
 * dispatches), the combine's the weighted sums. */
void col_feed_forward(col_session *s, uint32_t layer_index, uint32_t n, uint64_t *phase_ns)
{
    const col_model *m = s->model;
    const col_hparams *hp = &m->hp;
    const col_layer *layer = &m->layers[layer_index];
    uint32_t d_model = hp->d_model, n_experts = hp->n_experts, ks = s->k_slots;
    if (layer->kind != COL_LAYER_MOE) {
        swiglu(s, layer->mlp_w1, layer->mlp_w3, layer->mlp_w2, s->xn, n, s->tmp);
        return;
    }
    uint64_t t0 = phase_ns ? col_now_ns() : 0;
    /* The shared expert does not wait for the routing: its up-projections (and its gate) share the
     * router's dispatch, its down-projection the routed experts' up-projections', its SwiGLU gate
     * runs between them. Each product is the one it was alone, so the bits are. */
    const uint64_t sff = layer->shared_w1 ? layer->shared_w1->shape[0] : 0;
    uint32_t n_first = 0;
    if (sff) {
        s->jobs[n_first++] = (col_matvec_job){col_weight_of(layer->shared_w1), s->xn, s->shared_h1, n, NULL};
        s->jobs[n_first++] = (col_matvec_job){col_weight_of(layer->shared_w3), s->xn, s->shared_h3, n, NULL};
    }
    s->jobs[n_first++] = (col_matvec_job){col_weight_of(layer->moe_gate), s->xn, s->router_logits, n, NULL};
    const int shared_gate = sff && layer->shared_gate;
    if (shared_gate)
        s->jobs[n_first++] = (col_matvec_job){col_weight_of(layer->shared_gate), s->xn, s->shared_gate, n, NULL};
    col_matmul_many(s->pool, s->jobs, n_first);
    for (uint32_t t = 0; t < n; t++) { /* the router bias, then the numerics variant's noise (no-op by default) */
        add_gate_bias(layer, s->router_logits + (uint64_t)t * n_experts, n_experts);
        col_numerics_perturb(&s->numerics, s->router_logits + (uint64_t)t * n_experts, n_experts, s->position + t,
                             layer_index);
    }
    uint32_t base = s->position, gs = m->n_chosen_groups ? m->n_chosen_groups : 1;
    for (uint32_t e = 0; e < n_experts; e++) s->expert_count[e] = 0;
    /* Each slot runs the expert it chose, or the other one of a SWAP intervention's pair. */
    int32_t *run = s->n_interventions ? s->route_run : s->route_ids;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t count = route(s, layer, layer_index, base + t, s->router_logits + (uint64_t)t * n_experts,
                               s->route_ids + (uint64_t)t * ks, s->route_weights + (uint64_t)t * ks,
                               s->route_selection + (uint64_t)t * n_experts, s->route_groups + (uint64_t)t * gs,
                               s->route_bias_changed + t, s->route_edits + t);
        s->route_count[t] = count;
        for (uint32_t slot = 0; slot < count; slot++) {
            if (run != s->route_ids) {
                uint32_t applied = 0;
                run[t * ks + slot] = col_intervene_run_expert(s, layer_index, base + t, s->route_ids[t * ks + slot],
                                                              &applied);
                s->route_edits[t] |= (uint8_t)applied;
            }
            s->expert_count[run[t * ks + slot]]++;
        }
    }
    uint64_t t1 = phase_ns ? col_now_ns() : 0;

    /* counting sort of the (token, slot) pairs by expert */
    uint32_t n_jobs = 0, off = 0;
    for (uint32_t e = 0; e < n_experts; e++) {
        s->expert_offset[e] = off;
        off += s->expert_count[e];
        s->expert_count[e] = 0; /* becomes the fill cursor */
    }
    /* A lone token is its own group: every expert reads it in place, so a decode step copies
     * nothing and quantises or packs its activations once for all the experts' products. Llama 4
     * scales each expert's input by its weight, so each (token, slot) has a row of its own. */
    const int weight_inputs = layer->route->weight_inputs != 0;
    const int alone = n == 1 && !weight_inputs;
    uint64_t d_ff = layer->moe_w1->shape[1];
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t slot = 0; slot < s->route_count[t]; slot++) {
            uint32_t e = (uint32_t)run[t * ks + slot];
            s->route_rows[t * ks + slot] = s->expert_offset[e] + s->expert_count[e]++;
        }
    /* Quantised experts (and bf16 experts under bf16 dot products) read each token's row
     * quantised (packed) once, its bytes copied to the token's rows of the batch (in expert_x's
     * storage: at most 2 bytes an element), instead of its f32 row copied and each copy
     * quantised. */
    const uint32_t up_dtype = layer->moe_w1->dtype;
    const uint64_t qrow = alone || weight_inputs || layer->moe_w3->dtype != up_dtype
                              ? 0 : col_pool_qrow_bytes(s->pool, up_dtype, d_model);
    tokens_task tokens = {s, d_model, ks, up_dtype, qrow, weight_inputs, sff != 0, shared_gate};
    if (!alone) col_pool_run(s->pool, group_tokens, &tokens, n);
    /* Each expert's down-projection follows its own up-projections in one chain, not everyone's. */
    uint32_t n_groups = 0;
    for (uint32_t e = 0; e < n_experts; e++) {
        if (!s->expert_count[e]) continue;
        uint64_t o = s->expert_offset[e];
        const float *x = alone ? s->xn : qrow ? NULL : s->expert_x + o * d_model;
        const uint8_t *xq = qrow ? (const uint8_t *)s->expert_x + o * qrow : NULL;
        const uint32_t count = s->expert_count[e];
        s->group_expert[n_groups] = e;
        s->job_group[n_jobs] = n_groups;
        s->jobs[n_jobs++] = (col_matvec_job){col_weight_expert(layer->moe_w1, e), x, s->h1 + o * d_ff, count, xq};
        s->job_group[n_jobs] = n_groups++;
        s->jobs[n_jobs++] = (col_matvec_job){col_weight_expert(layer->moe_w3, e), x, s->h3 + o * d_ff, count, xq};
    }
    if (sff) {
        col_swiglu_gate(s->pool, s->shared_h1, s->shared_h3, (uint64_t)n * sff);
        s->job_group[n_jobs] = COL_CHAIN_NONE;
        s->jobs[n_jobs++] = (col_matvec_job){col_weight_of(layer->shared_w2), s->shared_h1, s->shared_out, n, NULL};
    }
    const uint32_t n_up = n_jobs;
    for (uint32_t g = 0; g < n_groups; g++) {
        const uint32_t e = s->group_expert[g];
        const uint64_t o = s->expert_offset[e];
        s->job_group[n_jobs] = g;
        s->jobs[n_jobs++] = (col_matvec_job){col_weight_expert(layer->moe_w2, e), s->h1 + o * d_ff,
                                             s->expert_out + o * d_model, s->expert_count[e], NULL};
    }
    expert_step step = {s, layer, d_ff};
    col_matmul_chain(s->pool, s->jobs, n_up, n_jobs, s->job_group, n_groups, expert_activation, &step);
    if (layer->moe_w2_bias)
        for (uint32_t e = 0; e < n_experts; e++)
            if (s->expert_count[e])
                add_expert_bias(s->expert_out, layer->moe_w2_bias, e, s->expert_offset[e], s->expert_count[e], d_model);
    uint64_t t2 = phase_ns ? col_now_ns() : 0;
    col_pool_run(s->pool, combine_tokens, &tokens, n);
    uint64_t t3 = phase_ns ? col_now_ns() : 0;

    if (s->trace_ids)
        for (uint32_t t = 0; t < n; t++)
            trace_decision(s, layer, base + t, s->route_count[t], s->route_ids + (uint64_t)t * ks,
                           s->route_weights + (uint64_t)t * ks, s->router_logits + (uint64_t)t * n_experts,
                           s->route_selection + (uint64_t)t * n_experts, s->route_groups + (uint64_t)t * gs,
                           s->route_bias_changed[t], s->route_edits[t], s->shared_gate[t],
                           s->xn + (uint64_t)t * d_model);
    if (phase_ns) {
        phase_ns[COL_PHASE_ROUTER] = t1 - t0;
        phase_ns[COL_PHASE_EXPERTS] = t2 - t1;
        phase_ns[COL_PHASE_COMBINE] = t3 - t2;
    }
}
