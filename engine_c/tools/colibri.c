/*
 * colibri.c - the `colibri` command-line tool: validate a file, print what is in it, run it.
 *
 * It is the public API's first user and a debugging aid for machines without Python or a GUI, so
 * it uses only colibri.h (nothing from internal.h) and prints what the API returns with as little
 * interpretation as possible: problem lines are `code offset tensor message`, JSON output mirrors
 * the C structs field for field. Exit status: 0 success (a valid file), 1 the file is invalid or
 * the run failed, 2 the file cannot be read at all or the command line is wrong.
 */
#include "colibri.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_INVALID 1
#define EXIT_UNREADABLE 2

static void usage(FILE *f)
{
    fputs("usage:\n"
          "  colibri validate FILE [--checksums] [--nan-check] [--json]\n"
          "      structural checks (and optionally tensor CRCs and a NaN/Inf scan);\n"
          "      exit 0 valid, 1 invalid (one `code offset tensor message` line per problem),\n"
          "      2 unreadable\n"
          "  colibri info FILE [--json]\n"
          "      header fields, hyper-parameters, routing section and tensor table\n"
          "  colibri run FILE --tokens ID,ID,... [-n N] [--routing topk|stable|soft|gumbel]\n"
          "              [--epsilon E] [--seed S] [--threads T] [--debug-routing]\n"
          "      greedy decoding: prefill the tokens, generate N (default 16) tokens by argmax,\n"
          "      print the generated ids; --debug-routing prints each position's experts\n"
          "  colibri --help\n",
          f);
}

/* ---- Small helpers --------------------------------------------------------------------------- */

/* JSON string literal: escapes quotes, backslashes and control bytes; other bytes pass through
 * (tensor names are ASCII after validation; messages are ASCII by construction). */
static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

/* JSON has no NaN/Inf: print null for them. */
static void json_num(double x)
{
    if (isfinite(x))
        printf("%.17g", x);
    else
        fputs("null", stdout);
}

static bool parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static const char *dtype_name(uint32_t dtype)
{
    switch (dtype) {
    case COL_DTYPE_F32: return "f32";
    case COL_DTYPE_F16: return "f16";
    case COL_DTYPE_BF16: return "bf16";
    default: return "?";
    }
}

static const char *arch_name(uint32_t arch)
{
    switch (arch) {
    case COL_ARCH_MIXTRAL: return "mixtral";
    case COL_ARCH_QWEN2_MOE: return "qwen2_moe";
    case COL_ARCH_QWEN3_MOE: return "qwen3_moe";
    case COL_ARCH_OLMOE: return "olmoe";
    case COL_ARCH_DEEPSEEK_V2: return "deepseek_v2";
    case COL_ARCH_DEEPSEEK_V3: return "deepseek_v3";
    case COL_ARCH_GLM4_MOE: return "glm4_moe";
    case COL_ARCH_ERNIE4_5_MOE: return "ernie4_5_moe";
    case COL_ARCH_PHIMOE: return "phimoe";
    case COL_ARCH_GRANITEMOE: return "granitemoe";
    case COL_ARCH_GRANITEMOESHARED: return "granitemoeshared";
    case COL_ARCH_DBRX: return "dbrx";
    default: return "unknown";
    }
}

static void print_problem_line(const col_problem *p)
{
    printf("%s 0x%" PRIX64 " %s %s%s\n", col_status_name(p->code), p->offset,
           p->tensor[0] ? p->tensor : "-", p->severity == COL_SEVERITY_WARNING ? "warning: " : "",
           p->message);
}

static void print_problem_json(const col_problem *p)
{
    printf("{\"code\": %" PRId32 ", \"status\": ", p->code);
    json_str(col_status_name(p->code));
    printf(", \"severity\": \"%s\", \"offset\": %" PRIu64 ", \"tensor\": ",
           p->severity == COL_SEVERITY_WARNING ? "warning" : "error", p->offset);
    json_str(p->tensor);
    fputs(", \"message\": ", stdout);
    json_str(p->message);
    putchar('}');
}

/* ---- validate -------------------------------------------------------------------------------- */

static int cmd_validate(int argc, char **argv)
{
    const char *path = NULL;
    uint32_t flags = 0;
    bool json = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--checksums") == 0)
            flags |= COL_CHECK_CHECKSUMS;
        else if (strcmp(argv[i], "--nan-check") == 0)
            flags |= COL_CHECK_NONFINITE;
        else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "colibri validate: unexpected argument '%s'\n", argv[i]);
            return EXIT_UNREADABLE;
        }
    }
    if (!path) {
        usage(stderr);
        return EXIT_UNREADABLE;
    }
    /* Most files have few problems; re-run with an exact-size array only when they overflow. */
    uint32_t cap = 1024, n = 0;
    col_problem *problems = malloc(cap * sizeof *problems);
    if (!problems) {
        fprintf(stderr, "colibri: out of memory\n");
        return EXIT_UNREADABLE;
    }
    int32_t rc = col_validate_file(path, flags, problems, cap, &n);
    if (n > cap) {
        col_problem *bigger = malloc((size_t)n * sizeof *problems);
        if (bigger) {
            free(problems);
            problems = bigger;
            cap = n;
            rc = col_validate_file(path, flags, problems, cap, &n);
        }
    }
    uint32_t shown = n < cap ? n : cap, n_err = 0;
    for (uint32_t i = 0; i < shown; i++)
        n_err += problems[i].severity == COL_SEVERITY_ERROR;
    if (json) {
        fputs("{\"file\": ", stdout);
        json_str(path);
        printf(", \"valid\": %s, \"status\": ", rc == COL_OK ? "true" : "false");
        json_str(col_status_name(rc));
        printf(", \"code\": %" PRId32 ", \"n_problems\": %" PRIu32 ", \"problems\": [", rc, n);
        for (uint32_t i = 0; i < shown; i++) {
            fputs(i ? ",\n  " : "\n  ", stdout);
            print_problem_json(&problems[i]);
        }
        fputs(shown ? "\n]}\n" : "]}\n", stdout);
    } else {
        for (uint32_t i = 0; i < shown; i++)
            print_problem_line(&problems[i]);
        if (rc == COL_OK)
            fprintf(stderr, "%s: valid (%" PRIu32 " warnings)\n", path, n);
        else if (rc == COL_ERR_IO)
            fprintf(stderr, "%s: cannot be read\n", path);
        else
            fprintf(stderr, "%s: invalid, %" PRIu32 " errors, %" PRIu32 " warnings\n", path,
                    n_err, shown - n_err);
    }
    free(problems);
    if (rc == COL_OK)
        return 0;
    /* IO: cannot be read at all. A zero-byte file is readable, just truncated. */
    return rc == COL_ERR_IO ? EXIT_UNREADABLE : EXIT_INVALID;
}

/* ---- info ------------------------------------------------------------------------------------ */

static int open_model(const char *path, col_model **m)
{
    col_problem p;
    int32_t rc = col_model_open(path, m, &p);
    if (rc == COL_OK)
        return 0;
    fprintf(stderr, "colibri: cannot open '%s': %s at offset 0x%" PRIX64 "%s%s: %s\n", path,
            col_status_name(rc), p.offset, p.tensor[0] ? ", tensor " : "", p.tensor, p.message);
    return rc == COL_ERR_IO ? EXIT_UNREADABLE : EXIT_INVALID;
}

static void print_field_value(const col_field *f, const uint8_t *bytes, bool json)
{
    if (!f->present) {
        fputs(json ? "null" : "(absent)", stdout);
        return;
    }
    bool crc = strcmp(f->group, "integrity") == 0;
    switch (f->kind) {
    case COL_FIELD_U32: case COL_FIELD_U64:
        if (crc && !json)
            printf("0x%08" PRIX64, f->u); /* CRCs are compared by eye in hex */
        else
            printf("%" PRIu64, f->u);
        break;
    case COL_FIELD_I32: printf("%" PRId64, f->i); break;
    case COL_FIELD_F32: case COL_FIELD_F64:
        if (json)
            json_num(f->f);
        else
            printf("%.9g", f->f);
        break;
    default: { /* bytes as hex */
        if (json)
            putchar('"');
        for (uint32_t k = 0; k < f->size; k++)
            printf("%02x", bytes[f->offset + k]);
        if (json)
            putchar('"');
    }
    }
}

static int cmd_info(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "colibri info: unexpected argument '%s'\n", argv[i]);
            return EXIT_UNREADABLE;
        }
    }
    if (!path) {
        usage(stderr);
        return EXIT_UNREADABLE;
    }
    col_model *m = NULL;
    int rc = open_model(path, &m);
    if (rc)
        return rc;
    uint64_t size = 0, tok_size = 0, meta_size = 0;
    const uint8_t *bytes = col_model_bytes(m, &size);
    col_model_tokenizer(m, &tok_size);
    col_model_metadata(m, &meta_size);
    col_hparams hp;
    col_model_hparams(m, &hp);
    uint32_t nf = col_header_field_count(), nt = col_model_tensor_count(m);

    if (json) {
        fputs("{\"file\": ", stdout);
        json_str(path);
        printf(", \"size\": %" PRIu64 ", \"arch\": \"%s\", \"header\": [", size, arch_name(hp.arch));
        for (uint32_t i = 0, shown = 0; i < nf; i++) {
            col_field f;
            col_header_field(bytes, size, i, &f);
            if (!f.in_version)
                continue; /* a field of the other format version's header */
            printf("%s\n  {\"name\": \"%s\", \"group\": \"%s\", \"offset\": %" PRIu64
                   ", \"size\": %" PRIu32 ", \"value\": ", shown++ ? "," : "", f.name, f.group, f.offset,
                   f.size);
            print_field_value(&f, bytes, true);
            putchar('}');
        }
        fputs("\n], \"routing\": [", stdout);
        for (uint32_t l = 0; l < hp.n_layers; l++) {
            col_routing_info r;
            col_model_routing(m, l, &r);
            printf("%s\n  {\"layer\": %" PRIu32 ", \"kind\": \"%s\", \"gate_tensor\": %" PRId64
                   ", \"top_k\": %" PRIu32 ", \"n_experts\": %" PRIu32 ", \"scoring\": %" PRIu32 "}",
                   l ? "," : "", r.layer, r.kind == COL_LAYER_MOE ? "moe" : "dense",
                   r.gate_tensor == COL_NO_TENSOR ? (int64_t)-1 : (int64_t)r.gate_tensor, r.top_k,
                   r.n_experts, r.scoring);
        }
        printf("\n], \"tokenizer_size\": %" PRIu64 ", \"metadata_size\": %" PRIu64
               ", \"tensors\": [", tok_size, meta_size);
        for (uint32_t i = 0; i < nt; i++) {
            col_tensor_info t;
            col_model_tensor(m, i, &t);
            printf("%s\n  {\"index\": %" PRIu32 ", \"name\": ", i ? "," : "", t.index);
            json_str(t.name);
            printf(", \"dtype\": \"%s\", \"shape\": [", dtype_name(t.dtype));
            for (uint32_t k = 0; k < t.ndim; k++)
                printf("%s%" PRIu64, k ? ", " : "", t.shape[k]);
            printf("], \"offset\": %" PRIu64 ", \"nbytes\": %" PRIu64 ", \"crc32\": %" PRIu32
                   ", \"table_offset\": %" PRIu64 "}", t.offset, t.nbytes, t.crc32, t.table_offset);
        }
        fputs("\n]}\n", stdout);
    } else {
        printf("%s: %" PRIu64 " bytes, arch %s, %" PRIu32 " layers (%" PRIu32 " MoE), %" PRIu32
               " experts (top-%" PRIu32 "), %" PRIu32 " tensors\n\nheader:\n", path, size,
               arch_name(hp.arch), hp.n_layers, hp.n_moe_layers, hp.n_experts,
               hp.n_experts_active, nt);
        for (uint32_t i = 0; i < nf; i++) {
            col_field f;
            col_header_field(bytes, size, i, &f);
            if (!f.in_version)
                continue;
            printf("  0x%03" PRIX64 " %-26s %-17s ", f.offset, f.name, f.group);
            print_field_value(&f, bytes, false);
            putchar('\n');
        }
        printf("\nrouting:\n");
        for (uint32_t l = 0; l < hp.n_layers; l++) {
            col_routing_info r;
            col_model_routing(m, l, &r);
            char rule[512];
            col_routing_describe(&r, rule, sizeof rule);
            if (r.kind == COL_LAYER_MOE)
                printf("  layer %-4" PRIu32 " moe   gate tensor %" PRIu32 ": %s\n", l, r.gate_tensor, rule);
            else
                printf("  layer %-4" PRIu32 " %s\n", l, rule);
        }
        printf("\ntokenizer: %" PRIu64 " bytes, metadata: %" PRIu64 " bytes\n\ntensors:\n",
               tok_size, meta_size);
        for (uint32_t i = 0; i < nt; i++) {
            col_tensor_info t;
            col_model_tensor(m, i, &t);
            char shape[96];
            int used = snprintf(shape, sizeof shape, "[");
            for (uint32_t k = 0; k < t.ndim && used > 0 && (size_t)used < sizeof shape; k++)
                used += snprintf(shape + used, sizeof shape - (size_t)used, "%s%" PRIu64,
                                 k ? ", " : "", t.shape[k]);
            if (used > 0 && (size_t)used < sizeof shape)
                snprintf(shape + used, sizeof shape - (size_t)used, "]");
            printf("  %5" PRIu32 " %-32s %-4s %-18s offset 0x%-10" PRIX64 " %12" PRIu64
                   " bytes crc %08" PRIX32 "\n", i, t.name, dtype_name(t.dtype), shape, t.offset,
                   t.nbytes, t.crc32);
        }
    }
    col_model_close(m);
    return 0;
}

/* ---- run ------------------------------------------------------------------------------------- */

static int32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* Print the routing rows of positions [from, to) from the session's trace. */
static void print_routing(const col_session *s, uint32_t from, uint32_t to)
{
    col_trace_view tv;
    if (col_session_trace(s, &tv) != COL_OK || !tv.expert_ids)
        return;
    for (uint32_t p = from; p < to && p < tv.n_positions; p++)
        for (uint32_t j = 0; j < tv.n_moe_layers; j++) {
            size_t row = ((size_t)p * tv.n_moe_layers + j) * tv.k;
            printf("pos %" PRIu32 " layer %" PRId32 " experts [", p, tv.moe_layers[j]);
            for (uint32_t k = 0; k < tv.k; k++)
                printf("%s%" PRId32, k ? "," : "", tv.expert_ids[row + k]);
            fputs("] weights [", stdout);
            for (uint32_t k = 0; k < tv.k; k++)
                printf("%s%.2f", k ? "," : "", (double)tv.expert_weights[row + k]);
            fputs("]\n", stdout);
        }
}

static bool parse_tokens(const char *s, int32_t **out, uint32_t *n)
{
    uint32_t count = 1;
    for (const char *p = s; *p; p++)
        count += *p == ',';
    int32_t *t = malloc((size_t)count * sizeof *t);
    if (!t)
        return false;
    uint32_t k = 0;
    const char *p = s;
    while (k < count) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            free(t);
            return false;
        }
        t[k++] = (int32_t)v;
        p = end + (*end == ',');
    }
    *out = t;
    *n = count;
    return true;
}

static int cmd_run(int argc, char **argv)
{
    const char *path = NULL, *tokens_arg = NULL;
    uint64_t n_gen = 16, seed = 0, threads = 1;
    double epsilon = -1;
    uint32_t routing = COL_ROUTING_TOPK;
    bool debug = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (strcmp(a, "--tokens") == 0 && v)
            tokens_arg = argv[++i];
        else if (strcmp(a, "-n") == 0) {
            ok = parse_u64(v, &n_gen) && n_gen <= 1u << 20;
            i++;
        } else if (strcmp(a, "--seed") == 0) {
            ok = parse_u64(v, &seed);
            i++;
        } else if (strcmp(a, "--threads") == 0) {
            ok = parse_u64(v, &threads) && threads >= 1 && threads <= 1024;
            i++;
        } else if (strcmp(a, "--epsilon") == 0) {
            ok = parse_double(v, &epsilon) && epsilon >= 0;
            i++;
        } else if (strcmp(a, "--routing") == 0 && v) {
            i++;
            if (strcmp(v, "topk") == 0)
                routing = COL_ROUTING_TOPK;
            else if (strcmp(v, "stable") == 0)
                routing = COL_ROUTING_STABLE;
            else if (strcmp(v, "soft") == 0)
                routing = COL_ROUTING_SOFT;
            else if (strcmp(v, "gumbel") == 0)
                routing = COL_ROUTING_GUMBEL;
            else
                ok = false;
        } else if (strcmp(a, "--debug-routing") == 0)
            debug = true;
        else if (a[0] != '-' && !path)
            path = a;
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "colibri run: bad or unexpected argument '%s'%s%s\n", a,
                    v ? " " : "", v ? v : "");
            return EXIT_UNREADABLE;
        }
    }
    if (!path || !tokens_arg) {
        usage(stderr);
        return EXIT_UNREADABLE;
    }
    int32_t *tokens = NULL;
    uint32_t n_tokens = 0;
    if (!parse_tokens(tokens_arg, &tokens, &n_tokens)) {
        fprintf(stderr, "colibri run: --tokens wants comma-separated non-negative ids, got '%s'\n",
                tokens_arg);
        return EXIT_UNREADABLE;
    }
    col_model *m = NULL;
    int rc = open_model(path, &m);
    if (rc) {
        free(tokens);
        return rc;
    }
    col_hparams hp;
    col_model_hparams(m, &hp);
    col_session_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.routing = routing;
    cfg.n_threads = (uint32_t)threads;
    /* exactly the positions this run needs: prompt + generated tokens fed back (the last
     * generated token is never fed back) */
    uint64_t need = (uint64_t)n_tokens + (n_gen ? n_gen - 1 : 0);
    cfg.max_context = need > UINT32_MAX ? UINT32_MAX : (uint32_t)need;
    cfg.trace = debug ? 1 : 0;
    cfg.epsilon = epsilon >= 0 ? epsilon : (double)hp.default_epsilon;
    cfg.seed = seed;

    char err[512] = "";
    col_session *s = NULL;
    int32_t st = col_session_create(m, &cfg, &s, err, sizeof err);
    int32_t *generated = malloc((size_t)(n_gen ? n_gen : 1) * sizeof *generated);
    if (st == COL_OK && !generated) {
        st = COL_ERR_NOMEM;
        snprintf(err, sizeof err, "out of memory");
    }
    uint64_t produced = 0;
    if (st == COL_OK && n_gen > 0) {
        st = col_session_prefill(s, tokens, n_tokens, NULL, err, sizeof err);
        if (st == COL_OK && debug)
            print_routing(s, 0, col_session_position(s));
        while (st == COL_OK && produced < n_gen) {
            int32_t next = argmax(col_session_logits(s), hp.vocab_size);
            generated[produced++] = next;
            if (produced == n_gen)
                break;
            uint32_t before = col_session_position(s);
            st = col_session_step(s, next, NULL, err, sizeof err);
            if (st == COL_OK && debug)
                print_routing(s, before, col_session_position(s));
        }
    } else if (st == COL_OK) {
        st = col_session_prefill(s, tokens, n_tokens, NULL, err, sizeof err);
        if (st == COL_OK && debug)
            print_routing(s, 0, col_session_position(s));
    }
    for (uint64_t i = 0; i < produced; i++)
        printf("%s%" PRId32, i ? "," : "", generated[i]);
    if (produced)
        putchar('\n');
    if (st != COL_OK)
        fprintf(stderr, "colibri run: %s: %s\n", col_status_name(st), err);
    free(generated);
    col_session_free(s);
    col_model_close(m);
    free(tokens);
    return st == COL_OK ? 0 : EXIT_INVALID;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_UNREADABLE;
    }
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0 ||
            strcmp(argv[1], "help") == 0) {
            usage(stdout);
            return 0;
        }
    if (strcmp(argv[1], "validate") == 0)
        return cmd_validate(argc - 2, argv + 2);
    if (strcmp(argv[1], "info") == 0)
        return cmd_info(argc - 2, argv + 2);
    if (strcmp(argv[1], "run") == 0)
        return cmd_run(argc - 2, argv + 2);
    fprintf(stderr, "colibri: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_UNREADABLE;
}
