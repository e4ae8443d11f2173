/*
 * test_format.c - unit tests of the .colibri reader (format.c): CRC-32, the validator, the
 * header-field iterator and col_model_open.
 *
 * The tests build their own small valid images in C (an independent re-statement of the layout
 * in docs/format.md, so the validator is not checked against itself), then break one thing at a
 * time and assert the exact finding: status code, absolute byte offset and tensor name. Header
 * and table CRCs are recomputed after each deliberate edit so the edit is reported as itself,
 * not as a checksum error. The truncation sweep, random inputs and byte mutations are there to
 * be run under -fsanitize=address,undefined: they assert only "an error, never a crash".
 */
#include "internal.h" /* the test also checks the decoded layer tables */
#include "harness.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Little-endian writers ------------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static void putf32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put32(p, u);
}

static void putf64(uint8_t *p, double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    put64(p, u);
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* ---- A tiny model builder --------------------------------------------------------------------- */

typedef struct cfg {
    uint32_t arch, flags, n_layers, n_experts, topk, d_model, n_heads, n_kv_heads, head_dim;
    uint32_t vocab, d_ff_expert, d_ff_dense, d_ff_shared;
    uint32_t kinds[4];      /* layer kinds */
    uint32_t dtype;         /* storage dtype of the matrices */
    const char *tokenizer;  /* may be NULL */
    uint32_t n_extra;       /* unknown one-element tensors "extra.N" appended to the table */
    /* format version 2 (version 0 or 1: a version-1 file) */
    uint32_t version;
    uint32_t mla, q_lora, kv_lora, nope, rope; /* MLA attention: head_dim = nope + rope */
    col_routing_info rule;  /* every MoE layer's rule; its tensor fields: 0 = absent, 1 = present */
} cfg;

typedef struct tspec {
    char name[64];
    uint32_t dtype, ndim;
    uint64_t shape[4];
} tspec;

typedef struct image {
    uint8_t *d;
    uint64_t size;
    uint64_t routing_off, table_off, data_off;
    uint32_t n_tensors, n_layers;
} image;

/* Mixtral-like: 1 MoE layer, H=8, 2 heads of 4 (1 kv head), V=16, E=4, k=2, I=8. */
static cfg mixtral_cfg(void)
{
    cfg c = {0};
    c.arch = COL_ARCH_MIXTRAL;
    c.flags = COL_FLAG_NORM_TOPK;
    c.n_layers = 1;
    c.n_experts = 4;
    c.topk = 2;
    c.d_model = 8;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.head_dim = 4;
    c.vocab = 16;
    c.d_ff_expert = 8;
    c.kinds[0] = COL_LAYER_MOE;
    c.dtype = COL_DTYPE_F32;
    return c;
}

static uint32_t add(tspec *t, uint32_t n, uint32_t dtype, const char *name, uint32_t ndim,
                    uint64_t a, uint64_t b, uint64_t c)
{
    memset(&t[n], 0, sizeof t[n]);
    snprintf(t[n].name, sizeof t[n].name, "%s", name);
    t[n].dtype = ndim == 1 ? COL_DTYPE_F32 : dtype;
    t[n].ndim = ndim;
    t[n].shape[0] = a;
    if (ndim > 1)
        t[n].shape[1] = b;
    if (ndim > 2)
        t[n].shape[2] = c;
    return n + 1;
}

/* A version-2 configuration: the version-1 one with its v1-only flags turned into the rule. */
static cfg as_v2(cfg c)
{
    c.version = 2;
    memset(&c.rule, 0, sizeof c.rule);
    c.rule.scoring = COL_SCORING_SOFTMAX;
    c.rule.n_groups = c.rule.n_groups_kept = 1;
    c.rule.normalize = (c.flags & COL_FLAG_NORM_TOPK) ? COL_NORM_SUM : COL_NORM_NONE;
    c.rule.scale = 1.0f;
    c.rule.shared = !(c.flags & COL_FLAG_SHARED_EXPERT) ? COL_SHARED_NONE
                    : (c.flags & COL_FLAG_SHARED_EXPERT_GATE) ? COL_SHARED_SIGMOID_GATE : COL_SHARED_PLAIN;
    c.flags &= ~(uint32_t)(COL_FLAG_NORM_TOPK | COL_FLAG_SHARED_EXPERT | COL_FLAG_SHARED_EXPERT_GATE);
    return c;
}

static bool v2(const cfg *c) { return c->version == 2; }
static bool has_shared(const cfg *c)
{
    return v2(c) ? c->rule.shared != COL_SHARED_NONE : (c->flags & COL_FLAG_SHARED_EXPERT) != 0;
}
static bool has_shared_gate(const cfg *c)
{
    return v2(c) ? c->rule.shared == COL_SHARED_SIGMOID_GATE : (c->flags & COL_FLAG_SHARED_EXPERT_GATE) != 0;
}

/* The tensor list the format's name/shape table requires for `c`. */
static uint32_t tensor_list(const cfg *c, tspec *t)
{
    uint32_t n = 0, dt = c->dtype;
    uint64_t H = c->d_model, Q = (uint64_t)c->n_heads * c->head_dim;
    uint64_t KV = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t O = c->mla ? (uint64_t)c->n_heads * 6 : Q; /* MLA files here have v_head_dim 6 */
    char nm[64];
    n = add(t, n, dt, "token_embd", 2, c->vocab, H, 0);
    for (uint32_t l = 0; l < c->n_layers; l++) {
#define L_(s) (snprintf(nm, sizeof nm, "layers.%u.%s", l, s), nm)
        n = add(t, n, dt, L_("attn_norm"), 1, H, 0, 0);
        if (c->mla) {
            if (c->q_lora) {
                n = add(t, n, dt, L_("attn_q_a"), 2, c->q_lora, H, 0);
                n = add(t, n, dt, L_("attn_q_a_norm"), 1, c->q_lora, 0, 0);
                n = add(t, n, dt, L_("attn_q_b"), 2, Q, c->q_lora, 0);
            } else {
                n = add(t, n, dt, L_("attn_q"), 2, Q, H, 0);
            }
            n = add(t, n, dt, L_("attn_kv_a"), 2, c->kv_lora + c->rope, H, 0);
            n = add(t, n, dt, L_("attn_kv_a_norm"), 1, c->kv_lora, 0, 0);
            n = add(t, n, dt, L_("attn_k_b"), 3, c->n_heads, c->kv_lora, c->nope);
            n = add(t, n, dt, L_("attn_v_b"), 3, c->n_heads, 6, c->kv_lora);
            n = add(t, n, dt, L_("attn_o"), 2, H, O, 0);
        } else {
            n = add(t, n, dt, L_("attn_q"), 2, Q, H, 0);
            n = add(t, n, dt, L_("attn_k"), 2, KV, H, 0);
            n = add(t, n, dt, L_("attn_v"), 2, KV, H, 0);
            n = add(t, n, dt, L_("attn_o"), 2, H, Q, 0);
        }
        if (c->flags & COL_FLAG_QKV_BIAS) {
            n = add(t, n, dt, L_("attn_q_bias"), 1, Q, 0, 0);
            n = add(t, n, dt, L_("attn_k_bias"), 1, KV, 0, 0);
            n = add(t, n, dt, L_("attn_v_bias"), 1, KV, 0, 0);
        }
        if (c->flags & COL_FLAG_QK_NORM_HEAD) {
            n = add(t, n, dt, L_("attn_q_norm"), 1, c->head_dim, 0, 0);
            n = add(t, n, dt, L_("attn_k_norm"), 1, c->head_dim, 0, 0);
        }
        if (c->flags & COL_FLAG_QK_NORM_FULL) {
            n = add(t, n, dt, L_("attn_q_norm"), 1, Q, 0, 0);
            n = add(t, n, dt, L_("attn_k_norm"), 1, KV, 0, 0);
        }
        n = add(t, n, dt, L_("ffn_norm"), 1, H, 0, 0);
        if (c->kinds[l] == COL_LAYER_MOE) {
            n = add(t, n, COL_DTYPE_F32, L_("moe_gate"), 2, c->n_experts, H, 0);
            if (v2(c) && c->rule.gate_bias_tensor)
                n = add(t, n, dt, L_("moe_gate_bias"), 1, c->n_experts, 0, 0);
            if (v2(c) && c->rule.correction_bias_tensor)
                n = add(t, n, dt, L_("moe_correction_bias"), 1, c->n_experts, 0, 0);
            n = add(t, n, dt, L_("moe_w1"), 3, c->n_experts, c->d_ff_expert, H);
            n = add(t, n, dt, L_("moe_w2"), 3, c->n_experts, H, c->d_ff_expert);
            n = add(t, n, dt, L_("moe_w3"), 3, c->n_experts, c->d_ff_expert, H);
            if (has_shared(c)) {
                n = add(t, n, dt, L_("shared_w1"), 2, c->d_ff_shared, H, 0);
                n = add(t, n, dt, L_("shared_w2"), 2, H, c->d_ff_shared, 0);
                n = add(t, n, dt, L_("shared_w3"), 2, c->d_ff_shared, H, 0);
            }
            if (has_shared_gate(c))
                n = add(t, n, dt, L_("shared_gate"), 2, 1, H, 0);
        } else {
            n = add(t, n, dt, L_("mlp_w1"), 2, c->d_ff_dense, H, 0);
            n = add(t, n, dt, L_("mlp_w2"), 2, H, c->d_ff_dense, 0);
            n = add(t, n, dt, L_("mlp_w3"), 2, c->d_ff_dense, H, 0);
        }
#undef L_
    }
    n = add(t, n, dt, "output_norm", 1, H, 0, 0);
    if (!(c->flags & COL_FLAG_TIED_EMBEDDINGS))
        n = add(t, n, dt, "output", 2, c->vocab, H, 0);
    for (uint32_t i = 0; i < c->n_extra; i++) {
        snprintf(nm, sizeof nm, "extra.%u", i);
        n = add(t, n, dt, nm, 1, 1, 0, 0);
    }
    return n;
}

/* Quantised dtypes (rows and panels alike): blocks of 32 elements, f16 scale + payload. */
static uint64_t block_size(uint32_t dtype)
{
    return dtype == COL_DTYPE_Q8_0 || dtype == COL_DTYPE_Q8_0X8 ? 34 : 18;
}

static uint64_t tensor_bytes(const tspec *t)
{
    const uint32_t es = col_dtype_size(t->dtype);
    uint64_t n = 1;
    for (uint32_t k = 0; k < t->ndim; k++)
        n *= t->shape[k];
    return es ? n * es : n / 32 * block_size(t->dtype); /* block dtypes: blocks of 32 along a row */
}

/* Recompute header_crc32 and tables_crc32 from the (possibly edited) header, as the Python
 * writer's refresh_checksums does; regions outside the image are skipped. */
static void refresh(image *im)
{
    uint8_t *d = im->d;
    if (im->size < 256)
        return;
    bool two = get32(d + 0x04) == 2 && im->size >= 512;
    uint64_t nl = get32(d + 0x0C), nt = get32(d + 0x14);
    uint64_t ro = get64(d + 0x18), to = get64(d + 0x28);
    uint64_t rl = nl * (two ? 128 : 32), tl = nt * 128;
    if (ro <= im->size && rl <= im->size - ro && to <= im->size && tl <= im->size - to) {
        uint32_t c = col_crc32(0, d + ro, (size_t)rl);
        put32(d + 0xC4, col_crc32(c, d + to, (size_t)tl));
    }
    uint32_t c = col_crc32(0, d, 0xC0);
    put32(d + 0xC0, two ? col_crc32(c, d + 0xC8, 512 - 0xC8) : c); /* v2: also 0x0C8..0x1FF */
}

static void fill_data(uint8_t *p, const tspec *t, uint32_t salt)
{
    if (col_dtype_size(t->dtype) == 0) { /* block dtypes: every 16-bit pair a finite f16 (< 0x4000) */
        for (uint64_t k = 0; k < tensor_bytes(t); k++)
            p[k] = (uint8_t)(((uint32_t)(k * 2654435761u) ^ salt) & 0x3F);
        return;
    }
    uint64_t n = tensor_bytes(t) / col_dtype_size(t->dtype);
    for (uint64_t k = 0; k < n; k++) {
        uint32_t h = (uint32_t)(k * 2654435761u) ^ salt;
        if (t->dtype == COL_DTYPE_F32)
            putf32(p + 4 * k, (float)((int)(h % 201) - 100) / 400.0f);
        else if (t->dtype == COL_DTYPE_F16) {
            uint16_t v = (uint16_t)(0x2C00 | (h & 0x3FF) | ((h >> 10 & 1) << 15)); /* |x| < 0.125 */
            p[2 * k] = (uint8_t)v;
            p[2 * k + 1] = (uint8_t)(v >> 8);
        } else {
            uint16_t v = (uint16_t)(0x3D80 | (h & 0x7F) | ((h >> 7 & 1) << 15));
            p[2 * k] = (uint8_t)v;
            p[2 * k + 1] = (uint8_t)(v >> 8);
        }
    }
}

/* Lay out a whole file exactly as docs/format.md and fileformat.plan_file do. */
static image build(const cfg *c)
{
    tspec *t = malloc((128 + c->n_extra) * sizeof *t);
    uint64_t *offs = malloc((128 + c->n_extra) * sizeof *offs);
    uint32_t nt = tensor_list(c, t);
    const char *meta = "{\"source\":\"test_format.c\"}";
    uint64_t tok_len = c->tokenizer ? strlen(c->tokenizer) : 0, meta_len = strlen(meta);
    image im = {0};
    im.n_tensors = nt;
    im.n_layers = c->n_layers;
    uint32_t hsize = v2(c) ? 512 : 256, esize = v2(c) ? 128 : 32;
    im.routing_off = hsize;
    im.table_off = align_up(im.routing_off + (uint64_t)esize * c->n_layers, 8);
    uint64_t tok_off = align_up(im.table_off + 128u * nt, 8);
    uint64_t meta_off = align_up(tok_off + tok_len, 8);
    im.data_off = align_up(meta_off + meta_len, 64);
    uint64_t cur = im.data_off;
    for (uint32_t i = 0; i < nt; i++) {
        offs[i] = cur;
        cur = align_up(cur + tensor_bytes(&t[i]), 64);
    }
    im.size = offs[nt - 1] + tensor_bytes(&t[nt - 1]);
    im.d = calloc(1, im.size);
    uint8_t *d = im.d;

    memcpy(d, "COLI", 4);
    put32(d + 0x04, v2(c) ? 2 : 1);
    put32(d + 0x08, c->n_experts);
    put32(d + 0x0C, c->n_layers);
    put32(d + 0x10, hsize);
    put32(d + 0x14, nt);
    put64(d + 0x18, im.routing_off);
    put64(d + 0x20, im.data_off);
    put64(d + 0x28, im.table_off);
    put64(d + 0x30, tok_len ? tok_off : 0);
    put64(d + 0x38, tok_len);
    put64(d + 0x40, meta_off);
    put64(d + 0x48, meta_len);
    put64(d + 0x50, im.size);
    put32(d + 0x58, c->arch);
    put32(d + 0x5C, c->flags);
    put32(d + 0x60, c->d_model);
    put32(d + 0x64, c->n_heads);
    put32(d + 0x68, c->n_kv_heads);
    put32(d + 0x6C, c->head_dim);
    put32(d + 0x70, c->vocab);
    put32(d + 0x74, 64);
    put32(d + 0x78, c->d_ff_expert);
    put32(d + 0x7C, c->d_ff_dense);
    put32(d + 0x80, c->d_ff_shared);
    put32(d + 0x84, c->topk);
    putf64(d + 0x90, 10000.0);
    putf32(d + 0x98, 1.0f);
    putf32(d + 0xA8, 1e-5f);
    putf32(d + 0xB0, 1e-8f);
    put32(d + 0xB4, 1);
    put32(d + 0xB8, 2);
    uint32_t n_moe = 0;
    for (uint32_t l = 0; l < c->n_layers; l++)
        n_moe += c->kinds[l] == COL_LAYER_MOE;
    put32(d + 0xBC, n_moe);
    if (v2(c)) { /* docs/format.md, version 2's header fields */
        put32(d + 0xC8, c->mla);
        put32(d + 0xCC, c->q_lora);
        put32(d + 0xD0, c->kv_lora);
        put32(d + 0xD4, c->nope);
        put32(d + 0xD8, c->rope);
        put32(d + 0xDC, c->mla ? 6 : c->head_dim);
        put32(d + 0xE0, c->mla ? c->rope : c->head_dim);
        putf32(d + 0xE8, 0.5f);
        putf32(d + 0xEC, c->mla ? 1e-6f : 0.0f);
        putf32(d + 0xF0, 1.0f);
    }

    for (uint32_t i = 0; i < nt; i++) {
        uint8_t *e = d + im.table_off + 128u * i;
        memcpy(e, t[i].name, strlen(t[i].name));
        put32(e + 0x40, t[i].dtype);
        put32(e + 0x44, t[i].ndim);
        for (int k = 0; k < 4; k++)
            put64(e + 0x48 + 8 * k, t[i].shape[k]);
        put64(e + 0x68, offs[i]);
        put64(e + 0x70, tensor_bytes(&t[i]));
        fill_data(d + offs[i], &t[i], i * 7919u);
        put32(e + 0x78, col_crc32(0, d + offs[i], (size_t)tensor_bytes(&t[i])));
    }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        uint8_t *r = d + im.routing_off + (uint64_t)esize * l;
        uint32_t gate = 0xFFFFFFFFu, gate_bias = 0xFFFFFFFFu, correction = 0xFFFFFFFFu;
        char want[3][64];
        snprintf(want[0], sizeof want[0], "layers.%u.moe_gate", l);
        snprintf(want[1], sizeof want[1], "layers.%u.moe_gate_bias", l);
        snprintf(want[2], sizeof want[2], "layers.%u.moe_correction_bias", l);
        for (uint32_t i = 0; i < nt; i++) {
            if (strcmp(t[i].name, want[0]) == 0)
                gate = i;
            if (strcmp(t[i].name, want[1]) == 0)
                gate_bias = i;
            if (strcmp(t[i].name, want[2]) == 0)
                correction = i;
        }
        bool moe = c->kinds[l] == COL_LAYER_MOE;
        put32(r + 0, l);
        put32(r + 4, c->kinds[l]);
        put32(r + 8, moe ? gate : 0xFFFFFFFFu);
        put32(r + 12, moe ? gate_bias : 0xFFFFFFFFu);
        put32(r + 16, moe ? c->topk : 0);
        put32(r + 20, moe ? c->n_experts : 0);
        if (!v2(c))
            continue;
        put32(r + 0x20, 0xFFFFFFFFu);
        if (!moe)
            continue;
        const col_routing_info *ru = &c->rule;
        put32(r + 0x18, ru->scoring);
        put32(r + 0x1C, ru->select_on);
        put32(r + 0x20, correction);
        put32(r + 0x24, ru->n_groups);
        put32(r + 0x28, ru->n_groups_kept);
        put32(r + 0x2C, ru->group_score);
        put32(r + 0x30, ru->normalize);
        putf32(r + 0x34, ru->norm_eps);
        putf32(r + 0x38, ru->norm_p);
        putf32(r + 0x3C, ru->scale);
        put32(r + 0x40, ru->shared);
        putf32(r + 0x44, ru->sparsemixer_eps);
    }
    if (tok_len)
        memcpy(d + tok_off, c->tokenizer, tok_len);
    memcpy(d + meta_off, meta, meta_len);
    refresh(&im);
    free(t);
    free(offs);
    return im;
}

static image build_mixtral(void)
{
    cfg c = mixtral_cfg();
    return build(&c);
}

/* Absolute offset of the table entry of `name`, or 0. */
static uint64_t entry(const image *im, const char *name)
{
    for (uint32_t i = 0; i < im->n_tensors; i++) {
        uint64_t eo = im->table_off + 128u * i;
        if (strncmp((const char *)im->d + eo, name, 64) == 0)
            return eo;
    }
    return 0;
}

static uint64_t data_of(const image *im, const char *name)
{
    return get64(im->d + entry(im, name) + 0x68);
}

/* ---- Expectation helper ---------------------------------------------------------------------- */

static void dump(const col_problem *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        fprintf(stderr, "    %s%s 0x%llx '%s' %s\n", col_status_name(p[i].code),
                p[i].severity ? " (warning)" : "", (unsigned long long)p[i].offset, p[i].tensor,
                p[i].message);
}

/* Validate and assert the first error: code, offset and tensor name. */
static void expect_at(const char *what, const uint8_t *d, uint64_t size, uint32_t flags,
                      int32_t code, uint64_t offset, const char *tensor)
{
    enum { CAP = 8192 };
    col_problem *p = malloc(CAP * sizeof *p);
    uint32_t n = 0;
    int32_t rc = col_validate_buffer(d, size, flags, p, CAP, &n);
    const col_problem *first = NULL;
    for (uint32_t i = 0; i < n && i < CAP; i++)
        if (p[i].severity == COL_SEVERITY_ERROR) {
            first = &p[i];
            break;
        }
    bool ok = rc == code;
    if (code == COL_OK)
        ok = ok && first == NULL;
    else
        ok = ok && first && first->code == code && first->offset == offset &&
             strcmp(first->tensor, tensor) == 0;
    CHECK(ok);
    if (!ok) {
        fprintf(stderr, "  %s: expected %s at 0x%llx '%s', got %s with %u problems:\n", what,
                col_status_name(code), (unsigned long long)offset, tensor, col_status_name(rc), n);
        dump(p, n < 64 ? n : 64);
    }
    free(p);
}

static void expect(const char *what, image *im, uint32_t flags, int32_t code, uint64_t offset,
                   const char *tensor)
{
    expect_at(what, im->d, im->size, flags, code, offset, tensor);
}

/* ---- CRC ------------------------------------------------------------------------------------- */

static uint32_t crc_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return ~c;
}

static void test_crc32(void)
{
    CHECK(col_crc32(0, "123456789", 9) == 0xCBF43926u);
    CHECK(col_crc32(0, "", 0) == 0);
    uint8_t buf[1031];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 131 + 7);
    bool all = true;
    for (size_t n = 0; n < sizeof buf; n += 13) {
        all = all && col_crc32(0, buf + 1, n) == crc_bitwise(buf + 1, n); /* unaligned start */
        size_t h = n / 3;
        all = all && col_crc32(col_crc32(0, buf, h), buf + h, n - h) == crc_bitwise(buf, n);
    }
    CHECK(all);
}

/* ---- Valid images ---------------------------------------------------------------------------- */

static void test_valid(void)
{
    image im = build_mixtral();
    expect("mixtral", &im, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, COL_OK, 0, "");
    uint32_t n = 99;
    CHECK(col_validate_buffer(im.d, im.size, 0, NULL, 0, &n) == COL_OK && n == 0);
    free(im.d);

    for (uint32_t dt = COL_DTYPE_F16; dt <= COL_DTYPE_BF16; dt++) {
        cfg c = mixtral_cfg();
        c.dtype = dt;
        im = build(&c);
        expect("mixtral f16/bf16", &im, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, COL_OK, 0, "");
        free(im.d);
    }

    /* Qwen2-MoE: shared expert with gate, QKV bias, a dense layer before a MoE layer. */
    cfg q2 = mixtral_cfg();
    q2.arch = COL_ARCH_QWEN2_MOE;
    q2.flags = COL_FLAG_SHARED_EXPERT | COL_FLAG_SHARED_EXPERT_GATE | COL_FLAG_QKV_BIAS;
    q2.n_layers = 2;
    q2.kinds[0] = COL_LAYER_DENSE;
    q2.kinds[1] = COL_LAYER_MOE;
    q2.d_ff_dense = 16;
    q2.d_ff_shared = 12;
    q2.dtype = COL_DTYPE_BF16;
    q2.tokenizer = "{\"model\":{}}";
    im = build(&q2);
    expect("qwen2", &im, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, COL_OK, 0, "");
    free(im.d);

    cfg q3 = mixtral_cfg();
    q3.arch = COL_ARCH_QWEN3_MOE;
    q3.flags = COL_FLAG_NORM_TOPK | COL_FLAG_QK_NORM_HEAD;
    im = build(&q3);
    expect("qwen3", &im, 0, COL_OK, 0, "");
    free(im.d);

    cfg ol = mixtral_cfg();
    ol.arch = COL_ARCH_OLMOE;
    ol.flags = COL_FLAG_QK_NORM_FULL | COL_FLAG_TIED_EMBEDDINGS;
    ol.n_layers = 3;
    ol.kinds[1] = ol.kinds[2] = COL_LAYER_MOE;
    ol.dtype = COL_DTYPE_F16;
    im = build(&ol);
    expect("olmoe", &im, 0, COL_OK, 0, "");
    free(im.d);
}

/* ---- One test per problem class -------------------------------------------------------------- */

static void test_identity(void)
{
    image im = build_mixtral();
    im.d[0] = 'X';
    expect("bad magic", &im, 0, COL_ERR_BAD_MAGIC, 0, "");
    free(im.d);

    im = build_mixtral();
    put32(im.d + 4, 3);
    refresh(&im);
    expect("bad version", &im, 0, COL_ERR_BAD_VERSION, 4, "");
    free(im.d);

    im = build_mixtral();
    expect_at("short", im.d, 100, 0, COL_ERR_TRUNCATED, 100, "");
    expect_at("truncated", im.d, im.size - 1, 0, COL_ERR_TRUNCATED, im.size - 1, "");
    expect_at("empty", NULL, 0, 0, COL_ERR_TRUNCATED, 0, "");
    free(im.d);

    im = build_mixtral();
    put32(im.d + 0x10, 100);
    refresh(&im);
    expect("header_size", &im, 0, COL_ERR_HEADER, 0x10, "");
    free(im.d);

    /* Trailing bytes past file_size. */
    im = build_mixtral();
    uint8_t *big = calloc(1, im.size + 64);
    memcpy(big, im.d, im.size);
    expect_at("trailing", big, im.size + 64, 0, COL_ERR_HEADER, 0x50, "");
    free(big);
    free(im.d);
}

static void test_limits(void)
{
    image im = build_mixtral();
    put32(im.d + 0x14, 0xFFFFFFFFu);
    refresh(&im);
    expect("tensor_count", &im, 0, COL_ERR_LIMIT, 0x14, "");
    free(im.d);

    im = build_mixtral();
    put32(im.d + 0x14, 1000); /* plausible count, but 128000 bytes exceed the file */
    refresh(&im);
    expect("tensor_count > file", &im, 0, COL_ERR_LIMIT, 0x14, "");
    free(im.d);

    im = build_mixtral();
    put32(im.d + 0x0C, 5000);
    refresh(&im);
    expect("num_layers", &im, 0, COL_ERR_LIMIT, 0x0C, "");
    free(im.d);

    /* dims whose product overflows 64 bits */
    im = build_mixtral();
    uint64_t e = entry(&im, "layers.0.moe_w1");
    put64(im.d + e + 0x48, 1ull << 32);
    put64(im.d + e + 0x50, 1ull << 32);
    put64(im.d + e + 0x58, 1ull << 32);
    refresh(&im);
    expect("shape overflow", &im, 0, COL_ERR_LIMIT, e + 0x50, "layers.0.moe_w1");
    free(im.d);
}

static void test_checksums(void)
{
    image im = build_mixtral();
    put32(im.d + 0x88, 4096); /* sliding_window edited, CRC not refreshed */
    expect("header crc", &im, 0, COL_ERR_CHECKSUM, 0xC0, "");
    free(im.d);

    im = build_mixtral();
    im.d[entry(&im, "output") + 0x7C] = 1; /* reserved byte of a table entry */
    expect("tables crc", &im, 0, COL_ERR_CHECKSUM, 0xC4, "");
    free(im.d);

    im = build_mixtral();
    uint64_t off = data_of(&im, "layers.0.moe_w2");
    im.d[off + 100] ^= 0x01;
    expect("data crc off", &im, 0, COL_OK, 0, "");
    expect("data crc", &im, COL_CHECK_CHECKSUMS, COL_ERR_CHECKSUM, off, "layers.0.moe_w2");
    free(im.d);
}

static void test_nonfinite(void)
{
    image im = build_mixtral();
    uint64_t e = entry(&im, "layers.0.attn_q"), off = get64(im.d + e + 0x68);
    putf32(im.d + off + 12, NAN);
    putf32(im.d + off + 40, INFINITY);
    put32(im.d + e + 0x78, col_crc32(0, im.d + off, (size_t)get64(im.d + e + 0x70)));
    refresh(&im);
    expect("nan off", &im, COL_CHECK_CHECKSUMS, COL_OK, 0, "");
    expect("nan", &im, COL_CHECK_NONFINITE, COL_ERR_NONFINITE, off + 12, "layers.0.attn_q");
    free(im.d);

    cfg c = mixtral_cfg();
    c.dtype = COL_DTYPE_BF16;
    im = build(&c);
    e = entry(&im, "layers.0.moe_w3");
    off = get64(im.d + e + 0x68);
    im.d[off + 6] = 0x80; /* bf16 +Inf = 0x7F80 */
    im.d[off + 7] = 0x7F;
    expect("bf16 inf", &im, COL_CHECK_NONFINITE, COL_ERR_NONFINITE, off + 6, "layers.0.moe_w3");
    free(im.d);

    c.dtype = COL_DTYPE_F16;
    im = build(&c);
    off = data_of(&im, "token_embd");
    im.d[off + 2] = 0x01; /* f16 NaN = 0x7C01 */
    im.d[off + 3] = 0x7C;
    expect("f16 nan", &im, COL_CHECK_NONFINITE, COL_ERR_NONFINITE, off + 2, "token_embd");
    free(im.d);
}

static void test_hparams(void)
{
    image im = build_mixtral();
    put32(im.d + 0x58, 9);
    refresh(&im);
    expect("arch", &im, 0, COL_ERR_UNSUPPORTED, 0x58, "");
    free(im.d);

    im = build_mixtral();
    put32(im.d + 0x68, 3); /* n_kv_heads does not divide n_heads */
    refresh(&im);
    expect("n_kv_heads", &im, 0, COL_ERR_HEADER, 0x68, "");
    free(im.d);

    im = build_mixtral();
    put32(im.d + 0x84, 5); /* top-k > experts */
    refresh(&im);
    expect("top-k", &im, 0, COL_ERR_HEADER, 0x84, "");
    free(im.d);
}

static void test_sections(void)
{
    image im = build_mixtral();
    put64(im.d + 0x48, 1ull << 40); /* metadata_size */
    refresh(&im);
    expect("metadata bounds", &im, 0, COL_ERR_SECTION_BOUNDS, 0x40, "");
    free(im.d);

    im = build_mixtral();
    put64(im.d + 0x18, im.size + 8); /* routing section beyond the file */
    refresh(&im);
    expect("routing bounds", &im, 0, COL_ERR_SECTION_BOUNDS, 0x18, "");
    free(im.d);

    im = build_mixtral();
    put64(im.d + 0x40, im.table_off); /* metadata on top of the tensor table */
    refresh(&im);
    expect("section overlap", &im, 0, COL_ERR_SECTION_BOUNDS, 0x40, "");
    free(im.d);

    im = build_mixtral();
    put64(im.d + 0x20, im.data_off + 8);
    refresh(&im);
    expect("data_offset align", &im, 0, COL_ERR_MISALIGNED, 0x20, "");
    free(im.d);
}

static void test_tensor_entries(void)
{
    image im = build_mixtral();
    uint64_t e = entry(&im, "output");
    put64(im.d + e + 0x68, align_up(im.size, 64) + 64);
    refresh(&im);
    expect("tensor bounds", &im, 0, COL_ERR_TENSOR_BOUNDS, e + 0x68, "output");
    free(im.d);

    /* One wild offset is one finding, not an overlap for every later entry. */
    im = build_mixtral();
    e = entry(&im, "token_embd");
    put64(im.d + e + 0x68, 1ull << 40);
    refresh(&im);
    expect("wild offset", &im, 0, COL_ERR_TENSOR_BOUNDS, e + 0x68, "token_embd");
    uint32_t n = 0;
    col_validate_buffer(im.d, im.size, 0, NULL, 0, &n);
    CHECK(n == 1);
    free(im.d);

    im = build_mixtral();
    e = entry(&im, "token_embd");
    put64(im.d + e + 0x68, im.data_off - 64);
    refresh(&im);
    expect("tensor before data", &im, 0, COL_ERR_TENSOR_BOUNDS, e + 0x68, "token_embd");
    free(im.d);

    im = build_mixtral();
    e = entry(&im, "output");
    put64(im.d + e + 0x68, get64(im.d + e + 0x68) + 4);
    refresh(&im);
    expect("misaligned", &im, 0, COL_ERR_MISALIGNED, e + 0x68, "output");
    free(im.d);

    im = build_mixtral();
    e = entry(&im, "layers.0.attn_k");
    put64(im.d + e + 0x70, get64(im.d + e + 0x70) - 4);
    refresh(&im);
    expect("size mismatch", &im, 0, COL_ERR_SIZE_MISMATCH, e + 0x70, "layers.0.attn_k");
    free(im.d);

    im = build_mixtral();
    e = entry(&im, "layers.0.attn_v");
    put64(im.d + e + 0x68, data_of(&im, "layers.0.attn_k"));
    refresh(&im);
    expect("overlap", &im, 0, COL_ERR_OVERLAP, e + 0x68, "layers.0.attn_v");
    free(im.d);

    im = build_mixtral();
    e = entry(&im, "layers.0.moe_w1");
    put32(im.d + e + 0x40, 10); /* the first dtype after COL_DTYPE_BF16X16 */
    refresh(&im);
    expect("bad dtype", &im, 0, COL_ERR_DTYPE, e + 0x40, "layers.0.moe_w1");
    free(im.d);

    im = build_mixtral(); /* a norm stored as f16: valid dtype, not allowed for a 1-D tensor */
    e = entry(&im, "layers.0.attn_norm");
    put32(im.d + e + 0x40, COL_DTYPE_F16);
    put64(im.d + e + 0x70, get64(im.d + e + 0x70) / 2);
    refresh(&im);
    expect("dtype not allowed", &im, 0, COL_ERR_DTYPE, e + 0x40, "layers.0.attn_norm");
    free(im.d);

    im = build_mixtral();
    e = entry(&im, "layers.0.attn_q");
    im.d[e + 13] = ' ';
    refresh(&im);
    expect("bad name", &im, 0, COL_ERR_NAME, e + 13, "layers.0.attn q");
    free(im.d);

    im = build_mixtral();
    e = entry(&im, "layers.0.ffn_norm");
    memset(im.d + e, 'a', 64);
    refresh(&im);
    expect("unterminated name", &im, 0, COL_ERR_NAME, e + 63, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    free(im.d);

    im = build_mixtral();
    e = entry(&im, "layers.0.attn_o");
    memset(im.d + e, 0, 64);
    memcpy(im.d + e, "layers.0.attn_q", 15);
    refresh(&im);
    expect("duplicate", &im, 0, COL_ERR_NAME, e, "layers.0.attn_q");
    free(im.d);
}

/* ---- Quantised panels (dtypes 7 and 8) ------------------------------------------------------- */

/* Every matrix in panels: H = 32, Q = 32 (2 heads of 16), KV = 16, V = 16, I = 32, so each has
 * rows % 8 == 0 and columns % 32 == 0. */
static cfg panels_cfg(uint32_t dtype)
{
    cfg c = mixtral_cfg();
    c.d_model = 32;
    c.head_dim = 16;
    c.d_ff_expert = 32;
    c.dtype = dtype;
    return c;
}

static void test_panels_valid(void)
{
    for (uint32_t dt = COL_DTYPE_Q8_0X8; dt <= COL_DTYPE_Q4_0X8; dt++) {
        cfg c = panels_cfg(dt);
        image im = build(&c);
        expect("panels", &im, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, COL_OK, 0, "");
        col_model *m = NULL;
        col_problem p;
        char path[] = "/tmp/test_format_panelsXXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0 && write(fd, im.d, im.size) == (ssize_t)im.size);
        close(fd);
        CHECK(col_model_open(path, &m, &p) == COL_OK && m != NULL);
        col_model_close(m);
        unlink(path);
        free(im.d);
    }
}

static void test_panels_problems(void)
{
    /* rows not a multiple of 8: a vocabulary of 12 gives token_embd [12, 32] */
    cfg c = panels_cfg(COL_DTYPE_Q8_0X8);
    c.vocab = 12;
    image im = build(&c);
    expect("panel rows", &im, 0, COL_ERR_SHAPE, entry(&im, "token_embd") + 0x48, "token_embd");
    free(im.d);

    /* a stack's rows are its second dimension: experts' w2 [4, 32, 32] told it has 36 rows */
    c = panels_cfg(COL_DTYPE_Q4_0X8);
    im = build(&c);
    uint64_t e = entry(&im, "layers.0.moe_w2");
    put64(im.d + e + 0x50, 36);
    refresh(&im);
    expect("panel stack rows", &im, 0, COL_ERR_SHAPE, e + 0x50, "layers.0.moe_w2");
    free(im.d);

    /* a vector in a panel dtype: attn_norm [32] as q8_0x8 (34 bytes) */
    im = build(&c);
    e = entry(&im, "layers.0.attn_norm");
    put32(im.d + e + 0x40, COL_DTYPE_Q8_0X8);
    put64(im.d + e + 0x70, 34);
    refresh(&im);
    expect("panel vector", &im, 0, COL_ERR_SHAPE, e + 0x44, "layers.0.attn_norm");
    free(im.d);

    /* nbytes are the row dtype's: attn_q [32, 32] q4_0x8 is 32 * 18 bytes, not one panel less */
    im = build(&c);
    e = entry(&im, "layers.0.attn_q");
    put64(im.d + e + 0x70, 24 * 18);
    refresh(&im);
    expect("panel nbytes", &im, 0, COL_ERR_SIZE_MISMATCH, e + 0x70, "layers.0.attn_q");
    free(im.d);

    /* a non-finite scale is found where the panel keeps it: attn_q [32, 32] q8_0x8 (one block a
     * row, 34-byte rows), row 11 = panel 1 (at 8 * 34), lane 3 (scale at 2 * 3); row 11's bytes in
     * row order (11 * 34) hold a payload byte of panel 1 instead, which must not be read as one */
    c = panels_cfg(COL_DTYPE_Q8_0X8);
    im = build(&c);
    e = entry(&im, "layers.0.attn_q");
    const uint64_t off = get64(im.d + e + 0x68), at = off + 8 * 34 + 2 * 3;
    im.d[at] = 0x00, im.d[at + 1] = 0x7C; /* f16 +Inf */
    im.d[off + 11 * 34] = 0x00, im.d[off + 11 * 34 + 1] = 0x7C; /* an int8 payload pair: not a scale */
    put32(im.d + e + 0x78, col_crc32(0, im.d + off, (size_t)get64(im.d + e + 0x70)));
    refresh(&im);
    expect("panel nan off", &im, COL_CHECK_CHECKSUMS, COL_OK, 0, "");
    expect("panel nan", &im, COL_CHECK_NONFINITE, COL_ERR_NONFINITE, at, "layers.0.attn_q");
    col_problem p[4];
    uint32_t n = 0;
    col_validate_buffer(im.d, im.size, COL_CHECK_NONFINITE, p, 4, &n);
    CHECK(n == 1 && strstr(p[0].message, "1 NaN/Inf values, first at the scale of row 11, block 0") != NULL);
    free(im.d);
}

/* ---- bf16 panels (dtype 9) ------------------------------------------------------------------- */

static void test_bf16_panels(void)
{
    /* every matrix of panels_cfg's shapes has rows % 16 == 0 (a vocabulary of 16) */
    cfg c = panels_cfg(COL_DTYPE_BF16X16);
    image im = build(&c);
    expect("bf16 panels", &im, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, COL_OK, 0, "");
    free(im.d);

    /* rows not a multiple of 16: a vocabulary of 24 gives token_embd [24, 32] */
    c.vocab = 24;
    im = build(&c);
    expect("bf16 panel rows", &im, 0, COL_ERR_SHAPE, entry(&im, "token_embd") + 0x48, "token_embd");
    free(im.d);

    /* columns in pairs: attn_q [32, 32] told it has 31 columns */
    c = panels_cfg(COL_DTYPE_BF16X16);
    im = build(&c);
    uint64_t e = entry(&im, "layers.0.attn_q");
    put64(im.d + e + 0x50, 31);
    refresh(&im);
    expect("bf16 panel columns", &im, 0, COL_ERR_SHAPE, e + 0x50, "layers.0.attn_q");
    free(im.d);

    /* a NaN is named by its row and column: attn_q [32, 32], row 17 (panel 1, lane 1), column 3
     * (pair 1, its odd element) is element 16 * 32 + 32 * 1 + 2 * 1 + 1 in storage order */
    im = build(&c);
    e = entry(&im, "layers.0.attn_q");
    const uint64_t off = get64(im.d + e + 0x68), at = off + 2 * (16 * 32 + 32 + 2 + 1);
    im.d[at] = 0xC0, im.d[at + 1] = 0x7F; /* bf16 NaN */
    put32(im.d + e + 0x78, col_crc32(0, im.d + off, (size_t)get64(im.d + e + 0x70)));
    refresh(&im);
    expect("bf16 panel nan", &im, COL_CHECK_NONFINITE, COL_ERR_NONFINITE, at, "layers.0.attn_q");
    col_problem p[4];
    uint32_t n = 0;
    col_validate_buffer(im.d, im.size, COL_CHECK_NONFINITE, p, 4, &n);
    CHECK(n == 1 && strstr(p[0].message, "1 NaN/Inf values, first at row 17, column 3 (stored in 16-row panels)") != NULL);
    free(im.d);
}

static void test_architecture(void)
{
    image im = build_mixtral();
    uint64_t e = entry(&im, "layers.0.moe_w3");
    im.d[e + 14] = '9';
    refresh(&im);
    expect("missing", &im, 0, COL_ERR_MISSING_TENSOR, im.table_off, "layers.0.moe_w3");
    col_problem p[8];
    uint32_t n = 0;
    col_validate_buffer(im.d, im.size, 0, p, 8, &n);
    CHECK(n == 2 && p[0].code == COL_ERR_UNKNOWN_TENSOR && p[0].severity == COL_SEVERITY_WARNING &&
          p[0].offset == e && strcmp(p[0].tensor, "layers.0.moe_w9") == 0);
    free(im.d);

    /* An extra, unknown tensor alone is a warning: the file stays valid. */
    im = build_mixtral();
    e = entry(&im, "output");
    memcpy(im.d + e, "outpux", 6);
    put32(im.d + 0x5C, get32(im.d + 0x5C) | COL_FLAG_TIED_EMBEDDINGS);
    refresh(&im);
    n = 0;
    CHECK(col_validate_buffer(im.d, im.size, 0, p, 8, &n) == COL_OK && n == 1 &&
          p[0].code == COL_ERR_UNKNOWN_TENSOR && p[0].offset == e);
    free(im.d);

    /* The transposed router: [H, E] instead of [E, H], same byte size. */
    im = build_mixtral();
    e = entry(&im, "layers.0.moe_gate");
    put64(im.d + e + 0x48, 8);
    put64(im.d + e + 0x50, 4);
    refresh(&im);
    expect("transposed gate", &im, 0, COL_ERR_SHAPE, e + 0x48, "layers.0.moe_gate");
    free(im.d);

    im = build_mixtral();
    put32(im.d + im.routing_off + 8, 0); /* gate_tensor -> token_embd */
    refresh(&im);
    expect("routing gate", &im, 0, COL_ERR_ROUTING, im.routing_off + 8, "layers.0.moe_gate");
    free(im.d);

    im = build_mixtral();
    put32(im.d + im.routing_off + 16, 3); /* top_k */
    refresh(&im);
    expect("routing top_k", &im, 0, COL_ERR_ROUTING, im.routing_off + 16, "");
    free(im.d);

    /* Layer turned dense in the routing section: the MoE tensors become unexpected and the
     * routing entry no longer matches the header's n_moe_layers. */
    im = build_mixtral();
    memset(im.d + im.routing_off + 4, 0, 4);
    put32(im.d + im.routing_off + 8, 0xFFFFFFFFu);
    memset(im.d + im.routing_off + 16, 0, 8);
    refresh(&im);
    expect("dense layer", &im, 0, COL_ERR_ROUTING, 0xBC, "");
    free(im.d);
}

/* Above 4096 tensors the check of every name for duplicates is off; duplicates of the architecture's names
 * are still caught (by the bitset of step 8). */
static void test_many_tensors(void)
{
    /* the largest table that still gets every name checked for duplicates */
    cfg c4 = mixtral_cfg();
    c4.n_extra = 4096 - 13;
    image big = build(&c4);
    CHECK(big.n_tensors == 4096);
    uint32_t nb = 0;
    CHECK(col_validate_buffer(big.d, big.size, 0, NULL, 0, &nb) == COL_OK && nb == 4083);
    /* two later copies of an unknown name: each an error at its own entry naming the first */
    uint64_t first = entry(&big, "extra.7");
    uint64_t copies[2] = {entry(&big, "extra.4000"), entry(&big, "extra.4082")};
    for (int k = 0; k < 2; k++) {
        memset(big.d + copies[k], 0, 64);
        memcpy(big.d + copies[k], "extra.7", 7);
    }
    refresh(&big);
    char want[96];
    snprintf(want, sizeof want, "tensor %u: name 'extra.7' duplicates tensor %u",
             (unsigned)((copies[0] - big.table_off) / 128), (unsigned)((first - big.table_off) / 128));
    col_problem *found = malloc(4096 * sizeof *found);
    CHECK(col_validate_buffer(big.d, big.size, 0, found, 4096, &nb) == COL_ERR_NAME && nb == 4085);
    uint32_t n_dup = 0;
    for (uint32_t i = 0; i < nb; i++)
        if (found[i].code == COL_ERR_NAME) {
            CHECK(n_dup < 2 && found[i].offset == copies[n_dup]);
            CHECK(n_dup > 0 || strcmp(found[i].message, want) == 0);
            n_dup++;
        }
    CHECK(n_dup == 2);
    free(found);
    free(big.d);

    cfg c = mixtral_cfg();
    c.n_extra = 5000;
    image im = build(&c);
    uint32_t n = 0;
    CHECK(col_validate_buffer(im.d, im.size, 3, NULL, 0, &n) == COL_OK && n == 5000);
    uint64_t e = entry(&im, "extra.77");
    memset(im.d + e, 0, 64);
    memcpy(im.d + e, "layers.0.attn_q", 15);
    put32(im.d + e + 0x44, 2); /* keep the byte size: [1, 1] */
    put64(im.d + e + 0x50, 1);
    refresh(&im);
    expect("duplicate, large table", &im, 0, COL_ERR_NAME, e, "layers.0.attn_q");
    free(im.d);
}

/* ---- Robustness ------------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Every prefix of a valid image is an error, and is read only inside its own bytes (each prefix
 * is copied to an exact-size heap block so AddressSanitizer sees any over-read). */
static void test_truncation_sweep(void)
{
    image im = build_mixtral();
    bool all = true;
    for (uint64_t cut = 0; cut < im.size; cut++) {
        uint8_t *p = malloc(cut ? cut : 1);
        memcpy(p, im.d, cut);
        uint32_t n = 0;
        int32_t rc = col_validate_buffer(p, cut, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, NULL, 0, &n);
        if (rc == COL_OK || n == 0) {
            all = false;
            fprintf(stderr, "  cut %llu accepted\n", (unsigned long long)cut);
        }
        free(p);
    }
    CHECK(all);
    free(im.d);
}

static void test_random_inputs(void)
{
    uint64_t s = 0x9E3779B97F4A7C15ull;
    col_problem p[16];
    bool all = true;
    for (int iter = 0; iter < 2000; iter++) {
        size_t n = (size_t)(rng_next(&s) % 2048);
        uint8_t *b = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++)
            b[i] = (uint8_t)rng_next(&s);
        if (iter % 2 && n >= 8) { /* get past the magic and version checks */
            memcpy(b, "COLI\1\0\0\0", 8);
        }
        uint32_t cnt = 0;
        all = all && col_validate_buffer(b, n, 3, p, 16, &cnt) != COL_OK;
        free(b);
    }
    CHECK(all);

    /* Mutations of a valid image with the CRCs repaired, to reach the deep checks. */
    image im = build_mixtral();
    uint8_t *b = malloc(im.size);
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(b, im.d, im.size);
        int flips = 1 + (int)(rng_next(&s) % 4);
        for (int f = 0; f < flips; f++) {
            uint64_t where = rng_next(&s) % (iter % 3 ? im.data_off : im.size);
            b[where] = (uint8_t)rng_next(&s);
        }
        image m = im;
        m.d = b;
        if (iter % 5)
            refresh(&m);
        uint32_t cnt = 0;
        (void)col_validate_buffer(b, im.size, 3, p, 16, &cnt);
    }
    free(b);
    free(im.d);
}

/* ---- Header fields --------------------------------------------------------------------------- */

static void test_header_fields(void)
{
    image im = build_mixtral();
    uint32_t n = col_header_field_count();
    col_field f;
    uint64_t next = 0;
    bool contiguous = true;
    for (uint32_t i = 0; i < n; i++) {
        CHECK(col_header_field(im.d, im.size, i, &f) == COL_OK);
        if (!f.in_version)
            continue; /* a version-2 field in a version-1 file */
        contiguous = contiguous && f.offset == next && f.present;
        next = f.offset + f.size;
        if (strcmp(f.name, "num_experts") == 0)
            CHECK(f.kind == COL_FIELD_U32 && f.u == 4);
        if (strcmp(f.name, "rope_theta") == 0)
            CHECK(f.kind == COL_FIELD_F64 && f.f == 10000.0);
        if (strcmp(f.name, "eos_token_id") == 0)
            CHECK(f.kind == COL_FIELD_I32 && f.i == 2);
        if (strcmp(f.name, "file_size") == 0)
            CHECK(f.kind == COL_FIELD_U64 && f.u == im.size);
        if (strcmp(f.name, "reserved") == 0)
            CHECK(f.kind == COL_FIELD_BYTES && f.size == 56);
    }
    CHECK(contiguous && next == 256);
    CHECK(col_header_field(im.d, im.size, n, &f) == COL_ERR_INVALID_ARG);

    /* version 2: the fields of its 512-byte header, and not version 1's reserved block */
    cfg c2 = as_v2(mixtral_cfg());
    image v = build(&c2);
    next = 0;
    contiguous = true;
    for (uint32_t i = 0; i < n; i++) {
        CHECK(col_header_field(v.d, v.size, i, &f) == COL_OK);
        if (!f.in_version)
            continue;
        contiguous = contiguous && f.offset == next && f.present;
        next = f.offset + f.size;
        if (strcmp(f.name, "attn_scale") == 0)
            CHECK(f.kind == COL_FIELD_F32 && f.f == 0.5);
        if (strcmp(f.name, "attention_chunk_size") == 0)
            CHECK(f.offset == 0x110 && f.kind == COL_FIELD_U32 && f.u == 0);
        if (strcmp(f.name, "reserved") == 0)
            CHECK(f.offset == 0x114 && f.size == 236); /* after the fields */
    }
    CHECK(contiguous && next == 512);
    free(v.d);
    CHECK(col_header_field(im.d, 0x0C, 3, &f) == COL_OK && f.present == 0 && f.u == 0);
    CHECK(col_header_field(im.d, 0x0C, 2, &f) == COL_OK && f.present == 1 && f.u == 4);
    CHECK(col_header_field(NULL, 0, 0, &f) == COL_OK && f.present == 0);
    free(im.d);
}

/* ---- col_model ------------------------------------------------------------------------------- */

static bool write_temp(const uint8_t *d, uint64_t n, char path[64])
{
    snprintf(path, 64, "/tmp/test_format_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        return false;
    bool ok = write(fd, d, (size_t)n) == (ssize_t)n;
    close(fd);
    return ok;
}

/* ---- Format version 2 ------------------------------------------------------------------------ */

/* DeepSeek-V3's rule on 4 experts, top-2: sigmoid + correction bias, 2 groups by their best two
 * with 1 kept, renormalised with +1e-20, scaled by 2.5; a plain shared expert. */
static cfg deepseek_v3_cfg(void)
{
    cfg c = as_v2(mixtral_cfg());
    c.arch = COL_ARCH_DEEPSEEK_V3;
    c.n_layers = 2;
    c.kinds[0] = COL_LAYER_DENSE;
    c.kinds[1] = COL_LAYER_MOE;
    c.d_ff_dense = 16;
    c.d_ff_shared = 8;
    c.rule.scoring = COL_SCORING_SIGMOID;
    c.rule.correction_bias_tensor = 1;
    c.rule.n_groups = 2;
    c.rule.n_groups_kept = 1;
    c.rule.group_score = COL_GROUP_TOP2_SUM;
    c.rule.normalize = COL_NORM_SUM;
    c.rule.norm_eps = 1e-20f;
    c.rule.scale = 2.5f;
    c.rule.shared = COL_SHARED_PLAIN;
    return c;
}

/* MLA: 2 heads of nope 4 + rope 2, latent 8, value heads of 6 (as tensor_list lays them out). */
static cfg mla_cfg(uint32_t q_lora)
{
    cfg c = deepseek_v3_cfg();
    c.mla = 1;
    c.n_kv_heads = c.n_heads;
    c.nope = 4;
    c.rope = 2;
    c.head_dim = 6;
    c.kv_lora = 8;
    c.q_lora = q_lora;
    return c;
}

static void test_v2_valid(void)
{
    cfg c = as_v2(mixtral_cfg());
    image im = build(&c);
    expect("v2 mixtral", &im, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, COL_OK, 0, "");
    free(im.d);

    cfg ds = deepseek_v3_cfg();
    im = build(&ds);
    expect("v2 deepseek-v3 rule", &im, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, COL_OK, 0, "");
    free(im.d);

    for (uint32_t q_lora = 0; q_lora <= 5; q_lora += 5) {
        cfg m = mla_cfg(q_lora);
        im = build(&m);
        expect(q_lora ? "v2 mla q_lora" : "v2 mla", &im, 0, COL_OK, 0, "");
        free(im.d);
    }
}

static void test_v2_problems(void)
{
    /* the header CRC of version 2 covers its fields after the CRCs */
    cfg c = deepseek_v3_cfg();
    image im = build(&c);
    im.d[0xE9] ^= 1;
    expect("v2 header crc", &im, 0, COL_ERR_CHECKSUM, 0xC0, "");
    free(im.d);

    /* a version-2 file shorter than its 512-byte header */
    im = build(&c);
    expect_at("v2 truncated header", im.d, 300, 0, COL_ERR_TRUNCATED, 300, "");
    free(im.d);

    /* the group limit must hold top_k: 4 groups of 1, 1 kept, top-2 */
    im = build(&c);
    uint64_t e1 = im.routing_off + 128;
    put32(im.d + e1 + 0x24, 4);
    put32(im.d + e1 + 0x2C, COL_GROUP_MAX);
    refresh(&im);
    expect("groups hold top_k", &im, 0, COL_ERR_ROUTING, e1 + 0x28, "");
    free(im.d);

    /* the correction bias must be named: an index to another tensor */
    im = build(&c);
    put32(im.d + e1 + 0x20, get32(im.d + e1 + 0x08));
    refresh(&im);
    expect("correction bias index", &im, 0, COL_ERR_ROUTING, e1 + 0x20, "layers.1.moe_correction_bias");
    free(im.d);

    /* a dense layer's entry states no rule */
    im = build(&c);
    putf32(im.d + im.routing_off + 0x3C, 1.0f);
    refresh(&im);
    expect("dense entry with a scale", &im, 0, COL_ERR_ROUTING, im.routing_off + 0x3C, "");
    free(im.d);

    /* MLA: a missing latent projection, and n_kv_heads that is not n_heads */
    cfg m = mla_cfg(0);
    im = build(&m);
    uint64_t kv = entry(&im, "layers.0.attn_kv_a");
    memcpy(im.d + kv, "layers.0.attn_kv_x", 19);
    refresh(&im);
    expect("mla missing kv_a", &im, 0, COL_ERR_MISSING_TENSOR, im.table_off, "layers.0.attn_kv_a");
    free(im.d);
    im = build(&m);
    put32(im.d + 0x68, 1);
    refresh(&im);
    expect("mla kv heads", &im, 0, COL_ERR_HEADER, 0x68, "");
    free(im.d);

    /* version 1's header flags are refused in version 2 */
    im = build(&c);
    put32(im.d + 0x5C, COL_FLAG_NORM_TOPK);
    refresh(&im);
    expect("v1 flag in v2", &im, 0, COL_ERR_HEADER, 0x5C, "");
    free(im.d);
}

/* What col_model_open decodes from a version-2 file, and from a version-1 file the rule version 1
 * means: the forward pass reads the same struct for both. */
static void test_v2_decoded_rules(void)
{
    char path[64];
    col_model *m = NULL;
    col_problem pr;
    cfg c = deepseek_v3_cfg();
    image im = build(&c);
    CHECK(write_temp(im.d, im.size, path));
    CHECK(col_model_open(path, &m, &pr) == COL_OK && m != NULL);
    if (m) {
        col_routing_info r;
        CHECK(col_model_routing(m, 1, &r) == COL_OK && r.kind == COL_LAYER_MOE &&
              r.scoring == COL_SCORING_SIGMOID && r.n_groups == 2 && r.n_groups_kept == 1 &&
              r.group_score == COL_GROUP_TOP2_SUM && r.normalize == COL_NORM_SUM && r.norm_eps == 1e-20f &&
              r.scale == 2.5f && r.shared == COL_SHARED_PLAIN && r.gate_bias_tensor == COL_NO_TENSOR);
        uint32_t idx = 0;
        CHECK(col_model_find_tensor(m, "layers.1.moe_correction_bias", &idx) == COL_OK &&
              r.correction_bias_tensor == idx);
        CHECK(m->layers[1].moe_correction_bias == &m->tensors[idx] && m->layers[1].route == &m->routing[1]);
        CHECK(m->layers[1].shared_w1 && m->layers[1].shared_gate == NULL);
        CHECK(m->n_chosen_groups == 1);
        char text[512];
        CHECK(col_routing_describe(&r, text, sizeof text) == COL_OK);
        CHECK(strcmp(text, "sigmoid over 4 experts, + correction bias for the choice only, top-2 within the 1 best "
                           "of 2 groups (by the sum of their best two), divided by their sum + 1e-20, times 2.5; "
                           "plus a shared expert") == 0);
        CHECK(col_routing_describe(&r, text, 8) == COL_OK && strlen(text) == 7); /* truncated, terminated */
        CHECK(col_routing_describe(&r, text, 0) == COL_ERR_INVALID_ARG);
        col_hparams hp;
        CHECK(col_model_hparams(m, &hp) == COL_OK && hp.version == 2 && hp.attn_scale == 0.5f &&
              hp.rotary_dim == 4 && hp.v_head_dim == 4 && hp.attention == COL_ATTENTION_GQA);
        col_model_close(m);
    }
    unlink(path);
    free(im.d);

    cfg v1 = mixtral_cfg();
    v1.flags = COL_FLAG_NORM_TOPK | COL_FLAG_SHARED_EXPERT | COL_FLAG_SHARED_EXPERT_GATE;
    v1.d_ff_shared = 8;
    im = build(&v1);
    CHECK(write_temp(im.d, im.size, path));
    m = NULL;
    CHECK(col_model_open(path, &m, &pr) == COL_OK && m != NULL);
    if (m) {
        col_routing_info r;
        CHECK(col_model_routing(m, 0, &r) == COL_OK && r.scoring == COL_SCORING_SOFTMAX &&
              r.select_on == COL_SELECT_SCORES && r.n_groups == 1 && r.normalize == COL_NORM_SUM &&
              r.scale == 1.0f && r.shared == COL_SHARED_SIGMOID_GATE &&
              r.correction_bias_tensor == COL_NO_TENSOR && r.attention == COL_LAYER_FULL);
        col_hparams hp;
        CHECK(col_model_hparams(m, &hp) == COL_OK && hp.version == 1 && hp.attn_scale == 0.5f &&
              hp.rotary_dim == 4 && hp.v_head_dim == 4 && hp.rope_attn_factor == 1.0f);
        CHECK(m->n_chosen_groups == 0);
        col_model_close(m);
    }
    unlink(path);
    free(im.d);

    cfg mla = mla_cfg(5);
    im = build(&mla);
    CHECK(write_temp(im.d, im.size, path));
    m = NULL;
    CHECK(col_model_open(path, &m, &pr) == COL_OK && m != NULL);
    if (m) {
        const struct col_layer *l = &m->layers[0];
        CHECK(l->attn_q == NULL && l->attn_q_a && l->attn_q_a_norm && l->attn_q_b && l->attn_kv_a &&
              l->attn_kv_a_norm && l->attn_k_b && l->attn_v_b && l->attn_k == NULL && l->attn_v == NULL);
        col_model_close(m);
    }
    unlink(path);
    free(im.d);
}

static void test_model_open(void)
{
    char path[64];
    col_model *m = NULL;
    col_problem pr;

    cfg c = mixtral_cfg();
    c.arch = COL_ARCH_QWEN2_MOE;
    c.flags = COL_FLAG_SHARED_EXPERT | COL_FLAG_SHARED_EXPERT_GATE | COL_FLAG_QKV_BIAS |
              COL_FLAG_TIED_EMBEDDINGS;
    c.n_layers = 2;
    c.kinds[0] = COL_LAYER_DENSE;
    c.kinds[1] = COL_LAYER_MOE;
    c.d_ff_dense = 16;
    c.d_ff_shared = 12;
    c.tokenizer = "{\"model\":{}}";
    image im = build(&c);
    CHECK(write_temp(im.d, im.size, path));
    CHECK(col_model_open(path, &m, &pr) == COL_OK && m != NULL);
    if (m) {
        col_hparams hp;
        CHECK(col_model_hparams(m, &hp) == COL_OK && hp.n_layers == 2 && hp.n_moe_layers == 1 &&
              hp.d_ff_shared == 12 && hp.bos_token_id == 1 && hp.rope_theta == 10000.0);
        CHECK(col_model_tensor_count(m) == im.n_tensors);
        uint32_t idx = 0;
        col_tensor_info t;
        CHECK(col_model_find_tensor(m, "layers.1.moe_gate", &idx) == COL_OK);
        CHECK(col_model_tensor(m, idx, &t) == COL_OK && strcmp(t.name, "layers.1.moe_gate") == 0 &&
              t.shape[0] == 4 && t.shape[1] == 8 && t.table_offset == entry(&im, t.name));
        uint64_t size = 0;
        const uint8_t *base = col_model_bytes(m, &size);
        CHECK(size == im.size && memcmp(base, im.d, (size_t)size) == 0);
        CHECK(t.data == base + t.offset);
        CHECK(col_model_find_tensor(m, "nope", &idx) == COL_ERR_MISSING_TENSOR);
        CHECK(col_model_tensor(m, im.n_tensors, &t) == COL_ERR_INVALID_ARG);
        col_routing_info r;
        CHECK(col_model_routing(m, 1, &r) == COL_OK && r.kind == COL_LAYER_MOE && r.top_k == 2 &&
              r.gate_tensor == idx);
        CHECK(col_model_routing(m, 0, &r) == COL_OK && r.kind == COL_LAYER_DENSE &&
              r.gate_tensor == COL_NO_TENSOR);
        CHECK(col_model_routing(m, 2, &r) == COL_ERR_INVALID_ARG);
        CHECK(col_model_tokenizer(m, &size) != NULL && size == strlen(c.tokenizer));
        CHECK(col_model_metadata(m, &size) != NULL && size > 0);
        uint32_t n = 9;
        CHECK(col_model_check_tensor(m, idx, 3, NULL, 0, &n) == COL_OK && n == 0);

        /* the internal tables the forward pass reads */
        const struct col_layer *l0 = &m->layers[0], *l1 = &m->layers[1];
        CHECK(l0->kind == COL_LAYER_DENSE && l0->mlp_w2 && l0->moe_gate == NULL && l0->attn_q_bias);
        CHECK(l1->kind == COL_LAYER_MOE && l1->moe_index == 0 && l1->moe_gate == &m->tensors[idx] &&
              l1->shared_gate && l1->shared_w3 && l1->mlp_w1 == NULL && l1->attn_q_norm == NULL);
        CHECK(m->moe_layers[0] == 1 && m->output == m->token_embd && m->output_norm);
        col_model_close(m);
    }
    unlink(path);

    /* A corrupted data byte opens (structural checks only) but fails the tensor check. */
    uint64_t e = entry(&im, "layers.0.mlp_w1"), off = get64(im.d + e + 0x68);
    im.d[off] ^= 0x40;
    CHECK(write_temp(im.d, im.size, path));
    m = NULL;
    CHECK(col_model_open(path, &m, &pr) == COL_OK && m);
    if (m) {
        uint32_t idx = 0, n = 0;
        col_problem p[2];
        CHECK(col_model_find_tensor(m, "layers.0.mlp_w1", &idx) == COL_OK);
        CHECK(col_model_check_tensor(m, idx, COL_CHECK_CHECKSUMS, p, 2, &n) == COL_ERR_CHECKSUM &&
              n == 1 && p[0].offset == off && strcmp(p[0].tensor, "layers.0.mlp_w1") == 0);
        col_model_close(m);
    }
    unlink(path);
    free(im.d);

    /* Absurd tensor_count: refused with LIMIT before anything is allocated. */
    im = build_mixtral();
    put32(im.d + 0x14, 0xFFFFFFFFu);
    refresh(&im);
    CHECK(write_temp(im.d, im.size, path));
    m = (col_model *)&pr; /* must be reset to NULL */
    CHECK(col_model_open(path, &m, &pr) == COL_ERR_LIMIT && m == NULL && pr.offset == 0x14);
    unlink(path);

    /* First error, not the first warning, is returned. */
    e = entry(&im, "layers.0.moe_w3");
    put32(im.d + 0x14, im.n_tensors);
    im.d[e + 14] = '9';
    refresh(&im);
    CHECK(write_temp(im.d, im.size, path));
    CHECK(col_model_open(path, &m, &pr) == COL_ERR_MISSING_TENSOR && m == NULL &&
          strcmp(pr.tensor, "layers.0.moe_w3") == 0);
    unlink(path);
    free(im.d);

    /* Empty and missing files. */
    CHECK(write_temp((const uint8_t *)"", 0, path));
    CHECK(col_model_open(path, &m, &pr) == COL_ERR_TRUNCATED && m == NULL);
    uint32_t n = 0;
    col_problem p[1];
    CHECK(col_validate_file(path, 0, p, 1, &n) == COL_ERR_TRUNCATED && n == 1 &&
          p[0].code == COL_ERR_TRUNCATED);
    unlink(path);
    CHECK(col_validate_file("/nonexistent/x.colibri", 0, p, 1, &n) == COL_ERR_IO && n == 1 &&
          p[0].code == COL_ERR_IO);
    CHECK(col_model_open("/nonexistent/x.colibri", &m, &pr) == COL_ERR_IO && m == NULL);
    col_model_close(NULL);
}

/* col_model_open_report: one validation pass keeps every finding, the same ones
 * col_validate_buffer lists, and col_model_open_ex's first error is the first of them. */
static void test_model_open_report(void)
{
    char path[64];
    col_model *m = NULL;
    col_problem p[8], q[8], first;
    uint32_t n = 99, nq = 0;

    /* A valid file with two unknown tensors opens; its two warnings come with it. */
    cfg c = mixtral_cfg();
    c.n_extra = 2;
    image im = build(&c);
    CHECK(write_temp(im.d, im.size, path));
    CHECK(col_model_open_report(path, NULL, &m, p, 8, &n) == COL_OK && m != NULL && n == 2);
    CHECK(p[0].code == COL_ERR_UNKNOWN_TENSOR && p[0].severity == COL_SEVERITY_WARNING &&
          strcmp(p[0].tensor, "extra.0") == 0 && p[1].code == COL_ERR_UNKNOWN_TENSOR);
    col_model_close(m);
    unlink(path);

    /* Two errors and a warning: every one, in validation order, and nothing opened. */
    uint64_t e = entry(&im, "layers.0.moe_w3");
    im.d[e + 14] = '9';                                   /* a missing tensor, an unknown one */
    put32(im.d + 0x74, 0);                                /* max_context 0 */
    refresh(&im);
    CHECK(write_temp(im.d, im.size, path));
    m = (col_model *)p; /* must be reset to NULL */
    int32_t rc = col_model_open_report(path, NULL, &m, p, 8, &n);
    int32_t vrc = col_validate_buffer(im.d, im.size, 0, q, 8, &nq);
    CHECK(rc == vrc && rc != COL_OK && m == NULL && n == nq && n >= 3);
    for (uint32_t i = 0; i < n && i < 8; i++)
        CHECK(p[i].code == q[i].code && p[i].severity == q[i].severity &&
              p[i].offset == q[i].offset && strcmp(p[i].message, q[i].message) == 0);
    bool warned = false;
    for (uint32_t i = 0; i < n && i < 8; i++)
        warned |= p[i].severity == COL_SEVERITY_WARNING;
    CHECK(warned);
    CHECK(col_model_open_ex(path, NULL, &m, &first) == rc && m == NULL && first.code == rc &&
          first.offset == p[0].offset && strcmp(first.message, p[0].message) == 0);
    /* A short array still gets the count of every finding. */
    CHECK(col_model_open_report(path, NULL, &m, p, 1, &n) == rc && n == nq && p[0].code == rc);
    CHECK(col_model_open_report(path, NULL, &m, NULL, 0, &n) == rc && n == nq);
    unlink(path);
    free(im.d);

    /* A file that cannot be opened: one finding saying why. */
    CHECK(col_model_open_report("/nonexistent/x.colibri", NULL, &m, p, 8, &n) == COL_ERR_IO &&
          m == NULL && n == 1 && p[0].code == COL_ERR_IO && strstr(p[0].message, "/nonexistent"));
    CHECK(write_temp((const uint8_t *)"", 0, path));
    CHECK(col_model_open_report(path, NULL, &m, p, 8, &n) == COL_ERR_TRUNCATED && n == 1);
    unlink(path);
    CHECK(col_model_open_report(path, NULL, NULL, p, 8, &n) == COL_ERR_INVALID_ARG && n == 1);
}

/* col_model_section: the regions of the file as the builder laid them out. */
static void test_model_sections(void)
{
    char path[64];
    col_model *m = NULL;
    col_problem pr;
    cfg c = mixtral_cfg();
    c.tokenizer = "{\"model\":{}}";
    image im = build(&c);
    CHECK(write_temp(im.d, im.size, path));
    CHECK(col_model_open(path, &m, &pr) == COL_OK && m);
    CHECK(col_model_section_count() == 6);
    if (m) {
        col_section sec[6];
        for (uint32_t i = 0; i < 6; i++)
            CHECK(col_model_section(m, i, &sec[i]) == COL_OK);
        uint64_t tok_size = 0, meta_size = 0;
        const uint8_t *tok = col_model_tokenizer(m, &tok_size), *meta = col_model_metadata(m, &meta_size);
        CHECK(strcmp(sec[0].name, "header") == 0 && sec[0].offset == 0 && sec[0].size == 256);
        CHECK(strcmp(sec[1].name, "routing") == 0 && sec[1].offset == im.routing_off &&
              sec[1].size == 32u * im.n_layers);
        CHECK(strcmp(sec[2].name, "tensor_table") == 0 && sec[2].offset == im.table_off &&
              sec[2].size == 128u * im.n_tensors);
        CHECK(strcmp(sec[3].name, "tokenizer") == 0 && sec[3].offset == get64(im.d + 0x30) &&
              sec[3].size == tok_size && sec[3].size == strlen(c.tokenizer) &&
              tok == col_model_bytes(m, NULL) + sec[3].offset);
        CHECK(strcmp(sec[4].name, "metadata") == 0 && sec[4].offset == get64(im.d + 0x40) &&
              sec[4].size == meta_size && meta_size > 0 &&
              meta == col_model_bytes(m, NULL) + sec[4].offset);
        CHECK(strcmp(sec[5].name, "data") == 0 && sec[5].offset == im.data_off &&
              sec[5].offset + sec[5].size == im.size);
        CHECK(col_model_section(m, 6, &sec[0]) == COL_ERR_INVALID_ARG);
        CHECK(col_model_section(m, 0, NULL) == COL_ERR_INVALID_ARG);
        col_model_close(m);
    }
    unlink(path);
    free(im.d);

    /* Without a tokenizer its section is empty at offset 0. */
    im = build_mixtral();
    CHECK(write_temp(im.d, im.size, path));
    CHECK(col_model_open(path, &m, &pr) == COL_OK && m);
    if (m) {
        col_section sec;
        CHECK(col_model_section(m, 3, &sec) == COL_OK && sec.offset == 0 && sec.size == 0);
        col_model_close(m);
    }
    unlink(path);
    free(im.d);
}

static void test_misc(void)
{
    CHECK(col_abi_version() == COL_ABI_VERSION);
    CHECK(strcmp(col_status_name(COL_ERR_SHAPE), "COL_ERR_SHAPE") == 0);
    CHECK(strcmp(col_status_name(COL_ERR_UNKNOWN_TENSOR), "COL_ERR_UNKNOWN_TENSOR") == 0);
    CHECK(col_status_name(-1) != NULL && col_status_name(1000) != NULL);
    CHECK(col_dtype_size(COL_DTYPE_F32) == 4 && col_dtype_size(COL_DTYPE_BF16) == 2 &&
          col_dtype_size(3) == 0);
    CHECK(col_dtype_row_bytes(COL_DTYPE_Q8_0X8, 64) == 68 && col_dtype_row_bytes(COL_DTYPE_Q4_0X8, 64) == 36 &&
          col_dtype_row_bytes(COL_DTYPE_Q4_0X8, 48) == 0 && col_dtype_size(COL_DTYPE_Q8_0X8) == 0);
}

int main(void)
{
    test_crc32();
    test_misc();
    test_valid();
    test_identity();
    test_limits();
    test_checksums();
    test_nonfinite();
    test_hparams();
    test_sections();
    test_tensor_entries();
    test_architecture();
    test_panels_valid();
    test_panels_problems();
    test_bf16_panels();
    test_many_tensors();
    test_header_fields();
    test_v2_valid();
    test_v2_problems();
    test_v2_decoded_rules();
    test_model_open();
    test_model_open_report();
    test_model_sections();
    test_truncation_sweep();
    test_random_inputs();
    return TEST_REPORT();
}
