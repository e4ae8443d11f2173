/*
 * test_capture.c - hidden-state capture (col_session_capture, col_session_hidden,
 * col_session_config.capture_hidden) on tests/corpus/valid.colibri:
 *   - the session's own buffer fills one row per processed position, sized in the estimate;
 *   - a caller's buffer receives exactly the positions of its window and nothing else;
 *   - prefill and stepping, one thread and three, capture the same bits;
 *   - the last layer's row is the residual stream: col_session_logits follows from it;
 *   - bad arguments are refused, not dereferenced.
 */
#include "colibri.h"
#include "harness.h"
#include "corpus.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static col_session_config config(uint32_t threads, uint32_t capture)
{
    col_session_config c;
    memset(&c, 0, sizeof c);
    c.n_threads = threads;
    c.max_context = 8;
    c.capture_hidden = capture;
    return c;
}

enum { N_TOKENS = 5 };
static const int32_t tokens[N_TOKENS] = {1, 4, 2, 7, 3};

/* The session's own buffer: every processed position's row, in the memory estimate. */
static void test_own_buffer(const col_model *m, const col_hparams *hp, float *own)
{
    col_session_config with = config(1, 1), without = config(1, 0);
    uint64_t row = (uint64_t)hp->n_layers * hp->d_model;
    CHECK(col_session_memory_estimate(m, &with) - col_session_memory_estimate(m, &without) >=
          8 * row * sizeof(float));
    char err[256];
    col_session *s = NULL;
    CHECK(col_session_create(m, &with, &s, err, sizeof err) == COL_OK);
    if (!s) return;
    col_hidden_view h;
    CHECK(col_session_hidden(s, &h) == COL_OK);
    CHECK(h.data != NULL && h.first_position == 0 && h.n_rows == 8);
    CHECK(h.n_layers == hp->n_layers && h.d_model == hp->d_model);
    CHECK(col_session_prefill(s, tokens, N_TOKENS, NULL, err, sizeof err) == COL_OK);
    memcpy(own, h.data, N_TOKENS * row * sizeof(float));
    bool finite = true, nonzero = false;
    for (uint64_t i = 0; i < N_TOKENS * row; i++) {
        finite &= isfinite(own[i]) != 0;
        nonzero |= own[i] != 0.0f;
    }
    CHECK(finite && nonzero);
    col_session_free(s);

    /* without capture_hidden there is nothing to read */
    CHECK(col_session_create(m, &without, &s, err, sizeof err) == COL_OK);
    if (!s) return;
    CHECK(col_session_hidden(s, &h) == COL_OK && h.data == NULL && h.n_rows == 0);
    col_session_free(s);
}

/* A caller's window of two positions, stepping on three threads: exactly those rows, the same
 * bits as the one-thread prefill; the rows around it untouched. */
static void test_caller_window(const col_model *m, const col_hparams *hp, const float *own)
{
    uint64_t row = (uint64_t)hp->n_layers * hp->d_model;
    float *buf = malloc(4 * row * sizeof(float)); /* 1 guard row, 2 captured, 1 guard row */
    if (!buf) return;
    for (uint64_t i = 0; i < 4 * row; i++) buf[i] = -12345.0f;
    col_session_config c = config(3, 0);
    char err[256];
    col_session *s = NULL;
    CHECK(col_session_create(m, &c, &s, err, sizeof err) == COL_OK);
    if (!s) { free(buf); return; }
    CHECK(col_session_capture(s, buf + row, 2, 2, err, sizeof err) == COL_OK);
    col_hidden_view h;
    CHECK(col_session_hidden(s, &h) == COL_OK && h.data == buf + row && h.first_position == 2 &&
          h.n_rows == 2);
    for (int i = 0; i < N_TOKENS; i++) CHECK(col_session_step(s, tokens[i], NULL, err, sizeof err) == COL_OK);
    CHECK(memcmp(buf + row, own + 2 * row, 2 * row * sizeof(float)) == 0);
    bool guards = true;
    for (uint64_t i = 0; i < row; i++) guards &= buf[i] == -12345.0f && buf[3 * row + i] == -12345.0f;
    CHECK(guards);

    /* the last layer's row at the last position is what the LM head read: its logits follow */
    const float *x = own + (N_TOKENS - 1) * row + (uint64_t)(hp->n_layers - 1) * hp->d_model;
    uint32_t index;
    col_tensor_info norm, head;
    CHECK(col_model_find_tensor(m, "output_norm", &index) == COL_OK && col_model_tensor(m, index, &norm) == COL_OK);
    const char *head_name = (hp->flags & COL_FLAG_TIED_EMBEDDINGS) ? "token_embd" : "output";
    CHECK(col_model_find_tensor(m, head_name, &index) == COL_OK && col_model_tensor(m, index, &head) == COL_OK);
    if (norm.dtype == COL_DTYPE_F32 && head.dtype == COL_DTYPE_F32) {
        double ss = 0;
        for (uint32_t i = 0; i < hp->d_model; i++) ss += (double)x[i] * x[i];
        double inv = 1.0 / sqrt(ss / hp->d_model + hp->norm_eps);
        const float *w = norm.data, *e = head.data;
        const float *logits = col_session_logits(s);
        double worst = 0;
        for (uint32_t v = 0; v < hp->vocab_size; v++) {
            double dot = 0;
            for (uint32_t i = 0; i < hp->d_model; i++) dot += (double)e[(uint64_t)v * hp->d_model + i] * w[i] * x[i] * inv;
            worst = fmax(worst, fabs(dot - logits[v]));
        }
        CHECK(worst < 1e-4);
    }

    /* detached: nothing captured any more */
    CHECK(col_session_capture(s, NULL, 0, 0, err, sizeof err) == COL_OK);
    CHECK(col_session_hidden(s, &h) == COL_OK && h.data == NULL);
    col_session_free(s);
    free(buf);
}

static void test_bad_arguments(const col_model *m)
{
    char err[256] = "";
    float one = 0.0f;
    col_hidden_view h;
    CHECK(col_session_capture(NULL, &one, 0, 1, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(col_session_hidden(NULL, &h) == COL_ERR_INVALID_ARG);
    col_session_config c = config(1, 2);
    CHECK(col_session_config_check(m, &c, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(strstr(err, "capture_hidden must be 0 or 1") != NULL);
    c = config(1, 0);
    col_session *s = NULL;
    CHECK(col_session_create(m, &c, &s, err, sizeof err) == COL_OK);
    if (!s) return;
    CHECK(col_session_capture(s, &one, 0, 0, err, sizeof err) == COL_ERR_INVALID_ARG);
    CHECK(strstr(err, "0 rows") != NULL);
    CHECK(col_session_hidden(s, NULL) == COL_ERR_INVALID_ARG);
    col_session_free(s);
}

int main(void)
{
    col_model *m = open_valid();
    if (!m) return TEST_REPORT();
    col_hparams hp;
    CHECK(col_model_hparams(m, &hp) == COL_OK);
    float *own = malloc((uint64_t)N_TOKENS * hp.n_layers * hp.d_model * sizeof(float));
    if (own) {
        test_own_buffer(m, &hp, own);
        test_caller_window(m, &hp, own);
    }
    test_bad_arguments(m);
    free(own);
    col_model_close(m);
    return TEST_REPORT();
}
