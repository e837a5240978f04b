/* test_eval.c - the speculator evaluation loop (tools/train/eval.c).
 *
 * Target: the tiny golden model tests/golden/data/tiny-gqa (GGUF F32, vocab
 * 512, dim 64). Drafters: an MLPSpeculator with random weights shaped for
 * it (written at test time; no trained fixture of that shape exists, and
 * losslessness must hold for any weights), and the draft LM drafter on the
 * target's own model file, which proposes exactly the target's greedy
 * continuation. Checks that:
 *   - plain greedy decoding through the loop has tau exactly 1;
 *   - speculative output equals plain greedy token for token, for several
 *     tree shapes (random MLP speculator: nothing accepted; n-gram prompt
 *     lookup: partly accepted paths), with tau >= 1;
 *   - SpecDec++'s adaptive stop (a random acceptance head) reaches the
 *     drafter and keeps the output greedy's;
 *   - with the perfect drafter every drafted token is accepted and every
 *     tree step but the last emits depth + 1 tokens (tau -> 1 + depth);
 *   - the step counts add up (generated = the prefill's token + what each
 *     step emitted, accepted <= drafted);
 *   - decoding several prompts together changes no count;
 *   - a wrong reference is reported as EVAL_MISMATCH. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/model_file.h"
#include "common/model/accept_head.h"
#include "draft-svc/drafter.h"
#include "tests/harness/test_util.h"
#include "tools/train/eval.h"

#define MODEL "tests/golden/data/tiny-gqa/model-f32.gguf"
#define N_PROMPTS 5
#define MAX_NEW 40
#define MAX_TREE 16
#define EOS 2

static specd_model_file *g_model;
static char g_model_path[PATH_MAX];
static char g_spec_dir[64];
static int32_t g_prompt_ids[N_PROMPTS][24];
static eval_prompt g_prompts[N_PROMPTS];

/* A SpecDec++ acceptance head with random weights for that speculator, in
 * dir/accept_head: its p's sit around 1/2, so thresholds cut paths at
 * different depths. It reads draft features, as the shipped head does, so
 * the drafter's per-row probabilities are on the lossless path too. */
#define HEAD_HIDDEN 16
static void write_random_accept_head(const char *dir) {
    specd_accept_head_config c = {.input_dim = TEST_SPEC_INNER, .hidden_dim = HEAD_HIDDEN,
                                  .n_layers = 1, .n_stages = TEST_SPEC_STAGES,
                                  .n_draft_features = SPECD_ACCEPT_HEAD_DRAFT_FEATURES};
    enum { H = HEAD_HIDDEN, D = TEST_SPEC_INNER, F = SPECD_ACCEPT_HEAD_DRAFT_FEATURES };
    static float in_w[H * D], in_b[H], emb[TEST_SPEC_STAGES * H], dw[H * F], w1[H * H], b1[H],
        w2[H * H], b2[H], out_w[H];
    float *all[] = {in_w, in_b, emb, dw, w1, b1, w2, b2, out_w};
    size_t sizes[] = {H * D, H, TEST_SPEC_STAGES * H, H * F, H * H, H, H * H, H, H};
    for (int i = 0; i < 9; i++) test_fill_random(all[i], sizes[i], 77 + (uint64_t)i, 0.2f);
    specd_accept_head_weights w = {.in_w = in_w, .in_b = in_b, .stage_emb = emb, .draft_w = dw,
                                   .fc1_w = {w1}, .fc1_b = {b1}, .fc2_w = {w2}, .fc2_b = {b2},
                                   .out_w = out_w, .out_b = 0.0f};
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/accept_head", dir);
    specd_error err = {{0}};
    if (specd_accept_head_save(path, &c, &w, "F32", NULL, &err)) fail_msg("%s", err.msg);
}

static int group_setup(void **state) {
    (void)state;
    specd_error err = {{0}};
    snprintf(g_model_path, sizeof g_model_path, "%s", test_path(MODEL));
    g_model = specd_model_open(g_model_path, &err);
    if (!g_model) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    snprintf(g_spec_dir, sizeof g_spec_dir, "/tmp/specd_eval_spec_%d", (int)getpid());
    if (mkdir(g_spec_dir, 0700)) return -1;
    assert_int_equal(test_write_random_speculator(g_spec_dir), 0);
    write_random_accept_head(g_spec_dir);
    /* prompts of different lengths, so lanes finish at different rounds */
    for (int p = 0; p < N_PROMPTS; p++) {
        int n = 4 + 4 * p;
        for (int i = 0; i < n; i++)
            g_prompt_ids[p][i] = (int32_t)(3 + (p * 131 + i * 37 + i * i) % 509);
        g_prompts[p] = (eval_prompt){g_prompt_ids[p], n};
    }
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_spec_dir);
    if (system(cmd)) return -1;
    specd_model_close(g_model);
    return 0;
}

static eval_target *open_target(int lanes) {
    eval_target_opts o = {.backend = {.name = "cpu", .n_threads = 1}, .lanes = lanes,
                          .max_new_tokens = MAX_NEW, .max_prompt = 24,
                          .max_tree_tokens = MAX_TREE, .eos_id = EOS};
    specd_error err = {{0}};
    eval_target *t = eval_target_create(g_model, &o, &err);
    if (!t) fail_msg("%s", err.msg);
    return t;
}

static void greedy(eval_target *t, eval_output *out, eval_stats *st) {
    specd_error err = {{0}};
    if (eval_greedy(t, g_prompts, N_PROMPTS, out, st, NULL, &err)) fail_msg("%s", err.msg);
}

static specd_drafter *mlp_drafter_with(const char *accept_head) {
    specd_mlp_drafter_opts o = {.path = g_spec_dir, .n_threads = 1, .accept_head = accept_head};
    specd_error err = {{0}};
    specd_drafter *d = specd_mlp_drafter_create(&o, &err);
    if (!d) fail_msg("%s", err.msg);
    return d;
}

static specd_drafter *mlp_drafter(void) { return mlp_drafter_with(NULL); }

static specd_drafter *self_drafter(void) {
    specd_lm_drafter_opts o = {.path = g_model_path, .n_threads = 1, .max_sessions = 4};
    specd_error err = {{0}};
    specd_drafter *d = specd_lm_drafter_create(&o, &err);
    if (!d) fail_msg("%s", err.msg);
    return d;
}

static void spec(eval_target *t, specd_drafter *d, eval_config c, const eval_output *ref,
                 eval_stats *st) {
    specd_error err = {{0}};
    int rc = eval_spec(t, d, &c, g_prompts, N_PROMPTS, ref, st, NULL, &err);
    if (rc) fail_msg("k=%d depth=%d: rc %d: %s", c.candidates, c.depth, rc, err.msg);
}

/* The invariants every speculative run must satisfy for prompt p. */
static void check_counts(const eval_stats *s, const eval_output *ref, int depth) {
    assert_int_equal(s->generated, ref->n);
    assert_true(s->steps >= 1);
    double tau = (double)s->generated / (double)s->steps;
    assert_true(tau >= 1.0);
    assert_true(s->accepted <= s->drafted);
    /* A tree step emits its accepted tokens and one of its own; only the
     * last step can be cut short (EOS or the token limit), by at most its
     * accepted tokens. */
    long full = 1 + s->accepted + (s->steps - 1);
    assert_true(s->generated <= full);
    assert_true(s->generated >= full - depth);
}

static void test_plain_tau_is_one(void **state) {
    (void)state;
    eval_target *t = open_target(2);
    eval_output out[N_PROMPTS];
    eval_stats st[N_PROMPTS];
    greedy(t, out, st);
    for (int p = 0; p < N_PROMPTS; p++) {
        assert_true(out[p].n >= 1 && out[p].n <= MAX_NEW);
        /* ends at EOS or at the limit, and EOS only at the end */
        for (int i = 0; i + 1 < out[p].n; i++) assert_int_not_equal(out[p].ids[i], EOS);
        if (out[p].n < MAX_NEW) assert_int_equal(out[p].ids[out[p].n - 1], EOS);
        assert_int_equal(st[p].generated, out[p].n);
        assert_int_equal(st[p].steps, out[p].n);
        assert_int_equal(st[p].drafted, 0);
        eval_output_free(&out[p]);
    }
    eval_target_free(t);
}

static void test_mlp_is_lossless(void **state) {
    (void)state;
    eval_target *t = open_target(3);
    specd_drafter *d = mlp_drafter();
    eval_output ref[N_PROMPTS];
    greedy(t, ref, NULL);
    const eval_config cfgs[] = {{1, 1, 0, 0, 0, 0}, {1, 3, 0, 0, 0, 0}, {4, 2, 0, 0, 0, 0},
                                {5, 3, 0, 0, 0, 0}};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        eval_stats st[N_PROMPTS];
        spec(t, d, cfgs[c], ref, st);
        long drafted = 0, accepted = 0, gen = 0, steps = 0;
        for (int p = 0; p < N_PROMPTS; p++) {
            check_counts(&st[p], &ref[p], cfgs[c].depth);
            accepted += st[p].accepted, gen += st[p].generated, steps += st[p].steps;
            /* a tree never holds more than k paths of `depth` nodes */
            assert_true(st[p].drafted <= (long)cfgs[c].candidates * cfgs[c].depth *
                                             (st[p].steps - 1));
            drafted += st[p].drafted;
        }
        assert_true(drafted > 0);
        printf("  k %d depth %d: %ld tokens in %ld steps, %ld of %ld drafted accepted\n",
               cfgs[c].candidates, cfgs[c].depth, gen, steps, accepted, drafted);
    }
    for (int p = 0; p < N_PROMPTS; p++) eval_output_free(&ref[p]);
    specd_drafter_free(d);
    eval_target_free(t);
}

/* SpecDec++ rows: the adaptive stop reaches the drafter (a lower threshold
 * drafts shorter chains than a higher one, and both fewer than the fixed
 * depth), and the output stays greedy's. */
static void test_adaptive_rows(void **state) {
    (void)state;
    char head[PATH_MAX];
    snprintf(head, sizeof head, "%s/accept_head", g_spec_dir);
    eval_target *t = open_target(3);
    specd_drafter *d = mlp_drafter_with(head);
    eval_output ref[N_PROMPTS];
    greedy(t, ref, NULL);
    const eval_config cfgs[] = {{1, 3, 0.0f, 0, 0, 0}, {1, 3, 0.9f, 1, 0, 0}, {1, 3, 0.2f, 1, 0, 0},
                                {3, 3, 0.5f, 2, 0, 0}};
    long drafted[4] = {0};
    for (int c = 0; c < 4; c++) {
        eval_stats st[N_PROMPTS];
        spec(t, d, cfgs[c], ref, st);
        for (int p = 0; p < N_PROMPTS; p++) {
            check_counts(&st[p], &ref[p], 3);
            drafted[c] += st[p].drafted;
        }
        printf("  k %d threshold %.1f: %ld drafted\n", cfgs[c].candidates,
               cfgs[c].stop_threshold, drafted[c]);
    }
    assert_true(drafted[2] < drafted[1] && drafted[1] <= drafted[0]);
    assert_true(drafted[2] > 0);
    for (int p = 0; p < N_PROMPTS; p++) eval_output_free(&ref[p]);
    specd_drafter_free(d);
    eval_target_free(t);
}

/* `specd eval --drafter mlp_ngram`: the lookup's shape reaches the hybrid
 * drafter through eval_config (its nodes join the speculator's in each
 * tree: more drafted than the speculator alone at the same k x depth), and
 * the output stays greedy's. */
static void test_mlp_ngram_rows(void **state) {
    (void)state;
    eval_target *t = open_target(3);
    specd_drafter *mlp = mlp_drafter();
    specd_ngram_drafter_opts no = {.vocab = 512};
    specd_error err = {{0}};
    specd_drafter *ngram = specd_ngram_drafter_create(&no, &err);
    if (!ngram) fail_msg("%s", err.msg);
    specd_hybrid_drafter_opts ho = {.model = mlp, .lookup = ngram};
    specd_drafter *hy = specd_hybrid_drafter_create(&ho, &err);
    if (!hy) fail_msg("%s", err.msg);
    eval_output ref[N_PROMPTS];
    greedy(t, ref, NULL);
    eval_stats alone[N_PROMPTS], both[N_PROMPTS];
    spec(t, mlp, (eval_config){1, 2, 0, 0, 0, 0}, ref, alone);
    spec(t, hy, (eval_config){1, 2, 0, 0, 2, 3}, ref, both);
    long d_alone = 0, d_both = 0, a_both = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        check_counts(&both[p], &ref[p], 3);
        /* k x depth of the speculator's and up to 2 x 3 of the lookup's */
        assert_true(both[p].drafted <= (long)(1 * 2 + 2 * 3) * (both[p].steps - 1));
        d_alone += alone[p].drafted, d_both += both[p].drafted, a_both += both[p].accepted;
    }
    printf("  mlp 1x2: %ld drafted; mlp_ngram 1x2 + lookup 2x3: %ld drafted, %ld accepted\n",
           d_alone, d_both, a_both);
    assert_true(d_both > d_alone);
    for (int p = 0; p < N_PROMPTS; p++) eval_output_free(&ref[p]);
    specd_drafter_free(hy);
    specd_drafter_free(ngram);
    specd_drafter_free(mlp);
    eval_target_free(t);
}

/* Prompt lookup: on a tiny random model's repetitive output it is right
 * part of the time, so steps accept some of a path and reject the rest. */
static void test_ngram_partial_accepts(void **state) {
    (void)state;
    eval_target *t = open_target(3);
    specd_ngram_drafter_opts o = {.vocab = 512};
    specd_error err = {{0}};
    specd_drafter *d = specd_ngram_drafter_create(&o, &err);
    if (!d) fail_msg("%s", err.msg);
    eval_output ref[N_PROMPTS];
    greedy(t, ref, NULL);
    eval_stats st[N_PROMPTS];
    spec(t, d, (eval_config){1, 4, 0, 0, 0, 0}, ref, st);
    long drafted = 0, accepted = 0, gen = 0, steps = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        check_counts(&st[p], &ref[p], 4);
        drafted += st[p].drafted, accepted += st[p].accepted;
        gen += st[p].generated, steps += st[p].steps;
    }
    printf("  ngram depth 4: %ld tokens in %ld steps, %ld of %ld drafted accepted\n", gen, steps,
           accepted, drafted);
    assert_true(accepted > 0 && accepted < drafted);
    for (int p = 0; p < N_PROMPTS; p++) eval_output_free(&ref[p]);
    specd_drafter_free(d);
    eval_target_free(t);
}

static void test_perfect_drafter(void **state) {
    (void)state;
    eval_target *t = open_target(2);
    specd_drafter *d = self_drafter();
    eval_output ref[N_PROMPTS];
    greedy(t, ref, NULL);
    for (int depth = 1; depth <= 4; depth++) {
        eval_stats st[N_PROMPTS];
        spec(t, d, (eval_config){1, depth, 0, 0, 0, 0}, ref, st);
        long gen = 0, steps = 0;
        for (int p = 0; p < N_PROMPTS; p++) gen += st[p].generated, steps += st[p].steps;
        printf("  depth %d: %ld tokens in %ld steps, tau %.2f\n", depth, gen, steps,
               (double)gen / (double)steps);
        for (int p = 0; p < N_PROMPTS; p++) {
            check_counts(&st[p], &ref[p], depth);
            /* every drafted token is the target's own choice */
            assert_int_equal(st[p].accepted, st[p].drafted);
            /* after the prefill, each step emits depth + 1 tokens but the last */
            long after = ref[p].n - 1;
            assert_int_equal(st[p].steps - 1, (after + depth) / (depth + 1));
            if (after > 0 && after % (depth + 1) == 0) {
                double tau_steps = (double)after / (double)(st[p].steps - 1);
                assert_true(tau_steps == 1.0 + depth);
            }
        }
    }
    for (int p = 0; p < N_PROMPTS; p++) eval_output_free(&ref[p]);
    specd_drafter_free(d);
    eval_target_free(t);
}

static void test_lanes_change_nothing(void **state) {
    (void)state;
    specd_drafter *d = mlp_drafter();
    eval_stats st[2][N_PROMPTS];
    const int lanes[2] = {1, 4};
    for (int i = 0; i < 2; i++) {
        eval_target *t = open_target(lanes[i]);
        eval_output ref[N_PROMPTS];
        greedy(t, ref, NULL);
        spec(t, d, (eval_config){3, 3, 0, 0, 0, 0}, ref, st[i]);
        for (int p = 0; p < N_PROMPTS; p++) eval_output_free(&ref[p]);
        eval_target_free(t);
    }
    assert_memory_equal(st[0], st[1], sizeof st[0]);
    specd_drafter_free(d);
}

static void test_mismatch_is_caught(void **state) {
    (void)state;
    eval_target *t = open_target(2);
    specd_drafter *d = mlp_drafter();
    eval_output ref[N_PROMPTS];
    greedy(t, ref, NULL);
    int p = 2, pos = ref[p].n / 2;
    ref[p].ids[pos] = (ref[p].ids[pos] + 1) % 512;
    eval_stats st[N_PROMPTS];
    specd_error err = {{0}};
    eval_config c = {2, 2, 0, 0, 0, 0};
    assert_int_equal(eval_spec(t, d, &c, g_prompts, N_PROMPTS, ref, st, NULL, &err),
                     EVAL_MISMATCH);
    printf("  %s\n", err.msg);
    char want[64];
    snprintf(want, sizeof want, "prompt %d: output position %d ", p, pos);
    assert_non_null(strstr(err.msg, want));
    /* and a reference that stops early */
    ref[p].ids[pos] = (ref[p].ids[pos] + 511) % 512;
    ref[p].n = pos;
    assert_int_equal(eval_spec(t, d, &c, g_prompts, N_PROMPTS, ref, st, NULL, &err),
                     EVAL_MISMATCH);
    printf("  %s\n", err.msg);
    assert_non_null(strstr(err.msg, "stopped after"));
    for (int i = 0; i < N_PROMPTS; i++) eval_output_free(&ref[i]);
    specd_drafter_free(d);
    eval_target_free(t);
}

static void test_bad_setup(void **state) {
    (void)state;
    specd_error err = {{0}};
    eval_target_opts o = {.backend = {.name = "cpu", .n_threads = 1}, .lanes = 1,
                          .max_new_tokens = 200, .max_prompt = 100, .max_tree_tokens = 8,
                          .eos_id = EOS};
    assert_null(eval_target_create(g_model, &o, &err)); /* 308 rows > context 256 */
    assert_non_null(strstr(err.msg, "exceed the model context"));
    eval_target *t = open_target(1);
    specd_drafter *d = mlp_drafter();
    eval_stats st[N_PROMPTS];
    eval_config bad = {0, 2, 0, 0, 0, 0};
    assert_int_equal(eval_spec(t, d, &bad, g_prompts, N_PROMPTS, NULL, st, NULL, &err), -1);
    specd_drafter_free(d);
    eval_target_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_tau_is_one),
        cmocka_unit_test(test_mlp_is_lossless),
        cmocka_unit_test(test_adaptive_rows),
        cmocka_unit_test(test_ngram_partial_accepts),
        cmocka_unit_test(test_mlp_ngram_rows),
        cmocka_unit_test(test_perfect_drafter),
        cmocka_unit_test(test_lanes_change_nothing),
        cmocka_unit_test(test_mismatch_is_caught),
        cmocka_unit_test(test_bad_setup),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
