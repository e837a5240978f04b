/* test_chat.c - ChatML rendering against Jinja.
 *
 * tests/golden/tokenizer/chat_fixtures.json holds conversations rendered by
 * jinja2 (as transformers' apply_chat_template does) with SmolLM2's template
 * from the GGUF and with a plain ChatML template; specd_chat_render must
 * reproduce them byte for byte. Also: the default system prompt is read from
 * the template (not hard-coded), other quoting styles, and clear errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/text/chat.h"
#include "common/model/gguf.h"
#include "tests/harness/test_util.h"

#define FIXTURES "tests/golden/tokenizer/chat_fixtures.json"
#define GGUF_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define SMOLLM2_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

static cJSON *load_fixtures(void) {
    char *text = test_read_file(test_path(FIXTURES), NULL);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    return root;
}

/* Renders one fixture; tmpl overrides the fixture's template when given. */
static char *render_fixture(const cJSON *f, const char *tmpl, specd_error *err) {
    const cJSON *msgs = cJSON_GetObjectItem(f, "messages");
    size_t n = (size_t)cJSON_GetArraySize(msgs), i = 0;
    specd_chat_msg *m = calloc(n ? n : 1, sizeof *m);
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs) {
        m[i].role = cJSON_GetObjectItem(msg, "role")->valuestring;
        m[i].content = cJSON_GetObjectItem(msg, "content")->valuestring;
        i++;
    }
    int gen = cJSON_IsTrue(cJSON_GetObjectItem(f, "add_generation_prompt"));
    char *out = specd_chat_render(tmpl, m, n, gen, err);
    free(m);
    return out;
}

static void test_matches_jinja(void **state) {
    (void)state;
    cJSON *fixtures = load_fixtures();
    int total = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, fixtures) {
        specd_error err = {{0}};
        const char *tmpl = cJSON_GetObjectItem(f, "template")->valuestring;
        const char *want = cJSON_GetObjectItem(f, "expected")->valuestring;
        char *got = render_fixture(f, tmpl, &err);
        if (!got || strcmp(got, want) != 0)
            fprintf(stderr, "fixture %d (%s): got [%s] want [%s] %s\n", total,
                    cJSON_GetObjectItem(f, "template_name")->valuestring, got ? got : "NULL",
                    want, err.msg);
        assert_non_null(got);
        assert_string_equal(got, want);
        free(got);
        total++;
    }
    printf("  %d chat fixtures match jinja2\n", total);
    assert_true(total >= 32);
    cJSON_Delete(fixtures);
}

/* No template means plain ChatML: the same output as the "chatml" fixtures. */
static void test_null_template_is_plain_chatml(void **state) {
    (void)state;
    cJSON *fixtures = load_fixtures();
    const cJSON *f;
    cJSON_ArrayForEach(f, fixtures) {
        if (strcmp(cJSON_GetObjectItem(f, "template_name")->valuestring, "chatml") != 0) continue;
        specd_error err = {{0}};
        char *got = render_fixture(f, NULL, &err);
        assert_non_null(got);
        assert_string_equal(got, cJSON_GetObjectItem(f, "expected")->valuestring);
        free(got);
    }
    cJSON_Delete(fixtures);
}

static void test_default_system_prompt_from_template(void **state) {
    (void)state;
    cJSON *fixtures = load_fixtures();
    const char *smollm = NULL;
    const cJSON *f;
    cJSON_ArrayForEach(f, fixtures)
        if (!strcmp(cJSON_GetObjectItem(f, "template_name")->valuestring, "smollm2"))
            smollm = cJSON_GetObjectItem(f, "template")->valuestring;
    assert_non_null(smollm);
    char *sys = specd_chat_default_system(smollm);
    assert_non_null(sys);
    assert_string_equal(sys, SMOLLM2_SYSTEM);
    free(sys);
    /* The prompt really comes from the template: change it, output follows. */
    const char *custom =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ \"<|im_start|>system\\nYou\\'re \\\"Bob\\\".<|im_end|>\\n\" }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
        "'\\n'}}{% endfor %}";
    sys = specd_chat_default_system(custom);
    assert_non_null(sys);
    assert_string_equal(sys, "You're \"Bob\".");
    free(sys);
    specd_chat_msg m = {"user", "hi"};
    specd_error err = {{0}};
    char *out = specd_chat_render(custom, &m, 1, 0, &err);
    assert_string_equal(out, "<|im_start|>system\nYou're \"Bob\".<|im_end|>\n"
                             "<|im_start|>user\nhi<|im_end|>\n");
    free(out);
    /* A template that only concatenates the system message has no default. */
    assert_null(specd_chat_default_system(
        "{{'<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n'}}"));
    cJSON_Delete(fixtures);
}

/* The GGUF's own template is the one the fixtures were rendered with. */
static void test_gguf_template_is_the_fixture_template(void **state) {
    (void)state;
    if (!test_file_exists(test_path(GGUF_PATH))) {
        printf("  skipped: %s not present\n", GGUF_PATH);
        skip();
    }
    specd_error err = {{0}};
    gguf_file *g = gguf_open(test_path(GGUF_PATH), &err);
    assert_non_null(g);
    char *tmpl = gguf_get_str(g, "tokenizer.chat_template", &err);
    assert_non_null(tmpl);
    cJSON *fixtures = load_fixtures();
    assert_string_equal(tmpl, cJSON_GetObjectItem(fixtures->child, "template")->valuestring);
    char *sys = specd_chat_default_system(tmpl);
    assert_string_equal(sys, SMOLLM2_SYSTEM);
    free(sys);
    cJSON_Delete(fixtures);
    free(tmpl);
    gguf_close(g);
}

static void test_errors(void **state) {
    (void)state;
    specd_chat_msg m = {"user", "hi"};
    specd_error err = {{0}};
    const char *llama3 = "{% for message in messages %}{{ '<|start_header_id|>' + message['role']"
                         " + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
                         "{% endfor %}";
    assert_null(specd_chat_render(llama3, &m, 1, 1, &err));
    assert_non_null(strstr(err.msg, "unsupported chat template"));
    assert_null(specd_chat_render("", &m, 1, 1, &err));
    assert_non_null(strstr(err.msg, "unsupported chat template"));
    specd_chat_msg bad[2] = {{"user", "hi"}, {"assistant", NULL}};
    assert_null(specd_chat_render(NULL, bad, 2, 0, &err));
    assert_non_null(strstr(err.msg, "message 1 has no content"));
    bad[1] = (specd_chat_msg){NULL, "x"};
    assert_null(specd_chat_render(NULL, bad, 2, 0, &err));
    assert_non_null(strstr(err.msg, "no role"));
    char *empty = specd_chat_render(NULL, NULL, 0, 0, &err);
    assert_non_null(empty);
    assert_string_equal(empty, "");
    free(empty);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_jinja),
        cmocka_unit_test(test_null_template_is_plain_chatml),
        cmocka_unit_test(test_default_system_prompt_from_template),
        cmocka_unit_test(test_gguf_template_is_the_fixture_template),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
