/*
 * test_corpus.c - the corrupt-file corpus (tests/corpus/, see tools/make_corpus.py) through the C
 * API: every file listed in manifest.txt gives its expected first finding (status code and
 * absolute byte offset) from col_validate_file, and col_model_open refuses the structurally
 * broken ones with the same code and offset. The Python suite checks the messages as well.
 *
 * The corpus directory is argv[1], else ../tests/corpus (run from engine_c/, as `make test`
 * does), else tests/corpus (run from the repository root, as pytest does).
 */
#include "colibri.h"
#include "harness.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_PROBLEMS 1024

static col_problem problems[MAX_PROBLEMS];

static const char *corpus_dir(int argc, char **argv)
{
    if (argc > 1)
        return argv[1];
    if (access("../tests/corpus/manifest.txt", R_OK) == 0)
        return "../tests/corpus";
    return "tests/corpus";
}

/* The first error-severity finding, else the first finding, else NULL. */
static const col_problem *first_finding(uint32_t n)
{
    if (n > MAX_PROBLEMS)
        n = MAX_PROBLEMS;
    for (uint32_t i = 0; i < n; i++)
        if (problems[i].severity == COL_SEVERITY_ERROR)
            return &problems[i];
    return n ? &problems[0] : NULL;
}

static void check_entry(const char *dir, const char *file, unsigned flags, int code,
                        long long offset)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    uint32_t n = 0;
    int32_t rc = col_validate_file(path, flags, problems, MAX_PROBLEMS, &n);
    const col_problem *got = first_finding(n);
    bool warning = code == COL_ERR_UNKNOWN_TENSOR;
    bool ok;
    if (code == COL_OK)
        ok = rc == COL_OK && n == 0;
    else
        ok = got && got->code == code && (offset < 0 || got->offset == (uint64_t)offset) &&
             rc == (warning ? COL_OK : code);
    if (!ok)
        fprintf(stderr, "%s: rc %d, first %s at 0x%llX (%s); expected %s at 0x%llX\n", file, rc,
                got ? col_status_name(got->code) : "none",
                got ? (unsigned long long)got->offset : 0ull, got ? got->message : "",
                col_status_name(code), (unsigned long long)offset);
    CHECK(ok);

    /* Structural errors stop col_model_open with the same finding; data findings
     * (checksums, NaN) and warnings do not. */
    col_model *model = NULL;
    col_problem p;
    int32_t orc = col_model_open(path, &model, &p);
    if (code != COL_OK && !warning && flags == 0) {
        CHECK(orc == code && model == NULL && (offset < 0 || p.offset == (uint64_t)offset));
    } else {
        CHECK(orc == COL_OK && model != NULL);
    }
    col_model_close(model);
}

int main(int argc, char **argv)
{
    const char *dir = corpus_dir(argc, argv);
    char path[1024];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return TEST_REPORT();
    }
    char line[1024];
    int entries = 0;
    while (fgets(line, sizeof line, f)) {
        char file[512];
        unsigned flags;
        int code;
        long long offset;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (sscanf(line, "%511s %u %d %lld", file, &flags, &code, &offset) != 4) {
            fprintf(stderr, "bad manifest line: %s", line);
            CHECK(0);
            continue;
        }
        check_entry(dir, file, flags, code, offset);
        entries++;
    }
    fclose(f);
    CHECK(entries >= 20);
    return TEST_REPORT();
}
