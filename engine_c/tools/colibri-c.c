/*
 * colibri-c.c - the `colibri-c` command-line tool: validate a file, print what is in it, run it.
 *
 * It is the C API's first user and the way to check and run a model on a machine without Python
 * or a GUI, so it uses only colibri.h. Its name is not `colibri` so that it never shadows the
 * Python command on a user's PATH. `validate` and `info` print the same lines as the Python
 * `colibri validate` and `colibri info` (app/colibri/cli/files.py) and JSON documents that parse
 * to the same values, so a result read on one machine means the same on another; tests/test_cli.py
 * runs both tools on the same files. Exit status, as there: 0 success (a valid file), 1 the file is
 * invalid or the run failed, 2 the file cannot be read at all or the command line is wrong.
 */
#include "colibri.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "colibri-c"
#define EXIT_INVALID 1
#define EXIT_UNREADABLE 2

/* A run of this many consecutive findings of one code about different tensors is summarised
 * (app/colibri/inspection/report.py's GROUP_FROM). */
#define GROUP_FROM 4
/* The user metadata shown in text, in characters (cli/files.py). */
#define METADATA_SHOWN 2000

static void usage(FILE *f)
{
    fputs("usage:\n"
          "  " PROG " validate FILE [--checksums] [--nan-check] [--json]\n"
          "      structural checks (and optionally tensor CRCs and a NaN/Inf scan), one line\n"
          "      per problem and a verdict; exit 0 valid, 1 invalid, 2 unreadable\n"
          "  " PROG " info FILE [--json]\n"
          "      header fields, hyper-parameters, routing rules, user metadata and tensor table\n"
          "  " PROG " run FILE --tokens ID,ID,... [-n|--generate N] [-t|--threads T]\n"
          "              [--routing topk|stable|soft|gumbel|cached] [--epsilon E] [--seed S]\n"
          "              [--cache-threshold T] [--expert-cache N] [--debug-routing]\n"
          "      greedy decoding: prefill the tokens, generate N (default 16) tokens by argmax,\n"
          "      print the generated ids; --debug-routing prints each position's experts;\n"
          "      expert caching's counts go to stderr\n"
          "  " PROG " --help\n"
          "The same lines as the Python `colibri validate` and `colibri info`.\n",
          f);
}

/* The one way a command reports a problem: `colibri-c: message` on stderr. */
__attribute__((format(printf, 1, 2))) static void error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(PROG ": ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- JSON output ----------------------------------------------------------------------------- */

/* A JSON string literal: quotes, backslashes and control bytes escaped; other bytes pass through
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

/* A number as Python's json module writes it: the shortest digits that read back to the same
 * double, fixed notation for exponents -4..15 with at least one decimal, NaN and Infinity as
 * Python spells them. */
static void json_num(double x)
{
    if (isnan(x)) {
        fputs("NaN", stdout);
        return;
    }
    if (isinf(x)) {
        fputs(x < 0 ? "-Infinity" : "Infinity", stdout);
        return;
    }
    char sci[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, x);
        if (strtod(sci, NULL) == x)
            break;
    }
    char *e = strchr(sci, 'e');
    int exp10 = atoi(e + 1);
    if (exp10 < -4 || exp10 >= 16) {
        fputs(sci, stdout);
        return;
    }
    char digits[24];
    size_t n = 0;
    for (const char *c = sci; c < e; c++)
        if (*c >= '0' && *c <= '9')
            digits[n++] = *c;
    if (sci[0] == '-')
        putchar('-');
    if (exp10 < 0) {
        fputs("0.", stdout);
        for (int i = -1; i > exp10; i--)
            putchar('0');
        fwrite(digits, 1, n, stdout);
        return;
    }
    size_t whole = (size_t)exp10 + 1;
    for (size_t i = 0; i < whole; i++)
        putchar(i < n ? digits[i] : '0');
    putchar('.');
    if (n > whole)
        fwrite(digits + whole, 1, n - whole, stdout);
    else
        putchar('0');
}

/* ---- Checking JSON as Python reads it -------------------------------------------------------- */

/* Whether the user metadata is a document Python's json.loads reads (RFC 8259 plus NaN, Infinity
 * and -Infinity, on strict UTF-8, integers of at most 4300 digits), so both tools show the same
 * files' metadata. Python gives up on nesting near 1000 levels; this stops at JSON_DEPTH. */
#define JSON_DEPTH 512
#define JSON_INT_DIGITS 4300

typedef struct json_scan {
    const uint8_t *p, *end;
    int depth;
} json_scan;

static bool js_value(json_scan *s);

static void js_space(json_scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static bool js_at(const json_scan *s, char c)
{
    return s->p < s->end && *s->p == (uint8_t)c;
}

static bool js_word(json_scan *s, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return false;
    s->p += n;
    return true;
}

static size_t js_digits(json_scan *s)
{
    const uint8_t *start = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
        s->p++;
    return (size_t)(s->p - start);
}

static bool js_number(json_scan *s)
{
    if (js_at(s, '-')) {
        s->p++;
        if (js_word(s, "Infinity"))
            return true;
    }
    size_t whole;
    if (js_at(s, '0')) {
        s->p++;
        whole = 1;
    } else if (s->p < s->end && *s->p >= '1' && *s->p <= '9')
        whole = js_digits(s);
    else
        return false;
    bool integer = true;
    if (js_at(s, '.')) {
        s->p++;
        if (!js_digits(s))
            return false;
        integer = false;
    }
    if (js_at(s, 'e') || js_at(s, 'E')) {
        s->p++;
        if (js_at(s, '+') || js_at(s, '-'))
            s->p++;
        if (!js_digits(s))
            return false;
        integer = false;
    }
    return !integer || whole <= JSON_INT_DIGITS;
}

/* One UTF-8 sequence starting at a byte >= 0x80, strictly (no overlong forms, no surrogates,
 * nothing above U+10FFFF), as Python decodes. */
static bool js_utf8(json_scan *s)
{
    uint8_t c = *s->p;
    size_t n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 2;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 3;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else
        return false;
    if ((size_t)(s->end - s->p) <= n || s->p[1] < lo || s->p[1] > hi)
        return false;
    for (size_t i = 2; i <= n; i++)
        if (s->p[i] < 0x80 || s->p[i] > 0xBF)
            return false;
    s->p += n + 1;
    return true;
}

static bool js_string(json_scan *s)
{
    s->p++; /* the opening quote */
    while (s->p < s->end) {
        uint8_t c = *s->p;
        if (c == '"') {
            s->p++;
            return true;
        }
        if (c < 0x20)
            return false;
        if (c >= 0x80) {
            if (!js_utf8(s))
                return false;
            continue;
        }
        s->p++;
        if (c != '\\')
            continue;
        if (s->p >= s->end)
            return false;
        c = *s->p++;
        if (c == 'u') {
            for (int i = 0; i < 4; i++, s->p++)
                if (s->p >= s->end || !strchr("0123456789abcdefABCDEF", *s->p) || !*s->p)
                    return false;
        } else if (!strchr("\"\\/bfnrt", c) || !c)
            return false;
    }
    return false;
}

/* The members of an object or the items of an array, after its opening bracket. */
static bool js_members(json_scan *s, char close, bool object)
{
    if (++s->depth > JSON_DEPTH)
        return false;
    s->p++;
    js_space(s);
    if (js_at(s, close)) {
        s->p++;
        s->depth--;
        return true;
    }
    for (;;) {
        if (object) {
            if (!js_at(s, '"') || !js_string(s))
                return false;
            js_space(s);
            if (!js_at(s, ':'))
                return false;
            s->p++;
            js_space(s);
        }
        if (!js_value(s))
            return false;
        js_space(s);
        if (js_at(s, close)) {
            s->p++;
            s->depth--;
            return true;
        }
        if (!js_at(s, ','))
            return false;
        s->p++;
        js_space(s);
    }
}

static bool js_value(json_scan *s)
{
    if (s->p >= s->end)
        return false;
    switch (*s->p) {
    case '{': return js_members(s, '}', true);
    case '[': return js_members(s, ']', false);
    case '"': return js_string(s);
    case 't': return js_word(s, "true");
    case 'f': return js_word(s, "false");
    case 'n': return js_word(s, "null");
    case 'N': return js_word(s, "NaN");
    case 'I': return js_word(s, "Infinity");
    default: return js_number(s);
    }
}

/* Whether `text` is what Python's json.loads reads as a value other than None (the Python tools
 * treat absent, unreadable and `null` metadata alike). */
static bool json_document(const uint8_t *text, uint64_t size)
{
    json_scan s = {text, text + size, 0};
    js_space(&s);
    const uint8_t *start = s.p;
    if (!js_value(&s))
        return false;
    bool null = s.p - start == 4 && memcmp(start, "null", 4) == 0;
    js_space(&s);
    return s.p == s.end && !null;
}

/* ---- Names and values as the Python tools show them ------------------------------------------ */

static const char *dtype_name(uint32_t dtype)
{
    switch (dtype) {
    case COL_DTYPE_F32: return "f32";
    case COL_DTYPE_F16: return "f16";
    case COL_DTYPE_BF16: return "bf16";
    case COL_DTYPE_Q8_0: return "q8_0";
    case COL_DTYPE_Q4_0: return "q4_0";
    case COL_DTYPE_Q8_0X8: return "q8_0x8";
    case COL_DTYPE_Q4_0X8: return "q4_0x8";
    case COL_DTYPE_BF16X16: return "bf16x16";
    default: return "?";
    }
}

/* colibri.values.ARCH_NAMES; `arch-N` for a number it does not name. */
static const char *arch_name(uint32_t arch, char *buf, size_t len)
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
    case COL_ARCH_GPT_OSS: return "gpt_oss";
    case COL_ARCH_LLAMA4: return "llama4";
    case COL_ARCH_PHIMOE: return "phimoe";
    case COL_ARCH_GRANITEMOE: return "granitemoe";
    case COL_ARCH_GRANITEMOESHARED: return "granitemoeshared";
    case COL_ARCH_DBRX: return "dbrx";
    default: snprintf(buf, len, "arch-%" PRIu32, arch); return buf;
    }
}

static const char *field_kind_name(uint32_t kind, char *buf, size_t len)
{
    static const char *names[] = {"bytes", "u32", "i32", "u64", "f32", "f64"}; /* col_field_kind */
    if (kind < sizeof names / sizeof names[0])
        return names[kind];
    snprintf(buf, len, "kind-%" PRIu32, kind);
    return buf;
}

/* A float as Python's format(x, '.7g') shows it (`nan` whatever its sign bit). */
static void print_g7(double x)
{
    if (isnan(x))
        fputs("nan", stdout);
    else
        printf("%.7g", x);
}

/* Python's repr() of printable ASCII bytes: b'...', or b"..." when only that avoids escaping a
 * quote. */
static void print_bytes_repr(const uint8_t *b, uint32_t n)
{
    bool single = memchr(b, '\'', n) != NULL, dbl = memchr(b, '"', n) != NULL;
    char quote = single && !dbl ? '"' : '\'';
    printf("b%c", quote);
    for (uint32_t i = 0; i < n; i++) {
        if (b[i] == '\\' || b[i] == (uint8_t)quote)
            putchar('\\');
        putchar(b[i]);
    }
    putchar(quote);
}

/* ---- validate -------------------------------------------------------------------------------- */

/* Why `path` cannot be read as a file at all (common.py's `unreadable`), or NULL. */
static const char *unreadable(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return "no such file";
    if (S_ISDIR(st.st_mode))
        return "is a directory";
    if (access(path, R_OK) != 0)
        return "permission denied";
    return NULL;
}

/* A finding's message without the "tensor 'NAME': " the engine puts first for callers that get
 * only the text: here the tensor is shown in its own place. */
static const char *problem_message(const col_problem *p)
{
    size_t n = strlen(p->tensor);
    const char *m = p->message;
    if (n && strncmp(m, "tensor '", 8) == 0 && strncmp(m + 8, p->tensor, n) == 0 &&
        strncmp(m + 8 + n, "': ", 3) == 0)
        return m + 8 + n + 3;
    return m;
}

static const char *severity_name(const col_problem *p)
{
    return p->severity == COL_SEVERITY_WARNING ? "warning" : "error";
}

static void print_problem_line(const col_problem *p)
{
    printf("%s: %s at 0x%" PRIX64, severity_name(p), col_status_name(p->code), p->offset);
    if (p->tensor[0])
        printf(" tensor '%s'", p->tensor);
    printf(": %s\n", problem_message(p));
}

static bool same_run(const col_problem *a, const col_problem *b)
{
    return a->severity == b->severity && a->code == b->code &&
           (a->tensor[0] != 0) == (b->tensor[0] != 0);
}

/* The problem lines: one per finding, except that a run of GROUP_FROM or more consecutive
 * findings of one code and severity, each about a tensor, is its first line and a summary. */
static void print_problem_lines(const col_problem *problems, uint32_t n)
{
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i + 1;
        while (j < n && same_run(&problems[i], &problems[j]))
            j++;
        if (!problems[i].tensor[0] || j - i < GROUP_FROM) {
            for (; i < j; i++)
                print_problem_line(&problems[i]);
            continue;
        }
        const col_problem *first = &problems[i + 1], *last = &problems[j - 1];
        print_problem_line(&problems[i]);
        printf("  ... and %" PRIu32 " more %s %ss like it, for tensors '%s' to '%s' (table entries "
               "0x%" PRIX64 "..0x%" PRIX64 "; --json lists each)\n", j - i - 1,
               col_status_name(first->code), severity_name(first), first->tensor, last->tensor,
               first->offset, last->offset);
        i = j;
    }
}

static void print_problem_json(const col_problem *p)
{
    printf("{\"code\": %" PRId32 ", \"code_name\": ", p->code);
    json_str(col_status_name(p->code));
    printf(", \"severity\": \"%s\", \"offset\": %" PRIu64 ", \"tensor\": ", severity_name(p),
           p->offset);
    json_str(p->tensor);
    fputs(", \"message\": ", stdout);
    json_str(problem_message(p));
    putchar('}');
}

/* A file that cannot be read: the message, and in JSON the document that says so. */
static int report_unreadable(const char *message, bool json)
{
    if (json) {
        fputs("{\"valid\": false, \"format\": null, \"error\": ", stdout);
        json_str(message);
        fputs(", \"problems\": []}\n", stdout);
    } else
        error("%s", message);
    return EXIT_UNREADABLE;
}

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
            error("validate: unexpected argument '%s'", argv[i]);
            return EXIT_UNREADABLE;
        }
    }
    if (!path) {
        usage(stderr);
        return EXIT_UNREADABLE;
    }
    char message[sizeof ((col_problem *)0)->message + 4200];
    const char *reason = unreadable(path);
    if (reason) {
        snprintf(message, sizeof message, "%s: %s: %s", col_status_name(COL_ERR_IO), path, reason);
        return report_unreadable(message, json);
    }
    /* Most files have few problems; validate again with room for all when they overflow. */
    uint32_t cap = 1024, n = 0;
    col_problem *problems = malloc(cap * sizeof *problems);
    if (!problems) {
        error("%s: out of memory", col_status_name(COL_ERR_NOMEM));
        return EXIT_INVALID;
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
    if (rc == COL_ERR_IO || rc == COL_ERR_FILE_CHANGED || rc == COL_ERR_NOMEM ||
        rc == COL_ERR_INVALID_ARG) { /* the engine could not validate the file */
        snprintf(message, sizeof message, "%s: %s", col_status_name(rc),
                 shown ? problems[0].message : col_status_name(rc));
        free(problems);
        if (rc == COL_ERR_IO || rc == COL_ERR_FILE_CHANGED)
            return report_unreadable(message, json);
        error("%s", message);
        return EXIT_INVALID;
    }
    for (uint32_t i = 0; i < shown; i++)
        n_err += problems[i].severity == COL_SEVERITY_ERROR;
    if (json) {
        printf("{\"valid\": %s, \"format\": \"colibri\", \"problems\": [", n_err ? "false" : "true");
        for (uint32_t i = 0; i < shown; i++) {
            fputs(i ? ",\n  " : "\n  ", stdout);
            print_problem_json(&problems[i]);
        }
        fputs(shown ? "\n]}\n" : "]}\n", stdout);
    } else {
        print_problem_lines(problems, shown);
        printf("%s: %s (%" PRIu32 " error(s), %" PRIu32 " warning(s))\n", path,
               n_err ? "INVALID" : "valid", n_err, shown - n_err);
    }
    free(problems);
    return n_err ? EXIT_INVALID : 0;
}

/* ---- info ------------------------------------------------------------------------------------ */

/* Open `path` as the Python tools do, printing why not: 0, or the exit status. */
static int open_model(const char *path, col_model **m)
{
    const char *reason = unreadable(path);
    if (reason) {
        error("%s: %s: %s", col_status_name(COL_ERR_IO), path, reason);
        return EXIT_UNREADABLE;
    }
    col_problem p;
    memset(&p, 0, sizeof p);
    int32_t rc = col_model_open(path, m, &p);
    if (rc == COL_OK)
        return 0;
    const char *msg = p.message[0] ? problem_message(&p) : col_status_name(rc);
    bool format_error = (rc >= COL_ERR_TRUNCATED && rc <= COL_ERR_ROUTING) ||
                        rc == COL_ERR_UNKNOWN_TENSOR;
    if (format_error && p.tensor[0])
        error("%s at 0x%" PRIX64 " (tensor '%s'): %s", col_status_name(rc), p.offset, p.tensor, msg);
    else if (format_error)
        error("%s at 0x%" PRIX64 ": %s", col_status_name(rc), p.offset, msg);
    else
        error("%s: %s", col_status_name(rc), msg);
    return rc == COL_ERR_IO || rc == COL_ERR_FILE_CHANGED ? EXIT_UNREADABLE : EXIT_INVALID;
}

static bool all_zero(const uint8_t *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

static void print_hex(const uint8_t *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        printf("%02x", b[i]);
}

/* A header field's value: in JSON, bytes as hex (or a count of zeros) and numbers as they are;
 * for people, CRCs in hex, floats to 7 digits, printable bytes as text. */
static void print_field_value(const col_field *f, const uint8_t *bytes, bool json)
{
    if (!f->present) {
        fputs(json ? "null" : "None", stdout);
        return;
    }
    size_t name_len = strlen(f->name);
    bool crc = name_len >= 5 && strcmp(f->name + name_len - 5, "crc32") == 0;
    const uint8_t *b = bytes + f->offset;
    switch (f->kind) {
    case COL_FIELD_U32: case COL_FIELD_U64:
        printf(crc && !json ? "0x%08" PRIX64 : "%" PRIu64, f->u);
        return;
    case COL_FIELD_I32:
        printf("%" PRId64, f->i);
        return;
    case COL_FIELD_F32: case COL_FIELD_F64:
        if (json)
            json_num(f->f);
        else
            print_g7(f->f);
        return;
    default:
        break;
    }
    bool printable = !all_zero(b, f->size);
    for (uint32_t k = 0; k < f->size && printable; k++)
        printable = b[k] >= 32 && b[k] < 127;
    if (printable && !json)
        print_bytes_repr(b, f->size);
    else if (all_zero(b, f->size))
        printf(json ? "\"%" PRIu32 " zero bytes\"" : "%" PRIu32 " zero bytes", f->size);
    else {
        if (json)
            putchar('"');
        print_hex(b, f->size);
        if (json)
            putchar('"');
    }
}

/* colibri.values.HParams, field by field in its order. */
typedef enum hp_kind { HP_U32, HP_I32, HP_F32, HP_F64 } hp_kind;
typedef struct hp_field {
    const char *name;
    size_t offset;
    hp_kind kind;
} hp_field;

#define HP(name, kind) {#name, offsetof(col_hparams, name), kind}
static const hp_field HPARAMS[] = {
    HP(version, HP_U32), HP(arch, HP_U32), HP(flags, HP_U32), HP(n_layers, HP_U32),
    HP(n_experts, HP_U32), HP(n_experts_active, HP_U32), HP(n_moe_layers, HP_U32),
    HP(d_model, HP_U32), HP(n_heads, HP_U32), HP(n_kv_heads, HP_U32), HP(head_dim, HP_U32),
    HP(vocab_size, HP_U32), HP(max_context, HP_U32), HP(d_ff_expert, HP_U32),
    HP(d_ff_dense, HP_U32), HP(d_ff_shared, HP_U32), HP(sliding_window, HP_U32),
    HP(rope_type, HP_U32), HP(rope_original_max_context, HP_U32), HP(bos_token_id, HP_I32),
    HP(eos_token_id, HP_I32), HP(rope_theta, HP_F64), HP(rope_factor, HP_F32),
    HP(rope_low_freq_factor, HP_F32), HP(rope_high_freq_factor, HP_F32), HP(norm_eps, HP_F32),
    HP(clip_qkv, HP_F32), HP(default_epsilon, HP_F32), HP(attention, HP_U32),
    HP(q_lora_rank, HP_U32), HP(kv_lora_rank, HP_U32), HP(qk_nope_head_dim, HP_U32),
    HP(qk_rope_head_dim, HP_U32), HP(v_head_dim, HP_U32), HP(rotary_dim, HP_U32),
    HP(rope_layout, HP_U32), HP(attn_scale, HP_F32), HP(latent_norm_eps, HP_F32),
    HP(rope_attn_factor, HP_F32), HP(rope_beta_fast, HP_F32), HP(rope_beta_slow, HP_F32),
    HP(rope_truncate, HP_U32), HP(norm_kind, HP_U32), HP(embedding_scale, HP_F32),
    HP(residual_scale, HP_F32), HP(logit_divisor, HP_F32), HP(attention_chunk_size, HP_U32),
};
#undef HP

static void print_hparam(const col_hparams *hp, const hp_field *f, bool json)
{
    const unsigned char *at = (const unsigned char *)hp + f->offset;
    uint32_t u;
    int32_t i;
    float x;
    double d;
    switch (f->kind) {
    case HP_U32: memcpy(&u, at, sizeof u); printf("%" PRIu32, u); break;
    case HP_I32: memcpy(&i, at, sizeof i); printf("%" PRId32, i); break;
    case HP_F32:
        memcpy(&x, at, sizeof x);
        if (json)
            json_num((double)x);
        else
            print_g7((double)x);
        break;
    case HP_F64:
        memcpy(&d, at, sizeof d);
        if (json)
            json_num(d);
        else
            print_g7(d);
        break;
    }
}

/* The names of the col_model_flag bits set in `flags`, then any unknown bits in hex. */
static void print_flag_names(uint32_t flags)
{
    static const char *names[] = {"NORM_TOPK", "TIED_EMBEDDINGS", "SHARED_EXPERT",
                                  "SHARED_EXPERT_GATE", "QKV_BIAS", "O_BIAS", "QK_NORM_HEAD",
                                  "QK_NORM_FULL", "OUTPUT_BIAS"}; /* bit 0, 1, 2, ... */
    const uint32_t n_known = sizeof names / sizeof names[0];
    bool any = false;
    for (uint32_t bit = 0; bit < n_known; bit++)
        if (flags & (1u << bit)) {
            printf("%s%s", any ? "|" : "", names[bit]);
            any = true;
        }
    uint32_t unknown = flags & ~((1u << n_known) - 1);
    if (unknown) {
        printf("%s0x%" PRIX32, any ? "|" : "", unknown);
        any = true;
    }
    if (!any)
        fputs("none", stdout);
}

/* The first `max_chars` characters of UTF-8 `text`, each line indented by two spaces. */
static void print_indented(const uint8_t *text, uint64_t size, uint64_t max_chars)
{
    uint64_t chars = 0;
    fputs("  ", stdout);
    for (uint64_t i = 0; i < size; i++) {
        if ((text[i] & 0xC0) != 0x80 && chars++ == max_chars)
            break;
        putchar(text[i]);
        if (text[i] == '\n')
            fputs("  ", stdout);
    }
    putchar('\n');
}

/* A tensor index of a routing entry: null for COL_NO_TENSOR, as the Python tools have None. */
static void print_tensor_index(const char *key, uint32_t index)
{
    if (index == COL_NO_TENSOR)
        printf(", \"%s\": null", key);
    else
        printf(", \"%s\": %" PRIu32, key, index);
}

/* A routing entry as colibri.engine.RoutingInfo's fields, and its rule in words. */
static void print_routing_json(const col_routing_info *r)
{
    char rule[512];
    col_routing_describe(r, rule, sizeof rule);
    printf("{\"layer\": %" PRIu32 ", \"kind\": \"%s\"", r->layer,
           r->kind == COL_LAYER_MOE ? "moe" : "dense");
    print_tensor_index("gate_tensor", r->gate_tensor);
    print_tensor_index("gate_bias_tensor", r->gate_bias_tensor);
    printf(", \"top_k\": %" PRIu32 ", \"n_experts\": %" PRIu32 ", \"scoring\": %" PRIu32
           ", \"select_on\": %" PRIu32, r->top_k, r->n_experts, r->scoring, r->select_on);
    print_tensor_index("correction_bias_tensor", r->correction_bias_tensor);
    printf(", \"n_groups\": %" PRIu32 ", \"n_groups_kept\": %" PRIu32 ", \"group_score\": %" PRIu32
           ", \"normalize\": %" PRIu32, r->n_groups, r->n_groups_kept, r->group_score, r->normalize);
    const struct { const char *name; float value; } floats[] = {
        {"norm_eps", r->norm_eps}, {"norm_p", r->norm_p}, {"scale", r->scale},
        {"sparsemixer_eps", r->sparsemixer_eps}};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        printf(", \"%s\": ", floats[i].name);
        json_num((double)floats[i].value);
    }
    printf(", \"shared\": %" PRIu32 ", \"attention\": %" PRIu32 ", \"sinks\": %" PRIu32
           ", \"expert_bias\": %" PRIu32 ", \"activation\": %" PRIu32, r->shared, r->attention, r->sinks,
           r->expert_bias, r->activation);
    const struct { const char *name; float value; } act[] = {{"act_alpha", r->act_alpha}, {"act_limit", r->act_limit}};
    for (size_t i = 0; i < sizeof act / sizeof act[0]; i++) {
        printf(", \"%s\": ", act[i].name);
        json_num((double)act[i].value);
    }
    printf(", \"weight_inputs\": %" PRIu32 ", \"no_rope\": %" PRIu32 ", \"qk_l2_norm\": %" PRIu32
           ", \"temperature_floor\": %" PRIu32 ", \"temperature_scale\": ", r->weight_inputs, r->no_rope,
           r->qk_l2_norm, r->temperature_floor);
    json_num((double)r->temperature_scale);
    fputs(", \"rule\": ", stdout);
    json_str(rule);
    putchar('}');
}

static void print_shape(const col_tensor_info *t, char *out, size_t len)
{
    size_t used = (size_t)snprintf(out, len, "[");
    for (uint32_t k = 0; k < t->ndim && used < len; k++)
        used += (size_t)snprintf(out + used, len - used, "%s%" PRIu64, k ? ", " : "", t->shape[k]);
    if (used < len)
        snprintf(out + used, len - used, "]");
}

static void info_json(const char *path, col_model *m)
{
    uint64_t size = 0, meta_size = 0;
    const uint8_t *bytes = col_model_bytes(m, &size);
    const uint8_t *meta = col_model_metadata(m, &meta_size);
    col_hparams hp;
    col_model_hparams(m, &hp);
    char buf[32];
    fputs("{\"path\": ", stdout);
    json_str(path);
    printf(", \"format\": \"colibri\", \"arch\": \"%s\", \"size\": %" PRIu64 ",\n\"header\": [",
           arch_name(hp.arch, buf, sizeof buf), size);
    for (uint32_t i = 0, nf = col_header_field_count(), shown = 0; i < nf; i++) {
        col_field f;
        col_header_field(bytes, size, i, &f);
        if (!f.in_version)
            continue; /* a field of the other format version's header */
        printf("%s\n  {\"name\": \"%s\", \"group\": \"%s\", \"offset\": %" PRIu64
               ", \"size\": %" PRIu32 ", \"kind\": \"%s\", \"value\": ", shown++ ? "," : "",
               f.name, f.group, f.offset, f.size, field_kind_name(f.kind, buf, sizeof buf));
        print_field_value(&f, bytes, true);
        putchar('}');
    }
    fputs("\n],\n\"hparams\": {", stdout);
    for (size_t i = 0; i < sizeof HPARAMS / sizeof HPARAMS[0]; i++) {
        printf("%s\"%s\": ", i ? ", " : "", HPARAMS[i].name);
        print_hparam(&hp, &HPARAMS[i], true);
    }
    fputs("},\n\"user_metadata\": ", stdout);
    if (json_document(meta, meta_size))
        fwrite(meta, 1, (size_t)meta_size, stdout);
    else
        fputs("null", stdout);
    fputs(",\n\"routing\": [", stdout);
    for (uint32_t l = 0; l < hp.n_layers; l++) {
        col_routing_info r;
        col_model_routing(m, l, &r);
        fputs(l ? ",\n  " : "\n  ", stdout);
        print_routing_json(&r);
    }
    fputs("\n],\n\"tensors\": [", stdout);
    for (uint32_t i = 0, nt = col_model_tensor_count(m); i < nt; i++) {
        col_tensor_info t;
        col_model_tensor(m, i, &t);
        printf("%s\n  {\"name\": ", i ? "," : "");
        json_str(t.name);
        printf(", \"dtype\": \"%s\", \"shape\": [", dtype_name(t.dtype));
        for (uint32_t k = 0; k < t.ndim; k++)
            printf("%s%" PRIu64, k ? ", " : "", t.shape[k]);
        printf("], \"offset\": %" PRIu64 ", \"nbytes\": %" PRIu64 ", \"crc32\": %" PRIu32 "}",
               t.offset, t.nbytes, t.crc32);
    }
    fputs("\n]}\n", stdout);
}

static void info_text(const char *path, col_model *m)
{
    uint64_t size = 0, meta_size = 0;
    const uint8_t *bytes = col_model_bytes(m, &size);
    const uint8_t *meta = col_model_metadata(m, &meta_size);
    col_hparams hp;
    col_model_hparams(m, &hp);
    uint32_t nt = col_model_tensor_count(m);
    char buf[32];
    printf("%s: %s, %" PRIu64 " bytes, %" PRIu32 " tensors\n\nheader:\n", path,
           arch_name(hp.arch, buf, sizeof buf), size, nt);
    for (uint32_t i = 0, nf = col_header_field_count(); i < nf; i++) {
        col_field f;
        col_header_field(bytes, size, i, &f);
        if (!f.in_version)
            continue;
        printf("  0x%03" PRIX64 "  %-28s ", f.offset, f.name);
        print_field_value(&f, bytes, false);
        putchar('\n');
    }
    fputs("\nhyper-parameters:\n", stdout);
    for (size_t i = 0; i < sizeof HPARAMS / sizeof HPARAMS[0]; i++) {
        printf("  %-28s ", HPARAMS[i].name);
        print_hparam(&hp, &HPARAMS[i], false);
        if (strcmp(HPARAMS[i].name, "flags") == 0) {
            fputs(" (", stdout);
            print_flag_names(hp.flags);
            putchar(')');
        }
        putchar('\n');
    }
    fputs("\nrouting:\n", stdout);
    for (uint32_t l = 0; l < hp.n_layers; l++) {
        col_routing_info r;
        char rule[512];
        col_model_routing(m, l, &r);
        col_routing_describe(&r, rule, sizeof rule);
        printf("  layer %-4" PRIu32 " %s\n", r.layer, rule);
    }
    if (json_document(meta, meta_size)) {
        fputs("\nuser metadata:\n", stdout);
        print_indented(meta, meta_size, METADATA_SHOWN);
    }
    fputs("\ntensors:\n", stdout);
    int width = 4;
    for (uint32_t i = 0; i < nt; i++) {
        col_tensor_info t;
        col_model_tensor(m, i, &t);
        int len = (int)strlen(t.name);
        width = len > width ? len : width;
    }
    printf("  %-*s  dtype  %-20s %12s %12s\n", width, "name", "shape", "offset", "bytes");
    for (uint32_t i = 0; i < nt; i++) {
        col_tensor_info t;
        col_model_tensor(m, i, &t);
        char shape[128];
        print_shape(&t, shape, sizeof shape);
        printf("  %-*s  %-5s  %-20s 0x%010" PRIX64 " %12" PRIu64 "\n", width, t.name,
               dtype_name(t.dtype), shape, t.offset, t.nbytes);
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
            error("info: unexpected argument '%s'", argv[i]);
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
    if (json)
        info_json(path, m);
    else
        info_text(path, m);
    col_model_close(m);
    return 0;
}

/* ---- run ------------------------------------------------------------------------------------- */

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

static bool is(const char *arg, const char *short_name, const char *long_name)
{
    return (short_name && strcmp(arg, short_name) == 0) || strcmp(arg, long_name) == 0;
}

static int cmd_run(int argc, char **argv)
{
    const char *path = NULL, *tokens_arg = NULL;
    uint64_t n_gen = 16, seed = 0, threads = 1;
    double epsilon = 0, cache_threshold = 0;
    bool has_epsilon = false;
    uint64_t expert_cache = 0;
    uint32_t routing = COL_ROUTING_TOPK;
    bool debug = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (is(a, NULL, "--tokens") && v)
            tokens_arg = argv[++i];
        else if (is(a, "-n", "--generate")) {
            ok = parse_u64(v, &n_gen) && n_gen <= UINT32_MAX;
            i++;
        } else if (is(a, NULL, "--seed")) {
            ok = parse_u64(v, &seed);
            i++;
        } else if (is(a, "-t", "--threads")) {
            /* the range is the engine's to check (col_session_config_check) */
            ok = parse_u64(v, &threads) && threads <= UINT32_MAX;
            i++;
        } else if (is(a, NULL, "--epsilon")) {
            ok = has_epsilon = parse_double(v, &epsilon);
            i++;
        } else if (is(a, NULL, "--cache-threshold")) {
            ok = parse_double(v, &cache_threshold); /* the range is the engine's to check */
            i++;
        } else if (is(a, NULL, "--expert-cache")) {
            ok = parse_u64(v, &expert_cache) && expert_cache <= UINT32_MAX;
            i++;
        } else if (is(a, NULL, "--routing") && v) {
            i++;
            if (strcmp(v, "topk") == 0)
                routing = COL_ROUTING_TOPK;
            else if (strcmp(v, "stable") == 0)
                routing = COL_ROUTING_STABLE;
            else if (strcmp(v, "soft") == 0)
                routing = COL_ROUTING_SOFT;
            else if (strcmp(v, "gumbel") == 0)
                routing = COL_ROUTING_GUMBEL;
            else if (strcmp(v, "cached") == 0)
                routing = COL_ROUTING_CACHED;
            else
                ok = false;
        } else if (is(a, NULL, "--debug-routing"))
            debug = true;
        else if (a[0] != '-' && !path)
            path = a;
        else
            ok = false;
        if (!ok) {
            error("run: bad or unexpected argument '%s'%s%s", a, v ? " " : "", v ? v : "");
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
        error("run: --tokens wants comma-separated non-negative ids, got '%s'", tokens_arg);
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
    /* exactly the positions this run needs: the last generated token is never fed back */
    uint64_t need = (uint64_t)n_tokens + (n_gen ? n_gen - 1 : 0);
    cfg.max_context = need > UINT32_MAX ? UINT32_MAX : (uint32_t)need;
    cfg.trace = debug ? 1 : 0;
    cfg.epsilon = has_epsilon ? epsilon : (double)hp.default_epsilon;
    cfg.seed = seed;
    cfg.cache_threshold = cache_threshold;
    cfg.expert_cache = (uint32_t)expert_cache;

    char err[512] = "";
    col_session *s = NULL;
    int32_t st = col_session_create(m, &cfg, &s, err, sizeof err);
    int32_t *generated = st == COL_OK ? malloc((size_t)(n_gen ? n_gen : 1) * sizeof *generated)
                                      : NULL;
    if (st == COL_OK && !generated) {
        st = COL_ERR_NOMEM;
        snprintf(err, sizeof err, "out of memory");
    }
    /* the prompt's last token is the first of the engine's greedy steps (the same bits as inside
     * the prefill), which then feed each choice back */
    uint32_t produced = 0;
    if (st == COL_OK)
        st = col_session_prefill(s, tokens, n_gen ? n_tokens - 1 : n_tokens, NULL, err, sizeof err);
    if (st == COL_OK && n_gen)
        st = col_session_generate(s, tokens[n_tokens - 1], (uint32_t)n_gen, -1, generated, &produced, err, sizeof err);
    if (debug && s)
        print_routing(s, 0, col_session_position(s));
    for (uint64_t i = 0; i < produced; i++)
        printf("%s%" PRId32, i ? "," : "", generated[i]);
    if (produced)
        putchar('\n');
    col_cache_stats cs;
    if (st == COL_OK && col_session_cache_stats(s, -1, &cs) == COL_OK) {
        if (cs.expert_cache)
            fprintf(stderr, "expert cache: %" PRIu64 " hits, %" PRIu64 " misses (%u experts per MoE layer)\n",
                    cs.hits, cs.misses, cs.expert_cache);
        if (routing == COL_ROUTING_CACHED)
            fprintf(stderr, "cached routing: kept the previous experts in %" PRIu64 " of %" PRIu64 " decisions\n",
                    cs.kept, cs.decisions);
    }
    if (st != COL_OK)
        error("run: %s: %s", col_status_name(st), err);
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
    error("unknown command '%s'", argv[1]);
    usage(stderr);
    return EXIT_UNREADABLE;
}
