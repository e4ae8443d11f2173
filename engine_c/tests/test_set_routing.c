/*
 * test_set_routing.c - changing a live session's routing (col_session_set_routing) on
 * tests/corpus/valid.colibri:
 *   - the same routing again changes no recorded decision (first changed = the position);
 *   - after each change, truncating at the first changed position and processing the rest gives
 *     every position's logits with the bits of a session created with that routing;
 *   - without a trace nothing can be routed again, so the first changed position is 0;
 *   - refusals (soft or cached routing, a bad epsilon, a position in progress, NULL) change
 *     nothing: the next position has the old routing's bits.
 */
#include "colibri.h"
#include "harness.h"
#include "corpus.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N = 8 };
static const int32_t tokens[N] = {1, 4, 2, 7, 3, 5, 6, 2};

static col_session *session_of(const col_model *m, uint32_t routing, double epsilon, uint64_t seed, uint32_t trace)
{
    col_session_config c;
    memset(&c, 0, sizeof c);
    c.routing = routing;
    c.epsilon = epsilon;
    c.seed = seed;
    c.n_threads = 1;
    c.max_context = N;
    c.trace = trace;
    char err[256];
    col_session *s = NULL;
    CHECK(col_session_create(m, &c, &s, err, sizeof err) == COL_OK);
    return s;
}

static void test_same_routing_changes_nothing(const col_model *m)
{
    col_session *s = session_of(m, COL_ROUTING_STABLE, 1e-3, 0, 1);
    if (!s) return;
    char err[256];
    uint32_t first = 99;
    CHECK(col_session_prefill(s, tokens, N, NULL, err, sizeof err) == COL_OK);
    CHECK(col_session_set_routing(s, COL_ROUTING_STABLE, 1e-3, 0, &first, err, sizeof err) == COL_OK);
    CHECK(first == N);
    CHECK(col_session_set_routing(s, COL_ROUTING_STABLE, 1e-3, 0, NULL, err, sizeof err) == COL_OK);
    col_session_free(s);
}

static void test_rerun_has_a_fresh_sessions_bits(const col_model *m, uint32_t vocab)
{
    struct { uint32_t routing; double epsilon; uint64_t seed; } settings[] = {
        {COL_ROUTING_STABLE, 0.0, 0}, {COL_ROUTING_STABLE, 1e-2, 0}, {COL_ROUTING_STABLE, 1.0, 0},
        {COL_ROUTING_GUMBEL, 0.0, 1}, {COL_ROUTING_GUMBEL, 0.0, 9}, {COL_ROUTING_TOPK, 0.0, 0}};
    float *live_logits = malloc(sizeof(float) * N * vocab), *want = malloc(sizeof(float) * N * vocab);
    col_session *live = session_of(m, COL_ROUTING_TOPK, 0.0, 0, 1);
    char err[256];
    if (!live || !live_logits || !want) goto done;
    CHECK(col_session_prefill(live, tokens, N, live_logits, err, sizeof err) == COL_OK);
    uint32_t changed_somewhere = 0;
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
        uint32_t first = 99;
        CHECK(col_session_set_routing(live, settings[i].routing, settings[i].epsilon, settings[i].seed, &first, err,
                                      sizeof err) == COL_OK);
        CHECK(first <= N);
        if (first > N) break;
        changed_somewhere |= first < N;
        CHECK(col_session_truncate(live, first, err, sizeof err) == COL_OK);
        if (first < N)
            CHECK(col_session_prefill(live, tokens + first, N - first, live_logits + (size_t)first * vocab, err,
                                      sizeof err) == COL_OK);
        col_session *fresh = session_of(m, settings[i].routing, settings[i].epsilon, settings[i].seed, 1);
        if (!fresh) continue;
        CHECK(col_session_prefill(fresh, tokens, N, want, err, sizeof err) == COL_OK);
        CHECK(memcmp(live_logits, want, sizeof(float) * N * vocab) == 0);
        col_session_free(fresh);
    }
    CHECK(changed_somewhere); /* else the test shows nothing */
done:
    col_session_free(live);
    free(live_logits);
    free(want);
}

static void test_without_a_trace_everything_counts_as_changed(const col_model *m)
{
    col_session *s = session_of(m, COL_ROUTING_TOPK, 0.0, 0, 0);
    if (!s) return;
    char err[256];
    uint32_t first = 99;
    CHECK(col_session_prefill(s, tokens, 3, NULL, err, sizeof err) == COL_OK);
    CHECK(col_session_set_routing(s, COL_ROUTING_TOPK, 0.0, 0, &first, err, sizeof err) == COL_OK);
    CHECK(first == 0);
    col_session_free(s);
}

/* After a refused change the session still routes as before: its next position's logits are a
 * plain top-k session's. */
static void test_refusals_change_nothing(const col_model *m, uint32_t vocab)
{
    float *got = malloc(sizeof(float) * vocab), *want = malloc(sizeof(float) * vocab);
    col_session *s = session_of(m, COL_ROUTING_TOPK, 0.0, 0, 1), *ref = session_of(m, COL_ROUTING_TOPK, 0.0, 0, 1);
    char err[256] = "";
    uint32_t first = 99, layers = 0;
    if (!s || !ref || !got || !want) goto done;
    CHECK(col_session_set_routing(NULL, COL_ROUTING_TOPK, 0.0, 0, &first, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(col_session_prefill(s, tokens, N - 2, NULL, err, sizeof err) == COL_OK);
    CHECK(col_session_set_routing(s, COL_ROUTING_SOFT, 0.0, 0, &first, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(strstr(err, "routing changes only among top-k, stable and Gumbel routing") != NULL);
    CHECK(col_session_set_routing(s, COL_ROUTING_CACHED, 0.0, 0, &first, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(col_session_set_routing(s, COL_ROUTING_STABLE, -1.0, 0, &first, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(strstr(err, "epsilon must be finite and >= 0") != NULL);
    CHECK(col_session_set_routing(s, COL_ROUTING_STABLE, NAN, 0, &first, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(col_session_set_routing(s, 99, 0.0, 0, &first, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(col_session_begin_token(s, tokens[N - 2], err, sizeof err) == COL_OK);
    CHECK(col_session_step_layer(s, NULL, &layers, err, sizeof err) == COL_OK);
    CHECK(col_session_set_routing(s, COL_ROUTING_STABLE, 1.0, 0, &first, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(strstr(err, "in progress") != NULL);
    CHECK(first == 99);
    CHECK(col_session_truncate(s, N - 2, err, sizeof err) == COL_OK);
    CHECK(col_session_prefill(s, tokens + N - 2, 2, NULL, err, sizeof err) == COL_OK);
    CHECK(col_session_prefill(ref, tokens, N, NULL, err, sizeof err) == COL_OK);
    memcpy(got, col_session_logits(s), sizeof(float) * vocab);
    memcpy(want, col_session_logits(ref), sizeof(float) * vocab);
    CHECK(memcmp(got, want, sizeof(float) * vocab) == 0);
done:
    col_session_free(s);
    col_session_free(ref);
    free(got);
    free(want);
}

int main(void)
{
    col_model *m = open_valid();
    if (!m) return TEST_REPORT();
    col_hparams hp;
    col_model_hparams(m, &hp);
    test_same_routing_changes_nothing(m);
    test_rerun_has_a_fresh_sessions_bits(m, hp.vocab_size);
    test_without_a_trace_everything_counts_as_changed(m);
    test_refusals_change_nothing(m, hp.vocab_size);
    col_model_close(m);
    return TEST_REPORT();
}
