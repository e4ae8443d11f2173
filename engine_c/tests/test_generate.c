/*
 * test_generate.c - greedy decoding in the engine (col_session_generate) on
 * tests/corpus/valid.colibri:
 *   - its choices, positions and last logits are those of col_session_step with an arg-max after
 *     each step, on one thread and on three;
 *   - it stops after the step that chose eos, and never when eos is negative;
 *   - a full context stops it after the steps that fit, reporting them; a bad first token is
 *     refused before anything is processed;
 *   - bad arguments are refused, not dereferenced; n = 0 does nothing.
 */
#include "colibri.h"
#include "harness.h"
#include "corpus.h"

#include <stdio.h>
#include <string.h>

enum { N_PROMPT = 4, N_STEPS = 3, CONTEXT = 8 };
static const int32_t prompt[N_PROMPT + 1] = {1, 4, 2, 7, 3}; /* the last one is the first step's */

static col_session *session_after_prompt(const col_model *m, uint32_t threads)
{
    col_session_config c;
    memset(&c, 0, sizeof c);
    c.n_threads = threads;
    c.max_context = CONTEXT;
    char err[256];
    col_session *s = NULL;
    CHECK(col_session_create(m, &c, &s, err, sizeof err) == COL_OK);
    if (s) CHECK(col_session_prefill(s, prompt, N_PROMPT, NULL, err, sizeof err) == COL_OK);
    return s;
}

/* The reference choice, written apart from the engine's: the first index of the largest logit. */
static int32_t first_largest(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static void test_same_as_steps(const col_model *m, uint32_t vocab, uint32_t threads, int32_t *chosen)
{
    col_session *a = session_after_prompt(m, threads), *b = session_after_prompt(m, threads);
    if (!a || !b) return;
    char err[256];
    uint32_t steps = 99;
    CHECK(col_session_generate(a, prompt[N_PROMPT], N_STEPS, -1, chosen, &steps, err, sizeof err) == COL_OK);
    CHECK(steps == N_STEPS);
    int32_t token = prompt[N_PROMPT];
    for (int i = 0; i < N_STEPS; i++) {
        CHECK(col_session_step(b, token, NULL, err, sizeof err) == COL_OK);
        token = first_largest(col_session_logits(b), vocab);
        CHECK(chosen[i] == token);
    }
    CHECK(col_session_position(a) == N_PROMPT + N_STEPS && col_session_position(b) == N_PROMPT + N_STEPS);
    CHECK(memcmp(col_session_logits(a), col_session_logits(b), vocab * sizeof(float)) == 0);
    col_session_free(a);
    col_session_free(b);
}

static void test_stops_at_eos(const col_model *m, const int32_t *chosen)
{
    col_session *s = session_after_prompt(m, 1);
    if (!s) return;
    char err[256];
    int32_t out[N_STEPS];
    uint32_t steps = 0, expected = 1;
    while (chosen[expected - 1] != chosen[1]) expected++; /* the first step that chooses it */
    CHECK(col_session_generate(s, prompt[N_PROMPT], N_STEPS, chosen[1], out, &steps, err, sizeof err) == COL_OK);
    CHECK(steps == expected);
    CHECK(out[steps - 1] == chosen[1]);
    CHECK(col_session_position(s) == N_PROMPT + expected);
    col_session_free(s);
}

static void test_full_context(const col_model *m, const int32_t *chosen)
{
    col_session *s = session_after_prompt(m, 1);
    if (!s) return;
    char err[256] = "";
    int32_t out[CONTEXT];
    uint32_t steps = 0;
    const uint32_t fit = CONTEXT - N_PROMPT;
    CHECK(col_session_generate(s, prompt[N_PROMPT], fit + 2, -1, out, &steps, err, sizeof err) == COL_ERR_CONTEXT_FULL);
    CHECK(steps == fit);
    CHECK(memcmp(out, chosen, N_STEPS * sizeof *out) == 0);
    CHECK(col_session_position(s) == CONTEXT);
    CHECK(strstr(err, "exceed the context") != NULL);
    col_session_free(s);
}

static void test_bad_first_token(const col_model *m, uint32_t vocab)
{
    col_session *s = session_after_prompt(m, 1);
    if (!s) return;
    char err[256] = "", expected[64];
    int32_t out[1];
    uint32_t steps = 99;
    CHECK(col_session_generate(s, (int32_t)vocab, 1, -1, out, &steps, err, sizeof err) == COL_ERR_BAD_TOKEN);
    CHECK(steps == 0 && col_session_position(s) == N_PROMPT);
    snprintf(expected, sizeof expected, "token %u outside [0, %u)", vocab, vocab);
    CHECK(strcmp(err, expected) == 0);
    CHECK(col_session_generate(s, -1, 1, -1, out, &steps, err, sizeof err) == COL_ERR_BAD_TOKEN);
    col_session_free(s);
}

static void test_bad_arguments(const col_model *m)
{
    char err[256];
    int32_t out[1];
    uint32_t steps = 99;
    CHECK(col_session_generate(NULL, 1, 1, -1, out, &steps, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(steps == 0);
    col_session *s = session_after_prompt(m, 1);
    if (!s) return;
    CHECK(col_session_generate(s, 1, 1, -1, out, NULL, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(col_session_generate(s, 1, 1, -1, NULL, &steps, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(col_session_generate(s, 1, 0, -1, NULL, &steps, err, sizeof err) == COL_OK);
    CHECK(steps == 0 && col_session_position(s) == N_PROMPT);
    col_session_free(s);
}

int main(void)
{
    col_model *m = open_valid();
    if (!m) return TEST_REPORT();
    col_hparams hp;
    col_model_hparams(m, &hp);
    int32_t chosen[N_STEPS], on_three[N_STEPS];
    test_same_as_steps(m, hp.vocab_size, 1, chosen);
    test_same_as_steps(m, hp.vocab_size, 3, on_three);
    CHECK(memcmp(chosen, on_three, sizeof chosen) == 0);
    test_stops_at_eos(m, chosen);
    test_full_context(m, chosen);
    test_bad_first_token(m, hp.vocab_size);
    test_bad_arguments(m);
    col_model_close(m);
    return TEST_REPORT();
}
