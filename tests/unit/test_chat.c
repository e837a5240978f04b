/* test_chat.c - chat templates rendered natively against Jinja.
 *
 * tests/golden/tokenizer/chat_fixtures.json holds conversations rendered by
 * jinja2 (as transformers' apply_chat_template does) with SmolLM2's template
 * from the GGUF and with a plain ChatML template; llama3_chat_fixtures.json
 * the same with Meta's Llama 3.0-3.3 templates (make_llama3_chat_fixtures.py,
 * from llama.cpp's source tree), and templates that reuse Llama 3's tokens
 * for another format. specd_chat_render must reproduce every rendering byte
 * for byte and refuse the look-alikes. Also: the default system prompt is
 * read from the template (not hard-coded), other quoting styles, the date
 * Llama 3.2 prints, BOS written once, and clear errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/text/chat.h"
#include "common/model/gguf.h"
#include "tests/harness/test_util.h"

#define FIXTURES "tests/golden/tokenizer/chat_fixtures.json"
#define LLAMA3_FIXTURES "tests/golden/tokenizer/llama3_chat_fixtures.json"
#define TINY_LLAMA3_TOKENIZER "tests/golden/tokenizer/tiny_llama3_tokenizer.json"
#define GGUF_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define SMOLLM2_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

static cJSON *load_json(const char *path) {
    char *text = test_read_file(test_path(path), NULL);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    return root;
}

static cJSON *load_fixtures(void) { return load_json(FIXTURES); }

/* Renders one fixture with tmpl and vars (may be NULL). */
static char *render_fixture(const cJSON *f, const char *tmpl, const specd_chat_vars *vars,
                            specd_error *err) {
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
    char *out = specd_chat_render(tmpl, vars, m, n, gen, err);
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
        char *got = render_fixture(f, tmpl, NULL, &err);
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
        char *got = render_fixture(f, NULL, NULL, &err);
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
    char *out = specd_chat_render(custom, NULL, &m, 1, 0, &err);
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
    assert_null(specd_chat_render(llama3, NULL, &m, 1, 1, &err));
    assert_non_null(strstr(err.msg, "unsupported chat template"));
    assert_null(specd_chat_render("", NULL, &m, 1, 1, &err));
    assert_non_null(strstr(err.msg, "unsupported chat template"));
    specd_chat_msg bad[2] = {{"user", "hi"}, {"assistant", NULL}};
    assert_null(specd_chat_render(NULL, NULL, bad, 2, 0, &err));
    assert_non_null(strstr(err.msg, "message 1 has no content"));
    bad[1] = (specd_chat_msg){NULL, "x"};
    assert_null(specd_chat_render(NULL, NULL, bad, 2, 0, &err));
    assert_non_null(strstr(err.msg, "no role"));
    char *empty = specd_chat_render(NULL, NULL, NULL, 0, 0, &err);
    assert_non_null(empty);
    assert_string_equal(empty, "");
    free(empty);
}

static int32_t token_id_of(const specd_tokenizer *tok, const char *text) {
    int32_t id = specd_tokenizer_token_id(tok, text);
    assert_true(id >= 0);
    return id;
}

/* Meta's Llama 3.0-3.3 templates and DeepSeek's R1-Distill one: every
 * conversation as jinja2 renders it, or refused where the template raises. */
static void test_llama3_matches_jinja(void **state) {
    (void)state;
    cJSON *root = load_json(LLAMA3_FIXTURES);
    const cJSON *templates = cJSON_GetObjectItem(root, "templates");
    const char *date = cJSON_GetObjectItem(root, "date")->valuestring;
    int total = 0, refused = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(root, "fixtures")) {
        const char *name = cJSON_GetObjectItem(f, "template_name")->valuestring;
        const char *tmpl = cJSON_GetObjectItem(templates, name)->valuestring;
        specd_chat_vars vars = {cJSON_GetObjectItem(f, "bos_token")->valuestring, date};
        const cJSON *want = cJSON_GetObjectItem(f, "expected");
        specd_error err = {{0}};
        char *got = render_fixture(f, tmpl, &vars, &err);
        if (cJSON_IsNull(want)) {
            assert_null(got);
            assert_non_null(strstr(err.msg, "at least one message"));
            refused++;
        } else {
            if (!got || strcmp(got, want->valuestring) != 0)
                fprintf(stderr, "fixture %d (%s): got [%s] want [%s] %s\n", total, name,
                        got ? got : "NULL", want->valuestring, err.msg);
            assert_non_null(got);
            assert_string_equal(got, want->valuestring);
        }
        free(got);
        total++;
    }
    printf("  %d Llama 3 and DeepSeek-R1 chat fixtures match jinja2 (%d refused as jinja2 "
           "raises)\n", total, refused);
    assert_true(total >= 100);
    assert_true(refused >= 1);
    cJSON_Delete(root);
}

/* Which family each template is, and look-alikes refused. */
static void test_families(void **state) {
    (void)state;
    cJSON *root = load_json(LLAMA3_FIXTURES);
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "templates")) {
        specd_error err = {{0}};
        const char *fam = specd_chat_family(t->valuestring, &err);
        assert_non_null(fam);
        const char *want = !strcmp(t->string, "llama3.0")    ? "llama3"
                           : !strcmp(t->string, "deepseek-r1") ? "deepseek-r1"
                                                                : "llama3.1";
        assert_string_equal(fam, want);
    }
    int refused = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "refused")) {
        specd_error err = {{0}};
        const char *tmpl = cJSON_GetObjectItem(t, "template")->valuestring;
        if (specd_chat_family(tmpl, &err))
            fprintf(stderr, "%s was taken for %s\n",
                    cJSON_GetObjectItem(t, "template_name")->valuestring,
                    specd_chat_family(tmpl, &err));
        assert_null(specd_chat_family(tmpl, &err));
        assert_non_null(strstr(err.msg, "unsupported chat template"));
        specd_chat_msg m = {"user", "hi"};
        assert_null(specd_chat_render(tmpl, NULL, &m, 1, 1, &err));
        refused++;
    }
    assert_int_equal(refused, 6);
    specd_error err = {{0}};
    assert_string_equal(specd_chat_family(NULL, &err), "chatml");
    cJSON *chatml = load_fixtures();
    assert_string_equal(
        specd_chat_family(cJSON_GetObjectItem(chatml->child, "template")->valuestring, &err),
        "chatml");
    cJSON_Delete(chatml);
    cJSON_Delete(root);
}

/* "Today Date: DD Mon YYYY\n\n" for now, UTC, in the C locale (tests set
 * no other). */
static void today_line(char out[64]) {
    char today[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(today, sizeof today, "%d %b %Y", &tm);
    snprintf(out, 64, "Today Date: %s\n\n", today);
}

/* Llama 3.2 prints today's date (UTC) unless told one; 3.1 and 3.3 always
 * their own literal. */
static void test_llama3_date(void **state) {
    (void)state;
    cJSON *root = load_json(LLAMA3_FIXTURES);
    const cJSON *templates = cJSON_GetObjectItem(root, "templates");
    specd_chat_msg m = {"user", "hi"};
    specd_error err = {{0}};
    /* today before and after the render: either, should midnight pass */
    char line[2][64];
    today_line(line[0]);
    char *out = specd_chat_render(cJSON_GetObjectItem(templates, "llama3.2")->valuestring, NULL,
                                  &m, 1, 1, &err);
    today_line(line[1]);
    assert_non_null(out);
    assert_true(strstr(out, line[0]) || strstr(out, line[1]));
    free(out);
    specd_chat_vars vars = {"<|begin_of_text|>", "07 Mar 2026"};
    out = specd_chat_render(cJSON_GetObjectItem(templates, "llama3.1")->valuestring, &vars, &m, 1,
                            1, &err);
    assert_non_null(strstr(out, "Today Date: 26 Jul 2024\n\n"));
    assert_int_equal(strncmp(out, "<|begin_of_text|><|start_header_id|>system", 42), 0);
    free(out);
    cJSON_Delete(root);
}

/* Writes doc to dir/name and frees it. */
static void write_json(const char *dir, const char *name, cJSON *doc) {
    char path[256], *text = cJSON_PrintUnformatted(doc);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
    free(text);
    cJSON_Delete(doc);
}

/* A Hugging Face directory's template comes from tokenizer_config.json;
 * specd_chat_tokenize writes BOS once (the template writes it and the model
 * wants one), spells the turns' control tokens as single ids, and the end
 * ids hold Llama 3's end of turn. */
static void test_hf_dir_llama3_tokenize(void **state) {
    (void)state;
    char dir[] = "/tmp/specd_chat_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    /* the tiny Llama 3 tokenizer of the fixtures, with the header tokens */
    char *json = test_read_file(test_path(TINY_LLAMA3_TOKENIZER), NULL);
    assert_non_null(json);
    cJSON *tj = cJSON_Parse(json);
    free(json);
    assert_non_null(tj);
    cJSON *added = cJSON_GetObjectItem(tj, "added_tokens"), *a;
    int next_id = 0;
    cJSON_ArrayForEach(a, added) {
        int id = cJSON_GetObjectItem(a, "id")->valueint;
        if (id >= next_id) next_id = id + 1;
    }
    const char *headers[2] = {"<|start_header_id|>", "<|end_header_id|>"};
    for (int h = 0; h < 2; h++) {
        cJSON *e = cJSON_Duplicate(cJSON_GetArrayItem(added, 0), 1);
        cJSON_ReplaceItemInObject(e, "id", cJSON_CreateNumber(next_id + h));
        cJSON_ReplaceItemInObject(e, "content", cJSON_CreateString(headers[h]));
        cJSON_AddItemToArray(added, e);
    }
    write_json(dir, "tokenizer.json", tj);
    cJSON *root = load_json(LLAMA3_FIXTURES);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "bos_token", "<|begin_of_text|>");
    cJSON_AddBoolToObject(cfg, "add_bos_token", 1);
    cJSON *list = cJSON_AddArrayToObject(cfg, "chat_template");
    cJSON *tool_use = cJSON_CreateObject(), *dflt = cJSON_CreateObject();
    cJSON_AddStringToObject(tool_use, "name", "tool_use");
    cJSON_AddStringToObject(tool_use, "template", "{{ not this one }}");
    cJSON_AddStringToObject(dflt, "name", "default");
    cJSON_AddStringToObject(
        dflt, "template",
        cJSON_GetObjectItem(cJSON_GetObjectItem(root, "templates"), "llama3.1")->valuestring);
    cJSON_AddItemToArray(list, tool_use);
    cJSON_AddItemToArray(list, dflt);
    write_json(dir, "tokenizer_config.json", cfg);

    specd_error err = {{0}};
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    specd_tokenizer *tok = specd_tokenizer_from_json(path, &err);
    assert_non_null(tok);
    assert_string_equal(specd_chat_family(specd_tokenizer_chat_template(tok), &err), "llama3.1");
    specd_chat_msg m[2] = {{"system", "Be brief."}, {"user", "hi"}};
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(specd_chat_tokenize(tok, m, 2, &ids, &n, &err), 0);
    int32_t bos = token_id_of(tok, "<|begin_of_text|>");
    int32_t eot = token_id_of(tok, "<|eot_id|>");
    int32_t hdr = token_id_of(tok, "<|start_header_id|>");
    assert_true(n > 10);
    assert_int_equal(ids[0], bos);
    assert_int_equal(ids[1], hdr);
    int n_bos = 0, n_eot = 0;
    for (size_t i = 0; i < n; i++) n_bos += ids[i] == bos, n_eot += ids[i] == eot;
    assert_int_equal(n_bos, 1);
    assert_int_equal(n_eot, 2);
    assert_true(specd_tokenizer_is_end(tok, eot));
    free(ids);
    /* a text prompt gets BOS once too, whether or not it spells it */
    ids = NULL;
    n = 0;
    assert_int_equal(specd_tokenize(tok, "hi", 2, 1, &ids, &n, &err), 0);
    assert_int_equal(specd_tokenizer_add_bos(tok, &ids, &n), 0);
    assert_int_equal(ids[0], bos);
    size_t n1 = n;
    assert_int_equal(specd_tokenizer_add_bos(tok, &ids, &n), 0);
    assert_int_equal(n, n1);
    free(ids);
    specd_tokenizer_free(tok);
    cJSON_Delete(root);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    assert_int_equal(system(path), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_jinja),
        cmocka_unit_test(test_null_template_is_plain_chatml),
        cmocka_unit_test(test_default_system_prompt_from_template),
        cmocka_unit_test(test_gguf_template_is_the_fixture_template),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_llama3_matches_jinja),
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_llama3_date),
        cmocka_unit_test(test_hf_dir_llama3_tokenize),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
