/* test_cli_client.c - `specd generate --server` end to end.
 *
 * target-svc and draft-svc run in this process on loopback (tools/inproc.h,
 * the harness `specd bench --e2e` uses) with the tiny golden model, which
 * has no tokenizer, so prompts go in as token ids (--prompt-ids). The built
 * `specd` executable (SPECD_CLI_PATH, set by CMake for this test only) is
 * run as a user would run it, and its stdout, stderr and exit status are
 * checked:
 *   1. text mode: --ids prints exactly the plain greedy tokens (computed on
 *      a separate transformer, no service involved), with the ngram drafter,
 *      with none, and through target-svc's own Generate; the stats line is
 *      on stderr;
 *   2. --json: one parseable object per response message whose token_ids
 *      concatenate to the same tokens, with logprobs (the greedy token is
 *      the top alternative), then a final object with the finish reason and
 *      stats;
 *   3. errors: an unknown drafter exits 1 with the server's code and a
 *      message naming the field (and a JSON error object with --json); an
 *      unreachable server is UNAVAILABLE; a server flag without --server is
 *      a usage error (exit 2).
 * Every CLI run has --timeout, so a broken server cannot hang the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/model/model_file.h"
#include "common/spec/sampling.h"
#include "common/util/version.h"
#include "specd.pb-c.h"
#include "common/model/transformer.h"
#include "tests/harness/svc.h"
#include "tests/harness/golden.h"
#include "tests/harness/test_util.h"
#include "tools/inproc.h"

#ifndef SPECD_CLI_PATH
#error "SPECD_CLI_PATH (the built specd executable) must be defined by the build"
#endif

#define MODEL "tests/golden/data/tiny-gqa/hf"
#define CTX 128
#define N_GEN 16
/* A prompt that repeats itself, so the ngram drafter has something to find. */
#define PROMPT_IDS "5,17,42,99,5,17,42,99,5,17"
static const int32_t prompt_ids[] = {5, 17, 42, 99, 5, 17, 42, 99, 5, 17};
#define N_PROMPT ((int)(sizeof prompt_ids / sizeof prompt_ids[0]))

static cli_inproc *svc;
static char draft_addr[64], target_addr[64];
static int32_t expect[N_GEN];

static int setup(void **state) {
    (void)state;
    char model[4096];
    snprintf(model, sizeof model, "%s", test_path(MODEL));
    /* plain greedy on its own transformer: what every run must print */
    golden_plain_greedy(model, CTX, prompt_ids, N_PROMPT, N_GEN, expect);
    specd_error err = {{0}};
    cli_inproc_opts o = {.model = model, .threads = 1, .max_sessions = 4, .ctx = CTX, .ngram = 1};
    if (!(svc = cli_inproc_start(&o, &err))) {
        fprintf(stderr, "in-process services: %s\n", err.msg);
        return -1;
    }
    snprintf(draft_addr, sizeof draft_addr, "%s", cli_inproc_draft_addr(svc));
    snprintf(target_addr, sizeof target_addr, "%s", cli_inproc_target_addr(svc));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cli_inproc_stop(svc);
    return 0;
}

/* ---- running the CLI ------------------------------------------------------------- */

typedef struct run_out {
    int status; /* exit code, or -1 if it did not exit normally */
    char *out, *err;
} run_out;

static void run_free(run_out *r) {
    free(r->out);
    free(r->err);
}

/* Runs `specd ARGS` (a shell fragment) and captures stdout and stderr. */
static run_out run_cli(const char *fmt, ...) {
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    char err_path[] = "/tmp/specd-cli-test-XXXXXX";
    int fd = mkstemp(err_path);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s %s 2>%s </dev/null", SPECD_CLI_PATH, args, err_path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    for (size_t got; (got = fread(out + n, 1, cap - n - 1, p)) > 0;) {
        n += got;
        if (n + 1 == cap) out = realloc(out, cap *= 2);
    }
    out[n] = 0;
    int ws = pclose(p);
    run_out r = {.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, .out = out};
    r.err = test_read_file(err_path, NULL);
    unlink(err_path);
    if (!r.err) r.err = strdup("");
    return r;
}

/* The "ids: ..." line of text mode, parsed. Returns the count. */
static int parse_ids_line(const char *out, int32_t *ids, int cap) {
    const char *line = strstr(out, "ids:");
    if (!line) return -1;
    int n = 0;
    char *end;
    for (const char *s = line + 4; n < cap; s = end) {
        long v = strtol(s, &end, 10);
        if (end == s) break;
        ids[n++] = (int32_t)v;
    }
    return n;
}

static void check_text_run(const char *extra) {
    run_out r = run_cli("generate --server %s --insecure --timeout 60 --prompt-ids " PROMPT_IDS
                        " --max-new-tokens %d --ignore-eos --ids %s",
                        draft_addr, N_GEN, extra);
    if (r.status != 0) fail_msg("exit %d, stderr: %s", r.status, r.err);
    int32_t got[N_GEN + 8];
    int n = parse_ids_line(r.out, got, N_GEN + 8);
    assert_int_equal(n, N_GEN);
    assert_memory_equal(got, expect, sizeof expect);
    /* the stats go to stderr, not into the generated output */
    assert_non_null(strstr(r.err, "16 tokens (length)"));
    assert_non_null(strstr(r.err, "tau"));
    assert_non_null(strstr(r.err, "TTFT"));
    assert_null(strstr(r.out, "TTFT"));
    run_free(&r);
}

static void test_text_ngram(void **state) {
    (void)state;
    check_text_run("--drafter ngram");
}

static void test_text_plain(void **state) {
    (void)state;
    check_text_run("--drafter none");
    check_text_run("--no-spec");
}

static void test_text_fixed_tree(void **state) {
    (void)state;
    check_text_run("--drafter ngram --candidates 2 --depth 3");
}

static void test_target_service(void **state) {
    (void)state;
    run_out r = run_cli("generate --server %s --service target --insecure --timeout 60 "
                        "--prompt-ids " PROMPT_IDS " --max-new-tokens %d --ignore-eos --ids",
                        target_addr, N_GEN);
    if (r.status != 0) fail_msg("exit %d, stderr: %s", r.status, r.err);
    int32_t got[N_GEN + 8];
    assert_int_equal(parse_ids_line(r.out, got, N_GEN + 8), N_GEN);
    assert_memory_equal(got, expect, sizeof expect);
    run_free(&r);
}

static void test_json(void **state) {
    (void)state;
    run_out r = run_cli("generate --server %s --insecure --timeout 60 --prompt-ids " PROMPT_IDS
                        " --max-new-tokens %d --ignore-eos --drafter ngram --json "
                        "--top-logprobs 2",
                        draft_addr, N_GEN);
    if (r.status != 0) fail_msg("exit %d, stderr: %s", r.status, r.err);
    int32_t got[N_GEN + 8];
    int n = 0, n_lines = 0, saw_final = 0;
    char *save = NULL;
    for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        n_lines++;
        cJSON *j = cJSON_Parse(line);
        if (!j) fail_msg("line %d is not JSON: %s", n_lines, line);
        assert_false(saw_final); /* the summary comes last */
        const cJSON *fin = cJSON_GetObjectItemCaseSensitive(j, "finish_reason");
        if (fin) {
            saw_final = 1;
            assert_string_equal(fin->valuestring, "length");
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "stats");
            assert_non_null(st);
            assert_int_equal(cJSON_GetObjectItemCaseSensitive(st, "generated_tokens")->valueint,
                             N_GEN);
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(st, "drafter")->valuestring,
                                "ngram");
            int steps = cJSON_GetObjectItemCaseSensitive(st, "target_steps")->valueint;
            assert_true(steps >= 1 && steps <= N_GEN);
            int trips = cJSON_GetObjectItemCaseSensitive(st, "round_trips")->valueint;
            assert_true(trips >= 1 && trips <= steps);
            assert_true(cJSON_GetObjectItemCaseSensitive(st, "mean_accepted_length")->valuedouble >=
                        1.0);
            assert_true(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(st, "acceptance_by_position")));
            const cJSON *cl = cJSON_GetObjectItemCaseSensitive(j, "client");
            assert_int_equal(cJSON_GetObjectItemCaseSensitive(cl, "tokens")->valueint, N_GEN);
        } else {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "token_ids");
            const cJSON *lps = cJSON_GetObjectItemCaseSensitive(j, "logprobs");
            assert_true(cJSON_IsString(text));
            assert_true(cJSON_IsArray(ids) && cJSON_IsArray(lps));
            assert_int_equal(cJSON_GetArraySize(lps), cJSON_GetArraySize(ids));
            int k = 0;
            const cJSON *id;
            cJSON_ArrayForEach(id, ids) {
                assert_true(n < N_GEN + 8);
                got[n++] = (int32_t)id->valueint;
                const cJSON *lp = cJSON_GetArrayItem(lps, k++);
                const cJSON *top = cJSON_GetObjectItemCaseSensitive(lp, "top");
                assert_int_equal(cJSON_GetArraySize(top), 2);
                /* greedy: the emitted token is the most likely one */
                const cJSON *best = cJSON_GetArrayItem(top, 0);
                assert_int_equal(cJSON_GetObjectItemCaseSensitive(lp, "token_id")->valueint,
                                 id->valueint);
                assert_int_equal(cJSON_GetObjectItemCaseSensitive(best, "token_id")->valueint,
                                 id->valueint);
                assert_true(cJSON_GetObjectItemCaseSensitive(lp, "logprob")->valuedouble <= 0);
            }
        }
        cJSON_Delete(j);
    }
    assert_true(saw_final);
    assert_true(n_lines >= 2);
    assert_int_equal(n, N_GEN);
    assert_memory_equal(got, expect, sizeof expect);
    run_free(&r);
}

static void test_unknown_drafter(void **state) {
    (void)state;
    run_out r = run_cli("generate --server %s --insecure --timeout 60 --prompt-ids " PROMPT_IDS
                        " --max-new-tokens 4 --drafter bogus",
                        draft_addr);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "INVALID_ARGUMENT"));
    assert_non_null(strstr(r.err, "request.drafter"));
    assert_non_null(strstr(r.err, "bogus"));
    assert_string_equal(r.out, "");
    run_free(&r);

    /* the same error as JSON on stdout, for scripts */
    r = run_cli("generate --server %s --insecure --timeout 60 --prompt-ids " PROMPT_IDS
                " --max-new-tokens 4 --drafter bogus --json",
                draft_addr);
    assert_int_equal(r.status, 1);
    cJSON *j = cJSON_Parse(r.out);
    assert_non_null(j);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring,
                        "INVALID_ARGUMENT");
    assert_non_null(strstr(cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring,
                           "request.drafter"));
    cJSON_Delete(j);
    run_free(&r);
}

static void test_other_errors(void **state) {
    (void)state;
    /* text input, but the model has no tokenizer: the server says so */
    run_out r = run_cli("generate --server %s --insecure --timeout 60 'hello there' "
                        "--max-new-tokens 4",
                        draft_addr);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "FAILED_PRECONDITION"));
    run_free(&r);
    /* nobody listens on port 1 */
    r = run_cli("generate --server 127.0.0.1:1 --insecure --timeout 20 --prompt-ids 1,2 "
                "--max-new-tokens 4");
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "UNAVAILABLE"));
    run_free(&r);
    /* a server flag in local mode is refused, not ignored */
    r = run_cli("generate --drafter ngram -p hi");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--drafter needs --server"));
    run_free(&r);
    /* a bad flag value never reaches the server */
    r = run_cli("generate --server %s --insecure --logit-bias 12 --prompt-ids 1", draft_addr);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--logit-bias"));
    run_free(&r);
    /* specd eval's drafter flags, refused before anything loads */
    r = run_cli("eval --drafter lookup");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--drafter: expected mlp or mlp_ngram"));
    run_free(&r);
    const char *bad_shapes[] = {"4y6", "0x6", "4x65", "4x6x", ""};
    for (size_t i = 0; i < sizeof bad_shapes / sizeof bad_shapes[0]; i++) {
        r = run_cli("eval --drafter mlp_ngram --lookup-shape '%s'", bad_shapes[i]);
        assert_int_equal(r.status, 2);
        assert_non_null(strstr(r.err, "--lookup-shape = '"));
        run_free(&r);
    }
}

/* One version everywhere: `specd --version` prints CMake's project version,
 * which both services report in GetInfo. */
static void test_version(void **state) {
    (void)state;
    run_out r = run_cli("--version");
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, "specd " SPECD_VERSION "\n");
    run_free(&r);
    specd_rpc_channel *ch = svc_channel_to(draft_addr);
    specd_rpc_channel *tch = svc_channel_to(target_addr);
    const char *methods[] = {"/specd.v1.Draft/GetInfo", "/specd.v1.Target/GetInfo"};
    specd_rpc_channel *chans[] = {ch, tch};
    for (int i = 0; i < 2; i++) {
        Specd__V1__InfoRequest q = SPECD__V1__INFO_REQUEST__INIT;
        Specd__V1__Info *info = NULL;
        specd_error err = {{0}};
        assert_int_equal(specd_rpc_unary(chans[i], methods[i], &q.base, &specd__v1__info__descriptor,
                                         (ProtobufCMessage **)&info, 10000, &err),
                         GRPC_STATUS_OK);
        assert_string_equal(info->version, SPECD_VERSION);
        protobuf_c_message_free_unpacked(&info->base, NULL);
    }
    specd_rpc_channel_free(ch);
    specd_rpc_channel_free(tch);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_ngram),     cmocka_unit_test(test_text_plain),
        cmocka_unit_test(test_text_fixed_tree), cmocka_unit_test(test_target_service),
        cmocka_unit_test(test_json),           cmocka_unit_test(test_unknown_drafter),
        cmocka_unit_test(test_other_errors),     cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
