/*
 * bench_session.c - time a prefill and the decode after it on a model file, through the public
 * API only, so that one source builds against any revision's libcolibri.a.
 *
 *   bench_session FILE [--prompt P] [--decode N] [--threads T] [--repeats R]
 *                 [--kernels best|portable|avx2|avx512f|avx512|amx] [--numerics default|dot-bf16|kv-f16|dot-bf16+kv-f16]
 *
 * Each repeat resets the session, prefills P tokens (the last position's logits only, as
 * `colibri bench` does) and steps N tokens more; a prefill and a few steps before the repeats page
 * the weights in. The tokens are fixed ((i * 7919) mod vocab), so two builds run the same work.
 * Prints one JSON line: the seconds of every repeat's prefill and of its N steps, and the kernel
 * path that ran. tools/bench_builds.py runs two builds of it in turns and prints the ratios.
 */
#include "colibri.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_common.h"

static int parse_kernels(const char *s, uint32_t *kernels)
{
    static const char *names[] = {"best", "portable", "avx2", "avx512f", "avx512", "amx"}; /* col_kernels order */
    for (uint32_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(s, names[i]) == 0) {
            *kernels = i;
            return 1;
        }
    return 0;
}

static int usage(void)
{
    fputs("usage: bench_session FILE [--prompt P] [--decode N] [--threads T] [--repeats R]\n"
          "                     [--kernels best|portable|avx2|avx512f|avx512|amx] [--numerics default|dot-bf16|kv-f16|dot-bf16+kv-f16]\n",
          stderr);
    return 2;
}

static void print_seconds(const char *key, const double *s, unsigned long n)
{
    printf("\"%s\": [", key);
    for (unsigned long i = 0; i < n; i++) printf("%s%.9f", i ? ", " : "", s[i]);
    printf("]");
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage();
    unsigned long prompt = 128, decode = 32, threads = 1, repeats = 5;
    uint32_t kernels = COL_KERNELS_BEST, reduction = 0, kv_f16 = 0;
    for (int i = 2; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (strcmp(argv[i], "--prompt") == 0) prompt = strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--decode") == 0) decode = strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--threads") == 0) threads = strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--repeats") == 0) repeats = strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--kernels") == 0) {
            if (!parse_kernels(v, &kernels)) return usage();
        } else if (strcmp(argv[i], "--numerics") == 0) {
            /* 4: COL_REDUCTION_BF16_DOT, spelled as its value so this builds against libraries
             * older than ABI 11, which refuse it when the session is made */
            if (strcmp(v, "dot-bf16") == 0 || strcmp(v, "dot-bf16+kv-f16") == 0) reduction = 4;
            if (strcmp(v, "kv-f16") == 0 || strcmp(v, "dot-bf16+kv-f16") == 0) kv_f16 = 1;
            if (!reduction && !kv_f16 && strcmp(v, "default") != 0) return usage();
        } else
            return usage();
    }
    if (prompt < 1 || prompt > (1u << 20) || decode > (1u << 20) || threads < 1 || threads > 256 || repeats < 1 ||
        repeats > 1000)
        return usage();

    col_model *model = NULL;
    col_problem problem;
    if (col_model_open(argv[1], &model, &problem) != COL_OK) {
        fprintf(stderr, "bench_session: %s: %s\n", argv[1], problem.message);
        return 1;
    }
    col_hparams hp;
    col_model_hparams(model, &hp);
    col_session_config config;
    memset(&config, 0, sizeof config);
    config.n_threads = (uint32_t)threads;
    config.max_context = (uint32_t)(prompt + decode + 1);
    config.kernels = kernels;
    config.reduction = reduction;
#if COL_ABI_VERSION >= 17 /* the KV cache in halves */
    config.kv_precision = kv_f16;
#else
    if (kv_f16) {
        fputs("bench_session: this library has no KV cache in halves (ABI < 17)\n", stderr);
        return 2;
    }
#endif
    col_session *session = NULL;
    char err[256] = "";
    int32_t *tokens = malloc(prompt * sizeof *tokens);
    double *prefill_s = malloc(repeats * sizeof *prefill_s), *decode_s = malloc(repeats * sizeof *decode_s);
    int rc = 1;
    if (!tokens || !prefill_s || !decode_s) {
        fputs("bench_session: out of memory\n", stderr);
        goto done;
    }
    if (col_session_create(model, &config, &session, err, sizeof err) != COL_OK) {
        fprintf(stderr, "bench_session: %s\n", err);
        goto done;
    }
    for (unsigned long i = 0; i < prompt; i++) tokens[i] = (int32_t)(i * 7919u % hp.vocab_size);
    /* warm: page the weights in and let the workers settle */
    if (col_session_prefill(session, tokens, (uint32_t)prompt, NULL, err, sizeof err) != COL_OK) goto failed;
    for (unsigned long i = 0; i < 4 && prompt + i < config.max_context; i++)
        if (col_session_step(session, tokens[i % prompt], NULL, err, sizeof err) != COL_OK) goto failed;
    for (unsigned long r = 0; r < repeats; r++) {
        if (col_session_reset(session) != COL_OK) { /* reset takes no message buffer */
            snprintf(err, sizeof err, "col_session_reset failed");
            goto failed;
        }
        double t0 = now_s();
        if (col_session_prefill(session, tokens, (uint32_t)prompt, NULL, err, sizeof err) != COL_OK) goto failed;
        double t1 = now_s();
        for (unsigned long i = 0; i < decode; i++)
            if (col_session_step(session, tokens[i % prompt], NULL, err, sizeof err) != COL_OK) goto failed;
        prefill_s[r] = t1 - t0;
        decode_s[r] = now_s() - t1;
    }
    printf("{\"kernels\": \"%s\", \"threads\": %lu, \"prompt\": %lu, \"decode\": %lu, ", col_session_kernels(session),
           threads, prompt, decode);
    print_seconds("prefill_seconds", prefill_s, repeats);
    printf(", ");
    print_seconds("decode_seconds", decode_s, repeats);
    printf("}\n");
    rc = 0;
    goto done;
failed:
    fprintf(stderr, "bench_session: %s\n", err);
done:
    col_session_free(session);
    col_model_close(model);
    free(tokens), free(prefill_s), free(decode_s);
    return rc;
}
