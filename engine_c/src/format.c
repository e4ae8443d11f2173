/*
 * format.c - everything about reading a .colibri file: the structural validator, the
 * header-field iterator, and col_model (open, accessors, close). Checksums use col_crc32
 * (crc32.c).
 *
 * This is the one place that trusts no byte. Every integer is read with explicit little-endian
 * byte composition (so the reader is correct on any host and never does an unaligned load), every
 * offset and size is checked with overflow-safe arithmetic against the real buffer size before it
 * is used, and the validator allocates nothing, so it can be pointed at any bytes (a fuzzer, a
 * GUI's half-written file) from any thread. col_model_open runs the same validator and only then
 * allocates the decoded tables the forward pass reads; no pointer into the mapping is handed out
 * before the check that makes it safe. The checks follow the numbered order of docs/format.md,
 * and every finding names the absolute byte offset of the field, table entry or data byte it is
 * about, so the Inspector can jump straight to it.
 */
#if defined(__linux__)
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#endif
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- Little-endian readers ------------------------------------------------------------------ */

/* Byte composition rather than memcpy into a host integer: correct on big-endian hosts too, and
 * compilers turn it into one load on little-endian ones. */
static uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static float rdf32(const uint8_t *p)
{
    uint32_t u = rd32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double rdf64(const uint8_t *p)
{
    uint64_t u = rd64(p);
    double f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* True when [off, off+len) lies inside [0, limit); never overflows. */
static bool range_ok(uint64_t off, uint64_t len, uint64_t limit)
{
    return off <= limit && len <= limit - off;
}

/* ---- Small public helpers -------------------------------------------------------------------- */

uint32_t col_abi_version(void) { return COL_ABI_VERSION; }

uint32_t col_dtype_size(uint32_t dtype)
{
    switch (dtype) {
    case COL_DTYPE_F32: return 4;
    case COL_DTYPE_F16: return 2;
    case COL_DTYPE_BF16: return 2;
    case COL_DTYPE_BF16X16: return 2;
    default: return 0; /* also the block dtypes: they have no per-element size */
    }
}

/* Bytes of one quantised block of 32 elements (f16 scale + payload), 0 for element dtypes; a
 * panel dtype's blocks are its row dtype's, rearranged. */
static uint32_t block_bytes(uint32_t dtype)
{
    if (dtype == COL_DTYPE_Q8_0 || dtype == COL_DTYPE_Q8_0X8) return 34;
    return dtype == COL_DTYPE_Q4_0 || dtype == COL_DTYPE_Q4_0X8 ? 18 : 0;
}

uint64_t col_dtype_row_bytes(uint32_t dtype, uint64_t n)
{
    uint32_t bb = block_bytes(dtype);
    if (bb) return n % 32 ? 0 : n / 32 * bb;
    return n * col_dtype_size(dtype);
}

static const char *const status_names[] = {
    "COL_OK", "COL_ERR_IO", "COL_ERR_NOMEM", "COL_ERR_INVALID_ARG", "COL_ERR_TRUNCATED",
    "COL_ERR_BAD_MAGIC", "COL_ERR_BAD_VERSION", "COL_ERR_LIMIT", "COL_ERR_HEADER",
    "COL_ERR_SECTION_BOUNDS", "COL_ERR_TENSOR_BOUNDS", "COL_ERR_MISALIGNED",
    "COL_ERR_SIZE_MISMATCH", "COL_ERR_OVERLAP", "COL_ERR_MISSING_TENSOR", "COL_ERR_SHAPE",
    "COL_ERR_DTYPE", "COL_ERR_NAME", "COL_ERR_CHECKSUM", "COL_ERR_NONFINITE",
    "COL_ERR_UNSUPPORTED", "COL_ERR_ROUTING", "COL_ERR_CONTEXT_FULL", "COL_ERR_BAD_TOKEN",
    "COL_ERR_UNKNOWN_TENSOR", "COL_ERR_FILE_CHANGED",
};

const char *col_status_name(int32_t status)
{
    if (status < 0 || (size_t)status >= sizeof status_names / sizeof status_names[0])
        return "COL_ERR_UNKNOWN_STATUS";
    return status_names[status];
}

/* ---- Problem collection ---------------------------------------------------------------------- */

/* Findings go to the caller's array up to its capacity and are counted beyond it. The first
 * error is also kept aside so col_model_open can return it even when the array holds nothing. */
typedef struct sink {
    col_problem *problems;
    uint32_t max;
    uint32_t count;
    int32_t first_error;     /* COL_OK until an error-severity finding */
    col_problem first;
} sink;

static void sink_init(sink *s, col_problem *problems, uint32_t max)
{
    memset(s, 0, sizeof *s);
    s->problems = problems;
    s->max = problems ? max : 0;
}

/* Copy a possibly hostile name field (64 bytes) into printable text for messages. */
static void printable_name(const uint8_t *field, char out[COL_TENSOR_NAME_MAX])
{
    size_t i = 0;
    for (; i < COL_TENSOR_NAME_MAX - 1 && field[i]; i++)
        out[i] = (field[i] >= 0x20 && field[i] < 0x7F) ? (char)field[i] : '?';
    out[i] = '\0';
}

#if defined(__GNUC__)
__attribute__((format(printf, 6, 7)))
#endif
static void report(sink *s, int32_t code, int32_t severity, uint64_t offset, const char *tensor,
                   const char *fmt, ...)
{
    bool keep = s->count < s->max;
    bool first = severity == COL_SEVERITY_ERROR && s->first_error == COL_OK;
    if (s->count < UINT32_MAX)
        s->count++;
    if (!keep && !first)
        return;
    col_problem p;
    memset(&p, 0, sizeof p);
    p.code = code;
    p.severity = severity;
    p.offset = offset;
    if (tensor)
        snprintf(p.tensor, sizeof p.tensor, "%s", tensor);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p.message, sizeof p.message, fmt, ap);
    va_end(ap);
    if (keep)
        s->problems[s->count - 1] = p;
    if (first) {
        s->first_error = code;
        s->first = p;
    }
}

#define ERR(s, code, off, tensor, ...) report((s), (code), COL_SEVERITY_ERROR, (off), (tensor), __VA_ARGS__)

/* ---- Header decoding ------------------------------------------------------------------------- */

enum {
    H_MAGIC = 0x000, H_VERSION = 0x004, H_NUM_EXPERTS = 0x008, H_NUM_LAYERS = 0x00C,
    H_HEADER_SIZE = 0x010, H_TENSOR_COUNT = 0x014, H_ROUTING_OFFSET = 0x018,
    H_DATA_OFFSET = 0x020, H_TABLE_OFFSET = 0x028, H_TOKENIZER_OFFSET = 0x030,
    H_TOKENIZER_SIZE = 0x038, H_METADATA_OFFSET = 0x040, H_METADATA_SIZE = 0x048,
    H_FILE_SIZE = 0x050, H_ARCH = 0x058, H_FLAGS = 0x05C, H_D_MODEL = 0x060, H_N_HEADS = 0x064,
    H_N_KV_HEADS = 0x068, H_HEAD_DIM = 0x06C, H_VOCAB = 0x070, H_MAX_CONTEXT = 0x074,
    H_D_FF_EXPERT = 0x078, H_D_FF_DENSE = 0x07C, H_D_FF_SHARED = 0x080, H_TOPK = 0x084,
    H_SLIDING_WINDOW = 0x088, H_ROPE_TYPE = 0x08C, H_ROPE_THETA = 0x090, H_ROPE_FACTOR = 0x098,
    H_ROPE_ORIG_CTX = 0x09C, H_ROPE_LOW = 0x0A0, H_ROPE_HIGH = 0x0A4, H_NORM_EPS = 0x0A8,
    H_CLIP_QKV = 0x0AC, H_DEFAULT_EPS = 0x0B0, H_BOS = 0x0B4, H_EOS = 0x0B8,
    H_N_MOE_LAYERS = 0x0BC, H_HEADER_CRC = 0x0C0, H_TABLES_CRC = 0x0C4, H_RESERVED = 0x0C8,
    /* version 2 */
    H_ATTENTION = 0x0C8, H_Q_LORA = 0x0CC, H_KV_LORA = 0x0D0, H_QK_NOPE = 0x0D4, H_QK_ROPE = 0x0D8,
    H_V_HEAD = 0x0DC, H_ROTARY_DIM = 0x0E0, H_ROPE_LAYOUT = 0x0E4, H_ATTN_SCALE = 0x0E8,
    H_LATENT_EPS = 0x0EC, H_ROPE_ATTN_FACTOR = 0x0F0, H_ROPE_BETA_FAST = 0x0F4,
    H_ROPE_BETA_SLOW = 0x0F8, H_ROPE_TRUNCATE = 0x0FC, H_NORM_KIND = 0x100,
    H_EMBEDDING_SCALE = 0x104, H_RESIDUAL_SCALE = 0x108, H_LOGIT_DIVISOR = 0x10C, H_CHUNK = 0x110,
    H_RESERVED_V2 = 0x114
};

/* Tensor table entry and routing entry field offsets. */
enum { T_NAME = 0x00, T_DTYPE = 0x40, T_NDIM = 0x44, T_SHAPE = 0x48, T_OFFSET = 0x68,
       T_NBYTES = 0x70, T_CRC = 0x78 };
enum { R_LAYER = 0x00, R_KIND = 0x04, R_GATE = 0x08, R_GATE_BIAS = 0x0C, R_TOPK = 0x10,
       R_N_EXPERTS = 0x14, R_SCORING = 0x18,
       /* version 2 */
       R_SELECT_ON = 0x1C, R_CORRECTION = 0x20, R_N_GROUPS = 0x24, R_GROUPS_KEPT = 0x28,
       R_GROUP_SCORE = 0x2C, R_NORMALIZE = 0x30, R_NORM_EPS = 0x34, R_NORM_P = 0x38, R_SCALE = 0x3C,
       R_SHARED = 0x40, R_SPARSEMIXER_EPS = 0x44, R_ATTENTION = 0x48, R_SINKS = 0x4C, R_EXPERT_BIAS = 0x50,
       R_ACTIVATION = 0x54, R_ACT_ALPHA = 0x58, R_ACT_LIMIT = 0x5C, R_WEIGHT_INPUTS = 0x60, R_NO_ROPE = 0x64,
       R_QK_L2_NORM = 0x68, R_TEMP_FLOOR = 0x6C, R_TEMP_SCALE = 0x70, R_RESERVED = 0x74 };

#define MAX_EXPERTS 4096u
#define MAX_LAYERS 1024u
#define MAX_TENSORS 1048576u
#define MAX_HEADER_SIZE 65536u
/* Beyond this many tensors the check of every name for duplicates would need more than a
 * stack-sized hash table (the validator allocates nothing); duplicates among the names the
 * architecture uses are still caught by the bitset of step 8, and only duplicated unknown names
 * go unreported. */
#define DUP_CHECK_ALL_MAX 4096u
#define DUP_CHECK_SLOTS (2u * DUP_CHECK_ALL_MAX)   /* a power of two; 16 KiB of uint16 indices */
#define DUP_SLOT_EMPTY 0xFFFFu
_Static_assert(DUP_CHECK_ALL_MAX < DUP_SLOT_EMPTY, "a table index must fit a slot below the empty mark");

/* The fixed header and routing entry of a format version (2 for 2, else version 1's). */
static uint32_t header_size_of(uint32_t version) { return version == 2 ? COL_HEADER_SIZE_V2 : COL_HEADER_SIZE; }
static uint32_t entry_size_of(uint32_t version) { return version == 2 ? COL_ROUTING_ENTRY_SIZE_V2 : COL_ROUTING_ENTRY_SIZE; }

/* Caller guarantees d has at least header_size_of(version) bytes. */
static void decode_hparams(const uint8_t *d, col_hparams *hp)
{
    memset(hp, 0, sizeof *hp);
    hp->version = rd32(d + H_VERSION);
    hp->arch = rd32(d + H_ARCH);
    hp->flags = rd32(d + H_FLAGS);
    hp->n_layers = rd32(d + H_NUM_LAYERS);
    hp->n_experts = rd32(d + H_NUM_EXPERTS);
    hp->n_experts_active = rd32(d + H_TOPK);
    hp->n_moe_layers = rd32(d + H_N_MOE_LAYERS);
    hp->d_model = rd32(d + H_D_MODEL);
    hp->n_heads = rd32(d + H_N_HEADS);
    hp->n_kv_heads = rd32(d + H_N_KV_HEADS);
    hp->head_dim = rd32(d + H_HEAD_DIM);
    hp->vocab_size = rd32(d + H_VOCAB);
    hp->max_context = rd32(d + H_MAX_CONTEXT);
    hp->d_ff_expert = rd32(d + H_D_FF_EXPERT);
    hp->d_ff_dense = rd32(d + H_D_FF_DENSE);
    hp->d_ff_shared = rd32(d + H_D_FF_SHARED);
    hp->sliding_window = rd32(d + H_SLIDING_WINDOW);
    hp->rope_type = rd32(d + H_ROPE_TYPE);
    hp->rope_original_max_context = rd32(d + H_ROPE_ORIG_CTX);
    hp->bos_token_id = (int32_t)rd32(d + H_BOS);
    hp->eos_token_id = (int32_t)rd32(d + H_EOS);
    hp->rope_theta = rdf64(d + H_ROPE_THETA);
    hp->rope_factor = rdf32(d + H_ROPE_FACTOR);
    hp->rope_low_freq_factor = rdf32(d + H_ROPE_LOW);
    hp->rope_high_freq_factor = rdf32(d + H_ROPE_HIGH);
    hp->norm_eps = rdf32(d + H_NORM_EPS);
    hp->clip_qkv = rdf32(d + H_CLIP_QKV);
    hp->default_epsilon = rdf32(d + H_DEFAULT_EPS);
    if (hp->version != 2) { /* what version 1 means by the fields it does not have */
        hp->attention = COL_ATTENTION_GQA;
        hp->v_head_dim = hp->head_dim;
        hp->rotary_dim = hp->head_dim;
        hp->rope_layout = COL_ROPE_HALVES;
        hp->attn_scale = (float)(1.0 / sqrt((double)hp->head_dim));
        hp->rope_attn_factor = 1.0f;
        return;
    }
    hp->attention = rd32(d + H_ATTENTION);
    hp->q_lora_rank = rd32(d + H_Q_LORA);
    hp->kv_lora_rank = rd32(d + H_KV_LORA);
    hp->qk_nope_head_dim = rd32(d + H_QK_NOPE);
    hp->qk_rope_head_dim = rd32(d + H_QK_ROPE);
    hp->v_head_dim = rd32(d + H_V_HEAD);
    hp->rotary_dim = rd32(d + H_ROTARY_DIM);
    hp->rope_layout = rd32(d + H_ROPE_LAYOUT);
    hp->attn_scale = rdf32(d + H_ATTN_SCALE);
    hp->latent_norm_eps = rdf32(d + H_LATENT_EPS);
    hp->rope_attn_factor = rdf32(d + H_ROPE_ATTN_FACTOR);
    hp->rope_beta_fast = rdf32(d + H_ROPE_BETA_FAST);
    hp->rope_beta_slow = rdf32(d + H_ROPE_BETA_SLOW);
    hp->rope_truncate = rd32(d + H_ROPE_TRUNCATE);
    hp->norm_kind = rd32(d + H_NORM_KIND);
    hp->embedding_scale = rdf32(d + H_EMBEDDING_SCALE);
    hp->residual_scale = rdf32(d + H_RESIDUAL_SCALE);
    hp->logit_divisor = rdf32(d + H_LOGIT_DIVISOR);
    hp->attention_chunk_size = rd32(d + H_CHUNK);
}

/* What the validator learned about the file's layout, and which regions are safe to read. */
typedef struct layout {
    const uint8_t *d;
    uint64_t size;           /* bytes really present */
    uint64_t end;            /* min(size, file_size): tensor data must end by here */
    uint32_t version;        /* 1 or 2 (anything else stops the validator at step 1) */
    uint32_t header_size;    /* the declared one if valid, else the version's */
    uint32_t entry_size;     /* bytes per routing entry: 32 (v1), 128 (v2) */
    uint32_t n_layers, n_tensors;
    uint64_t routing_off, data_off, table_off, tok_off, tok_size, meta_off, meta_size;
    bool layers_ok, experts_ok, count_ok;
    bool routing_safe, table_safe;   /* the whole region lies inside [0, size) */
    col_hparams hp;
} layout;

/* ---- Tensor names ---------------------------------------------------------------------------- */

enum { G_TOKEN_EMBD, G_OUTPUT_NORM, G_OUTPUT, G_OUTPUT_NORM_BIAS, G_OUTPUT_BIAS, G_ROPE_FREQ_FACTORS, N_GLOBALS };
static const char *const global_names[N_GLOBALS] = {"token_embd", "output_norm", "output", "output_norm_bias",
                                                    "output_bias", "rope_freq_factors"};

enum {
    S_ATTN_NORM, S_FFN_NORM, S_ATTN_Q, S_ATTN_K, S_ATTN_V, S_ATTN_O,
    S_ATTN_Q_BIAS, S_ATTN_K_BIAS, S_ATTN_V_BIAS, S_ATTN_O_BIAS, S_ATTN_Q_NORM, S_ATTN_K_NORM,
    S_MOE_GATE, S_MOE_W1, S_MOE_W2, S_MOE_W3,
    S_SHARED_W1, S_SHARED_W2, S_SHARED_W3, S_SHARED_GATE,
    S_MLP_W1, S_MLP_W2, S_MLP_W3,
    /* version 2 */
    S_MOE_GATE_BIAS, S_MOE_CORRECTION,
    S_ATTN_Q_A, S_ATTN_Q_A_NORM, S_ATTN_Q_A_BIAS, S_ATTN_Q_B,
    S_ATTN_KV_A, S_ATTN_KV_A_NORM, S_ATTN_KV_A_BIAS, S_ATTN_K_B, S_ATTN_V_B,
    S_ATTN_SINKS, S_MOE_W1_BIAS, S_MOE_W2_BIAS, S_MOE_W3_BIAS, S_ATTN_NORM_BIAS, S_FFN_NORM_BIAS,
    N_SLOTS
};
static const char *const slot_names[N_SLOTS] = {
    "attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_o",
    "attn_q_bias", "attn_k_bias", "attn_v_bias", "attn_o_bias", "attn_q_norm", "attn_k_norm",
    "moe_gate", "moe_w1", "moe_w2", "moe_w3",
    "shared_w1", "shared_w2", "shared_w3", "shared_gate",
    "mlp_w1", "mlp_w2", "mlp_w3",
    "moe_gate_bias", "moe_correction_bias",
    "attn_q_a", "attn_q_a_norm", "attn_q_a_bias", "attn_q_b",
    "attn_kv_a", "attn_kv_a_norm", "attn_kv_a_bias", "attn_k_b", "attn_v_b",
    "attn_sinks", "moe_w1_bias", "moe_w2_bias", "moe_w3_bias", "attn_norm_bias", "ffn_norm_bias",
};
/* The presence bitset of step 8 keeps a layer's slots in one u64. */
_Static_assert(N_SLOTS <= 64, "a layer's tensor slots must fit in 64 bits");

enum { NAME_UNKNOWN = 0, NAME_GLOBAL = 1, NAME_LAYER = 2 };

/* Classify a NUL-terminated name: a global tensor, `layers.L.<slot>`, or unknown. The layer
 * number is canonical decimal (no sign, no leading zero) so each tensor has exactly one name. */
static int parse_name(const char *name, uint32_t *layer, int *slot)
{
    for (int g = 0; g < N_GLOBALS; g++)
        if (strcmp(name, global_names[g]) == 0) {
            *slot = g;
            return NAME_GLOBAL;
        }
    if (strncmp(name, "layers.", 7) != 0)
        return NAME_UNKNOWN;
    const char *p = name + 7;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
        return NAME_UNKNOWN;
    uint32_t l = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        l = l * 10 + (uint32_t)(*p - '0');
        if (l >= MAX_LAYERS)
            return NAME_UNKNOWN;
    }
    if (*p != '.')
        return NAME_UNKNOWN;
    p++;
    for (int s = 0; s < N_SLOTS; s++)
        if (strcmp(p, slot_names[s]) == 0) {
            *layer = l;
            *slot = s;
            return NAME_LAYER;
        }
    return NAME_UNKNOWN;
}

/* Name rules of the tensor table: NUL-terminated within 64 bytes, NUL-padded, non-empty,
 * [A-Za-z0-9._-]. Returns true when valid; on failure *bad is the offending byte's index. */
static bool name_valid(const uint8_t *field, size_t *bad, const char **why)
{
    size_t len = 0;
    while (len < COL_TENSOR_NAME_MAX && field[len])
        len++;
    if (len == COL_TENSOR_NAME_MAX) {
        *bad = COL_TENSOR_NAME_MAX - 1;
        *why = "is not NUL-terminated within 64 bytes";
        return false;
    }
    if (len == 0) {
        *bad = 0;
        *why = "is empty";
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        uint8_t c = field[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) {
            *bad = i;
            *why = "has a character outside [A-Za-z0-9._-]";
            return false;
        }
    }
    for (size_t i = len; i < COL_TENSOR_NAME_MAX; i++)
        if (field[i]) {
            *bad = i;
            *why = "is not NUL-padded after its terminator";
            return false;
        }
    return true;
}

/* ---- Tensor table entries -------------------------------------------------------------------- */

/* Decode entry i and run the per-entry checks of step 6 (all but order/overlap, which need the
 * previous entry). With s == NULL it only decodes. Returns true when the entry is structurally
 * sound: valid name, known dtype, sane shape, consistent nbytes, aligned and inside the data
 * region, so that its data may be read. */
static bool check_entry(const layout *L, uint32_t i, sink *s, col_tensor_info *out)
{
    uint64_t eo = L->table_off + (uint64_t)i * COL_TENSOR_ENTRY_SIZE;
    const uint8_t *e = L->d + eo;
    bool ok = true;
    memset(out, 0, sizeof *out);
    printable_name(e, out->name);
    const char *nm = out->name;
    out->index = i;
    out->table_offset = eo;
    out->dtype = rd32(e + T_DTYPE);
    out->ndim = rd32(e + T_NDIM);
    for (int k = 0; k < 4; k++)
        out->shape[k] = rd64(e + T_SHAPE + 8 * k);
    out->offset = rd64(e + T_OFFSET);
    out->nbytes = rd64(e + T_NBYTES);
    out->crc32 = rd32(e + T_CRC);

    size_t bad;
    const char *why;
    if (!name_valid(e, &bad, &why)) {
        ok = false;
        if (s)
            ERR(s, COL_ERR_NAME, eo + bad, nm, "tensor %" PRIu32 ": name '%s' %s", i, nm, why);
    }
    uint32_t dsize = col_dtype_size(out->dtype);
    uint32_t bsize = block_bytes(out->dtype); /* q8_0/q4_0: sizes count blocks of 32 elements */
    if (bsize) {
        dsize = bsize;
        if (out->ndim >= 1 && out->ndim <= 4 && out->shape[out->ndim - 1] % 32) {
            ok = false;
            if (s)
                ERR(s, COL_ERR_SHAPE, eo + T_SHAPE + 8 * (uint64_t)(out->ndim - 1), nm,
                    "tensor '%s': rows of %" PRIu64 " elements, a block dtype needs a multiple of 32",
                    nm, out->shape[out->ndim - 1]);
        }
    }
    const uint32_t panel_rows = col_panel_rows(out->dtype);
    if (panel_rows && (out->ndim < 2 || out->ndim > 3)) {
        ok = false;
        if (s)
            ERR(s, COL_ERR_SHAPE, eo + T_NDIM, nm,
                "tensor '%s': ndim %" PRIu32 ", a panel dtype needs a matrix [rows, n] or a stack [E, rows, n]",
                nm, out->ndim);
    } else if (panel_rows && out->shape[out->ndim - 2] % panel_rows) {
        ok = false;
        if (s)
            ERR(s, COL_ERR_SHAPE, eo + T_SHAPE + 8 * (uint64_t)(out->ndim - 2), nm,
                "tensor '%s': %" PRIu64 " rows, a panel dtype needs a multiple of %" PRIu32, nm,
                out->shape[out->ndim - 2], panel_rows);
    } else if (is_bf16_panel(out->dtype) && out->shape[out->ndim - 1] % 2) {
        ok = false;
        if (s)
            ERR(s, COL_ERR_SHAPE, eo + T_SHAPE + 8 * (uint64_t)(out->ndim - 1), nm,
                "tensor '%s': rows of %" PRIu64 " elements, bf16x16 stores columns in pairs and needs an even count",
                nm, out->shape[out->ndim - 1]);
    }
    if (dsize == 0) {
        ok = false;
        if (s && (out->dtype == 3 || out->dtype == 4))
            ERR(s, COL_ERR_DTYPE, eo + T_DTYPE, nm,
                "tensor '%s': dtype %" PRIu32 " is %s with interleaved blocks, written by converters "
                "before 2026-11-29 and no longer read: convert the model again", nm, out->dtype,
                out->dtype == 3 ? "q8_0" : "q4_0");
        else if (s)
            ERR(s, COL_ERR_DTYPE, eo + T_DTYPE, nm, "tensor '%s': unknown dtype %" PRIu32, nm,
                out->dtype);
    }
    bool shape_ok = true;
    if (out->ndim < 1 || out->ndim > 4) {
        shape_ok = false;
        if (s)
            ERR(s, COL_ERR_LIMIT, eo + T_NDIM, nm, "tensor '%s': ndim %" PRIu32 " not in 1..4", nm,
                out->ndim);
    } else {
        uint64_t count = 1;
        for (uint32_t k = 0; k < 4; k++) {
            uint64_t dim = out->shape[k];
            if (k < out->ndim && (dim < 1 || dim > ((uint64_t)1 << 32))) {
                shape_ok = false;
                if (s)
                    ERR(s, COL_ERR_LIMIT, eo + T_SHAPE + 8 * k, nm,
                        "tensor '%s': dim %" PRIu32 " is %" PRIu64 ", not in 1..2^32", nm, k, dim);
            } else if (k >= out->ndim && dim != 0) {
                shape_ok = false;
                if (s)
                    ERR(s, COL_ERR_LIMIT, eo + T_SHAPE + 8 * k, nm,
                        "tensor '%s': dim %" PRIu32 " is %" PRIu64 " past ndim %" PRIu32
                        " (must be 0)", nm, k, dim, out->ndim);
            } else if (k < out->ndim && shape_ok) {
                if (count > UINT64_MAX / dim) {
                    shape_ok = false;
                    if (s)
                        ERR(s, COL_ERR_LIMIT, eo + T_SHAPE + 8 * k, nm,
                            "tensor '%s': element count overflows 64 bits", nm);
                } else {
                    count *= dim;
                }
            }
        }
        if (shape_ok && dsize) {
            if (count > UINT64_MAX / dsize) {
                shape_ok = false;
                if (s)
                    ERR(s, COL_ERR_LIMIT, eo + T_SHAPE, nm,
                        "tensor '%s': byte size overflows 64 bits", nm);
            } else if ((bsize ? count / 32 * bsize : count * dsize) != out->nbytes) {
                ok = false;
                if (s)
                    ERR(s, COL_ERR_SIZE_MISMATCH, eo + T_NBYTES, nm,
                        "tensor '%s': nbytes %" PRIu64 " != %" PRIu64 " %s * %" PRIu32
                        " bytes", nm, out->nbytes, bsize ? count / 32 : count,
                        bsize ? "blocks of 32" : "elements", dsize);
            }
        }
    }
    ok = ok && shape_ok;
    if (out->offset % COL_ALIGNMENT) {
        ok = false;
        if (s)
            ERR(s, COL_ERR_MISALIGNED, eo + T_OFFSET, nm,
                "tensor '%s': offset 0x%" PRIX64 " is not a multiple of 64", nm, out->offset);
    }
    if (out->offset < L->data_off) {
        ok = false;
        if (s)
            ERR(s, COL_ERR_TENSOR_BOUNDS, eo + T_OFFSET, nm,
                "tensor '%s': offset 0x%" PRIX64 " before data_offset 0x%" PRIX64, nm,
                out->offset, L->data_off);
    } else if (!range_ok(out->offset, out->nbytes, L->end)) {
        ok = false;
        if (s)
            ERR(s, COL_ERR_TENSOR_BOUNDS, eo + T_OFFSET, nm,
                "tensor '%s': offset 0x%" PRIX64 " + %" PRIu64 " beyond file end 0x%" PRIX64, nm,
                out->offset, out->nbytes, L->end);
    }
    if (ok)
        out->data = L->d + out->offset;
    return ok;
}

/* ---- Architecture rules (step 8) ------------------------------------------------------------- */

/* Whether slot `s` is required in a layer whose routing entry decodes to `ri` (NULL: the entry
 * cannot be trusted, and only slots that do not depend on it may be asked about). */
static bool slot_expected(int s, const col_hparams *hp, const col_routing_info *ri)
{
    bool mla = hp->attention == COL_ATTENTION_MLA, q_lora = mla && hp->q_lora_rank > 0;
    bool qkv_bias = (hp->flags & COL_FLAG_QKV_BIAS) != 0;
    bool moe = ri && ri->kind == COL_LAYER_MOE;
    switch (s) {
    case S_ATTN_NORM: case S_FFN_NORM: case S_ATTN_O:
        return true;
    case S_ATTN_Q:
        return !q_lora;
    case S_ATTN_K: case S_ATTN_V:
        return !mla;
    case S_ATTN_Q_BIAS: case S_ATTN_K_BIAS: case S_ATTN_V_BIAS:
        return !mla && qkv_bias;
    case S_ATTN_O_BIAS:
        return (hp->flags & COL_FLAG_O_BIAS) != 0;
    case S_ATTN_Q_NORM: case S_ATTN_K_NORM:
        return (hp->flags & (COL_FLAG_QK_NORM_HEAD | COL_FLAG_QK_NORM_FULL)) != 0;
    case S_ATTN_Q_A: case S_ATTN_Q_A_NORM: case S_ATTN_Q_B:
        return q_lora;
    case S_ATTN_Q_A_BIAS:
        return q_lora && qkv_bias;
    case S_ATTN_KV_A: case S_ATTN_KV_A_NORM: case S_ATTN_K_B: case S_ATTN_V_B:
        return mla;
    case S_ATTN_KV_A_BIAS:
        return mla && qkv_bias;
    case S_MOE_GATE: case S_MOE_W1: case S_MOE_W2: case S_MOE_W3:
        return moe;
    case S_MOE_GATE_BIAS:
        return moe && ri->gate_bias_tensor != COL_NO_TENSOR;
    case S_MOE_CORRECTION:
        return moe && ri->correction_bias_tensor != COL_NO_TENSOR;
    case S_SHARED_W1: case S_SHARED_W2: case S_SHARED_W3:
        return moe && ri->shared != COL_SHARED_NONE;
    case S_SHARED_GATE:
        return moe && ri->shared == COL_SHARED_SIGMOID_GATE;
    case S_MLP_W1: case S_MLP_W2: case S_MLP_W3:
        return ri && ri->kind == COL_LAYER_DENSE;
    case S_ATTN_SINKS:
        return ri && ri->sinks;
    case S_MOE_W1_BIAS: case S_MOE_W2_BIAS: case S_MOE_W3_BIAS:
        return moe && ri->expert_bias;
    case S_ATTN_NORM_BIAS: case S_FFN_NORM_BIAS:
        return hp->norm_kind == COL_NORM_KIND_LAYER_BIAS;
    default:
        return false;
    }
}

/* Whether global tensor `g` is required. */
static bool global_expected(int g, const col_hparams *hp)
{
    switch (g) {
    case G_OUTPUT: return !(hp->flags & COL_FLAG_TIED_EMBEDDINGS);
    case G_OUTPUT_NORM_BIAS: return hp->norm_kind == COL_NORM_KIND_LAYER_BIAS;
    case G_OUTPUT_BIAS: return (hp->flags & COL_FLAG_OUTPUT_BIAS) != 0;
    case G_ROPE_FREQ_FACTORS: return hp->rope_type == COL_ROPE_LONGROPE;
    default: return true;
    }
}

/* Slots whose presence depends on the layer's routing entry: unknowable when it is bad. */
static bool slot_depends_on_entry(int s)
{
    return (s >= S_MOE_GATE && s <= S_MLP_W3) || s == S_MOE_GATE_BIAS || s == S_MOE_CORRECTION ||
           s == S_ATTN_SINKS || s == S_MOE_W1_BIAS || s == S_MOE_W2_BIAS || s == S_MOE_W3_BIAS;
}

/* Expected shape of a tensor; returns ndim. */
static uint32_t expected_shape(const col_hparams *hp, int is_layer, int s, uint64_t dims[4])
{
    uint64_t H = hp->d_model, V = hp->vocab_size, E = hp->n_experts, I = hp->d_ff_expert;
    uint64_t D = hp->d_ff_dense, S = hp->d_ff_shared, d = hp->head_dim, nh = hp->n_heads;
    uint64_t Q = nh * d, KV = (uint64_t)hp->n_kv_heads * d, O = nh * hp->v_head_dim;
    uint64_t QL = hp->q_lora_rank, C = hp->kv_lora_rank, R = hp->qk_rope_head_dim;
    bool full = (hp->flags & COL_FLAG_QK_NORM_FULL) != 0;
#define SHAPE1(a) (dims[0] = (a), 1u)
#define SHAPE2(a, b) (dims[0] = (a), dims[1] = (b), 2u)
#define SHAPE3(a, b, c) (dims[0] = (a), dims[1] = (b), dims[2] = (c), 3u)
    if (!is_layer) {
        switch (s) {
        case G_OUTPUT_NORM: case G_OUTPUT_NORM_BIAS: return SHAPE1(H);
        case G_OUTPUT_BIAS: return SHAPE1(V);
        case G_ROPE_FREQ_FACTORS: return SHAPE1(hp->rotary_dim / 2);
        default: return SHAPE2(V, H); /* token_embd, output */
        }
    }
    switch (s) {
    case S_ATTN_NORM: case S_FFN_NORM: case S_ATTN_O_BIAS: case S_ATTN_NORM_BIAS: case S_FFN_NORM_BIAS:
        return SHAPE1(H);
    case S_ATTN_Q: return SHAPE2(Q, H);
    case S_ATTN_K: case S_ATTN_V: return SHAPE2(KV, H);
    case S_ATTN_O: return SHAPE2(H, O);
    case S_ATTN_Q_BIAS: return SHAPE1(Q);
    case S_ATTN_K_BIAS: case S_ATTN_V_BIAS: return SHAPE1(KV);
    case S_ATTN_Q_NORM: return SHAPE1(full ? Q : d);
    case S_ATTN_K_NORM: return SHAPE1(full ? KV : d);
    case S_MOE_GATE: return SHAPE2(E, H);
    case S_MOE_W1: case S_MOE_W3: return SHAPE3(E, I, H);
    case S_MOE_W2: return SHAPE3(E, H, I);
    case S_SHARED_W1: case S_SHARED_W3: return SHAPE2(S, H);
    case S_SHARED_W2: return SHAPE2(H, S);
    case S_SHARED_GATE: return SHAPE2(1, H);
    case S_MLP_W1: case S_MLP_W3: return SHAPE2(D, H);
    case S_MLP_W2: return SHAPE2(H, D);
    case S_MOE_GATE_BIAS: case S_MOE_CORRECTION: return SHAPE1(E);
    case S_ATTN_Q_A: return SHAPE2(QL, H);
    case S_ATTN_Q_A_NORM: case S_ATTN_Q_A_BIAS: return SHAPE1(QL);
    case S_ATTN_Q_B: return SHAPE2(Q, QL);
    case S_ATTN_KV_A: return SHAPE2(C + R, H);
    case S_ATTN_KV_A_NORM: return SHAPE1(C);
    case S_ATTN_KV_A_BIAS: return SHAPE1(C + R);
    case S_ATTN_K_B: return SHAPE3(nh, C, hp->qk_nope_head_dim);
    case S_ATTN_SINKS: return SHAPE1(nh);
    case S_MOE_W1_BIAS: case S_MOE_W3_BIAS: return SHAPE2(E, I);
    case S_MOE_W2_BIAS: return SHAPE2(E, H);
    default: return SHAPE3(nh, hp->v_head_dim, C); /* S_ATTN_V_B */
    }
#undef SHAPE1
#undef SHAPE2
#undef SHAPE3
}

static void format_shape(char *buf, size_t n, const uint64_t *dims, uint32_t ndim)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t k = 0; k < ndim && k < 4 && used < n; k++) {
        int w = snprintf(buf + used, n - used, "%s%" PRIu64, k ? ", " : "[", dims[k]);
        if (w < 0)
            return;
        used += (size_t)w;
    }
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

/* The routing entry of `layer` decoded to the rule it states; a version-1 entry to the rule
 * version 1 means (softmax over every expert, top-k of the scores, NORM_TOPK and the shared-expert
 * flags of the header, every layer sliding when sliding_window is set). Returns false when the
 * entry cannot be trusted: the section is unreadable or the layer kind unknown. Decoding checks
 * nothing else (step 7 does). */
static bool route_of(const layout *L, uint32_t layer, col_routing_info *ri)
{
    memset(ri, 0, sizeof *ri);
    if (!L->routing_safe || layer >= L->n_layers)
        return false;
    const uint8_t *r = L->d + L->routing_off + (uint64_t)layer * L->entry_size;
    ri->layer = rd32(r + R_LAYER);
    ri->kind = rd32(r + R_KIND);
    ri->gate_tensor = rd32(r + R_GATE);
    ri->top_k = rd32(r + R_TOPK);
    ri->n_experts = rd32(r + R_N_EXPERTS);
    ri->scoring = rd32(r + R_SCORING);
    if (ri->kind > COL_LAYER_MOE)
        return false;
    if (L->version == 2) {
        ri->gate_bias_tensor = rd32(r + R_GATE_BIAS);
        ri->select_on = rd32(r + R_SELECT_ON);
        ri->correction_bias_tensor = rd32(r + R_CORRECTION);
        ri->n_groups = rd32(r + R_N_GROUPS);
        ri->n_groups_kept = rd32(r + R_GROUPS_KEPT);
        ri->group_score = rd32(r + R_GROUP_SCORE);
        ri->normalize = rd32(r + R_NORMALIZE);
        ri->norm_eps = rdf32(r + R_NORM_EPS);
        ri->norm_p = rdf32(r + R_NORM_P);
        ri->scale = rdf32(r + R_SCALE);
        ri->shared = rd32(r + R_SHARED);
        ri->sparsemixer_eps = rdf32(r + R_SPARSEMIXER_EPS);
        ri->attention = rd32(r + R_ATTENTION);
        ri->sinks = rd32(r + R_SINKS);
        ri->expert_bias = rd32(r + R_EXPERT_BIAS);
        ri->activation = rd32(r + R_ACTIVATION);
        ri->act_alpha = rdf32(r + R_ACT_ALPHA);
        ri->act_limit = rdf32(r + R_ACT_LIMIT);
        ri->weight_inputs = rd32(r + R_WEIGHT_INPUTS);
        ri->no_rope = rd32(r + R_NO_ROPE);
        ri->qk_l2_norm = rd32(r + R_QK_L2_NORM);
        ri->temperature_floor = rd32(r + R_TEMP_FLOOR);
        ri->temperature_scale = rdf32(r + R_TEMP_SCALE);
        return true;
    }
    uint32_t flags = L->hp.flags;
    ri->gate_bias_tensor = COL_NO_TENSOR; /* version 1 has no router bias (step 7 checks the field) */
    ri->correction_bias_tensor = COL_NO_TENSOR;
    ri->attention = L->hp.sliding_window ? COL_LAYER_SLIDING : COL_LAYER_FULL;
    if (ri->kind == COL_LAYER_MOE) {
        ri->n_groups = ri->n_groups_kept = 1;
        ri->normalize = (flags & COL_FLAG_NORM_TOPK) ? COL_NORM_SUM : COL_NORM_NONE;
        ri->scale = 1.0f;
        ri->shared = !(flags & COL_FLAG_SHARED_EXPERT) ? COL_SHARED_NONE
                     : (flags & COL_FLAG_SHARED_EXPERT_GATE) ? COL_SHARED_SIGMOID_GATE : COL_SHARED_PLAIN;
    }
    return true;
}

/* ---- The validator --------------------------------------------------------------------------- */

static bool finite_pos(double x) { return isfinite(x) && x > 0; }
static bool finite_nonneg(double x) { return isfinite(x) && x >= 0; }

/* Steps 1-2. Returns false when nothing further can be read safely. */
static bool check_identity_and_limits(layout *L, sink *s)
{
    const uint8_t *d = L->d;
    if (L->size < COL_HEADER_SIZE) {
        ERR(s, COL_ERR_TRUNCATED, L->size, "",
            "file is %" PRIu64 " bytes, shorter than the 256-byte fixed header", L->size);
        if (L->size >= 4 && memcmp(d, "COLI", 4) != 0)
            ERR(s, COL_ERR_BAD_MAGIC, H_MAGIC, "", "magic is not \"COLI\"");
        return false;
    }
    if (memcmp(d, "COLI", 4) != 0) {
        ERR(s, COL_ERR_BAD_MAGIC, H_MAGIC, "",
            "magic is %02X %02X %02X %02X, expected \"COLI\" (43 4F 4C 49)", d[0], d[1], d[2], d[3]);
        return false;
    }
    uint32_t version = rd32(d + H_VERSION);
    if (version < 1 || version > COL_FORMAT_VERSION) {
        ERR(s, COL_ERR_BAD_VERSION, H_VERSION, "",
            "format version %" PRIu32 ", this engine reads versions 1 to %d", version, COL_FORMAT_VERSION);
        return false;
    }
    L->version = version;
    L->entry_size = entry_size_of(version);
    uint32_t min_header = header_size_of(version);
    if (L->size < min_header) {
        ERR(s, COL_ERR_TRUNCATED, L->size, "",
            "file is %" PRIu64 " bytes, shorter than the %" PRIu32 "-byte fixed header of format version %" PRIu32,
            L->size, min_header, version);
        return false;
    }
    uint32_t hs = rd32(d + H_HEADER_SIZE);
    L->header_size = min_header;
    if (hs < min_header || hs > MAX_HEADER_SIZE || hs % 8)
        ERR(s, COL_ERR_HEADER, H_HEADER_SIZE, "",
            "header_size %" PRIu32 " not a multiple of 8 in %" PRIu32 "..65536 (format version %" PRIu32 ")",
            hs, min_header, version);
    else if (hs > L->size)
        ERR(s, COL_ERR_TRUNCATED, L->size, "",
            "file is %" PRIu64 " bytes, shorter than its header_size %" PRIu32, L->size, hs);
    else
        L->header_size = hs;

    uint32_t ne = rd32(d + H_NUM_EXPERTS);
    L->experts_ok = ne >= 1 && ne <= MAX_EXPERTS;
    if (!L->experts_ok)
        ERR(s, COL_ERR_LIMIT, H_NUM_EXPERTS, "", "num_experts %" PRIu32 " not in 1..4096", ne);
    L->n_layers = rd32(d + H_NUM_LAYERS);
    L->layers_ok = L->n_layers >= 1 && L->n_layers <= MAX_LAYERS;
    if (!L->layers_ok)
        ERR(s, COL_ERR_LIMIT, H_NUM_LAYERS, "", "num_layers %" PRIu32 " not in 1..1024",
            L->n_layers);
    L->n_tensors = rd32(d + H_TENSOR_COUNT);
    L->count_ok = L->n_tensors >= 1 && L->n_tensors <= MAX_TENSORS &&
                  (uint64_t)L->n_tensors * COL_TENSOR_ENTRY_SIZE <= L->size;
    if (!L->count_ok)
        ERR(s, COL_ERR_LIMIT, H_TENSOR_COUNT, "",
            "tensor_count %" PRIu32 " not in 1..1048576 or its %" PRIu64
            "-byte table larger than the %" PRIu64 "-byte file",
            L->n_tensors, (uint64_t)L->n_tensors * COL_TENSOR_ENTRY_SIZE, L->size);

    uint64_t file_size = rd64(d + H_FILE_SIZE);
    L->end = file_size < L->size ? file_size : L->size;
    if (file_size > L->size)
        ERR(s, COL_ERR_TRUNCATED, L->size, "",
            "file is %" PRIu64 " bytes but its header declares file_size %" PRIu64, L->size,
            file_size);
    else if (file_size < L->size)
        ERR(s, COL_ERR_HEADER, H_FILE_SIZE, "",
            "file_size %" PRIu64 " but the file is %" PRIu64 " bytes (trailing bytes)", file_size,
            L->size);

    L->routing_off = rd64(d + H_ROUTING_OFFSET);
    L->data_off = rd64(d + H_DATA_OFFSET);
    L->table_off = rd64(d + H_TABLE_OFFSET);
    L->tok_off = rd64(d + H_TOKENIZER_OFFSET);
    L->tok_size = rd64(d + H_TOKENIZER_SIZE);
    L->meta_off = rd64(d + H_METADATA_OFFSET);
    L->meta_size = rd64(d + H_METADATA_SIZE);
    L->routing_safe = L->layers_ok &&
        range_ok(L->routing_off, (uint64_t)L->n_layers * L->entry_size, L->size);
    L->table_safe = L->count_ok &&
        range_ok(L->table_off, (uint64_t)L->n_tensors * COL_TENSOR_ENTRY_SIZE, L->size);
    decode_hparams(d, &L->hp);
    return true;
}

/* Step 3. The tables CRC needs both regions readable; when they are not, step 5 says why.
 * Version 1's header CRC covers bytes 0x000..0x0BF; version 2's covers them and then every
 * header byte after the two CRCs, 0x0C8..header_size-1. */
static void check_header_crcs(const layout *L, sink *s)
{
    uint32_t want = rd32(L->d + H_HEADER_CRC), got = col_crc32(0, L->d, H_HEADER_CRC);
    if (L->version == 2)
        got = col_crc32(got, L->d + H_RESERVED, L->header_size - H_RESERVED);
    if (want != got)
        ERR(s, COL_ERR_CHECKSUM, H_HEADER_CRC, "",
            "header_crc32 is 0x%08" PRIX32 ", bytes 0x000..0x0BF%s hash to 0x%08" PRIX32, want,
            L->version == 2 ? " and 0x0C8..header_size-1" : "", got);
    if (L->routing_safe && L->table_safe) {
        uint32_t c = col_crc32(0, L->d + L->routing_off,
                               (size_t)L->n_layers * L->entry_size);
        c = col_crc32(c, L->d + L->table_off, (size_t)L->n_tensors * COL_TENSOR_ENTRY_SIZE);
        want = rd32(L->d + H_TABLES_CRC);
        if (want != c)
            ERR(s, COL_ERR_CHECKSUM, H_TABLES_CRC, "",
                "tables_crc32 is 0x%08" PRIX32 ", routing section + tensor table hash to 0x%08"
                PRIX32, want, c);
    }
}

/* Step 4, the fields of version 2's header (0x0C8..0x1FF). */
static void check_hparams_v2(const layout *L, sink *s)
{
    const col_hparams *hp = &L->hp;
    if (hp->attention > COL_ATTENTION_MLA)
        ERR(s, COL_ERR_UNSUPPORTED, H_ATTENTION, "", "unknown attention %" PRIu32, hp->attention);
    if (hp->rope_layout > COL_ROPE_INTERLEAVED)
        ERR(s, COL_ERR_UNSUPPORTED, H_ROPE_LAYOUT, "", "unknown rope_layout %" PRIu32, hp->rope_layout);
    if (hp->norm_kind > COL_NORM_KIND_LAYER_BIAS)
        ERR(s, COL_ERR_UNSUPPORTED, H_NORM_KIND, "", "unknown norm_kind %" PRIu32, hp->norm_kind);
    static const struct { uint32_t off; const char *name; } scales[] = {
        {H_EMBEDDING_SCALE, "embedding_scale"}, {H_RESIDUAL_SCALE, "residual_scale"},
        {H_LOGIT_DIVISOR, "logit_divisor"}};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
        float v = rdf32(L->d + scales[i].off);
        if (v != 0.0f && !finite_pos((double)v))
            ERR(s, COL_ERR_HEADER, scales[i].off, "", "%s %g is not 0 (none) or a finite value > 0",
                scales[i].name, (double)v);
    }
    if (!finite_pos((double)hp->attn_scale))
        ERR(s, COL_ERR_HEADER, H_ATTN_SCALE, "", "attn_scale %g is not a finite value > 0",
            (double)hp->attn_scale);
    if (hp->attention == COL_ATTENTION_GQA) {
        static const struct { uint32_t off; const char *name; } mla_only[] = {
            {H_Q_LORA, "q_lora_rank"}, {H_KV_LORA, "kv_lora_rank"}, {H_QK_NOPE, "qk_nope_head_dim"},
            {H_QK_ROPE, "qk_rope_head_dim"}, {H_LATENT_EPS, "latent_norm_eps"}};
        for (size_t i = 0; i < sizeof mla_only / sizeof mla_only[0]; i++)
            if (rd32(L->d + mla_only[i].off) != 0)
                ERR(s, COL_ERR_HEADER, mla_only[i].off, "", "%s is set but attention is GQA (it must be 0)",
                    mla_only[i].name);
        if (hp->v_head_dim != hp->head_dim)
            ERR(s, COL_ERR_HEADER, H_V_HEAD, "", "v_head_dim %" PRIu32 " != head_dim %" PRIu32 " in GQA attention",
                hp->v_head_dim, hp->head_dim);
        if (hp->rotary_dim < 2 || hp->rotary_dim > hp->head_dim || hp->rotary_dim % 2)
            ERR(s, COL_ERR_HEADER, H_ROTARY_DIM, "", "rotary_dim %" PRIu32 " not even in 2..head_dim %" PRIu32,
                hp->rotary_dim, hp->head_dim);
    } else if (hp->attention == COL_ATTENTION_MLA) {
        if (hp->kv_lora_rank < 1 || hp->kv_lora_rank > 65536)
            ERR(s, COL_ERR_HEADER, H_KV_LORA, "", "kv_lora_rank %" PRIu32 " not in 1..65536", hp->kv_lora_rank);
        if (hp->q_lora_rank > 65536)
            ERR(s, COL_ERR_HEADER, H_Q_LORA, "", "q_lora_rank %" PRIu32 " not in 0..65536", hp->q_lora_rank);
        if (hp->qk_rope_head_dim < 2 || hp->qk_rope_head_dim > COL_MAX_HEAD_DIM || hp->qk_rope_head_dim % 2)
            ERR(s, COL_ERR_HEADER, H_QK_ROPE, "", "qk_rope_head_dim %" PRIu32 " not even in 2..%d",
                hp->qk_rope_head_dim, COL_MAX_HEAD_DIM);
        if (hp->qk_nope_head_dim < 1 || hp->qk_nope_head_dim > COL_MAX_HEAD_DIM)
            ERR(s, COL_ERR_HEADER, H_QK_NOPE, "", "qk_nope_head_dim %" PRIu32 " not in 1..%d",
                hp->qk_nope_head_dim, COL_MAX_HEAD_DIM);
        if ((uint64_t)hp->qk_nope_head_dim + hp->qk_rope_head_dim != hp->head_dim)
            ERR(s, COL_ERR_HEADER, H_HEAD_DIM, "", "head_dim %" PRIu32 " != qk_nope_head_dim %" PRIu32
                " + qk_rope_head_dim %" PRIu32 " in MLA attention", hp->head_dim, hp->qk_nope_head_dim,
                hp->qk_rope_head_dim);
        if (hp->v_head_dim < 1 || hp->v_head_dim > COL_MAX_HEAD_DIM)
            ERR(s, COL_ERR_HEADER, H_V_HEAD, "", "v_head_dim %" PRIu32 " not in 1..%d", hp->v_head_dim,
                COL_MAX_HEAD_DIM);
        if (hp->rotary_dim != hp->qk_rope_head_dim)
            ERR(s, COL_ERR_HEADER, H_ROTARY_DIM, "", "rotary_dim %" PRIu32 " != qk_rope_head_dim %" PRIu32
                " in MLA attention", hp->rotary_dim, hp->qk_rope_head_dim);
        if (hp->n_kv_heads != hp->n_heads)
            ERR(s, COL_ERR_HEADER, H_N_KV_HEADS, "", "n_kv_heads %" PRIu32 " != n_heads %" PRIu32
                ": MLA expands its latent to every head", hp->n_kv_heads, hp->n_heads);
        if (!finite_pos((double)hp->latent_norm_eps))
            ERR(s, COL_ERR_HEADER, H_LATENT_EPS, "", "latent_norm_eps %g is not a finite value > 0",
                (double)hp->latent_norm_eps);
        if (hp->flags & (COL_FLAG_QK_NORM_HEAD | COL_FLAG_QK_NORM_FULL))
            ERR(s, COL_ERR_HEADER, H_FLAGS, "", "QK_NORM flags with MLA attention (it normalises its latents)");
        if (hp->clip_qkv != 0.0f)
            ERR(s, COL_ERR_HEADER, H_CLIP_QKV, "", "clip_qkv with MLA attention (it must be 0)");
    }
    if (hp->rope_type == COL_ROPE_YARN) {
        if (hp->rope_original_max_context < 1)
            ERR(s, COL_ERR_HEADER, H_ROPE_ORIG_CTX, "", "YaRN needs rope_original_max_context >= 1");
        if (!finite_pos((double)hp->rope_beta_fast))
            ERR(s, COL_ERR_HEADER, H_ROPE_BETA_FAST, "", "rope_beta_fast %g is not a finite value > 0",
                (double)hp->rope_beta_fast);
        if (!finite_pos((double)hp->rope_beta_slow))
            ERR(s, COL_ERR_HEADER, H_ROPE_BETA_SLOW, "", "rope_beta_slow %g is not a finite value > 0",
                (double)hp->rope_beta_slow);
        if (hp->rope_truncate > 1)
            ERR(s, COL_ERR_HEADER, H_ROPE_TRUNCATE, "", "rope_truncate %" PRIu32 " is not 0 or 1", hp->rope_truncate);
        if (!finite_pos((double)hp->rope_attn_factor))
            ERR(s, COL_ERR_HEADER, H_ROPE_ATTN_FACTOR, "", "rope_attn_factor %g is not a finite value > 0",
                (double)hp->rope_attn_factor);
    } else {
        if (hp->rope_type == COL_ROPE_LONGROPE ? !finite_pos((double)hp->rope_attn_factor)
                                               : hp->rope_attn_factor != 1.0f)
            ERR(s, COL_ERR_HEADER, H_ROPE_ATTN_FACTOR, "",
                hp->rope_type == COL_ROPE_LONGROPE ? "rope_attn_factor %g is not a finite value > 0"
                                                   : "rope_attn_factor %g: only YaRN and LongRoPE scale cos and sin (1)",
                (double)hp->rope_attn_factor);
        if (hp->rope_type == COL_ROPE_LLAMA3 && hp->rope_original_max_context < 1)
            ERR(s, COL_ERR_HEADER, H_ROPE_ORIG_CTX, "", "llama3 RoPE needs rope_original_max_context >= 1");
        if (hp->rope_beta_fast != 0.0f || hp->rope_beta_slow != 0.0f || hp->rope_truncate != 0)
            ERR(s, COL_ERR_HEADER, hp->rope_beta_fast != 0.0f ? H_ROPE_BETA_FAST
                                   : hp->rope_beta_slow != 0.0f ? H_ROPE_BETA_SLOW : H_ROPE_TRUNCATE, "",
                "rope_beta_fast, rope_beta_slow and rope_truncate are YaRN's (they must be 0)");
    }
    if (hp->rope_type == COL_ROPE_LLAMA3) {
        if (!finite_pos((double)hp->rope_low_freq_factor))
            ERR(s, COL_ERR_HEADER, H_ROPE_LOW, "", "rope_low_freq_factor %g is not a finite value > 0",
                (double)hp->rope_low_freq_factor);
        if (!finite_pos((double)hp->rope_high_freq_factor))
            ERR(s, COL_ERR_HEADER, H_ROPE_HIGH, "", "rope_high_freq_factor %g is not a finite value > 0",
                (double)hp->rope_high_freq_factor);
    } else if (hp->rope_low_freq_factor != 0.0f || hp->rope_high_freq_factor != 0.0f) {
        ERR(s, COL_ERR_HEADER, hp->rope_low_freq_factor != 0.0f ? H_ROPE_LOW : H_ROPE_HIGH, "",
            "rope_low_freq_factor and rope_high_freq_factor are llama3 RoPE's (they must be 0)");
    }
    /* Reserved bytes must be zero: a later field takes them, and this reader then refuses a file
     * that sets it rather than running something else than what the file says. */
    for (uint32_t o = H_RESERVED_V2; o < COL_HEADER_SIZE_V2; o++)
        if (L->d[o]) {
            ERR(s, COL_ERR_UNSUPPORTED, o, "",
                "reserved header byte 0x%03" PRIX32 " is 0x%02X, not 0: a field this engine does not know", o, L->d[o]);
            break;
        }
}

/* The families a file of `version` may name (version 1: the first four). */
static bool arch_known(uint32_t arch, uint32_t version)
{
    switch (arch) {
    case COL_ARCH_MIXTRAL: case COL_ARCH_QWEN2_MOE: case COL_ARCH_QWEN3_MOE: case COL_ARCH_OLMOE:
        return true;
    case COL_ARCH_DEEPSEEK_V2: case COL_ARCH_DEEPSEEK_V3: case COL_ARCH_GLM4_MOE: case COL_ARCH_ERNIE4_5_MOE:
    case COL_ARCH_GPT_OSS: case COL_ARCH_LLAMA4: case COL_ARCH_PHIMOE: case COL_ARCH_GRANITEMOE:
    case COL_ARCH_GRANITEMOESHARED: case COL_ARCH_DBRX:
        return version == 2;
    default:
        return false;
    }
}

/* Step 4. */
static void check_hparams(const layout *L, sink *s)
{
    const col_hparams *hp = &L->hp;
    bool v2 = L->version == 2;
    if (!arch_known(hp->arch, L->version))
        ERR(s, COL_ERR_UNSUPPORTED, H_ARCH, "", "unknown arch %" PRIu32 " (format version %" PRIu32 ")",
            hp->arch, L->version);
    const uint32_t known_flags = v2 ? 0x1FFu : 0xFFu; /* OUTPUT_BIAS is version 2's */
    if (hp->flags & ~known_flags)
        ERR(s, COL_ERR_UNSUPPORTED, H_FLAGS, "", "unknown flag bits 0x%" PRIX32, hp->flags & ~known_flags);
    if ((hp->flags & COL_FLAG_QK_NORM_HEAD) && (hp->flags & COL_FLAG_QK_NORM_FULL))
        ERR(s, COL_ERR_HEADER, H_FLAGS, "", "flags QK_NORM_HEAD and QK_NORM_FULL are exclusive");
    const uint32_t v1_only = COL_FLAG_NORM_TOPK | COL_FLAG_SHARED_EXPERT | COL_FLAG_SHARED_EXPERT_GATE;
    if (v2 && (hp->flags & v1_only))
        ERR(s, COL_ERR_HEADER, H_FLAGS, "",
            "flag bits 0x%" PRIX32 " (NORM_TOPK, SHARED_EXPERT, SHARED_EXPERT_GATE) are format version 1's; "
            "a version-2 routing entry states its normalisation and shared expert", hp->flags & v1_only);
    if (!v2 && (hp->flags & COL_FLAG_SHARED_EXPERT_GATE) && !(hp->flags & COL_FLAG_SHARED_EXPERT))
        ERR(s, COL_ERR_HEADER, H_FLAGS, "", "flag SHARED_EXPERT_GATE without SHARED_EXPERT");
    if (hp->d_model < 1 || hp->d_model > 65536)
        ERR(s, COL_ERR_HEADER, H_D_MODEL, "", "d_model %" PRIu32 " not in 1..65536", hp->d_model);
    if (hp->n_heads < 1 || hp->n_heads > 1024)
        ERR(s, COL_ERR_HEADER, H_N_HEADS, "", "n_heads %" PRIu32 " not in 1..1024", hp->n_heads);
    if (hp->n_kv_heads < 1 || hp->n_kv_heads > hp->n_heads || hp->n_heads % hp->n_kv_heads)
        ERR(s, COL_ERR_HEADER, H_N_KV_HEADS, "",
            "n_kv_heads %" PRIu32 " not in 1..n_heads or does not divide n_heads %" PRIu32,
            hp->n_kv_heads, hp->n_heads);
    if (!v2 && (hp->head_dim < 2 || hp->head_dim > COL_MAX_HEAD_DIM || hp->head_dim % 2))
        ERR(s, COL_ERR_HEADER, H_HEAD_DIM, "", "head_dim %" PRIu32 " not even in 2..%d",
            hp->head_dim, COL_MAX_HEAD_DIM);
    if (v2 && (hp->head_dim < 1 || hp->head_dim > COL_MAX_HEAD_DIM))
        ERR(s, COL_ERR_HEADER, H_HEAD_DIM, "", "head_dim %" PRIu32 " not in 1..%d", hp->head_dim,
            COL_MAX_HEAD_DIM);
    if (hp->vocab_size < 1 || hp->vocab_size > 16777216)
        ERR(s, COL_ERR_HEADER, H_VOCAB, "", "vocab_size %" PRIu32 " not in 1..16777216",
            hp->vocab_size);
    if (hp->max_context < 1 || hp->max_context > 1048576)
        ERR(s, COL_ERR_HEADER, H_MAX_CONTEXT, "", "max_context %" PRIu32 " not in 1..1048576",
            hp->max_context);
    if (hp->n_moe_layers > hp->n_layers)
        ERR(s, COL_ERR_HEADER, H_N_MOE_LAYERS, "", "n_moe_layers %" PRIu32 " > num_layers %" PRIu32,
            hp->n_moe_layers, hp->n_layers);
    if (hp->n_moe_layers > 0 && hp->d_ff_expert == 0)
        ERR(s, COL_ERR_HEADER, H_D_FF_EXPERT, "", "d_ff_expert is 0 but there are MoE layers");
    if (hp->n_moe_layers < hp->n_layers && hp->d_ff_dense == 0)
        ERR(s, COL_ERR_HEADER, H_D_FF_DENSE, "", "d_ff_dense is 0 but there are dense layers");
    if (!v2 && ((hp->flags & COL_FLAG_SHARED_EXPERT) ? hp->d_ff_shared == 0 : hp->d_ff_shared != 0))
        ERR(s, COL_ERR_HEADER, H_D_FF_SHARED, "",
            "d_ff_shared %" PRIu32 " must be > 0 exactly when flag SHARED_EXPERT is set",
            hp->d_ff_shared);
    if (hp->n_experts_active < 1 || (L->experts_ok && hp->n_experts_active > hp->n_experts))
        ERR(s, COL_ERR_HEADER, H_TOPK, "", "n_experts_active %" PRIu32 " not in 1..num_experts %"
            PRIu32, hp->n_experts_active, hp->n_experts);
    if (hp->rope_type > (v2 ? COL_ROPE_LLAMA3 : COL_ROPE_LINEAR))
        ERR(s, COL_ERR_UNSUPPORTED, H_ROPE_TYPE, "", "unknown rope_type %" PRIu32 " (format version %" PRIu32 ")",
            hp->rope_type, L->version);
    if (!finite_pos(hp->rope_theta))
        ERR(s, COL_ERR_HEADER, H_ROPE_THETA, "", "rope_theta %g is not a finite value > 0",
            hp->rope_theta);
    if (!finite_pos((double)hp->rope_factor))
        ERR(s, COL_ERR_HEADER, H_ROPE_FACTOR, "", "rope_factor %g is not a finite value > 0",
            (double)hp->rope_factor);
    if (!finite_pos((double)hp->norm_eps))
        ERR(s, COL_ERR_HEADER, H_NORM_EPS, "", "norm_eps %g is not a finite value > 0",
            (double)hp->norm_eps);
    if (!finite_nonneg((double)hp->clip_qkv))
        ERR(s, COL_ERR_HEADER, H_CLIP_QKV, "", "clip_qkv %g is not a finite value >= 0",
            (double)hp->clip_qkv);
    if (!finite_nonneg((double)hp->default_epsilon))
        ERR(s, COL_ERR_HEADER, H_DEFAULT_EPS, "", "default_epsilon %g is not a finite value >= 0",
            (double)hp->default_epsilon);
    if (hp->bos_token_id < -1 || (hp->bos_token_id >= 0 && (uint32_t)hp->bos_token_id >= hp->vocab_size))
        ERR(s, COL_ERR_HEADER, H_BOS, "", "bos_token_id %" PRId32 " not -1 or in 0..vocab_size-1",
            hp->bos_token_id);
    if (hp->eos_token_id < -1 || (hp->eos_token_id >= 0 && (uint32_t)hp->eos_token_id >= hp->vocab_size))
        ERR(s, COL_ERR_HEADER, H_EOS, "", "eos_token_id %" PRId32 " not -1 or in 0..vocab_size-1",
            hp->eos_token_id);
    if (v2)
        check_hparams_v2(L, s);
}

/* Step 5. */
static void check_sections(layout *L, sink *s)
{
    uint64_t lo = L->header_size;
    if (L->data_off < lo || L->data_off > L->end)
        ERR(s, COL_ERR_SECTION_BOUNDS, H_DATA_OFFSET, "",
            "data_offset 0x%" PRIX64 " outside [header_size 0x%" PRIX64 ", file end 0x%" PRIX64 "]",
            L->data_off, lo, L->end);
    if (L->data_off % COL_ALIGNMENT)
        ERR(s, COL_ERR_MISALIGNED, H_DATA_OFFSET, "",
            "data_offset 0x%" PRIX64 " is not a multiple of 64", L->data_off);
    uint64_t hi = L->data_off <= L->end ? L->data_off : L->end;

    struct { const char *name; uint64_t field, off, len; bool have, ok; } sec[4] = {
        {"routing section", H_ROUTING_OFFSET, L->routing_off,
         (uint64_t)L->n_layers * L->entry_size, L->layers_ok, false},
        {"tensor table", H_TABLE_OFFSET, L->table_off,
         (uint64_t)L->n_tensors * COL_TENSOR_ENTRY_SIZE, L->count_ok, false},
        {"tokenizer", H_TOKENIZER_OFFSET, L->tok_off, L->tok_size, true, false},
        {"metadata", H_METADATA_OFFSET, L->meta_off, L->meta_size, true, false},
    };
    for (int k = 0; k < 4; k++) {
        if (!sec[k].have)
            continue;
        if (sec[k].len == 0) {
            if (sec[k].off != 0)
                ERR(s, COL_ERR_SECTION_BOUNDS, sec[k].field, "",
                    "%s is empty but its offset is 0x%" PRIX64 " (must be 0)", sec[k].name,
                    sec[k].off);
            continue;
        }
        if (sec[k].off < lo || !range_ok(sec[k].off, sec[k].len, hi)) {
            ERR(s, COL_ERR_SECTION_BOUNDS, sec[k].field, "",
                "%s 0x%" PRIX64 " + %" PRIu64 " outside [header_size 0x%" PRIX64
                ", data_offset 0x%" PRIX64 ")", sec[k].name, sec[k].off, sec[k].len, lo, hi);
            continue;
        }
        sec[k].ok = true;
        for (int j = 0; j < k; j++)
            if (sec[j].ok && sec[j].len && sec[k].off < sec[j].off + sec[j].len &&
                sec[j].off < sec[k].off + sec[k].len)
                ERR(s, COL_ERR_SECTION_BOUNDS, sec[k].field, "",
                    "%s 0x%" PRIX64 " + %" PRIu64 " overlaps the %s", sec[k].name, sec[k].off,
                    sec[k].len, sec[j].name);
    }
}

/* A hash of a whole 64-byte name field, eight bytes at a time (valid names are NUL-padded, so
 * equal fields are equal names); the final mix spreads every byte into the low bits. */
static uint32_t name_hash(const uint8_t *field)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t k = 0; k < COL_TENSOR_NAME_MAX; k += 8)
        h = (h ^ rd64(field + k)) * 0x100000001b3u;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9u;
    return (uint32_t)(h ^ (h >> 32));
}

/* Step 6: every entry, then order/overlap, then duplicate names. */
static void check_tensor_table(const layout *L, sink *s)
{
    uint64_t prev_end = 0;
    char prev_name[COL_TENSOR_NAME_MAX] = "";
    for (uint32_t i = 0; i < L->n_tensors; i++) {
        col_tensor_info t;
        check_entry(L, i, s, &t);
        if (i > 0 && t.offset < prev_end)
            ERR(s, COL_ERR_OVERLAP, t.table_offset + T_OFFSET, t.name,
                "tensor '%s': offset 0x%" PRIX64 " is before the end 0x%" PRIX64
                " of the previous tensor '%s' (overlap or table not sorted by offset)",
                t.name, t.offset, prev_end, prev_name);
        /* Only an in-bounds entry moves the high-water mark: one corrupt offset must not make
         * every later entry look like an overlap. */
        if (t.offset >= L->data_off && range_ok(t.offset, t.nbytes, L->end)) {
            prev_end = t.offset + t.nbytes;
            memcpy(prev_name, t.name, sizeof prev_name);
        }
    }
    if (L->n_tensors > DUP_CHECK_ALL_MAX)
        return;
    /* Open addressing over the entries' indices, at most half full: linear time for any table
     * within the cap, and no worse than comparing every pair when hostile names collide. */
    uint16_t slots[DUP_CHECK_SLOTS];
    memset(slots, 0xFF, sizeof slots);
    for (uint32_t i = 0; i < L->n_tensors; i++) {
        const uint8_t *a = L->d + L->table_off + (uint64_t)i * COL_TENSOR_ENTRY_SIZE;
        if (!a[0] || memchr(a, 0, COL_TENSOR_NAME_MAX) == NULL)
            continue;
        uint32_t at = name_hash(a) & (DUP_CHECK_SLOTS - 1);
        for (; slots[at] != DUP_SLOT_EMPTY; at = (at + 1) & (DUP_CHECK_SLOTS - 1)) {
            uint32_t j = slots[at];
            const uint8_t *b = L->d + L->table_off + (uint64_t)j * COL_TENSOR_ENTRY_SIZE;
            if (memcmp(a, b, COL_TENSOR_NAME_MAX) == 0)
                break;
        }
        if (slots[at] == DUP_SLOT_EMPTY) {
            slots[at] = (uint16_t)i;
            continue;
        }
        char nm[COL_TENSOR_NAME_MAX];
        printable_name(a, nm);
        ERR(s, COL_ERR_NAME, L->table_off + (uint64_t)i * COL_TENSOR_ENTRY_SIZE, nm,
            "tensor %" PRIu32 ": name '%s' duplicates tensor %" PRIu32, i, nm, (uint32_t)slots[at]);
    }
}

/* A tensor index of routing entry `l` at `field`: it must name `layers.L.<slot>`. */
static void check_entry_tensor(const layout *L, sink *s, uint32_t l, uint64_t field, uint32_t index,
                               const char *slot, const char *what)
{
    char want[COL_TENSOR_NAME_MAX];
    snprintf(want, sizeof want, "layers.%" PRIu32 ".%s", l, slot);
    if (!L->table_safe || index >= L->n_tensors) {
        ERR(s, COL_ERR_ROUTING, field, want, "routing entry %" PRIu32 ": %s %" PRIu32 " is not a tensor index",
            l, what, index);
        return;
    }
    const uint8_t *e = L->d + L->table_off + (uint64_t)index * COL_TENSOR_ENTRY_SIZE;
    if (strncmp((const char *)e, want, COL_TENSOR_NAME_MAX) != 0) {
        char got[COL_TENSOR_NAME_MAX];
        printable_name(e, got);
        ERR(s, COL_ERR_ROUTING, field, want, "routing entry %" PRIu32 ": %s %" PRIu32 " is '%s', expected '%s'",
            l, what, index, got, want);
    }
}

/* Step 7, the rule of a version-2 entry (docs/format.md, "The routing rule"). Returns whether it
 * has a shared expert. */
static bool check_route_v2(const layout *L, sink *s, uint32_t l, uint64_t ro, const col_routing_info *ri)
{
    const col_hparams *hp = &L->hp;
    const uint8_t *r = L->d + ro;
    for (uint32_t o = R_RESERVED; o < L->entry_size; o++)
        if (r[o]) {
            ERR(s, COL_ERR_UNSUPPORTED, ro + o, "", "routing entry %" PRIu32 ": reserved byte 0x%02" PRIX32
                " is 0x%02X, not 0: a field this engine does not know", l, o, r[o]);
            break;
        }
    if (ri->attention > COL_LAYER_CHUNKED)
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_ATTENTION, "", "routing entry %" PRIu32 ": unknown attention %" PRIu32,
            l, ri->attention);
    else if (ri->attention == COL_LAYER_SLIDING && hp->sliding_window == 0)
        ERR(s, COL_ERR_ROUTING, ro + R_ATTENTION, "", "routing entry %" PRIu32
            ": a sliding-window layer, but the header's sliding_window is 0", l);
    else if (ri->attention == COL_LAYER_CHUNKED && hp->attention_chunk_size == 0)
        ERR(s, COL_ERR_ROUTING, ro + R_ATTENTION, "", "routing entry %" PRIu32
            ": a chunked-attention layer, but the header's attention_chunk_size is 0", l);
    if (ri->no_rope > 1)
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_NO_ROPE, "", "routing entry %" PRIu32 ": no_rope %" PRIu32
            " is not 0 or 1", l, ri->no_rope);
    else if (ri->no_rope && hp->attention != COL_ATTENTION_GQA)
        ERR(s, COL_ERR_ROUTING, ro + R_NO_ROPE, "", "routing entry %" PRIu32
            ": a layer without RoPE needs GQA attention", l);
    if (ri->qk_l2_norm > 1)
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_QK_L2_NORM, "", "routing entry %" PRIu32 ": qk_l2_norm %" PRIu32
            " is not 0 or 1", l, ri->qk_l2_norm);
    else if (ri->qk_l2_norm && (hp->attention != COL_ATTENTION_GQA ||
                                (hp->flags & (COL_FLAG_QK_NORM_HEAD | COL_FLAG_QK_NORM_FULL))))
        ERR(s, COL_ERR_ROUTING, ro + R_QK_L2_NORM, "", "routing entry %" PRIu32
            ": the q/k L2 norm needs GQA attention without the header's QK_NORM flags", l);
    if (ri->temperature_floor ? !isfinite(ri->temperature_scale) : ri->temperature_scale != 0.0f)
        ERR(s, COL_ERR_ROUTING, ro + R_TEMP_SCALE, "", "routing entry %" PRIu32
            ": temperature_scale %g (finite with a temperature_floor, else 0)", l, (double)ri->temperature_scale);
    if (ri->sinks > 1)
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_SINKS, "", "routing entry %" PRIu32 ": sinks %" PRIu32 " is not 0 or 1",
            l, ri->sinks);
    else if (ri->sinks && hp->attention != COL_ATTENTION_GQA)
        ERR(s, COL_ERR_ROUTING, ro + R_SINKS, "", "routing entry %" PRIu32
            ": attention sinks need GQA attention", l);
    if (ri->kind == COL_LAYER_DENSE) {
        /* every routing field of a dense layer is "none": the first one that is not is named */
        static const struct { uint32_t off; const char *name; uint32_t none; } fields[] = {
            {R_GATE, "gate_tensor", COL_NO_TENSOR}, {R_GATE_BIAS, "gate_bias_tensor", COL_NO_TENSOR},
            {R_TOPK, "top_k", 0}, {R_N_EXPERTS, "n_experts", 0}, {R_SCORING, "scoring", 0},
            {R_SELECT_ON, "select_on", 0}, {R_CORRECTION, "correction_bias_tensor", COL_NO_TENSOR},
            {R_N_GROUPS, "n_groups", 0}, {R_GROUPS_KEPT, "n_groups_kept", 0}, {R_GROUP_SCORE, "group_score", 0},
            {R_NORMALIZE, "normalize", 0}, {R_NORM_EPS, "norm_eps", 0}, {R_NORM_P, "norm_p", 0},
            {R_SCALE, "scale", 0}, {R_SHARED, "shared", 0}, {R_SPARSEMIXER_EPS, "sparsemixer_eps", 0},
            {R_EXPERT_BIAS, "expert_bias", 0}, {R_ACTIVATION, "activation", 0}, {R_ACT_ALPHA, "act_alpha", 0},
            {R_ACT_LIMIT, "act_limit", 0}, {R_WEIGHT_INPUTS, "weight_inputs", 0}};
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
            if (rd32(r + fields[i].off) != fields[i].none) {
                ERR(s, COL_ERR_ROUTING, ro + fields[i].off, "", "routing entry %" PRIu32
                    ": dense layer with %s 0x%" PRIX32 " (expected 0x%" PRIX32 ")", l, fields[i].name,
                    rd32(r + fields[i].off), fields[i].none);
                break;
            }
        return false;
    }
    check_entry_tensor(L, s, l, ro + R_GATE, ri->gate_tensor, "moe_gate", "gate_tensor");
    if (ri->gate_bias_tensor != COL_NO_TENSOR)
        check_entry_tensor(L, s, l, ro + R_GATE_BIAS, ri->gate_bias_tensor, "moe_gate_bias", "gate_bias_tensor");
    if (ri->correction_bias_tensor != COL_NO_TENSOR)
        check_entry_tensor(L, s, l, ro + R_CORRECTION, ri->correction_bias_tensor, "moe_correction_bias",
                           "correction_bias_tensor");
    if (ri->scoring > COL_SCORING_SPARSEMIXER)
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_SCORING, "", "routing entry %" PRIu32 ": unknown scoring %" PRIu32,
            l, ri->scoring);
    if (ri->select_on > COL_SELECT_LOGITS)
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_SELECT_ON, "", "routing entry %" PRIu32 ": unknown select_on %" PRIu32,
            l, ri->select_on);
    if (ri->scoring == COL_SCORING_SPARSEMIXER) {
        if (ri->select_on != COL_SELECT_LOGITS)
            ERR(s, COL_ERR_ROUTING, ro + R_SELECT_ON, "", "routing entry %" PRIu32
                ": sparsemixer selects on the logits (select_on must be 1)", l);
        if (ri->top_k != 2)
            ERR(s, COL_ERR_ROUTING, ro + R_TOPK, "", "routing entry %" PRIu32
                ": sparsemixer chooses exactly 2 experts, top_k is %" PRIu32, l, ri->top_k);
        if (!finite_nonneg((double)ri->sparsemixer_eps))
            ERR(s, COL_ERR_ROUTING, ro + R_SPARSEMIXER_EPS, "", "routing entry %" PRIu32
                ": sparsemixer_eps %g is not a finite value >= 0", l, (double)ri->sparsemixer_eps);
    } else if (ri->sparsemixer_eps != 0.0f) {
        ERR(s, COL_ERR_ROUTING, ro + R_SPARSEMIXER_EPS, "", "routing entry %" PRIu32
            ": sparsemixer_eps %g without sparsemixer scoring (it must be 0)", l, (double)ri->sparsemixer_eps);
    }
    if (ri->correction_bias_tensor != COL_NO_TENSOR &&
        (ri->select_on != COL_SELECT_SCORES || ri->scoring == COL_SCORING_SPARSEMIXER))
        ERR(s, COL_ERR_ROUTING, ro + R_CORRECTION, "", "routing entry %" PRIu32
            ": a correction bias is added to the scores, so the rule must select on scores", l);
    uint32_t ne = ri->n_experts;
    if (ri->n_groups < 1 || ne == 0 || ne % ri->n_groups) {
        ERR(s, COL_ERR_ROUTING, ro + R_N_GROUPS, "", "routing entry %" PRIu32 ": n_groups %" PRIu32
            " does not divide n_experts %" PRIu32, l, ri->n_groups, ne);
    } else if (ri->n_groups_kept < 1 || ri->n_groups_kept > ri->n_groups) {
        ERR(s, COL_ERR_ROUTING, ro + R_GROUPS_KEPT, "", "routing entry %" PRIu32 ": n_groups_kept %" PRIu32
            " not in 1..n_groups %" PRIu32, l, ri->n_groups_kept, ri->n_groups);
    } else if (ri->n_groups == 1) {
        if (ri->group_score != COL_GROUP_NONE)
            ERR(s, COL_ERR_ROUTING, ro + R_GROUP_SCORE, "", "routing entry %" PRIu32
                ": group_score %" PRIu32 " without groups (n_groups 1: it must be 0)", l, ri->group_score);
    } else {
        uint32_t size = ne / ri->n_groups;
        if (ri->group_score > COL_GROUP_TOP2_SUM)
            ERR(s, COL_ERR_UNSUPPORTED, ro + R_GROUP_SCORE, "", "routing entry %" PRIu32
                ": unknown group_score %" PRIu32, l, ri->group_score);
        else if (ri->group_score == COL_GROUP_NONE)
            ERR(s, COL_ERR_ROUTING, ro + R_GROUP_SCORE, "", "routing entry %" PRIu32
                ": %" PRIu32 " groups but no group_score", l, ri->n_groups);
        else if (ri->group_score == COL_GROUP_TOP2_SUM && size < 2)
            ERR(s, COL_ERR_ROUTING, ro + R_N_GROUPS, "", "routing entry %" PRIu32
                ": a top-2 group score needs groups of 2 or more experts (%" PRIu32 " groups of %" PRIu32 ")",
                l, ri->n_groups, size);
        if (ri->select_on != COL_SELECT_SCORES)
            ERR(s, COL_ERR_ROUTING, ro + R_N_GROUPS, "", "routing entry %" PRIu32
                ": group-limited routing ranks scores (select_on must be 0)", l);
        if ((uint64_t)ri->n_groups_kept * size < ri->top_k)
            ERR(s, COL_ERR_ROUTING, ro + R_GROUPS_KEPT, "", "routing entry %" PRIu32 ": %" PRIu32
                " kept groups of %" PRIu32 " experts cannot hold top_k %" PRIu32, l, ri->n_groups_kept, size,
                ri->top_k);
    }
    if (ri->normalize > COL_NORM_P)
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_NORMALIZE, "", "routing entry %" PRIu32 ": unknown normalize %" PRIu32,
            l, ri->normalize);
    if (!finite_nonneg((double)ri->norm_eps))
        ERR(s, COL_ERR_ROUTING, ro + R_NORM_EPS, "", "routing entry %" PRIu32
            ": norm_eps %g is not a finite value >= 0", l, (double)ri->norm_eps);
    if (ri->normalize == COL_NORM_P ? !finite_pos((double)ri->norm_p) : ri->norm_p != 0.0f)
        ERR(s, COL_ERR_ROUTING, ro + R_NORM_P, "", "routing entry %" PRIu32
            ": norm_p %g (a finite value > 0 for the p-norm, else 0)", l, (double)ri->norm_p);
    if (!finite_pos((double)ri->scale))
        ERR(s, COL_ERR_ROUTING, ro + R_SCALE, "", "routing entry %" PRIu32 ": scale %g is not a finite value > 0",
            l, (double)ri->scale);
    if (ri->expert_bias > 1)
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_EXPERT_BIAS, "", "routing entry %" PRIu32
            ": expert_bias %" PRIu32 " is not 0 or 1", l, ri->expert_bias);
    if (ri->weight_inputs > 1)
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_WEIGHT_INPUTS, "", "routing entry %" PRIu32
            ": weight_inputs %" PRIu32 " is not 0 or 1", l, ri->weight_inputs);
    if (ri->activation > COL_EXPERT_SWIGLU_CLAMPED) {
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_ACTIVATION, "", "routing entry %" PRIu32 ": unknown activation %" PRIu32,
            l, ri->activation);
    } else if (ri->activation == COL_EXPERT_SWIGLU_CLAMPED) {
        if (!finite_pos((double)ri->act_alpha))
            ERR(s, COL_ERR_ROUTING, ro + R_ACT_ALPHA, "", "routing entry %" PRIu32
                ": act_alpha %g is not a finite value > 0", l, (double)ri->act_alpha);
        if (!finite_pos((double)ri->act_limit))
            ERR(s, COL_ERR_ROUTING, ro + R_ACT_LIMIT, "", "routing entry %" PRIu32
                ": act_limit %g is not a finite value > 0", l, (double)ri->act_limit);
    } else if (ri->act_alpha != 0.0f || ri->act_limit != 0.0f) {
        ERR(s, COL_ERR_ROUTING, ri->act_alpha != 0.0f ? ro + R_ACT_ALPHA : ro + R_ACT_LIMIT, "",
            "routing entry %" PRIu32 ": act_alpha and act_limit are the clamped SwiGLU's (they must be 0)", l);
    }
    if (ri->shared > COL_SHARED_SIGMOID_GATE) {
        ERR(s, COL_ERR_UNSUPPORTED, ro + R_SHARED, "", "routing entry %" PRIu32 ": unknown shared %" PRIu32,
            l, ri->shared);
        return false;
    }
    if (ri->shared != COL_SHARED_NONE && hp->d_ff_shared == 0)
        ERR(s, COL_ERR_ROUTING, ro + R_SHARED, "", "routing entry %" PRIu32
            ": a shared expert, but the header's d_ff_shared is 0", l);
    return ri->shared != COL_SHARED_NONE;
}

/* Step 7. */
static void check_routing(const layout *L, sink *s)
{
    const col_hparams *hp = &L->hp;
    uint32_t n_moe = 0;
    bool any_shared = false, any_sliding = false, any_chunked = false;
    for (uint32_t l = 0; l < L->n_layers; l++) {
        uint64_t ro = L->routing_off + (uint64_t)l * L->entry_size;
        const uint8_t *r = L->d + ro;
        uint32_t layer = rd32(r + R_LAYER), kind = rd32(r + R_KIND), gate = rd32(r + R_GATE);
        uint32_t bias = rd32(r + R_GATE_BIAS), topk = rd32(r + R_TOPK);
        uint32_t ne = rd32(r + R_N_EXPERTS), scoring = rd32(r + R_SCORING);
        if (layer != l)
            ERR(s, COL_ERR_ROUTING, ro + R_LAYER, "",
                "routing entry %" PRIu32 ": layer field is %" PRIu32, l, layer);
        if (kind > COL_LAYER_MOE) {
            ERR(s, COL_ERR_ROUTING, ro + R_KIND, "",
                "routing entry %" PRIu32 ": unknown layer kind %" PRIu32, l, kind);
            continue;
        }
        if (kind == COL_LAYER_MOE) {
            n_moe++;
            if (topk != hp->n_experts_active)
                ERR(s, COL_ERR_ROUTING, ro + R_TOPK, "",
                    "routing entry %" PRIu32 ": top_k %" PRIu32 " != n_experts_active %" PRIu32, l,
                    topk, hp->n_experts_active);
            if (ne != hp->n_experts)
                ERR(s, COL_ERR_ROUTING, ro + R_N_EXPERTS, "",
                    "routing entry %" PRIu32 ": n_experts %" PRIu32 " != num_experts %" PRIu32, l, ne,
                    hp->n_experts);
        }
        if (L->version == 2) {
            col_routing_info ri;
            route_of(L, l, &ri);
            any_shared |= check_route_v2(L, s, l, ro, &ri);
            any_sliding |= ri.attention == COL_LAYER_SLIDING;
            any_chunked |= ri.attention == COL_LAYER_CHUNKED;
            continue;
        }
        if (bias != COL_NO_TENSOR)
            ERR(s, COL_ERR_ROUTING, ro + R_GATE_BIAS, "",
                "routing entry %" PRIu32 ": gate_bias_tensor %" PRIu32
                " (no router bias in format version 1)", l, bias);
        if (scoring != 0)
            ERR(s, COL_ERR_UNSUPPORTED, ro + R_SCORING, "",
                "routing entry %" PRIu32 ": unknown scoring %" PRIu32, l, scoring);
        if (kind == COL_LAYER_DENSE) {
            if (gate != COL_NO_TENSOR || topk != 0 || ne != 0)
                ERR(s, COL_ERR_ROUTING, ro + (gate != COL_NO_TENSOR ? R_GATE : topk ? R_TOPK
                                              : R_N_EXPERTS), "",
                    "routing entry %" PRIu32 ": dense layer with gate_tensor %" PRIu32
                    ", top_k %" PRIu32 ", n_experts %" PRIu32 " (expected 0xFFFFFFFF, 0, 0)",
                    l, gate, topk, ne);
            continue;
        }
        check_entry_tensor(L, s, l, ro + R_GATE, gate, "moe_gate", "gate_tensor");
    }
    if (n_moe != hp->n_moe_layers)
        ERR(s, COL_ERR_ROUTING, H_N_MOE_LAYERS, "",
            "n_moe_layers %" PRIu32 " but the routing section has %" PRIu32 " MoE layers",
            hp->n_moe_layers, n_moe);
    if (L->version == 2 && hp->d_ff_shared != 0 && !any_shared)
        ERR(s, COL_ERR_HEADER, H_D_FF_SHARED, "",
            "d_ff_shared %" PRIu32 " but no routing entry has a shared expert", hp->d_ff_shared);
    if (L->version == 2 && hp->sliding_window != 0 && !any_sliding)
        ERR(s, COL_ERR_HEADER, H_SLIDING_WINDOW, "",
            "sliding_window %" PRIu32 " but no routing entry has a sliding-window layer", hp->sliding_window);
    if (L->version == 2 && hp->attention_chunk_size != 0 && !any_chunked)
        ERR(s, COL_ERR_HEADER, H_CHUNK, "",
            "attention_chunk_size %" PRIu32 " but no routing entry has a chunked-attention layer",
            hp->attention_chunk_size);
}

/* LongRoPE's factors divide RoPE's frequencies: each must be finite and > 0. A few hundred
 * values at most, read here (step 8) so a file that would rotate by NaN never opens. */
static void check_freq_factors(const layout *L, uint32_t i, sink *s)
{
    col_tensor_info t;
    if (!check_entry(L, i, NULL, &t) || t.dtype != COL_DTYPE_F32)
        return; /* step 6 or the dtype check reported it */
    for (uint64_t k = 0; k < t.shape[0]; k++) {
        float v = rdf32((const uint8_t *)t.data + 4 * k);
        if (!finite_pos((double)v)) {
            ERR(s, COL_ERR_LIMIT, t.offset + 4 * k, t.name, "tensor '%s': factor %" PRIu64 " is %g, not a finite "
                "value > 0", t.name, k, (double)v);
            return;
        }
    }
}

/* Step 8. Presence and duplicates of the architecture's names are tracked in a bitset on the
 * stack (one u64 of slots per layer: 8 KiB), so the check is O(tensor_count) and allocation-free
 * at any table size. */
static void check_architecture(const layout *L, sink *s)
{
    const col_hparams *hp = &L->hp;
    uint64_t seen_layer[MAX_LAYERS];
    uint64_t seen_global = 0;
    memset(seen_layer, 0, sizeof seen_layer);

    for (uint32_t i = 0; i < L->n_tensors; i++) {
        uint64_t eo = L->table_off + (uint64_t)i * COL_TENSOR_ENTRY_SIZE;
        const uint8_t *e = L->d + eo;
        size_t bad;
        const char *why;
        if (!name_valid(e, &bad, &why))
            continue; /* reported in step 6 */
        const char *nm = (const char *)e;
        uint32_t layer = 0;
        int slot = 0;
        int cls = parse_name(nm, &layer, &slot);
        bool expected;
        if (cls == NAME_GLOBAL)
            expected = global_expected(slot, hp);
        else if (cls == NAME_LAYER && L->layers_ok && layer < L->n_layers) {
            col_routing_info ri;
            bool known = route_of(L, layer, &ri);
            if (!known && slot_depends_on_entry(slot))
                continue; /* the routing error already explains this layer */
            expected = slot_expected(slot, hp, known ? &ri : NULL);
        } else
            expected = false;
        if (!expected) {
            report(s, COL_ERR_UNKNOWN_TENSOR, COL_SEVERITY_WARNING, eo, nm,
                   "tensor '%s' is not used by this architecture, flags and layer kinds", nm);
            continue;
        }
        uint64_t *word = cls == NAME_GLOBAL ? &seen_global : &seen_layer[layer];
        uint64_t bit = (uint64_t)1 << slot;
        if (*word & bit) {
            if (L->n_tensors > DUP_CHECK_ALL_MAX) /* else step 6 reported it */
                ERR(s, COL_ERR_NAME, eo, nm, "tensor %" PRIu32 ": name '%s' is a duplicate", i, nm);
            continue;
        }
        *word |= bit;

        uint64_t want[4] = {0, 0, 0, 0};
        uint32_t want_ndim = expected_shape(hp, cls == NAME_LAYER, slot, want);
        uint32_t ndim = rd32(e + T_NDIM);
        uint64_t got[4];
        for (int k = 0; k < 4; k++)
            got[k] = rd64(e + T_SHAPE + 8 * k);
        int diff = -1;
        if (ndim != want_ndim)
            diff = 4;
        for (uint32_t k = 0; diff < 0 && k < want_ndim; k++)
            if (got[k] != want[k])
                diff = (int)k;
        if (diff >= 0) {
            char gs[96], ws[96];
            format_shape(gs, sizeof gs, got, ndim <= 4 ? ndim : 4);
            format_shape(ws, sizeof ws, want, want_ndim);
            ERR(s, COL_ERR_SHAPE, eo + (diff == 4 ? T_NDIM : T_SHAPE + 8 * (uint64_t)diff), nm,
                "tensor '%s': shape %s, expected %s%s", nm, gs, ws,
                (want_ndim == 2 && ndim == 2 && got[0] == want[1] && got[1] == want[0])
                    ? " (transposed?)" : "");
        }
        uint32_t dtype = rd32(e + T_DTYPE);
        bool must_f32 = want_ndim == 1 ||
                        (cls == NAME_LAYER && (slot == S_MOE_GATE || slot == S_MOE_W1_BIAS ||
                                               slot == S_MOE_W2_BIAS || slot == S_MOE_W3_BIAS));
        if (must_f32 && (col_dtype_size(dtype) || block_bytes(dtype)) && dtype != COL_DTYPE_F32)
            ERR(s, COL_ERR_DTYPE, eo + T_DTYPE, nm,
                "tensor '%s': dtype %" PRIu32 ", this tensor must be f32", nm, dtype);
        else if (cls == NAME_GLOBAL && slot == G_ROPE_FREQ_FACTORS && diff < 0)
            check_freq_factors(L, i, s);
    }

    for (int g = 0; g < N_GLOBALS; g++)
        if (!(seen_global & ((uint64_t)1 << g)) && global_expected(g, hp))
            ERR(s, COL_ERR_MISSING_TENSOR, L->table_off, global_names[g],
                "required tensor '%s' is missing", global_names[g]);
    if (!L->layers_ok)
        return;
    for (uint32_t l = 0; l < L->n_layers; l++) {
        col_routing_info ri;
        bool known = route_of(L, l, &ri);
        for (int slot = 0; slot < N_SLOTS; slot++) {
            if (!known && slot_depends_on_entry(slot))
                continue;
            if (!slot_expected(slot, hp, known ? &ri : NULL) || (seen_layer[l] & ((uint64_t)1 << slot)))
                continue;
            char nm[COL_TENSOR_NAME_MAX];
            snprintf(nm, sizeof nm, "layers.%" PRIu32 ".%s", l, slot_names[slot]);
            ERR(s, COL_ERR_MISSING_TENSOR, L->table_off, nm, "required tensor '%s' is missing", nm);
        }
    }
}

/* ---- Data checks ----------------------------------------------------------------------------- */

/* Byte offset, in a quantised tensor's data, of its k-th stored scale (rows: k / nb's row, its
 * block k % nb; panels: a panel's 8 * nb scales come first, so in storage order the k-th of them). */
static uint64_t scale_offset(uint32_t dtype, uint64_t rb, uint64_t nb, uint64_t k)
{
    if (is_panel_dtype(dtype)) return COL_STORED_PANEL_ROWS * rb * (k / (COL_STORED_PANEL_ROWS * nb)) + 2 * (k % (COL_STORED_PANEL_ROWS * nb));
    return rb * (k / nb) + 2 * (k % nb);
}

static void check_data(const col_tensor_info *t, uint32_t flags, sink *s)
{
    if (flags & COL_CHECK_CHECKSUMS) {
        uint32_t got = col_crc32(0, t->data, (size_t)t->nbytes);
        if (got != t->crc32)
            ERR(s, COL_ERR_CHECKSUM, t->offset, t->name,
                "tensor '%s': data hashes to 0x%08" PRIX32 ", table says 0x%08" PRIX32, t->name,
                got, t->crc32);
    }
    if (flags & COL_CHECK_NONFINITE) {
        const uint8_t *p = t->data;
        uint64_t n_bad = 0, first = 0;
        uint32_t es = col_dtype_size(t->dtype);
        bool blocks = block_bytes(t->dtype) != 0; /* only the f16 scales can be non-finite */
        uint64_t cols = t->ndim >= 1 && t->ndim <= 4 ? t->shape[t->ndim - 1] : 0, nb = cols / 32;
        uint64_t rb = blocks ? col_dtype_row_bytes(t->dtype, cols) : 0;
        if (blocks)
            es = block_bytes(t->dtype);
        uint64_t n = t->nbytes / es; /* elements, or blocks: nb per row, scales at the row's start */
        for (uint64_t k = 0; k < n; k++) {
            bool bad;
            if (blocks)
                bad = rb && (rd16(p + scale_offset(t->dtype, rb, nb, k)) & 0x7C00u) == 0x7C00u;
            else if (t->dtype == COL_DTYPE_F32)
                bad = (rd32(p + 4 * k) & 0x7F800000u) == 0x7F800000u;
            else if (t->dtype == COL_DTYPE_F16)
                bad = (rd16(p + 2 * k) & 0x7C00u) == 0x7C00u;
            else
                bad = (rd16(p + 2 * k) & 0x7F80u) == 0x7F80u;
            if (bad && n_bad++ == 0)
                first = k;
        }
        if (n_bad && is_panel_dtype(t->dtype)) { /* the k-th scale of a panel is row 8p + k % 8's of block k / 8 */
            const uint64_t in_panel = first % (COL_STORED_PANEL_ROWS * nb);
            ERR(s, COL_ERR_NONFINITE, t->offset + scale_offset(t->dtype, rb, nb, first), t->name,
                "tensor '%s': %" PRIu64 " NaN/Inf values, first at the scale of row %" PRIu64 ", block %" PRIu64
                " (stored in 8-row panels)", t->name, n_bad,
                first / (COL_STORED_PANEL_ROWS * nb) * COL_STORED_PANEL_ROWS + in_panel % COL_STORED_PANEL_ROWS, in_panel / COL_STORED_PANEL_ROWS);
        } else if (n_bad && is_bf16_panel(t->dtype) && cols) { /* element k of a panel's pairs, in row and column */
            const uint64_t in_panel = first % (COL_BF16_PANEL_ROWS * cols), pair = in_panel / (2 * COL_BF16_PANEL_ROWS);
            ERR(s, COL_ERR_NONFINITE, t->offset + first * es, t->name,
                "tensor '%s': %" PRIu64 " NaN/Inf values, first at row %" PRIu64 ", column %" PRIu64
                " (stored in 16-row panels)", t->name, n_bad,
                first / (COL_BF16_PANEL_ROWS * cols) * COL_BF16_PANEL_ROWS + in_panel % (2 * COL_BF16_PANEL_ROWS) / 2,
                2 * pair + in_panel % 2);
        } else if (n_bad) {
            ERR(s, COL_ERR_NONFINITE, t->offset + (blocks ? scale_offset(t->dtype, rb, nb, first) : first * es), t->name,
                "tensor '%s': %" PRIu64 " NaN/Inf values, first at %s %" PRIu64, t->name,
                n_bad, blocks ? "the scale of block" : "element", first);
        }
    }
}

static void validate(const uint8_t *data, uint64_t size, uint32_t flags, layout *L, sink *s)
{
    memset(L, 0, sizeof *L);
    L->d = data;
    L->size = size;
    if (!check_identity_and_limits(L, s))
        return;
    check_header_crcs(L, s);
    check_hparams(L, s);
    check_sections(L, s);
    if (L->table_safe)
        check_tensor_table(L, s);
    if (L->routing_safe)
        check_routing(L, s);
    if (L->table_safe)
        check_architecture(L, s);
    if ((flags & (COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE)) && L->table_safe) {
        for (uint32_t i = 0; i < L->n_tensors; i++) {
            col_tensor_info t;
            if (check_entry(L, i, NULL, &t))
                check_data(&t, flags, s);
        }
    }
}

int32_t col_validate_buffer(const uint8_t *data, uint64_t size, uint32_t check_flags,
                            col_problem *problems, uint32_t max_problems, uint32_t *n_problems)
{
    sink s;
    layout L;
    sink_init(&s, problems, max_problems);
    if (!data && size) {
        ERR(&s, COL_ERR_INVALID_ARG, 0, "", "data is NULL but size is %" PRIu64, size);
    } else {
        validate(data ? data : (const uint8_t *)"", size, check_flags, &L, &s);
    }
    if (n_problems)
        *n_problems = s.count;
    return s.first_error;
}

/* ---- Header field iterator ------------------------------------------------------------------- */

typedef struct field_desc {
    const char *name;
    const char *group;
    uint16_t offset;
    uint16_t size;
    uint8_t kind;
    uint8_t versions;  /* bit v-1 set: the field is in format version v's header */
} field_desc;

enum { IN_V1 = 1, IN_V2 = 2, IN_ALL = 3 };

/* Every field of the fixed header in offset order, reserved bytes as one BYTES field, so a
 * structure view covering the fields of one version covers its header exactly: bytes
 * 0x000..0x0FF in version 1, 0x000..0x1FF in version 2. */
static const field_desc header_fields[] = {
    {"magic", "identity", H_MAGIC, 4, COL_FIELD_BYTES, IN_ALL},
    {"version", "identity", H_VERSION, 4, COL_FIELD_U32, IN_ALL},
    {"num_experts", "hyper-parameters", H_NUM_EXPERTS, 4, COL_FIELD_U32, IN_ALL},
    {"num_layers", "hyper-parameters", H_NUM_LAYERS, 4, COL_FIELD_U32, IN_ALL},
    {"header_size", "identity", H_HEADER_SIZE, 4, COL_FIELD_U32, IN_ALL},
    {"tensor_count", "sections", H_TENSOR_COUNT, 4, COL_FIELD_U32, IN_ALL},
    {"routing_offset", "sections", H_ROUTING_OFFSET, 8, COL_FIELD_U64, IN_ALL},
    {"data_offset", "sections", H_DATA_OFFSET, 8, COL_FIELD_U64, IN_ALL},
    {"tensor_table_offset", "sections", H_TABLE_OFFSET, 8, COL_FIELD_U64, IN_ALL},
    {"tokenizer_offset", "sections", H_TOKENIZER_OFFSET, 8, COL_FIELD_U64, IN_ALL},
    {"tokenizer_size", "sections", H_TOKENIZER_SIZE, 8, COL_FIELD_U64, IN_ALL},
    {"metadata_offset", "sections", H_METADATA_OFFSET, 8, COL_FIELD_U64, IN_ALL},
    {"metadata_size", "sections", H_METADATA_SIZE, 8, COL_FIELD_U64, IN_ALL},
    {"file_size", "sections", H_FILE_SIZE, 8, COL_FIELD_U64, IN_ALL},
    {"arch", "identity", H_ARCH, 4, COL_FIELD_U32, IN_ALL},
    {"flags", "identity", H_FLAGS, 4, COL_FIELD_U32, IN_ALL},
    {"d_model", "hyper-parameters", H_D_MODEL, 4, COL_FIELD_U32, IN_ALL},
    {"n_heads", "hyper-parameters", H_N_HEADS, 4, COL_FIELD_U32, IN_ALL},
    {"n_kv_heads", "hyper-parameters", H_N_KV_HEADS, 4, COL_FIELD_U32, IN_ALL},
    {"head_dim", "hyper-parameters", H_HEAD_DIM, 4, COL_FIELD_U32, IN_ALL},
    {"vocab_size", "hyper-parameters", H_VOCAB, 4, COL_FIELD_U32, IN_ALL},
    {"max_context", "hyper-parameters", H_MAX_CONTEXT, 4, COL_FIELD_U32, IN_ALL},
    {"d_ff_expert", "hyper-parameters", H_D_FF_EXPERT, 4, COL_FIELD_U32, IN_ALL},
    {"d_ff_dense", "hyper-parameters", H_D_FF_DENSE, 4, COL_FIELD_U32, IN_ALL},
    {"d_ff_shared", "hyper-parameters", H_D_FF_SHARED, 4, COL_FIELD_U32, IN_ALL},
    {"n_experts_active", "hyper-parameters", H_TOPK, 4, COL_FIELD_U32, IN_ALL},
    {"sliding_window", "hyper-parameters", H_SLIDING_WINDOW, 4, COL_FIELD_U32, IN_ALL},
    {"rope_type", "rope", H_ROPE_TYPE, 4, COL_FIELD_U32, IN_ALL},
    {"rope_theta", "rope", H_ROPE_THETA, 8, COL_FIELD_F64, IN_ALL},
    {"rope_factor", "rope", H_ROPE_FACTOR, 4, COL_FIELD_F32, IN_ALL},
    {"rope_original_max_context", "rope", H_ROPE_ORIG_CTX, 4, COL_FIELD_U32, IN_ALL},
    {"rope_low_freq_factor", "rope", H_ROPE_LOW, 4, COL_FIELD_F32, IN_ALL},
    {"rope_high_freq_factor", "rope", H_ROPE_HIGH, 4, COL_FIELD_F32, IN_ALL},
    {"norm_eps", "hyper-parameters", H_NORM_EPS, 4, COL_FIELD_F32, IN_ALL},
    {"clip_qkv", "hyper-parameters", H_CLIP_QKV, 4, COL_FIELD_F32, IN_ALL},
    {"default_epsilon", "hyper-parameters", H_DEFAULT_EPS, 4, COL_FIELD_F32, IN_ALL},
    {"bos_token_id", "tokens", H_BOS, 4, COL_FIELD_I32, IN_ALL},
    {"eos_token_id", "tokens", H_EOS, 4, COL_FIELD_I32, IN_ALL},
    {"n_moe_layers", "hyper-parameters", H_N_MOE_LAYERS, 4, COL_FIELD_U32, IN_ALL},
    {"header_crc32", "integrity", H_HEADER_CRC, 4, COL_FIELD_U32, IN_ALL},
    {"tables_crc32", "integrity", H_TABLES_CRC, 4, COL_FIELD_U32, IN_ALL},
    {"reserved", "reserved", H_RESERVED, COL_HEADER_SIZE - H_RESERVED, COL_FIELD_BYTES, IN_V1},
    {"attention", "attention", H_ATTENTION, 4, COL_FIELD_U32, IN_V2},
    {"q_lora_rank", "attention", H_Q_LORA, 4, COL_FIELD_U32, IN_V2},
    {"kv_lora_rank", "attention", H_KV_LORA, 4, COL_FIELD_U32, IN_V2},
    {"qk_nope_head_dim", "attention", H_QK_NOPE, 4, COL_FIELD_U32, IN_V2},
    {"qk_rope_head_dim", "attention", H_QK_ROPE, 4, COL_FIELD_U32, IN_V2},
    {"v_head_dim", "attention", H_V_HEAD, 4, COL_FIELD_U32, IN_V2},
    {"rotary_dim", "rope", H_ROTARY_DIM, 4, COL_FIELD_U32, IN_V2},
    {"rope_layout", "rope", H_ROPE_LAYOUT, 4, COL_FIELD_U32, IN_V2},
    {"attn_scale", "attention", H_ATTN_SCALE, 4, COL_FIELD_F32, IN_V2},
    {"latent_norm_eps", "attention", H_LATENT_EPS, 4, COL_FIELD_F32, IN_V2},
    {"rope_attn_factor", "rope", H_ROPE_ATTN_FACTOR, 4, COL_FIELD_F32, IN_V2},
    {"rope_beta_fast", "rope", H_ROPE_BETA_FAST, 4, COL_FIELD_F32, IN_V2},
    {"rope_beta_slow", "rope", H_ROPE_BETA_SLOW, 4, COL_FIELD_F32, IN_V2},
    {"rope_truncate", "rope", H_ROPE_TRUNCATE, 4, COL_FIELD_U32, IN_V2},
    {"norm_kind", "hyper-parameters", H_NORM_KIND, 4, COL_FIELD_U32, IN_V2},
    {"embedding_scale", "hyper-parameters", H_EMBEDDING_SCALE, 4, COL_FIELD_F32, IN_V2},
    {"residual_scale", "hyper-parameters", H_RESIDUAL_SCALE, 4, COL_FIELD_F32, IN_V2},
    {"logit_divisor", "hyper-parameters", H_LOGIT_DIVISOR, 4, COL_FIELD_F32, IN_V2},
    {"attention_chunk_size", "attention", H_CHUNK, 4, COL_FIELD_U32, IN_V2},
    {"reserved", "reserved", H_RESERVED_V2, COL_HEADER_SIZE_V2 - H_RESERVED_V2, COL_FIELD_BYTES, IN_V2},
};

uint32_t col_header_field_count(void)
{
    return (uint32_t)(sizeof header_fields / sizeof header_fields[0]);
}

int32_t col_header_field(const uint8_t *data, uint64_t size, uint32_t index, col_field *out)
{
    if (!out || index >= col_header_field_count())
        return COL_ERR_INVALID_ARG;
    const field_desc *f = &header_fields[index];
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", f->name);
    snprintf(out->group, sizeof out->group, "%s", f->group);
    out->offset = f->offset;
    out->size = f->size;
    out->kind = f->kind;
    uint32_t version = data != NULL && size >= H_VERSION + 4 ? rd32(data + H_VERSION) : 1;
    out->in_version = (f->versions & (version == 2 ? IN_V2 : IN_V1)) != 0;
    out->present = data != NULL && range_ok(f->offset, f->size, size);
    if (!out->present)
        return COL_OK;
    const uint8_t *p = data + f->offset;
    switch (f->kind) {
    case COL_FIELD_U32: out->u = rd32(p); break;
    case COL_FIELD_I32: out->i = (int32_t)rd32(p); break;
    case COL_FIELD_U64: out->u = rd64(p); break;
    case COL_FIELD_F32: out->f = (double)rdf32(p); break;
    case COL_FIELD_F64: out->f = rdf64(p); break;
    default: break; /* BYTES: the caller reads them at offset */
    }
    return COL_OK;
}

/* ---- Mapping files --------------------------------------------------------------------------- */

static void set_problem(col_problem *p, int32_t code, uint64_t offset, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static void set_problem(col_problem *p, int32_t code, uint64_t offset, const char *fmt, ...)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->code = code;
    p->severity = COL_SEVERITY_ERROR;
    p->offset = offset;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    va_end(ap);
}

/* strerror is not required to be thread safe; the XSI strerror_r is. */
static const char *errno_text(int e, char *buf, size_t n)
{
    if (strerror_r(e, buf, n) != 0)
        snprintf(buf, n, "errno %d", e);
    return buf;
}

/* Map `path` read-only. On failure returns the status and fills *p; a zero-size file is
 * TRUNCATED (mmap cannot map it, and it is a truncated .colibri file rather than an I/O fault).
 * With keep_fd non-NULL the file stays open and *keep_fd receives it (for identity checks). */
static int32_t map_file(const char *path, const uint8_t **base, uint64_t *size, col_problem *p,
                        int *keep_fd)
{
    *base = NULL;
    *size = 0;
    if (keep_fd)
        *keep_fd = -1;
    if (!path) {
        set_problem(p, COL_ERR_INVALID_ARG, 0, "path is NULL");
        return COL_ERR_INVALID_ARG;
    }
    char why[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        set_problem(p, COL_ERR_IO, 0, "cannot open '%s': %s", path, errno_text(e, why, sizeof why));
        return COL_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        set_problem(p, COL_ERR_IO, 0, "cannot stat '%s': %s", path, errno_text(e, why, sizeof why));
        return COL_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        set_problem(p, COL_ERR_IO, 0, "'%s' is not a regular file", path);
        return COL_ERR_IO;
    }
    if (st.st_size == 0) {
        close(fd);
        set_problem(p, COL_ERR_TRUNCATED, 0,
                    "file '%s' is empty, shorter than the 256-byte fixed header", path);
        return COL_ERR_TRUNCATED;
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        set_problem(p, COL_ERR_LIMIT, 0, "file '%s' is too large to map on this platform", path);
        return COL_ERR_LIMIT;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
#if defined(MADV_HUGEPAGE)
    /* A hint: what the file's first reads bring into the page cache through this mapping comes in
     * 2 MiB pages, so streaming the weights takes a TLB entry per 2 MiB instead of per 4 KiB. */
    if (m != MAP_FAILED) (void)madvise(m, (size_t)st.st_size, MADV_HUGEPAGE);
#endif
    if (keep_fd && m != MAP_FAILED)
        *keep_fd = fd;
    else
        close(fd); /* the mapping keeps the file alive */
    if (m == MAP_FAILED) {
        set_problem(p, COL_ERR_IO, 0, "cannot map '%s': %s", path, errno_text(e, why, sizeof why));
        return COL_ERR_IO;
    }
    *base = m;
    *size = (uint64_t)st.st_size;
    return COL_OK;
}

int32_t col_validate_file(const char *path, uint32_t check_flags,
                          col_problem *problems, uint32_t max_problems, uint32_t *n_problems)
{
    const uint8_t *base;
    uint64_t size;
    col_problem p;
    int32_t rc = map_file(path, &base, &size, &p, NULL);
    if (rc != COL_OK) {
        if (problems && max_problems)
            problems[0] = p;
        if (n_problems)
            *n_problems = 1;
        return rc;
    }
    /* A file truncated during the scan must not kill the process (guard.c): the findings of a
     * faulted scan are replaced by one FILE_CHANGED problem. */
    int32_t guard = col_guard_register(base, size);
    rc = col_validate_buffer(base, size, check_flags, problems, max_problems, n_problems);
    if (col_guard_faulted(guard)) {
        set_problem(&p, COL_ERR_FILE_CHANGED, size,
                    "'%s' was truncated while being read (a read past its new end faulted)", path);
        if (problems && max_problems)
            problems[0] = p;
        if (n_problems)
            *n_problems = 1;
        rc = COL_ERR_FILE_CHANGED;
    }
    col_guard_unregister(guard);
    munmap((void *)base, (size_t)size);
    return rc;
}

/* ---- col_model ------------------------------------------------------------------------------- */

/* The public struct plus what only this file needs: a name index for col_model_find_tensor.
 * col_model is the first member, so a col_model pointer converts back to the whole. */
typedef struct model_ext {
    struct col_model m;
    const col_tensor_info **by_name;   /* [n_tensors] sorted by name */
} model_ext;

static int cmp_tensor_name(const void *a, const void *b)
{
    const col_tensor_info *x = *(const col_tensor_info *const *)a;
    const col_tensor_info *y = *(const col_tensor_info *const *)b;
    return strcmp(x->name, y->name);
}

static const col_tensor_info **layer_slot(col_layer *ly, int slot)
{
    switch (slot) {
    case S_ATTN_NORM: return &ly->attn_norm;
    case S_FFN_NORM: return &ly->ffn_norm;
    case S_ATTN_Q: return &ly->attn_q;
    case S_ATTN_K: return &ly->attn_k;
    case S_ATTN_V: return &ly->attn_v;
    case S_ATTN_O: return &ly->attn_o;
    case S_ATTN_Q_BIAS: return &ly->attn_q_bias;
    case S_ATTN_K_BIAS: return &ly->attn_k_bias;
    case S_ATTN_V_BIAS: return &ly->attn_v_bias;
    case S_ATTN_O_BIAS: return &ly->attn_o_bias;
    case S_ATTN_Q_NORM: return &ly->attn_q_norm;
    case S_ATTN_K_NORM: return &ly->attn_k_norm;
    case S_MOE_GATE: return &ly->moe_gate;
    case S_MOE_W1: return &ly->moe_w1;
    case S_MOE_W2: return &ly->moe_w2;
    case S_MOE_W3: return &ly->moe_w3;
    case S_SHARED_W1: return &ly->shared_w1;
    case S_SHARED_W2: return &ly->shared_w2;
    case S_SHARED_W3: return &ly->shared_w3;
    case S_SHARED_GATE: return &ly->shared_gate;
    case S_MLP_W1: return &ly->mlp_w1;
    case S_MLP_W2: return &ly->mlp_w2;
    case S_MLP_W3: return &ly->mlp_w3;
    case S_MOE_GATE_BIAS: return &ly->moe_gate_bias;
    case S_MOE_CORRECTION: return &ly->moe_correction_bias;
    case S_ATTN_Q_A: return &ly->attn_q_a;
    case S_ATTN_Q_A_NORM: return &ly->attn_q_a_norm;
    case S_ATTN_Q_A_BIAS: return &ly->attn_q_a_bias;
    case S_ATTN_Q_B: return &ly->attn_q_b;
    case S_ATTN_KV_A: return &ly->attn_kv_a;
    case S_ATTN_KV_A_NORM: return &ly->attn_kv_a_norm;
    case S_ATTN_KV_A_BIAS: return &ly->attn_kv_a_bias;
    case S_ATTN_K_B: return &ly->attn_k_b;
    case S_ATTN_SINKS: return &ly->attn_sinks;
    case S_MOE_W1_BIAS: return &ly->moe_w1_bias;
    case S_MOE_W2_BIAS: return &ly->moe_w2_bias;
    case S_MOE_W3_BIAS: return &ly->moe_w3_bias;
    case S_ATTN_V_B: return &ly->attn_v_b;
    case S_ATTN_NORM_BIAS: return &ly->attn_norm_bias;
    default: return &ly->ffn_norm_bias;
    }
}

void col_model_close(col_model *model)
{
    if (!model)
        return;
    model_ext *x = (model_ext *)model;
    col_guard_unregister(model->guard);
    if (model->base)
        munmap((void *)model->base, (size_t)model->size);
    if (model->fd >= 0)
        close(model->fd);
    const col_allocator a = model->alloc;
    col_dealloc(&a, model->tensors);
    col_dealloc(&a, model->routing);
    col_dealloc(&a, model->layers);
    col_dealloc(&a, model->moe_layers);
    col_dealloc(&a, x->by_name);
    col_dealloc(&a, x);
}

/* Fill the decoded tables of a model whose bytes passed validation. Only tensors the
 * architecture expects (per flags and layer kind) are wired into the layer structs, so an
 * unknown or unexpected tensor can never be picked up by the forward pass. */
static int32_t build_model(model_ext *x, const layout *L, col_problem *problem)
{
    col_model *m = &x->m;
    m->hp = L->hp;
    m->n_tensors = L->n_tensors;
    const col_allocator *a = &m->alloc;
    m->tensors = col_alloc_zeroed(a, L->n_tensors, sizeof *m->tensors);
    m->routing = col_alloc_zeroed(a, L->n_layers, sizeof *m->routing);
    m->layers = col_alloc_zeroed(a, L->n_layers, sizeof *m->layers);
    m->moe_layers = col_alloc_zeroed(a, L->hp.n_moe_layers ? L->hp.n_moe_layers : 1,
                                     sizeof *m->moe_layers);
    x->by_name = col_alloc_zeroed(a, L->n_tensors, sizeof *x->by_name);
    if (!m->tensors || !m->routing || !m->layers || !m->moe_layers || !x->by_name) {
        set_problem(problem, COL_ERR_NOMEM, 0, "out of memory decoding %" PRIu32 " tensors",
                    L->n_tensors);
        return COL_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < L->n_tensors; i++) {
        if (!check_entry(L, i, NULL, &m->tensors[i])) {
            /* unreachable after a clean validation; kept so a logic slip cannot hand out a
             * pointer to unchecked bytes */
            set_problem(problem, COL_ERR_INVALID_ARG, m->tensors[i].table_offset,
                        "internal: tensor %" PRIu32 " failed to decode after validation", i);
            return COL_ERR_INVALID_ARG;
        }
        x->by_name[i] = &m->tensors[i];
    }
    qsort(x->by_name, L->n_tensors, sizeof *x->by_name, cmp_tensor_name);

    uint32_t n_moe = 0;
    for (uint32_t l = 0; l < L->n_layers; l++) {
        col_routing_info *ri = &m->routing[l];
        route_of(L, l, ri); /* validated: every entry decodes */
        m->layers[l].kind = ri->kind;
        m->layers[l].route = ri;
        if (ri->kind == COL_LAYER_MOE) {
            m->layers[l].moe_index = n_moe;
            m->moe_layers[n_moe++] = (int32_t)l;
            if (ri->n_groups > 1 && ri->n_groups_kept > m->n_chosen_groups)
                m->n_chosen_groups = ri->n_groups_kept;
        }
    }
    bool tied = (L->hp.flags & COL_FLAG_TIED_EMBEDDINGS) != 0;
    for (uint32_t i = 0; i < L->n_tensors; i++) {
        const col_tensor_info *t = &m->tensors[i];
        uint32_t layer = 0;
        int slot = 0;
        int cls = parse_name(t->name, &layer, &slot);
        if (cls == NAME_GLOBAL) {
            if (slot == G_TOKEN_EMBD)
                m->token_embd = t;
            else if (slot == G_OUTPUT_NORM)
                m->output_norm = t;
            else if (!global_expected(slot, &L->hp))
                continue;
            else if (slot == G_OUTPUT)
                m->output = t;
            else if (slot == G_OUTPUT_NORM_BIAS)
                m->output_norm_bias = t;
            else if (slot == G_OUTPUT_BIAS)
                m->output_bias = t;
            else
                m->rope_freq_factors = t;
        } else if (cls == NAME_LAYER && layer < L->n_layers &&
                   slot_expected(slot, &L->hp, &m->routing[layer])) {
            *layer_slot(&m->layers[layer], slot) = t;
        }
    }
    if (tied)
        m->output = m->token_embd;
    m->tokenizer = L->tok_size ? L->d + L->tok_off : NULL;
    m->tokenizer_size = L->tok_size;
    m->metadata = L->meta_size ? L->d + L->meta_off : NULL;
    m->metadata_size = L->meta_size;
    return COL_OK;
}

int32_t col_model_open(const char *path, col_model **out, col_problem *problem)
{
    return col_model_open_ex(path, NULL, out, problem);
}

/* Add a finding built elsewhere (a mapping or allocation failure) to the sink, as report does. */
static void sink_put(sink *s, const col_problem *p)
{
    bool keep = s->count < s->max;
    if (s->count < UINT32_MAX)
        s->count++;
    if (keep)
        s->problems[s->count - 1] = *p;
    if (p->severity == COL_SEVERITY_ERROR && s->first_error == COL_OK) {
        s->first_error = p->code;
        s->first = *p;
    }
}

/* Unmap and release what open_model holds before the model struct exists. */
static int32_t open_failed(const uint8_t *base, uint64_t size, int fd, int32_t guard, int32_t rc)
{
    col_guard_unregister(guard);
    munmap((void *)base, (size_t)size);
    close(fd);
    return rc;
}

/* Map, validate once (every finding into `s`) and build the model. Returns the first error's
 * code; a failure that is not a validation finding (mapping, allocation, a file changing while
 * it is read) is added to `s` as one finding, and a faulted validation's findings are replaced
 * by that one. */
static int32_t open_model(const char *path, const col_allocator *allocator, col_model **out, sink *s)
{
    col_problem p;
    if (!out) {
        set_problem(&p, COL_ERR_INVALID_ARG, 0, "out is NULL");
        sink_put(s, &p);
        return COL_ERR_INVALID_ARG;
    }
    *out = NULL;
    col_allocator alloc;
    col_allocator_or_default(allocator, &alloc);
    const uint8_t *base;
    uint64_t size;
    int fd;
    int32_t rc = map_file(path, &base, &size, &p, &fd);
    if (rc != COL_OK) {
        sink_put(s, &p);
        return rc;
    }
    /* Guarded from the first read: the validator itself may meet a truncation. */
    int32_t guard = col_guard_register(base, size);
    col_file_id id;
    if (col_file_identity(fd, &id) != COL_OK || id.size != size) {
        set_problem(&p, COL_ERR_FILE_CHANGED, 0, "'%s' changed while being opened", path);
        sink_put(s, &p);
        return open_failed(base, size, fd, guard, COL_ERR_FILE_CHANGED);
    }
    layout L;
    validate(base, size, 0, &L, s);
    if (col_guard_faulted(guard)) {
        sink_init(s, s->problems, s->max);
        set_problem(&p, COL_ERR_FILE_CHANGED, size,
                    "'%s' was truncated while being opened (a read past its new end faulted)",
                    path);
        sink_put(s, &p);
        return open_failed(base, size, fd, guard, COL_ERR_FILE_CHANGED);
    }
    if (s->first_error != COL_OK)
        return open_failed(base, size, fd, guard, s->first_error);
    model_ext *x = col_alloc_zeroed(&alloc, 1, sizeof *x);
    if (!x) {
        set_problem(&p, COL_ERR_NOMEM, 0, "out of memory");
        sink_put(s, &p);
        return open_failed(base, size, fd, guard, COL_ERR_NOMEM);
    }
    x->m.base = base;
    x->m.size = size;
    x->m.alloc = alloc;
    x->m.fd = fd;
    x->m.file_id = id;
    x->m.guard = guard;
    snprintf(x->m.path, sizeof x->m.path, "%s", path);
    rc = build_model(x, &L, &p);
    if (rc != COL_OK) {
        sink_put(s, &p);
        col_model_close(&x->m);
        return rc;
    }
    *out = &x->m;
    return COL_OK;
}

int32_t col_model_open_ex(const char *path, const col_allocator *allocator, col_model **out,
                          col_problem *problem)
{
    sink s;
    sink_init(&s, NULL, 0);
    int32_t rc = open_model(path, allocator, out, &s);
    if (problem) {
        memset(problem, 0, sizeof *problem);
        if (rc != COL_OK)
            *problem = s.first;
    }
    return rc;
}

int32_t col_model_open_report(const char *path, const col_allocator *allocator, col_model **out,
                              col_problem *problems, uint32_t max_problems, uint32_t *n_problems)
{
    sink s;
    sink_init(&s, problems, max_problems);
    int32_t rc = open_model(path, allocator, out, &s);
    if (n_problems)
        *n_problems = s.count;
    return rc;
}

const uint8_t *col_model_bytes(const col_model *model, uint64_t *size)
{
    if (size)
        *size = model ? model->size : 0;
    return model ? model->base : NULL;
}

int32_t col_model_hparams(const col_model *model, col_hparams *out)
{
    if (!model || !out)
        return COL_ERR_INVALID_ARG;
    *out = model->hp;
    return COL_OK;
}

uint32_t col_model_tensor_count(const col_model *model) { return model ? model->n_tensors : 0; }

int32_t col_model_tensor(const col_model *model, uint32_t index, col_tensor_info *out)
{
    if (!model || !out || index >= model->n_tensors)
        return COL_ERR_INVALID_ARG;
    *out = model->tensors[index];
    return COL_OK;
}

int32_t col_model_find_tensor(const col_model *model, const char *name, uint32_t *index)
{
    if (!model || !name || !index)
        return COL_ERR_INVALID_ARG;
    const model_ext *x = (const model_ext *)model;
    size_t lo = 0, hi = model->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(x->by_name[mid]->name, name);
        if (c == 0) {
            *index = x->by_name[mid]->index;
            return COL_OK;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return COL_ERR_MISSING_TENSOR;
}

int32_t col_model_routing(const col_model *model, uint32_t layer, col_routing_info *out)
{
    if (!model || !out || layer >= model->hp.n_layers)
        return COL_ERR_INVALID_ARG;
    *out = model->routing[layer];
    return COL_OK;
}

/* Append to a bounded buffer; `*used` may pass n (then nothing more is written). */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static void put_text(char *out, size_t n, size_t *used, const char *fmt, ...)
{
    if (*used >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(out + *used, n - *used, fmt, ap);
    va_end(ap);
    *used += w > 0 ? (size_t)w : 0;
}

/* The attention features of a layer's entry, each as "; ..." */
static void describe_attention(const col_routing_info *r, char *out, size_t n, size_t *used)
{
    if (r->attention == COL_LAYER_SLIDING)
        put_text(out, n, used, "; sliding-window attention");
    else if (r->attention == COL_LAYER_CHUNKED)
        put_text(out, n, used, "; chunked attention");
    if (r->sinks)
        put_text(out, n, used, "; attention sinks");
    if (r->no_rope)
        put_text(out, n, used, "; no RoPE");
    if (r->qk_l2_norm)
        put_text(out, n, used, "; q and k L2-normalised");
    if (r->temperature_floor)
        put_text(out, n, used, "; queries at position p times log1p(floor((p + 1) / %" PRIu32 ")) * %g + 1",
                 r->temperature_floor, (double)r->temperature_scale);
}

int32_t col_routing_describe(const col_routing_info *r, char *out, size_t n)
{
    if (!r || !out || n == 0)
        return COL_ERR_INVALID_ARG;
    size_t used = 0;
    out[0] = '\0';
    if (r->kind != COL_LAYER_MOE) {
        put_text(out, n, &used, "dense MLP");
        describe_attention(r, out, n, &used);
        return COL_OK;
    }
    const char *gate_bias = r->gate_bias_tensor != COL_NO_TENSOR ? " (+ router bias)" : "";
    if (r->scoring == COL_SCORING_SPARSEMIXER) {
        put_text(out, n, &used, "sparsemixer over %" PRIu32 " experts%s: the best logit, then the best of the "
                 "rest, each weighted by a softmax over the logits within %g of it", r->n_experts, gate_bias,
                 2.0 * (double)r->sparsemixer_eps);
    } else if (r->select_on == COL_SELECT_LOGITS) {
        put_text(out, n, &used, "top-%" PRIu32 " of %" PRIu32 " logits%s, weighted by %s", r->top_k,
                 r->n_experts, gate_bias,
                 r->scoring == COL_SCORING_SIGMOID ? "their sigmoids" : "a softmax over the chosen");
    } else {
        put_text(out, n, &used, "%s over %" PRIu32 " experts%s%s, top-%" PRIu32,
                 r->scoring == COL_SCORING_SIGMOID ? "sigmoid" : "softmax", r->n_experts, gate_bias,
                 r->correction_bias_tensor != COL_NO_TENSOR ? ", + correction bias for the choice only" : "",
                 r->top_k);
        if (r->n_groups > 1)
            put_text(out, n, &used, " within the %" PRIu32 " best of %" PRIu32 " groups (by %s)", r->n_groups_kept,
                     r->n_groups, r->group_score == COL_GROUP_TOP2_SUM ? "the sum of their best two" : "their best");
    }
    switch (r->normalize) {
    case COL_NORM_SUM:
        put_text(out, n, &used, r->norm_eps > 0.0f ? ", divided by their sum + %g" : ", divided by their sum",
                 (double)r->norm_eps);
        break;
    case COL_NORM_SUM_CLAMPED:
        put_text(out, n, &used, ", divided by max(their sum, %g)", (double)r->norm_eps);
        break;
    case COL_NORM_P:
        put_text(out, n, &used, ", divided by their %g-norm", (double)r->norm_p);
        break;
    default:
        break;
    }
    if (r->scale != 1.0f)
        put_text(out, n, &used, ", times %g", (double)r->scale);
    if (r->shared == COL_SHARED_PLAIN)
        put_text(out, n, &used, "; plus a shared expert");
    else if (r->shared == COL_SHARED_SIGMOID_GATE)
        put_text(out, n, &used, "; plus a sigmoid-gated shared expert");
    if (r->activation == COL_EXPERT_SWIGLU_CLAMPED)
        put_text(out, n, &used, "; experts: clamped SwiGLU (alpha %g, limit %g)%s", (double)r->act_alpha,
                 (double)r->act_limit, r->expert_bias ? " with biases" : "");
    else if (r->expert_bias)
        put_text(out, n, &used, "; experts with biases");
    if (r->weight_inputs)
        put_text(out, n, &used, "; each chosen expert's input scaled by its weight");
    describe_attention(r, out, n, &used);
    return COL_OK;
}

const uint8_t *col_model_tokenizer(const col_model *model, uint64_t *size)
{
    if (size)
        *size = model ? model->tokenizer_size : 0;
    return model ? model->tokenizer : NULL;
}

const uint8_t *col_model_metadata(const col_model *model, uint64_t *size)
{
    if (size)
        *size = model ? model->metadata_size : 0;
    return model ? model->metadata : NULL;
}

/* The sections in file order, read back from the header the model validated (every offset and
 * size in it was checked against the file at open). */
static const char *const section_names[] = {"header", "routing", "tensor_table", "tokenizer",
                                             "metadata", "data"};

uint32_t col_model_section_count(void)
{
    return (uint32_t)(sizeof section_names / sizeof section_names[0]);
}

int32_t col_model_section(const col_model *model, uint32_t index, col_section *out)
{
    if (!model || !out || index >= col_model_section_count())
        return COL_ERR_INVALID_ARG;
    const uint8_t *d = model->base;
    uint64_t offset = 0, size = 0;
    switch (index) {
    case 0: size = rd32(d + H_HEADER_SIZE); break;
    case 1:
        offset = rd64(d + H_ROUTING_OFFSET);
        size = (uint64_t)model->hp.n_layers * entry_size_of(model->hp.version);
        break;
    case 2:
        offset = rd64(d + H_TABLE_OFFSET);
        size = (uint64_t)model->n_tensors * COL_TENSOR_ENTRY_SIZE;
        break;
    case 3:
        size = model->tokenizer_size;
        offset = size ? (uint64_t)(model->tokenizer - d) : 0;
        break;
    case 4:
        size = model->metadata_size;
        offset = size ? (uint64_t)(model->metadata - d) : 0;
        break;
    default:
        offset = rd64(d + H_DATA_OFFSET);
        size = model->size - offset;
        break;
    }
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", section_names[index]);
    out->offset = offset;
    out->size = size;
    return COL_OK;
}

int32_t col_model_check_tensor(const col_model *model, uint32_t index, uint32_t check_flags,
                               col_problem *problems, uint32_t max_problems, uint32_t *n_problems)
{
    if (n_problems)
        *n_problems = 0;
    if (!model || index >= model->n_tensors)
        return COL_ERR_INVALID_ARG;
    sink s;
    sink_init(&s, problems, max_problems);
    char why[256];
    /* The file may have changed under the mapping (guard.c): check before reading, and throw
     * the findings away if a read faulted during the scan. */
    int32_t rc = col_model_check_file(model, NULL, why, sizeof why);
    if (rc == COL_OK)
        check_data(&model->tensors[index], check_flags, &s);
    if (rc == COL_OK && col_guard_faulted(model->guard))
        rc = col_model_check_file(model, NULL, why, sizeof why);
    if (rc != COL_OK) {
        sink_init(&s, problems, max_problems);
        ERR(&s, rc, model->tensors[index].offset, model->tensors[index].name, "%s", why);
    }
    if (n_problems)
        *n_problems = s.count;
    return s.first_error;
}
