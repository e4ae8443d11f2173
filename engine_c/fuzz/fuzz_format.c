/*
 * fuzz_format.c - libFuzzer entry point for the .colibri reader (`make fuzz`, then
 * tools/run_fuzz.sh; seeds: tests/corpus/).
 *
 * Every input goes through the whole read path a hostile file can reach:
 *   1. col_validate_buffer with no data checks and with CRC + NaN scans (allocation-free, must
 *      never read outside [data, data+size) - ASan checks that, since libFuzzer hands us an
 *      exactly sized heap copy);
 *   2. col_header_field for every field (the Inspector's header view on any bytes);
 *   3. when the structure is valid: col_model_open on a private copy of the bytes on disk, the
 *      per-tensor data checks, and a one-token session with a 4-position context, so the decoded
 *      tables and the forward pass are exercised on every file the validator lets through.
 * Invariants asserted (abort = finding): validate's status equals the first error it lists;
 * col_model_open accepts exactly the inputs col_validate_buffer accepts, with the same first
 * error otherwise.
 */
#include "colibri.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PROBLEMS 64

static char model_path[64];

static void write_file(const uint8_t *data, size_t size)
{
    if (!model_path[0])
        snprintf(model_path, sizeof model_path, "/tmp/colibri-fuzz-%ld.colibri", (long)getpid());
    int fd = open(model_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        abort();
    size_t done = 0;
    while (done < size) {
        ssize_t n = write(fd, data + done, size - done);
        if (n <= 0)
            abort();
        done += (size_t)n;
    }
    close(fd);
}

static void run_model(const uint8_t *data, size_t size, int32_t validated, const col_problem *first)
{
    write_file(data, size);
    col_model *model = NULL;
    col_problem p;
    int32_t rc = col_model_open(model_path, &model, &p);
    if (size > 0 && rc != validated)
        abort(); /* the validator and the loader disagree */
    if (rc != COL_OK) {
        if (size > 0 && (p.code != first->code || p.offset != first->offset))
            abort();
        return;
    }
    col_problem problems[4];
    uint32_t n;
    for (uint32_t i = 0; i < col_model_tensor_count(model); i++)
        col_model_check_tensor(model, i, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, problems, 4, &n);
    col_hparams hp;
    col_model_hparams(model, &hp);
    col_session_config cfg = {0};
    cfg.n_threads = 1;
    cfg.max_context = hp.max_context < 4 ? hp.max_context : 4;
    cfg.trace = 1;
    cfg.routing = (uint32_t)(data[size - 1] % 4);
    col_session *s = NULL;
    char err[256];
    if (col_session_create(model, &cfg, &s, err, sizeof err) == COL_OK) {
        float *logits = malloc((size_t)hp.vocab_size * sizeof *logits);
        int32_t tokens[2] = {0, (int32_t)(hp.vocab_size - 1)};
        if (logits) {
            col_session_prefill(s, tokens, 2, NULL, err, sizeof err);
            col_session_step(s, 0, logits, err, sizeof err);
        }
        free(logits);
        col_session_free(s);
    }
    col_model_close(model);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    col_problem problems[MAX_PROBLEMS];
    uint32_t n = 0;
    int32_t rc = col_validate_buffer(data, size, 0, problems, MAX_PROBLEMS, &n);
    col_problem first;
    memset(&first, 0, sizeof first);
    for (uint32_t i = 0; i < n && i < MAX_PROBLEMS; i++)
        if (problems[i].severity == COL_SEVERITY_ERROR) {
            first = problems[i];
            break;
        }
    if (n <= MAX_PROBLEMS && rc != first.code)
        abort(); /* the status must be the first listed error */
    uint32_t n2;
    col_validate_buffer(data, size, COL_CHECK_CHECKSUMS | COL_CHECK_NONFINITE, problems,
                        MAX_PROBLEMS, &n2);
    col_validate_buffer(data, size, COL_CHECK_CHECKSUMS, NULL, 0, &n2);

    col_field f;
    for (uint32_t i = 0; i < col_header_field_count(); i++)
        if (col_header_field(data, size, i, &f) != COL_OK)
            abort();
    if (n <= MAX_PROBLEMS || rc == COL_OK)
        run_model(data, size, rc, &first);
    return 0;
}
