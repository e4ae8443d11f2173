/*
 * test_config.c - the engine as the one judge of a session's configuration: every range
 * col_session_create refuses, through col_session_config_check (which must agree with it and
 * with col_session_memory_estimate), with the reason named in the message. The Python binding
 * checks only argument types and relies on these.
 * Uses tests/corpus/valid.colibri (directory as in test_corpus.c).
 */
#include "colibri.h"
#include "harness.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char valid_path[512];

static bool find_valid(void)
{
    const char *dirs[] = {"../tests/corpus", "tests/corpus"};
    for (int i = 0; i < 2; i++) {
        snprintf(valid_path, sizeof valid_path, "%s/valid.colibri", dirs[i]);
        if (access(valid_path, R_OK) == 0)
            return true;
    }
    return false;
}

static col_session_config base_config(void)
{
    col_session_config c;
    memset(&c, 0, sizeof c);
    c.n_threads = 1;
    c.max_context = 8;
    return c;
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

static void test_ranges(const col_model *m)
{
    col_hparams hp;
    CHECK(col_model_hparams(m, &hp) == COL_OK);
    col_session_config c = base_config();
    char err[256];
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_OK);
    CHECK(col_session_memory_estimate(m, &c) > 0);

    c = base_config(); c.routing = COL_ROUTING_GUMBEL + 1;
    expect_refused(m, c, "unknown routing mode 4");
    c = base_config(); c.n_threads = 0;
    expect_refused(m, c, "n_threads 0 outside 1..256");
    c = base_config(); c.n_threads = 257;
    expect_refused(m, c, "n_threads 257 outside 1..256");
    c = base_config(); c.n_threads = 256;
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_OK);
    c = base_config(); c.max_context = hp.max_context + 1;
    expect_refused(m, c, "exceeds the model's");
    c = base_config(); c.max_context = hp.max_context;
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_OK);
    c = base_config(); c.epsilon = -1e-9;
    expect_refused(m, c, "epsilon must be finite and >= 0");
    c = base_config(); c.epsilon = NAN;
    expect_refused(m, c, "epsilon must be finite and >= 0");
    c = base_config(); c.epsilon = INFINITY;
    expect_refused(m, c, "epsilon must be finite and >= 0");
    c = base_config(); c.trace = 2;
    expect_refused(m, c, "trace must be 0 or 1");
    c = base_config(); c.kernels = COL_KERNELS_AMX + 1;
    expect_refused(m, c, "unknown kernel path 5");

    /* the numerics fields */
    c = base_config(); c.reduction = COL_REDUCTION_BLOCKED + 1;
    expect_refused(m, c, "unknown reduction");
    c = base_config(); c.reduction = COL_REDUCTION_BLOCKED;
    expect_refused(m, c, "lanes in 1..256, got 0");
    c.lanes = 257;
    expect_refused(m, c, "lanes in 1..256, got 257");
    c.lanes = 256;
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_OK);
    c = base_config(); c.reduction = COL_REDUCTION_PAIRWISE; c.lanes = 4;
    expect_refused(m, c, "set without the blocked reduction");
    c = base_config(); c.fma = 2;
    expect_refused(m, c, "fma must be 0 or 1");
    c = base_config(); c.split = 257;
    expect_refused(m, c, "split 257 outside 0..256");
    c = base_config(); c.activation = COL_ACTIVATION_F16 + 1;
    expect_refused(m, c, "unknown activation precision");
    c = base_config(); c.router_noise_ulps = (1u << 22) + 1;
    expect_refused(m, c, "router_noise_ulps");

    /* NULL arguments are refused, not dereferenced */
    c = base_config();
    CHECK(col_session_config_check(NULL, &c, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(col_session_config_check(m, NULL, NULL, 0) == COL_ERR_INVALID_ARG);
}

int main(void)
{
    if (!find_valid()) {
        fprintf(stderr, "tests/corpus/valid.colibri not found\n");
        return 1;
    }
    col_model *m = NULL;
    col_problem p;
    CHECK(col_model_open(valid_path, &m, &p) == COL_OK && m);
    if (m) {
        test_ranges(m);
        col_model_close(m);
    }
    return TEST_REPORT();
}
