/*
 * test_hostile.c - the engine against a hostile environment or caller rather than a hostile file:
 *   - failing allocations: an allocator that fails the Nth call, for N = 0, 1, ... through
 *     col_model_open_ex and col_session_create_ex until they succeed; every failure must return
 *     COL_ERR_NOMEM with no block outstanding (the allocator counts them; LSan checks the rest
 *     under `make asan`);
 *   - a file truncated or rewritten while mapped: steps and checksum scans return
 *     COL_ERR_FILE_CHANGED, a read past the new end through the mapping is served zeros by the
 *     SIGBUS guard instead of killing the process, an atomic replace is reported as "replaced";
 *   - session configurations out of range: refused by the engine, the one judge, in its words.
 * Uses tests/corpus/valid.colibri (directory as in test_corpus.c).
 */
#include "colibri.h"
#include "harness.h"
#include "corpus.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- A failing, counting allocator ----------------------------------------------------------- */

typedef struct counting {
    long calls;         /* allocations attempted */
    long fail_at;       /* the call index that fails (and every later one), -1 = never */
    long outstanding;   /* blocks allocated and not yet freed */
    size_t bytes;       /* sum of the sizes of every block allocated */
} counting;

static void *counting_alloc(void *user, size_t size, size_t alignment)
{
    counting *c = user;
    long call = c->calls++;
    if (c->fail_at >= 0 && call >= c->fail_at)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, size) != 0)
        return NULL;
    c->outstanding++;
    c->bytes += size;
    return p;
}

static void counting_free(void *user, void *p)
{
    counting *c = user;
    c->outstanding--;
    free(p);
}

/* ---- Files ----------------------------------------------------------------------------------- */

/* Copy the valid file to a private temporary path (the tests truncate it). */
static void copy_valid(char *out, size_t n, const char *tag)
{
    snprintf(out, n, "/tmp/colibri-hostile-%ld-%s.colibri", (long)getpid(), tag);
    FILE *in = fopen(valid_path, "rb"), *o = fopen(out, "wb");
    char buf[4096];
    size_t k;
    while (in && o && (k = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, k, o);
    if (in)
        fclose(in);
    if (o)
        fclose(o);
}

static col_session_config small_config(void)
{
    col_session_config c;
    memset(&c, 0, sizeof c);
    c.n_threads = 1;
    c.max_context = 8;
    c.trace = 1;
    return c;
}

/* ---- Tests ----------------------------------------------------------------------------------- */

static void test_model_open_allocation_failures(void)
{
    int failures = 0;
    for (long n = 0; n < 1000; n++) {
        counting c = {0, n, 0, 0};
        col_allocator a = {counting_alloc, counting_free, &c};
        col_model *m = NULL;
        col_problem p;
        int32_t rc = col_model_open_ex(valid_path, &a, &m, &p);
        if (rc == COL_OK) {
            CHECK(m != NULL && c.outstanding > 0);
            col_model_close(m);
            CHECK(c.outstanding == 0);
            CHECK(n > 0 && failures == n); /* every earlier N failed cleanly */
            return;
        }
        failures++;
        CHECK(rc == COL_ERR_NOMEM && m == NULL && p.code == COL_ERR_NOMEM);
        CHECK(c.outstanding == 0);
    }
    CHECK(!"col_model_open_ex never succeeded");
}

/* Every allocation of session creation, the thread pool's bookkeeping included (n_threads > 1),
 * can fail without a leak. */
static void test_session_create_allocation_failures(uint32_t n_threads)
{
    col_model *m = NULL;
    CHECK(col_model_open(valid_path, &m, NULL) == COL_OK);
    if (!m)
        return;
    col_session_config cfg = small_config();
    cfg.n_threads = n_threads;
    for (long n = 0; n < 1000; n++) {
        counting c = {0, n, 0, 0};
        col_allocator a = {counting_alloc, counting_free, &c};
        col_session *s = NULL;
        char err[256] = "";
        int32_t rc = col_session_create_ex(m, &cfg, &a, &s, err, sizeof err);
        if (rc == COL_OK) {
            float logits[16];
            CHECK(col_session_step(s, 1, logits, err, sizeof err) == COL_OK);
            col_session_free(s);
            CHECK(c.outstanding == 0 && n > 0);
            col_model_close(m);
            return;
        }
        CHECK(rc == COL_ERR_NOMEM && s == NULL && strstr(err, "allocate") != NULL);
        CHECK(c.outstanding == 0);
    }
    CHECK(!"col_session_create_ex never succeeded");
    col_model_close(m);
}

/* After col_session_create_ex, running allocates nothing (the arena holds every buffer): a prefill
 * across a chunk boundary and steps beyond it leave the allocator's call count where creation left
 * it, on each family's kind of file (v1, DeepSeek-V3's rule, GPT-OSS's sinks and expert biases,
 * Llama 4's chunks, NoPE and shared expert, PhiMoE's biased LayerNorms), with 1 and 3 threads. */
static void test_running_allocates_nothing(void)
{
    const char *names[] = {"valid_v1", "valid_v3_rule", "valid_gpt_oss", "valid_llama4",
                           "valid_layernorm_bias"};
    char dir[512];
    snprintf(dir, sizeof dir, "%s", valid_path);
    *strrchr(dir, '/') = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s.colibri", dir, names[i]);
        col_model *m = NULL;
        CHECK(col_model_open(path, &m, NULL) == COL_OK);
        if (!m)
            continue;
        col_hparams hp;
        CHECK(col_model_hparams(m, &hp) == COL_OK);
        float *logits = malloc(sizeof(float) * 5 * hp.vocab_size);
        for (uint32_t threads = 1; threads <= 3; threads += 2) {
            col_session_config cfg = small_config();
            cfg.n_threads = threads;
            counting c = {0, -1, 0, 0};
            col_allocator a = {counting_alloc, counting_free, &c};
            col_session *s = NULL;
            char err[256] = "";
            CHECK(col_session_create_ex(m, &cfg, &a, &s, err, sizeof err) == COL_OK);
            if (!s)
                continue;
            long created = c.calls, held = c.outstanding;
            CHECK(created > 0 && held > 0); /* the arena and the rest came through `a` */
            /* what the session holds is its memory estimate, beyond it only the thread pool's
             * bookkeeping (a few hundred bytes a thread) */
            const uint64_t estimate = col_session_memory_estimate(m, &cfg);
            CHECK(estimate > 0 && c.bytes >= estimate && c.bytes <= estimate + 4096u * threads);
            if (c.bytes > estimate + 4096u * threads)
                fprintf(stderr, "%s, %u threads: %zu bytes allocated, estimate %llu\n", names[i],
                        threads, c.bytes, (unsigned long long)estimate);
            const int32_t prompt[5] = {1, 2, 3, 1, 0};
            CHECK(col_session_prefill(s, prompt, 5, logits, err, sizeof err) == COL_OK);
            for (int32_t t = 0; t < 3; t++)
                CHECK(col_session_step(s, t, logits, err, sizeof err) == COL_OK);
            CHECK(c.calls == created && c.outstanding == held);
            if (c.calls != created)
                fprintf(stderr, "%s, %u threads: %ld allocations while running\n", names[i],
                        threads, c.calls - created);
            col_session_free(s);
            CHECK(c.outstanding == 0);
        }
        free(logits);
        col_model_close(m);
    }
}

static void test_truncated_during_run(void)
{
    char path[256];
    copy_valid(path, sizeof path, "run");
    col_model *m = NULL;
    CHECK(col_model_open(path, &m, NULL) == COL_OK);
    if (!m)
        return;
    col_session_config cfg = small_config();
    col_session *s = NULL;
    char err[256];
    CHECK(col_session_create(m, &cfg, &s, err, sizeof err) == COL_OK);
    float logits[16];
    CHECK(col_session_step(s, 1, logits, err, sizeof err) == COL_OK);
    uint32_t replaced = 7;
    CHECK(col_model_check_file(m, &replaced, err, sizeof err) == COL_OK && replaced == 0);

    uint64_t size;
    const uint8_t *bytes = col_model_bytes(m, &size);
    CHECK(truncate(path, 4096) == 0);
    CHECK(col_session_step(s, 2, logits, err, sizeof err) == COL_ERR_FILE_CHANGED);
    CHECK(strstr(err, "size is now 4096") != NULL);
    CHECK(col_session_position(s) == 1);
    col_problem p;
    uint32_t n = 0;
    CHECK(col_model_check_tensor(m, col_model_tensor_count(m) - 1, COL_CHECK_CHECKSUMS, &p, 1, &n) ==
          COL_ERR_FILE_CHANGED);
    CHECK(n == 1 && p.code == COL_ERR_FILE_CHANGED);

    /* The guard: a direct read of a page past the new end would be SIGBUS; it reads zeros and
     * the model is marked. */
    volatile uint8_t last = bytes[size - 1];
    CHECK(last == 0);
    CHECK(col_model_check_file(m, NULL, err, sizeof err) == COL_ERR_FILE_CHANGED);
    CHECK(strstr(err, "faulted") != NULL);
    col_session_free(s);
    col_model_close(m);
    unlink(path);
}

static void test_rewritten_and_replaced(void)
{
    char path[256], other[256];
    copy_valid(path, sizeof path, "rewrite");
    copy_valid(other, sizeof other, "replacement");
    col_model *m = NULL;
    CHECK(col_model_open(path, &m, NULL) == COL_OK);
    if (!m)
        return;
    /* An atomic replace leaves the mapping intact: OK, replaced = 1. */
    CHECK(rename(other, path) == 0);
    uint32_t replaced = 0;
    char err[256];
    CHECK(col_model_check_file(m, &replaced, err, sizeof err) == COL_OK && replaced == 1);
    col_model_close(m);

    /* A rewrite in place of the same size changes the mtime. */
    CHECK(col_model_open(path, &m, NULL) == COL_OK);
    if (!m)
        return;
    struct timespec pause = {0, 20000000};
    nanosleep(&pause, NULL);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, 300, SEEK_SET);
        fputc(0x5A, f);
        fclose(f);
    }
    CHECK(col_model_check_file(m, &replaced, err, sizeof err) == COL_ERR_FILE_CHANGED);
    CHECK(strstr(err, "modified in place") != NULL);
    col_model_close(m);
    unlink(path);
}

static void test_validate_file_truncated(void)
{
    char path[256];
    copy_valid(path, sizeof path, "validate");
    CHECK(truncate(path, 200) == 0);
    col_problem p;
    uint32_t n = 0;
    CHECK(col_validate_file(path, COL_CHECK_CHECKSUMS, &p, 1, &n) == COL_ERR_TRUNCATED);
    unlink(path);
}

/* `c` is refused by the check, by creation and by the estimate, with `words` in the message. */
static void expect_refused(const col_model *m, col_session_config c, const char *words)
{
    char err[256] = "", err2[256] = "";
    col_session *s = (col_session *)err; /* must be reset to NULL */
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(strstr(err, words) != NULL);
    CHECK(col_session_create(m, &c, &s, err2, sizeof err2) == COL_ERR_INVALID_ARG && s == NULL);
    CHECK(strcmp(err, err2) == 0);
    CHECK(col_session_memory_estimate(m, &c) == 0);
    if (!strstr(err, words))
        fprintf(stderr, "  expected '%s' in '%s'\n", words, err);
}

/* A caller's configuration, refused in the engine's words: every range col_session_create
 * checks, through col_session_config_check (which must agree with it and with
 * col_session_memory_estimate). The Python binding checks only argument types and relies on these. */
static void test_session_config_ranges(void)
{
    col_model *m = NULL;
    col_problem p;
    CHECK(col_model_open(valid_path, &m, &p) == COL_OK && m);
    if (!m)
        return;
    col_hparams hp;
    CHECK(col_model_hparams(m, &hp) == COL_OK);
    col_session_config c = small_config();
    char err[256];
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_OK);
    CHECK(col_session_memory_estimate(m, &c) > 0);

    c = small_config(); c.routing = COL_ROUTING_CACHED + 1;
    expect_refused(m, c, "unknown routing mode 5");
    c = small_config(); c.routing = COL_ROUTING_CACHED; c.cache_threshold = -0.5;
    expect_refused(m, c, "cache_threshold must be finite and >= 0");
    c = small_config(); c.routing = COL_ROUTING_CACHED; c.cache_threshold = NAN;
    expect_refused(m, c, "cache_threshold must be finite and >= 0");
    c = small_config(); c.routing = COL_ROUTING_CACHED; c.cache_threshold = 0.25; c.expert_cache = hp.n_experts;
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_OK);
    c = small_config(); c.expert_cache = hp.n_experts_active - 1;
    if (hp.n_experts_active > 1) expect_refused(m, c, "outside");
    c = small_config(); c.expert_cache = hp.n_experts + 1;
    expect_refused(m, c, "outside");
    c = small_config(); c.routing = COL_ROUTING_SOFT; c.expert_cache = hp.n_experts_active;
    if (hp.n_experts_active < hp.n_experts) expect_refused(m, c, "the experts one decision takes");
    c = small_config(); c.n_threads = 0;
    expect_refused(m, c, "n_threads 0 outside 1..256");
    c = small_config(); c.n_threads = 257;
    expect_refused(m, c, "n_threads 257 outside 1..256");
    c = small_config(); c.n_threads = 256;
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_OK);
    c = small_config(); c.max_context = hp.max_context + 1;
    expect_refused(m, c, "exceeds the model's");
    c = small_config(); c.max_context = hp.max_context;
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_OK);
    c = small_config(); c.epsilon = -1e-9;
    expect_refused(m, c, "epsilon must be finite and >= 0");
    c = small_config(); c.epsilon = NAN;
    expect_refused(m, c, "epsilon must be finite and >= 0");
    c = small_config(); c.epsilon = INFINITY;
    expect_refused(m, c, "epsilon must be finite and >= 0");
    c = small_config(); c.trace = 2;
    expect_refused(m, c, "trace must be 0 or 1");
    c = small_config(); c.kernels = COL_KERNELS_AMX + 1;
    expect_refused(m, c, "unknown kernel path 6");

    /* the numerics fields */
    c = small_config(); c.reduction = COL_REDUCTION_BF16_DOT + 1;
    expect_refused(m, c, "unknown reduction");
    c = small_config(); c.reduction = COL_REDUCTION_BF16_DOT; c.split = 4;
    expect_refused(m, c, "fma and split do not apply");
    c = small_config(); c.reduction = COL_REDUCTION_BLOCKED;
    expect_refused(m, c, "lanes in 1..256, got 0");
    c.lanes = 257;
    expect_refused(m, c, "lanes in 1..256, got 257");
    c.lanes = 256;
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_OK);
    c = small_config(); c.reduction = COL_REDUCTION_PAIRWISE; c.lanes = 4;
    expect_refused(m, c, "set without the blocked reduction");
    c = small_config(); c.fma = 2;
    expect_refused(m, c, "fma must be 0 or 1");
    c = small_config(); c.split = 257;
    expect_refused(m, c, "split 257 outside 0..256");
    c = small_config(); c.activation = COL_ACTIVATION_F16 + 1;
    expect_refused(m, c, "unknown activation precision");
    c = small_config(); c.kv_precision = COL_KV_F16 + 1;
    expect_refused(m, c, "unknown KV cache precision");
    c = small_config(); c.router_noise_ulps = (1u << 22) + 1;
    expect_refused(m, c, "router_noise_ulps");

    /* NULL arguments are refused, not dereferenced */
    c = small_config();
    CHECK(col_session_config_check(NULL, &c, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(col_session_config_check(m, NULL, NULL, 0) == COL_ERR_INVALID_ARG);
    col_model_close(m);
}
int main(void)
{
    CHECK(find_valid());
    if (!find_valid())
        return TEST_REPORT();
    test_model_open_allocation_failures();
    test_session_create_allocation_failures(1);
    test_session_create_allocation_failures(3);
    test_running_allocates_nothing();
    test_truncated_during_run();
    test_rewritten_and_replaced();
    test_validate_file_truncated();
    test_session_config_ranges();
    return TEST_REPORT();
}
