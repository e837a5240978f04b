/* cmd_bench_e2e.c - `specd bench --e2e`: speculative serving end to end.
 *
 * What a user of the two services gets, measured through the front door:
 * draft-svc's Generate over gRPC, with target-svc behind it, for plain
 * decoding (drafter "none") and every drafter draft-svc offers, at 1..32
 * concurrent streams, all in ONE table from ONE run so the rows are
 * comparable (same build, same machine state, same prompts).
 *
 * The services run in this process on loopback (tools/inproc.h: assembled
 * as the real executables assemble them, with their default
 * configuration), or are reached at --draft ADDR (or draft-svc in-process
 * in front of an external --target ADDR).
 *
 * Workload per cell (drafter x streams): `streams` client threads, each
 * sending --requests requests one after another (default: the whole prompt
 * set, each stream starting at a different prompt), so every cell sees the
 * same prompt mix. Prompts: a fixed set committed below (two repetitive
 * ones where prompt lookup should pay off, two ordinary chat ones) or
 * --prompts FILE (JSONL). Greedy unless sampling flags say otherwise.
 *
 * Columns: tokens/s of all streams together (tokens / wall time of the
 * cell), tokens/s per stream (each stream's tokens / its own busy time,
 * averaged), tau (tokens per target step, from the server's stats), accept
 * rate (accepted / drafted tokens), round trips per request (the Verify
 * messages of draft-svc the target answered: plain decoding pays 2, an
 * Open and one plain run; each drafted or looked-at step 1), median time
 * to first token as the client saw it, where a decode step's time went
 * (the server's stats, ms per step: drafting, waiting for the target's
 * answer, and in brackets the target's forward pass within that wait; the
 * rest of the wait is transport and the target's queue), and the speed-up of total tokens/s over plain decoding at
 * the same concurrency. A last column splits tau by prompt class.
 *
 * Adaptive length: --stop-thresholds 0.3,0.5 adds a row "mlp adaptive
 * t=X" per threshold after the mlp row (the request's
 * speculation.stop_threshold; the mlp row itself then sends -1, fixed
 * length), so fixed and SpecDec++ drafting are compared in one run.
 * --depths 1,2,3 adds a row "mlp depth D" per depth, the fixed shape
 * --candidates x D, so the best fixed length is found in the same run too
 * (a run's rows share the host's moods; separate runs did not: docs/
 * BENCHMARKS.md). Either also adds "mlp priced", the server's own adaptive
 * length: no shape sent, so the cost policy sizes each step's tree from
 * its calibrated acceptance estimates and the target's measured costs,
 * within --max-shape (1x4: a chain of at most 4, the others' shape).
 *
 * Shared prefix (the prefix cache's proof): --shared-prefix N puts one fixed
 * system prompt of about N tokens in front of every prompt (the system
 * message of a chat prompt, the head of a raw one). Its text is whole lines
 * of a file of this repository (--shared-prefix-file, default
 * docs/ARCHITECTURE.md, repeated if short), cut to at most N tokens with the
 * in-process model's tokenizer (estimated at 3.3 characters a token against
 * --draft, which gives us no tokenizer). Each cell, and the warm-up, puts a
 * different first line ("Reference notes, set K.") before it: the hash chain
 * of every page then differs, so each cell's first request finds nothing
 * cached from an earlier cell and pays the whole prefill, as a fresh server
 * would. Three columns are added: the TTFT of the cell's first request (the
 * one that started first), the median TTFT of the requests that started
 * after that first one's first token came back (by then its prompt pages are
 * published, so they can hit the cache; requests running beside the first
 * are in neither number), and later / first. --no-prefix-cache turns the
 * in-process target's prefix cache off (limits.prefix_cache=false) for the
 * contrast. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "common/util/cpu_count.h"
#include "common/util/thread_name.h"
#include "common/util/small_file.h"
#include "kernels/backend.h"
#include "tools/client.h"
#include "tools/inproc.h"

#define MAX_LEVELS 16
#define MAX_DRAFTERS 5 /* none and pick_drafters' order */
#define MAX_CLASSES 8
#define MAX_THRESHOLDS 8
#define MAX_DEPTHS 8
#define MAX_ROWS (MAX_DRAFTERS + MAX_THRESHOLDS + MAX_DEPTHS + 1) /* + mlp priced */

typedef struct prompt {
    char *name, *cls, *system, *text;
    int chat; /* send as a chat user message (else raw text) */
} prompt;

/* The committed default set. The repetitive ones ask the model to copy most
 * of its prompt back (a list, a code edit), the case prompt lookup (ngram)
 * is built for; the chat ones are ordinary open-ended answers where it
 * should find little. */
static const struct {
    const char *name, *cls, *text;
} default_prompts[] = {
    {"repeat-list", "repeat",
     "Repeat the following list exactly, one item per line, without adding anything:\n"
     "1. Preheat the oven to 180 degrees.\n"
     "2. Mix the flour, sugar and salt in a large bowl.\n"
     "3. Add the eggs one at a time and stir well.\n"
     "4. Pour the batter into a greased baking tin.\n"
     "5. Bake for 35 minutes until golden brown.\n"
     "6. Let the cake cool for ten minutes before serving."},
    {"code-edit", "repeat",
     "Rename the variable `total` to `acc` in this Python function and return the whole "
     "function, otherwise unchanged:\n\n"
     "```python\n"
     "def average(values):\n"
     "    total = 0\n"
     "    count = 0\n"
     "    for value in values:\n"
     "        total += value\n"
     "        count += 1\n"
     "    if count == 0:\n"
     "        return 0\n"
     "    return total / count\n"
     "```"},
    {"chat-habits", "chat", "What are three good habits for staying healthy? Answer briefly."},
    {"chat-story", "chat",
     "Write a short story about a lighthouse keeper who finds a message in a bottle."},
};

typedef struct bench_opts {
    const char *model, *draft_model, *speculator, *target, *draft, *prompts_file;
    int shared_prefix;              /* --shared-prefix N tokens (0 = off) */
    const char *shared_prefix_file; /* the text it is cut from */
    int no_prefix_cache;            /* --no-prefix-cache: in-process target without it */
    int pipeline;                   /* --pipeline: in-process draft-svc drafts ahead */
    const char *max_shape;          /* --max-shape: the in-process draft-svc's, NULL = its default */
    int kv_dtype;                   /* --kv-cache-dtype: the in-process target's KV cache */
    int precision;                  /* --precision: the in-process target's CPU matmuls */
    int per_class; /* --per-class: keep the first N prompts of each class (0 = all) */
    int levels[MAX_LEVELS], n_levels;
    int max_new, threads, requests, ctx, candidates, depth;
    const char *only_drafters;
    const char *accept_head;
    const char *json; /* --json FILE: the rows as JSON too (bench/plot_e2e.py draws them) */
    int rounds;       /* --rounds N: the whole grid N times, drafter order alternated */
    int interleave;   /* --interleave: a level's drafters take turns wave by wave */
    const char *backend; /* in-process target's and speculator's backend (NULL = cpu) */
    int device;
    float stop_thresholds[MAX_THRESHOLDS];
    int n_thresholds;
    int depths[MAX_DEPTHS]; /* --depths: extra fixed-depth mlp rows */
    int n_depths;
    cli_sampling samp;
    specd_rpc_channel_opts tls;
} bench_opts;

/* One row group of the table: a drafter, the stop threshold its requests
 * send (0 = none sent: the server's default) and their depth (0 = --depth);
 * a priced row sends no shape at all, whatever --candidates and --depth
 * say, so the server's cost policy sizes every tree (within --max-shape). */
typedef struct row_spec {
    char drafter[16];
    char label[32]; /* what the table calls it */
    float stop_threshold;
    int depth;
    int priced;
} row_spec;

/* One request's outcome. */
typedef struct req_rec {
    int prompt;
    int tokens, steps, drafted, accepted, prompt_tokens;
    double t_start, t_first, t_end;
    double draft_ms, wait_ms, fwd_ms; /* the server's split of its decode steps */
    int ahead, ahead_hits;            /* trees drafted ahead (pipelined), and used */
    int round_trips;                  /* Verify messages the target answered */
} req_rec;

typedef struct cell {
    const char *drafter;
    int streams;
    double tok_s, tok_s_stream, tau, accept, ttft_ms, speedup;
    int have_accept;
    /* ms per decode step: drafting, waiting for the target, and the
     * target's forward pass within that wait */
    double draft_ms, wait_ms, fwd_ms;
    long ahead, ahead_hits; /* pipelined drafting: trees drafted ahead, and used */
    /* round trips (Verify messages the target answered) per request: plain
     * decoding in plain runs pays 2, a step that waits for draft-svc 1 */
    double trips;
    double tau_cls[MAX_CLASSES];
    /* --shared-prefix: the first request's TTFT and prompt size, the median
     * TTFT of the requests started after its first token (n_later of them;
     * 0 = none, e.g. as many streams as requests) */
    double ttft_first_ms, ttft_later_ms;
    int n_later, first_prompt_tokens;
} cell;

/* Shared by the client threads of one cell. */
typedef struct run_ctx {
    specd_rpc_channel *ch;
    const bench_opts *o;
    const prompt *prompts;
    int n_prompts;
    const char *drafter;
    float stop_threshold; /* the request's speculation.stop_threshold (0 = not sent) */
    int depth;            /* the request's speculation.depth (0 = --depth) */
    int priced;           /* no shape sent: the server's cost policy (row_spec) */
    /* --shared-prefix: this cell's system prompt (salt line + the fixed
     * text), put before every prompt; NULL = off */
    const char *shared;
    int requests; /* per stream */
    int slot0, n_slots; /* the requests of each stream this run sends: [slot0, slot0 + n_slots) */
    req_rec *recs; /* [streams * requests] */
    pthread_mutex_t mu;
    int failed;
    specd_error err;
} run_ctx;

typedef struct stream_arg {
    run_ctx *rc;
    int index;
} stream_arg;

static void usage(void) {
    printf("usage: specd bench --e2e [options]\n"
           "  -m, --model PATH     target model (default %s)\n"
           "  --draft-model PATH   also measure the draft_lm drafter with this model\n"
           "  --speculator DIR     also measure the mlp drafter (MLPSpeculator directory)\n"
           "  --target ADDR        use this target-svc (draft-svc still runs in-process)\n"
           "  --draft ADDR         use this draft-svc (and the targets behind it)\n"
           "  --streams LIST       concurrent streams (default 1,2,4,8,16,32)\n"
           "  --prompts FILE       JSONL, one {\"prompt\": TEXT, \"class\" (or \"kind\"): NAME,\n"
           "                       \"system\": TEXT,"
           "                       \"chat\": BOOL (default true), \"name\": NAME} per line\n"
           "                       (default: a committed set of 2 repetitive + 2 chat prompts)\n"
           "  --per-class N        only the first N prompts of each class\n"
           "  --shared-prefix N    put one fixed ~N-token system prompt before every prompt and\n"
           "                       report the first request's TTFT against the later ones'\n"
           "                       (the prefix cache); its text: whole lines of\n"
           "  --shared-prefix-file PATH  (default docs/ARCHITECTURE.md, repeated if short)\n"
           "  --no-prefix-cache    the in-process target without its prefix cache\n"
           "  --pipeline           pipelined drafting in the in-process draft-svc (draft_lm;\n"
           "                       off by default here: in one process it takes the target's\n"
           "                       cores; bench/pipeline.sh measures it on separate ones)\n"
           "  --max-shape CxD      the in-process draft-svc's speculation.max_shape: priced\n"
           "                       trees are drafted at most C candidates x D deep\n"
           "                       (default 4x6; 1xD prices chains, as SpecDec++ sizes them)\n"
           "  --kv-cache-dtype T   the in-process target's KV cache: auto (default), f32, f16\n"
           "                       or q8_0\n"
           "  --precision P        the in-process target's CPU matmuls: fast (default) or exact;\n"
           "                       a --draft-model stays fast (bench/pipeline.sh's pairing)\n"
           "  -n, --max-new-tokens N  tokens per request (default 128)\n"
           "  --requests N         requests per stream per cell (default: one per prompt)\n"
           "  -t, --threads N      CPU threads of the in-process services (default: all)\n"
           "  --ctx N              context rows per session in-process (default 1024 + N,\n"
           "                       + the shared prefix)\n"
           "  --backend cpu|cuda, --device N  backend of the in-process target and of the\n"
           "                       mlp speculator (default cpu)\n"
           "  --drafters LIST      only these (e.g. none,ngram); default: none + all offered\n"
           "  --candidates N, --depth N  fixed tree shape (default: the server's policy)\n"
           "  --stop-thresholds LIST  add a row \"mlp adaptive t=X\" per threshold X (0 < X < 1):\n"
           "                       SpecDec++ adaptive draft length, beside the fixed mlp row\n"
           "  --depths LIST        add a row \"mlp depth D\" per depth D: the fixed shape\n"
           "                       --candidates x D, to find the best fixed length in the\n"
           "                       same run as the adaptive rows; either option also adds\n"
           "                       \"mlp priced\", the cost policy's adaptive length (no shape\n"
           "                       sent; --max-shape bounds it)\n"
           "  --rounds N           run the grid N times; within a round each stream level\n"
           "                       runs every drafter back to back, in alternating order\n"
           "                       (forward, then reversed): each cell reports its median\n"
           "                       round and the median of its per-round speed-ups over the\n"
           "                       plain cell of the same round (default 1; use 3+ on a noisy\n"
           "                       machine)\n"
           "  --interleave         instead of a cell of back-to-back requests per drafter:\n"
           "                       at each stream level the drafters take turns request by\n"
           "                       request (a wave: one request per stream, all at once),\n"
           "                       their order turning round every wave; each cell is its\n"
           "                       waves put end to end. The rounds of a run then agree to\n"
           "                       a few percent on a shared host: for comparing drafters,\n"
           "                       or settings, with each other (above one stream every\n"
           "                       wave ends with its slowest stream)\n"
           "  --json FILE          also write the rows (and the machine, command) as JSON, for\n"
           "                       bench/plot_e2e.py\n"
           "  --accept-head DIR    the mlp drafter's acceptance head (default: SPECULATOR/\n"
           "                       accept_head when it exists; with --draft: that server's)\n",
           SPECD_DEFAULT_MODEL);
    cli_sampling_usage(stdout);
    printf("  TLS to --target / --draft:\n");
    cli_tls_usage(stdout);
}

/* ---- prompts ------------------------------------------------------------------ */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static void free_prompts(prompt *p, int n) {
    for (int i = 0; i < n; i++) {
        free(p[i].name);
        free(p[i].cls);
        free(p[i].system);
        free(p[i].text);
    }
    free(p);
}

/* The JSONL file: one object per non-blank line. -1 + err naming the line. */
static int load_prompts(const char *path, prompt **out, int *n_out, specd_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return specd_seterr(err, "--prompts: cannot open '%s'", path);
    prompt *v = NULL;
    int n = 0, cap = 0, line_no = 0, rc = 0;
    char *line = NULL;
    size_t line_cap = 0;
    while (getline(&line, &line_cap, f) >= 0) {
        line_no++;
        const char *s = line;
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
        if (!*s) continue;
        cJSON *j = cJSON_Parse(s);
        const cJSON *text = j ? cJSON_GetObjectItemCaseSensitive(j, "prompt") : NULL;
        if (!cJSON_IsString(text)) {
            rc = specd_seterr(err, "--prompts %s:%d: expected an object with a string \"prompt\"",
                              path, line_no);
            cJSON_Delete(j);
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            prompt *bigger = realloc(v, sizeof *v * (size_t)cap);
            if (!bigger) {
                rc = specd_seterr(err, "out of memory");
                cJSON_Delete(j);
                break;
            }
            v = bigger;
        }
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(j, "class");
        /* "kind" is what the training and eval prompt files call it */
        if (!cls) cls = cJSON_GetObjectItemCaseSensitive(j, "kind");
        const cJSON *sys = cJSON_GetObjectItemCaseSensitive(j, "system");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
        const cJSON *chat = cJSON_GetObjectItemCaseSensitive(j, "chat");
        char fallback[32];
        snprintf(fallback, sizeof fallback, "line%d", line_no);
        v[n] = (prompt){
            .name = strdup(cJSON_IsString(name) ? name->valuestring : fallback),
            .cls = strdup(cJSON_IsString(cls) ? cls->valuestring : "chat"),
            .system = cJSON_IsString(sys) ? dup_or_null(sys->valuestring) : NULL,
            .text = strdup(text->valuestring),
            .chat = !cJSON_IsFalse(chat),
        };
        n++;
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    if (!rc && n == 0) rc = specd_seterr(err, "--prompts %s: no prompts", path);
    if (rc) {
        free_prompts(v, n);
        return -1;
    }
    *out = v;
    *n_out = n;
    return 0;
}

static prompt *builtin_prompts(int *n) {
    *n = (int)(sizeof default_prompts / sizeof default_prompts[0]);
    prompt *v = calloc((size_t)*n, sizeof *v);
    for (int i = 0; v && i < *n; i++)
        v[i] = (prompt){.name = strdup(default_prompts[i].name),
                        .cls = strdup(default_prompts[i].cls),
                        .text = strdup(default_prompts[i].text),
                        .chat = 1};
    return v;
}

/* --shared-prefix: whole lines of the file (repeated when it is short), as
 * many as fit in n_tokens tokens by `tok` (binary search over line ends:
 * tokens only grow with more text), or about 3.3 characters a token (this
 * repository's Markdown) without a tokenizer. *n_got: tokens counted (an
 * estimate without tokenizer). NULL + err. */
static char *build_shared_prefix(const char *path, int n_tokens, const specd_tokenizer *tok,
                                 int *n_got, specd_error *err) {
    size_t len = 0;
    char *file = specd_read_small_file(path, 64u << 20, &len, err);
    if (!file) return NULL;
    if (!len) {
        free(file);
        specd_seterr(err, "--shared-prefix-file %s is empty", path);
        return NULL;
    }
    /* enough text for any tokenizer: > 8 characters a token */
    size_t want = (size_t)n_tokens * 8 + 1, have = 0;
    char *text = malloc(want + len + 1);
    if (!text) {
        free(file);
        specd_seterr(err, "out of memory");
        return NULL;
    }
    while (have < want) {
        memcpy(text + have, file, len);
        have += len;
    }
    text[have] = 0;
    free(file);
    /* candidate cuts: just after each newline */
    size_t *ends = NULL;
    int n_ends = 0, cap = 0;
    for (size_t i = 0; i < have; i++) {
        if (text[i] != '\n') continue;
        if (n_ends == cap) {
            cap = cap ? 2 * cap : 1024;
            size_t *bigger = realloc(ends, sizeof *ends * (size_t)cap);
            if (!bigger) {
                free(ends);
                free(text);
                specd_seterr(err, "out of memory");
                return NULL;
            }
            ends = bigger;
        }
        ends[n_ends++] = i + 1;
    }
    size_t cut = 0;
    int got = 0;
    if (!tok) {
        size_t chars = (size_t)n_tokens * 33 / 10;
        for (int i = 0; i < n_ends && ends[i] <= chars; i++) cut = ends[i];
        got = (int)(cut * 10 / 33);
    } else {
        int lo = 0, hi = n_ends - 1; /* the largest cut with <= n_tokens tokens */
        while (lo <= hi) {
            int mid = (lo + hi) / 2;
            int32_t *ids = NULL;
            size_t n_ids = 0;
            if (specd_tokenize(tok, text, ends[mid], 0, &ids, &n_ids, err)) {
                free(ends);
                free(text);
                return NULL;
            }
            free(ids);
            if ((int)n_ids <= n_tokens) {
                cut = ends[mid];
                got = (int)n_ids;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
    }
    free(ends);
    if (!cut) {
        free(text);
        specd_seterr(err, "--shared-prefix %d: the first line of %s is already longer", n_tokens,
                     path);
        return NULL;
    }
    text[cut] = 0;
    *n_got = got;
    return text;
}

/* ---- one cell ------------------------------------------------------------------- */

/* Sends prompt p with the bench's settings; fills rec. */
static grpc_status_code one_request(run_ctx *rc, int p, int max_new, req_rec *rec,
                                    specd_error *err) {
    const prompt *pr = &rc->prompts[p];
    const bench_opts *o = rc->o;
    Specd__V1__GenerateRequest req = SPECD__V1__GENERATE_REQUEST__INIT;
    Specd__V1__ChatMessages chat = SPECD__V1__CHAT_MESSAGES__INIT;
    Specd__V1__ChatMessage msgs[2] = {SPECD__V1__CHAT_MESSAGE__INIT, SPECD__V1__CHAT_MESSAGE__INIT};
    Specd__V1__ChatMessage *ptrs[2] = {&msgs[0], &msgs[1]};
    Specd__V1__SamplingParams sp;
    /* per call: threads must not share the bias arrays' protobuf wrappers */
    Specd__V1__LogitBias *bias_msgs = NULL, **bias_ptrs = NULL;
    Specd__V1__Speculation spec = SPECD__V1__SPECULATION__INIT;
    /* --shared-prefix: the cell's system prompt first, then the prompt's own
     * system text (chat) or the prompt itself (raw text) */
    char *joined = NULL;
    if (rc->shared) {
        const char *own = pr->chat ? pr->system : pr->text;
        size_t ls = strlen(rc->shared), lo = own ? strlen(own) : 0;
        if (!(joined = malloc(ls + lo + 3))) {
            specd_seterr(err, "out of memory");
            return GRPC_STATUS_RESOURCE_EXHAUSTED;
        }
        memcpy(joined, rc->shared, ls);
        if (own) {
            memcpy(joined + ls, "\n\n", 2);
            memcpy(joined + ls + 2, own, lo + 1);
        } else {
            joined[ls] = 0;
        }
    }
    if (pr->chat) {
        size_t n = 0;
        const char *system = joined ? joined : pr->system;
        if (system) {
            msgs[n].role = "system";
            msgs[n++].content = (char *)system;
        }
        msgs[n].role = "user";
        msgs[n++].content = pr->text;
        chat.n_messages = n;
        chat.messages = ptrs;
        req.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_CHAT;
        req.chat = &chat;
    } else {
        req.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_TEXT;
        req.text = joined ? joined : pr->text;
    }
    req.max_new_tokens = max_new;
    if (o->samp.s.n_logit_bias) {
        bias_msgs = calloc((size_t)o->samp.s.n_logit_bias, sizeof *bias_msgs);
        bias_ptrs = calloc((size_t)o->samp.s.n_logit_bias, sizeof *bias_ptrs);
        if (!bias_msgs || !bias_ptrs) {
            free(bias_msgs);
            free(bias_ptrs);
            free(joined);
            specd_seterr(err, "out of memory");
            return GRPC_STATUS_RESOURCE_EXHAUSTED;
        }
    }
    cli_sampling_to_proto(&o->samp, &sp, bias_msgs, bias_ptrs);
    req.sampling = &sp;
    req.drafter = (char *)rc->drafter;
    int depth = rc->depth ? rc->depth : o->depth;
    if (rc->priced) {
        spec.stop_threshold = -1.0f; /* the price alone decides the length */
        req.speculation = &spec;
    } else if (o->candidates || depth || rc->stop_threshold) {
        spec.candidates = o->candidates;
        spec.depth = depth;
        spec.stop_threshold = rc->stop_threshold;
        req.speculation = &spec;
    }
    cli_gen_result res;
    /* generous: a 32-stream cell on two CPU cores is slow, not hung */
    grpc_status_code code = cli_generate_call(rc->ch, CLI_DRAFT_GENERATE, &req, 1800 * 1000, NULL,
                                              NULL, &res, err);
    free(bias_msgs);
    free(bias_ptrs);
    free(joined);
    if (code != GRPC_STATUS_OK) return code;
    *rec = (req_rec){.prompt = p, .tokens = res.n_tokens, .steps = res.target_steps,
                     .prompt_tokens = res.prompt_tokens,
                     .drafted = res.drafted_tokens, .accepted = res.accepted_tokens,
                     .t_start = res.t_start, .t_first = res.t_first, .t_end = res.t_end,
                     .draft_ms = res.draft_ms, .wait_ms = res.target_wait_ms,
                     .fwd_ms = res.target_forward_ms, .ahead = res.pipelined_drafts,
                     .ahead_hits = res.pipelined_hits, .round_trips = res.round_trips};
    return GRPC_STATUS_OK;
}

static void *stream_main(void *arg) {
    stream_arg *sa = arg;
    run_ctx *rc = sa->rc;
    specd_thread_name("bench-stream");
    for (int r = rc->slot0; r < rc->slot0 + rc->n_slots; r++) {
        pthread_mutex_lock(&rc->mu);
        int stop = rc->failed;
        pthread_mutex_unlock(&rc->mu);
        if (stop) break;
        /* each stream starts at its own prompt, so every cell runs the same mix */
        int p = (sa->index + r) % rc->n_prompts;
        specd_error err = {{0}};
        req_rec *rec = &rc->recs[sa->index * rc->requests + r];
        if (one_request(rc, p, rc->o->max_new, rec, &err) != GRPC_STATUS_OK) {
            pthread_mutex_lock(&rc->mu);
            if (!rc->failed) rc->err = err;
            rc->failed = 1;
            pthread_mutex_unlock(&rc->mu);
            break;
        }
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int class_index(char classes[][32], int n_classes, const char *cls) {
    for (int c = 0; c < n_classes; c++)
        if (!strcmp(classes[c], cls)) return c;
    return 0;
}

/* --shared-prefix: the first request (the earliest start) and the median
 * TTFT of those that started after its first token arrived: the client saw
 * that token only after the target had run the whole prompt and published
 * its full pages, so each of these could reuse them. buf: scratch for n. */
static void shared_ttft(const req_rec *recs, int n, double *buf, cell *out) {
    int first = -1;
    for (int i = 0; i < n; i++)
        if (recs[i].t_first && (first < 0 || recs[i].t_start < recs[first].t_start)) first = i;
    if (first < 0) return;
    out->ttft_first_ms = (recs[first].t_first - recs[first].t_start) * 1e3;
    out->first_prompt_tokens = recs[first].prompt_tokens;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (i != first && recs[i].t_first && recs[i].t_start >= recs[first].t_first)
            buf[k++] = (recs[i].t_first - recs[i].t_start) * 1e3;
    out->n_later = k;
    if (!k) return;
    qsort(buf, (size_t)k, sizeof *buf, cmp_double);
    out->ttft_later_ms = k % 2 ? buf[k / 2] : 0.5 * (buf[k / 2 - 1] + buf[k / 2]);
}

/* Sends requests [slot0, slot0 + n_slots) of every stream into rc->recs,
 * the streams concurrently, each its requests one after another. 0, or
 * -1 + err. */
static int run_streams(run_ctx *rc, int streams, int slot0, int n_slots, specd_error *err) {
    pthread_t *th = calloc((size_t)streams, sizeof *th);
    stream_arg *args = calloc((size_t)streams, sizeof *args);
    if (!th || !args) {
        free(th);
        free(args);
        return specd_seterr(err, "out of memory");
    }
    rc->slot0 = slot0;
    rc->n_slots = n_slots;
    rc->failed = 0;
    int started = 0;
    for (int s = 0; s < streams; s++) {
        args[s] = (stream_arg){rc, s};
        if (pthread_create(&th[s], NULL, stream_main, &args[s])) {
            pthread_mutex_lock(&rc->mu);
            rc->failed = 1;
            specd_seterr(&rc->err, "cannot start client thread %d", s);
            pthread_mutex_unlock(&rc->mu);
            break;
        }
        started++;
    }
    for (int s = 0; s < started; s++) pthread_join(th[s], NULL);
    free(th);
    free(args);
    if (rc->failed) {
        *err = rc->err;
        return -1;
    }
    return 0;
}

/* The cell of rc->recs, every stream's rc->requests requests: tokens/s over
 * the span from the first start to the last end, per stream over each
 * stream's own span. */
static void summarize(const run_ctx *rc, int streams, char classes[][32], int n_classes,
                      cell *out) {
    int n_recs = streams * rc->requests;
    double t0 = 1e300, t1 = 0, per_stream = 0;
    long tokens = 0, steps = 0, drafted = 0, accepted = 0, decode_steps = 0;
    double draft_ms = 0, wait_ms = 0, fwd_ms = 0;
    long ahead = 0, ahead_hits = 0, trips = 0;
    long cls_tokens[MAX_CLASSES] = {0}, cls_steps[MAX_CLASSES] = {0};
    double *ttft = calloc((size_t)n_recs, sizeof *ttft);
    int n_ttft = 0;
    for (int s = 0; s < streams; s++) {
        long st_tokens = 0;
        double st0 = 1e300, st1 = 0;
        for (int r = 0; r < rc->requests; r++) {
            const req_rec *q = &rc->recs[s * rc->requests + r];
            st_tokens += q->tokens;
            st0 = q->t_start < st0 ? q->t_start : st0;
            st1 = q->t_end > st1 ? q->t_end : st1;
            steps += q->steps;
            drafted += q->drafted;
            accepted += q->accepted;
            decode_steps += q->steps > 1 ? q->steps - 1 : 0; /* step 0: the prompt */
            draft_ms += q->draft_ms;
            wait_ms += q->wait_ms;
            fwd_ms += q->fwd_ms;
            ahead += q->ahead;
            ahead_hits += q->ahead_hits;
            trips += q->round_trips;
            int c = class_index(classes, n_classes, rc->prompts[q->prompt].cls);
            cls_tokens[c] += q->tokens;
            cls_steps[c] += q->steps;
            if (q->t_first && ttft) ttft[n_ttft++] = (q->t_first - q->t_start) * 1e3;
        }
        tokens += st_tokens;
        t0 = st0 < t0 ? st0 : t0;
        t1 = st1 > t1 ? st1 : t1;
        per_stream += st1 > st0 ? st_tokens / (st1 - st0) : 0;
    }
    *out = (cell){.drafter = rc->drafter, .streams = streams};
    out->tok_s = t1 > t0 ? tokens / (t1 - t0) : 0;
    out->tok_s_stream = per_stream / streams;
    out->tau = steps ? (double)tokens / steps : 0;
    out->have_accept = drafted > 0;
    out->ahead = ahead;
    out->ahead_hits = ahead_hits;
    out->trips = n_recs ? (double)trips / n_recs : 0;
    out->accept = drafted ? (double)accepted / drafted : 0;
    if (decode_steps) {
        out->draft_ms = draft_ms / decode_steps;
        out->wait_ms = wait_ms / decode_steps;
        out->fwd_ms = fwd_ms / decode_steps;
    }
    if (n_ttft) {
        qsort(ttft, (size_t)n_ttft, sizeof *ttft, cmp_double);
        out->ttft_ms = n_ttft % 2 ? ttft[n_ttft / 2]
                                  : 0.5 * (ttft[n_ttft / 2 - 1] + ttft[n_ttft / 2]);
    }
    for (int c = 0; c < n_classes; c++)
        out->tau_cls[c] = cls_steps[c] ? (double)cls_tokens[c] / cls_steps[c] : 0;
    if (rc->shared && ttft) shared_ttft(rc->recs, n_recs, ttft, out);
    free(ttft);
}

/* Runs one cell and summarizes it. 0, or -1 + err. */
static int run_cell(run_ctx *rc, int streams, char classes[][32], int n_classes, cell *out,
                    specd_error *err) {
    if (!(rc->recs = calloc((size_t)streams * (size_t)rc->requests, sizeof *rc->recs)))
        return specd_seterr(err, "out of memory");
    int rc_out = run_streams(rc, streams, 0, rc->requests, err);
    if (!rc_out) summarize(rc, streams, classes, n_classes, out);
    free(rc->recs);
    rc->recs = NULL;
    return rc_out;
}

/* rc's requests from now on ask what `row`'s do. */
static void send_as(run_ctx *rc, const row_spec *row) {
    rc->drafter = row->drafter;
    rc->stop_threshold = row->stop_threshold;
    rc->depth = row->depth;
    rc->priced = row->priced;
}

/* Warm-up, not measured: connections, first-touch of weights and the
 * drafter's per-session state; rc then sends as `row` does. 0, or -1 + err. */
static int warm_row(run_ctx *rc, const row_spec *row, specd_error *err) {
    send_as(rc, row);
    req_rec warm;
    int max_new = rc->o->max_new < 8 ? rc->o->max_new : 8;
    return one_request(rc, 0, max_new, &warm, err) == GRPC_STATUS_OK ? 0 : -1;
}

/* One round's cell, on stderr as it finishes. */
static void report_round(int rounds, int r, int label_w, const cell *c) {
    fprintf(stderr, "specd bench: %s%-*s x%-3d %8.1f tok/s, tau %.2f\n",
            rounds > 1 ? (r % 2 ? "(round back) " : "(round fwd)  ") : "", label_w, c->drafter,
            c->streams, c->tok_s, c->tau);
}

/* --interleave: the cells of one stream level, every row's, in waves. Wave
 * j sends request j of every stream, all streams at once, for one row, then
 * for the next; the rows' order turns round from one wave to the next (and
 * starts reversed in odd rounds), so each row follows every other equally
 * often. A row's waves are then put end to end (each wave's times moved to
 * start where the row's previous wave ended) and the row's cell is
 * summarized from those as if it had run alone. Cells of back-to-back
 * requests take the rows seconds apart, and a shared host's speed moves in
 * between: at one stream three rounds of one run put a drafter at 0.98x,
 * 1.18x and 1.06x of plain; in waves the rounds of a run agreed to a few
 * percent (docs/BENCHMARKS.md, thirty-first session), which is what a
 * comparison of two drafters, or of two settings of one, needs. The host
 * still moves every row together between runs. A wave ends with its
 * slowest stream, so above one stream the load thins out at the end of
 * every wave, not only of the cell. out[d] for rows[d]. 0, or -1 + err. */
static int run_level_interleaved(run_ctx *rc, const row_spec *rows, int n_rows, int streams,
                                 int round, char classes[][32], int n_classes, cell *out,
                                 specd_error *err) {
    req_rec *recs[MAX_ROWS] = {0};
    double clock[MAX_ROWS] = {0}; /* where each row's next wave starts */
    int n_recs = streams * rc->requests, rc_out = 0;
    for (int d = 0; d < n_rows && !rc_out; d++)
        if (!(recs[d] = calloc((size_t)n_recs, sizeof *recs[d])))
            rc_out = specd_seterr(err, "out of memory");
    for (int j = 0; j < rc->requests && !rc_out; j++)
        for (int i = 0; i < n_rows && !rc_out; i++) {
            int d = (round + j) % 2 ? n_rows - 1 - i : i;
            send_as(rc, &rows[d]);
            rc->recs = recs[d];
            if ((rc_out = run_streams(rc, streams, j, 1, err))) break;
            double t0 = 1e300, t1 = 0;
            for (int s = 0; s < streams; s++) {
                const req_rec *q = &recs[d][s * rc->requests + j];
                t0 = q->t_start < t0 ? q->t_start : t0;
                t1 = q->t_end > t1 ? q->t_end : t1;
            }
            double shift = clock[d] - t0;
            for (int s = 0; s < streams; s++) {
                req_rec *q = &recs[d][s * rc->requests + j];
                q->t_start += shift;
                q->t_end += shift;
                if (q->t_first) q->t_first += shift;
            }
            clock[d] += t1 - t0;
        }
    for (int d = 0; d < n_rows && !rc_out; d++) {
        rc->drafter = rows[d].drafter;
        rc->recs = recs[d];
        summarize(rc, streams, classes, n_classes, &out[d]);
    }
    for (int d = 0; d < n_rows; d++) free(recs[d]);
    rc->recs = NULL;
    return rc_out;
}

/* ---- the run ---------------------------------------------------------------------- */

/* The drafters to measure: "none" first, then what draft-svc offers (or
 * --drafters). Returns the count, or -1 + err. */
static int pick_drafters(specd_rpc_channel *ch, const char *only, char names[][16],
                         specd_error *err) {
    Specd__V1__InfoRequest ireq = SPECD__V1__INFO_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    grpc_status_code code = specd_rpc_unary(ch, CLI_DRAFT_INFO, &ireq.base,
                                            &specd__v1__info__descriptor, &resp, 60000, err);
    if (code != GRPC_STATUS_OK) return -1;
    const Specd__V1__Info *info = (const Specd__V1__Info *)resp;
    /* plain first: every speed-up is relative to it */
    static const char *const order[MAX_DRAFTERS] = {"none", "ngram", "draft_lm", "mlp",
                                                    "mlp_ngram"};
    int n = 0;
    for (int k = 0; k < (int)(sizeof order / sizeof order[0]); k++) {
        int offered = !strcmp(order[k], "none");
        for (size_t j = 0; j < info->n_drafters; j++)
            offered |= !strcmp(info->drafters[j], order[k]);
        int wanted = 1;
        if (only) {
            /* whole comma-separated names only, so "lm" does not match "draft_lm" */
            size_t len = strlen(order[k]);
            wanted = 0;
            for (const char *s = only; s && *s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL)
                if (!strncmp(s, order[k], len) && (s[len] == ',' || s[len] == 0)) wanted = 1;
        }
        if (offered && wanted) snprintf(names[n++], 16, "%s", order[k]);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return n;
}

/* The command line as typed (shell-quoted where needed), so the table can
 * be reproduced exactly. */
/* The table as JSON: {"command", "machine", "threads", "max_new_tokens", "rounds",
 * "rows": [{drafter, streams, tok_s, tok_s_per_stream, tau, accept,
 * ttft_ms, step_draft_ms, step_wait_ms, step_forward_ms, pipelined_drafts,
 * pipelined_hits, round_trips_per_request, speedup,
 * tau_by_class: {class: tau}}]}; with --shared-prefix also
 * "shared_prefix_tokens", "prefix_cache", and per row first_prompt_tokens,
 * ttft_first_ms, n_later, ttft_later_ms, ttft_later_over_first. */
static int write_json(const char *path, int argc, char **argv, const bench_opts *o,
                      int shared_tokens, const cell *cells, int n_cells, char classes[][32],
                      int n_classes, specd_error *err) {
    cJSON *root = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    char cmd[4096];
    size_t k = 0;
    for (int i = 0; i < argc && k < sizeof cmd; i++)
        k += (size_t)snprintf(cmd + k, sizeof cmd - k, "%s%s", i ? " " : "", argv[i]);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    cJSON_AddStringToObject(root, "command", cmd);
    cJSON_AddStringToObject(root, "host", host);
    char cpu_name[256];
    cli_cpu_model(cpu_name, sizeof cpu_name);
    cJSON_AddStringToObject(root, "cpu", cpu_name);
    cJSON_AddNumberToObject(root, "threads", o->threads);
    cJSON_AddNumberToObject(root, "max_new_tokens", o->max_new);
    cJSON_AddNumberToObject(root, "rounds", o->rounds);
    cJSON_AddBoolToObject(root, "interleave", o->interleave);
    if (o->shared_prefix) {
        cJSON_AddNumberToObject(root, "shared_prefix_tokens", shared_tokens);
        cJSON_AddBoolToObject(root, "prefix_cache", !o->no_prefix_cache);
    }
    for (int i = 0; i < n_cells; i++) {
        const cell *c = &cells[i];
        cJSON *r = cJSON_CreateObject(), *bc = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "drafter", c->drafter);
        cJSON_AddNumberToObject(r, "streams", c->streams);
        cJSON_AddNumberToObject(r, "tok_s", c->tok_s);
        cJSON_AddNumberToObject(r, "tok_s_per_stream", c->tok_s_stream);
        cJSON_AddNumberToObject(r, "tau", c->tau);
        if (c->have_accept) cJSON_AddNumberToObject(r, "accept", c->accept);
        cJSON_AddNumberToObject(r, "ttft_ms", c->ttft_ms);
        cJSON_AddNumberToObject(r, "step_draft_ms", c->draft_ms);
        cJSON_AddNumberToObject(r, "step_wait_ms", c->wait_ms);
        cJSON_AddNumberToObject(r, "step_forward_ms", c->fwd_ms);
        cJSON_AddNumberToObject(r, "pipelined_drafts", (double)c->ahead);
        cJSON_AddNumberToObject(r, "pipelined_hits", (double)c->ahead_hits);
        cJSON_AddNumberToObject(r, "round_trips_per_request", c->trips);
        if (c->speedup > 0) cJSON_AddNumberToObject(r, "speedup", c->speedup);
        for (int j = 0; j < n_classes; j++) cJSON_AddNumberToObject(bc, classes[j], c->tau_cls[j]);
        cJSON_AddItemToObject(r, "tau_by_class", bc);
        if (o->shared_prefix) {
            cJSON_AddNumberToObject(r, "first_prompt_tokens", c->first_prompt_tokens);
            cJSON_AddNumberToObject(r, "ttft_first_ms", c->ttft_first_ms);
            cJSON_AddNumberToObject(r, "n_later", c->n_later);
            if (c->n_later) {
                cJSON_AddNumberToObject(r, "ttft_later_ms", c->ttft_later_ms);
                if (c->ttft_first_ms > 0)
                    cJSON_AddNumberToObject(r, "ttft_later_over_first",
                                            c->ttft_later_ms / c->ttft_first_ms);
            }
        }
        cJSON_AddItemToArray(rows, r);
    }
    cJSON_AddItemToObject(root, "rows", rows);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f)) ok = 0;
    free(text);
    if (!ok) return specd_seterr(err, "--json %s: cannot write", path);
    return 0;
}

static void print_command(int argc, char **argv) {
    printf("command: specd");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int plain = *a != 0;
        for (const char *c = a; *c; c++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,/:=+@",
                        *c))
                plain = 0;
        if (plain) {
            printf(" %s", a);
        } else {
            printf(" '");
            for (const char *c = a; *c; c++) {
                if (*c == '\'') printf("'\\''");
                else putchar(*c);
            }
            printf("'");
        }
    }
    printf("\n");
}

/* "1,2,4" into out[0..max) (each in 1..hi), *n its count. -1 when longer. */
static int int_list(const char *opt, const char *val, long hi, int *out, int max, int *n) {
    int32_t *v;
    int k = cli_int_list(opt, val, 1, hi, &v);
    if (k > max) {
        fprintf(stderr, "specd bench: %s takes at most %d values\n", opt, max);
        free(v);
        return -1;
    }
    for (int j = 0; j < k; j++) out[j] = v[j];
    *n = k;
    free(v);
    return 0;
}

/* "0.3,0.5" into o->stop_thresholds (each in 0.001..0.999). */
static int parse_thresholds(const char *opt, const char *val, bench_opts *o) {
    char *buf = strdup(val), *save = NULL;
    if (!buf) {
        fprintf(stderr, "specd bench: out of memory\n");
        return -1;
    }
    o->n_thresholds = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_thresholds == MAX_THRESHOLDS) {
            fprintf(stderr, "specd bench: %s takes at most %d values\n", opt, MAX_THRESHOLDS);
            free(buf);
            return -1;
        }
        o->stop_thresholds[o->n_thresholds++] = (float)cli_float(opt, t, 0.001, 0.999);
    }
    free(buf);
    if (!o->n_thresholds) {
        fprintf(stderr, "specd bench: %s expects a comma-separated list, got '%s'\n", opt, val);
        return -1;
    }
    return 0;
}

/* The table's rows: each drafter, and after mlp one row per extra depth
 * and one per stop threshold (the mlp and depth rows then ask for fixed
 * length explicitly, so a server whose default is adaptive still gives the
 * comparison), then "mlp priced": the server's own adaptive length, the
 * cost policy's trees (tree_choice.h) within --max-shape. -1 + err when
 * either is asked for without the mlp drafter. */
static int build_rows(const bench_opts *o, char names[][16], int n_names, row_spec *rows,
                      specd_error *err) {
    int n = 0, have_mlp = 0;
    for (int d = 0; d < n_names; d++) {
        int mlp = !strcmp(names[d], "mlp");
        have_mlp |= mlp;
        float fixed = mlp && (o->n_thresholds || o->n_depths) ? -1.0f : 0.0f;
        rows[n] = (row_spec){.stop_threshold = fixed};
        snprintf(rows[n].drafter, sizeof rows[n].drafter, "%.15s", names[d]);
        snprintf(rows[n].label, sizeof rows[n].label, "%.15s", names[d]);
        n++;
        for (int k = 0; mlp && k < o->n_depths; k++) {
            rows[n] = (row_spec){.stop_threshold = -1.0f, .depth = o->depths[k]};
            snprintf(rows[n].drafter, sizeof rows[n].drafter, "mlp");
            snprintf(rows[n].label, sizeof rows[n].label, "mlp depth %d", o->depths[k]);
            n++;
        }
        for (int k = 0; mlp && k < o->n_thresholds; k++) {
            rows[n] = (row_spec){.stop_threshold = o->stop_thresholds[k]};
            snprintf(rows[n].drafter, sizeof rows[n].drafter, "mlp");
            snprintf(rows[n].label, sizeof rows[n].label, "mlp adaptive t=%g",
                     (double)o->stop_thresholds[k]);
            n++;
        }
        if (mlp && (o->n_thresholds || o->n_depths)) {
            rows[n] = (row_spec){.priced = 1};
            snprintf(rows[n].drafter, sizeof rows[n].drafter, "mlp");
            snprintf(rows[n].label, sizeof rows[n].label, "mlp priced");
            n++;
        }
    }
    if ((o->n_thresholds || o->n_depths) && !have_mlp)
        return specd_seterr(err, "--stop-thresholds and --depths need the mlp drafter "
                                 "(--speculator DIR, or a --draft server offering it)");
    return n;
}

static int parse(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = SPECD_DEFAULT_MODEL;
    o->max_new = 128;
    o->rounds = 1;
    static const int default_levels[] = {1, 2, 4, 8, 16, 32};
    o->n_levels = 6;
    memcpy(o->levels, default_levels, sizeof default_levels);
    cli_sampling_init(&o->samp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_sampling_option(argc, argv, &i, &o->samp) ||
            cli_tls_option(argc, argv, &i, &o->tls))
            continue;
        if (!strcmp(a, "--e2e")) continue;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--draft-model")) o->draft_model = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--speculator")) o->speculator = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--target")) o->target = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--draft")) o->draft = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--prompts")) o->prompts_file = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--shared-prefix"))
            o->shared_prefix = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--shared-prefix-file"))
            o->shared_prefix_file = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--no-prefix-cache")) o->no_prefix_cache = 1;
        else if (!strcmp(a, "--pipeline")) o->pipeline = 1;
        else if (!strcmp(a, "--max-shape")) o->max_shape = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--kv-cache-dtype")) o->kv_dtype = cli_kv_dtype(a, cli_value(argc, argv, &i));
        else if (!strcmp(a, "--precision")) o->precision = cli_precision(a, cli_value(argc, argv, &i));
        else if (!strcmp(a, "--json")) o->json = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--rounds")) o->rounds = (int)cli_int(a, cli_value(argc, argv, &i), 1, 50);
        else if (!strcmp(a, "--interleave")) o->interleave = 1;
        else if (!strcmp(a, "--per-class"))
            o->per_class = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--drafters")) o->only_drafters = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--accept-head")) o->accept_head = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--stop-thresholds")) {
            if (parse_thresholds(a, cli_value(argc, argv, &i), o)) return 2;
        } else if (!strcmp(a, "--depths")) {
            if (int_list(a, cli_value(argc, argv, &i), 64, o->depths, MAX_DEPTHS, &o->n_depths))
                return 2;
        } else if (!strcmp(a, "--streams")) {
            if (int_list(a, cli_value(argc, argv, &i), 1024, o->levels, MAX_LEVELS, &o->n_levels))
                return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens"))
            o->max_new = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--requests"))
            o->requests = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            o->threads = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--backend")) {
            o->backend = cli_value(argc, argv, &i);
            if (strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda")) {
                fprintf(stderr, "specd bench --e2e: --backend must be cpu or cuda, not '%s'\n",
                        o->backend);
                return 2;
            }
        } else if (!strcmp(a, "--device"))
            o->device = (int)cli_int(a, cli_value(argc, argv, &i), 0, 255);
        else if (!strcmp(a, "--ctx")) o->ctx = (int)cli_int(a, cli_value(argc, argv, &i), 2, 1 << 24);
        else if (!strcmp(a, "--candidates"))
            o->candidates = (int)cli_int(a, cli_value(argc, argv, &i), 1, 64);
        else if (!strcmp(a, "--depth")) o->depth = (int)cli_int(a, cli_value(argc, argv, &i), 1, 64);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 1;
        } else {
            fprintf(stderr, "specd bench --e2e: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (o->draft && (o->target || o->draft_model || o->speculator || o->accept_head)) {
        fprintf(stderr, "specd bench --e2e: with --draft the drafters and targets are that "
                        "draft-svc's; --target, --draft-model, --speculator and --accept-head "
                        "do not apply\n");
        return 2;
    }
    if (o->shared_prefix_file && !o->shared_prefix) {
        fprintf(stderr, "specd bench --e2e: --shared-prefix-file needs --shared-prefix N\n");
        return 2;
    }
    if (o->kv_dtype && (o->draft || o->target)) {
        fprintf(stderr, "specd bench --e2e: --kv-cache-dtype configures the in-process target; "
                        "against --draft or --target, start that target with --kv_cache_dtype\n");
        return 2;
    }
    if (o->precision && (o->draft || o->target)) {
        fprintf(stderr, "specd bench --e2e: --precision configures the in-process target; "
                        "against --draft or --target, start that target with --precision\n");
        return 2;
    }
    if (o->no_prefix_cache && (o->draft || o->target)) {
        fprintf(stderr, "specd bench --e2e: --no-prefix-cache configures the in-process target; "
                        "against --draft or --target, start that target with --limits.prefix_cache=false\n");
        return 2;
    }
    if (o->max_shape && o->draft) {
        fprintf(stderr, "specd bench --e2e: --max-shape configures the in-process draft-svc; "
                        "against --draft, that draft-svc's speculation.max_shape decides\n");
        return 2;
    }
    if (o->pipeline && o->draft) {
        fprintf(stderr, "specd bench --e2e: --pipeline configures the in-process draft-svc; "
                        "against --draft, that draft-svc's speculation.pipeline decides\n");
        return 2;
    }
    if (o->interleave && o->shared_prefix) {
        fprintf(stderr, "specd bench --e2e: --interleave and --shared-prefix do not go together: "
                        "a shared-prefix cell's first request must find nothing cached, and "
                        "the rows' waves take turns on one cache\n");
        return 2;
    }
    if (o->accept_head && !o->speculator) {
        fprintf(stderr, "specd bench --e2e: --accept-head belongs to a --speculator\n");
        return 2;
    }
    return 0;
}

int cmd_bench_e2e(int argc, char **argv) {
    bench_opts o;
    int prc = parse(argc, argv, &o);
    if (prc) return prc == 1 ? 0 : prc;
    specd_error err = {{0}};
    if (specd_sampling_validate(cli_sampling_get(&o.samp), 0, &err)) {
        fprintf(stderr, "specd bench --e2e: %s\n", err.msg);
        return 2;
    }
    prompt *prompts = NULL;
    int n_prompts = 0;
    if (o.prompts_file) {
        if (load_prompts(o.prompts_file, &prompts, &n_prompts, &err)) {
            fprintf(stderr, "specd bench --e2e: %s\n", err.msg);
            return 2;
        }
    } else if (!(prompts = builtin_prompts(&n_prompts))) {
        fprintf(stderr, "specd bench --e2e: out of memory\n");
        return 1;
    }
    if (o.per_class > 0) { /* keep the first per_class of each class, in file order */
        int kept = 0;
        for (int i = 0; i < n_prompts; i++) {
            int seen = 0;
            for (int j = 0; j < kept; j++) seen += !strcmp(prompts[j].cls, prompts[i].cls);
            if (seen < o.per_class) {
                prompt keep = prompts[i];
                prompts[i] = prompts[kept];
                prompts[kept++] = keep;
            }
        }
        for (int i = kept; i < n_prompts; i++) {
            free(prompts[i].name);
            free(prompts[i].cls);
            free(prompts[i].system);
            free(prompts[i].text);
        }
        n_prompts = kept;
    }
    /* prompt classes, in order of first appearance */
    char classes[MAX_CLASSES][32];
    int n_classes = 0;
    for (int i = 0; i < n_prompts; i++) {
        int known = 0;
        for (int c = 0; c < n_classes; c++) known |= !strcmp(classes[c], prompts[i].cls);
        if (!known && n_classes < MAX_CLASSES)
            snprintf(classes[n_classes++], sizeof classes[0], "%s", prompts[i].cls);
    }
    int max_streams = 1;
    for (int k = 0; k < o.n_levels; k++)
        max_streams = o.levels[k] > max_streams ? o.levels[k] : max_streams;
    int requests = o.requests ? o.requests : n_prompts;

    print_command(argc, argv);
    fflush(stdout);
    int status = 1;
    cli_inproc *ip = NULL;
    specd_rpc_channel *ch = NULL;
    cell *cells = NULL;
    char *shared_text = NULL, *shared_cell = NULL; /* --shared-prefix: the text; + a cell's salt */
    size_t shared_cap = 0;
    int shared_tokens = 0;
    const char *draft_addr = o.draft;
    if (!draft_addr) {
        fprintf(stderr, "specd bench: starting %starget-svc and draft-svc in-process...\n",
                o.target ? "(external target) " : "");
        cli_inproc_opts io = {
            .model = o.model,
            .target_addr = o.target,
            .target_tls = o.tls,
            .threads = o.threads,
            .backend = o.backend,
            .device = o.device,
            .max_sessions = max_streams,
            /* room for prompts of up to ~1k tokens (after the shared
             * prefix) plus the output and a tree */
            .ctx = o.ctx ? o.ctx : 1024 + o.shared_prefix + o.max_new,
            .no_prefix_cache = o.no_prefix_cache,
            .pipeline = o.pipeline,
            .max_shape = o.max_shape,
            .kv_dtype = o.kv_dtype,
            .precision = o.precision,
            .ngram = 1,
            .draft_model = o.draft_model,
            .speculator = o.speculator,
            .accept_head = o.accept_head,
        };
        if (!(ip = cli_inproc_start(&io, &err))) goto fail;
        draft_addr = cli_inproc_draft_addr(ip);
    }
    if (o.shared_prefix) {
        const char *path = o.shared_prefix_file ? o.shared_prefix_file : "docs/ARCHITECTURE.md";
        /* the in-process model's tokenizer counts exactly (with an external
         * target too: inproc opens the model file for its tokenizer) */
        if (!(shared_text = build_shared_prefix(path, o.shared_prefix,
                                                ip ? cli_inproc_tokenizer(ip) : NULL,
                                                &shared_tokens, &err)))
            goto fail;
        shared_cap = strlen(shared_text) + 64; /* + the salt line */
        if (!(shared_cell = malloc(shared_cap))) {
            specd_seterr(&err, "out of memory");
            goto fail;
        }
    }
    specd_rpc_channel_opts co = o.tls;
    if (ip) co = (specd_rpc_channel_opts){.insecure = 1}; /* in-process: loopback plaintext */
    co.target = draft_addr;
    if (!(ch = specd_rpc_channel_create(&co, &err))) goto fail;
    char drafters[MAX_DRAFTERS][16];
    int n_drafters = pick_drafters(ch, o.only_drafters, drafters, &err);
    if (n_drafters < 0) goto fail;
    if (n_drafters == 0) {
        specd_seterr(&err, "--drafters '%s' names nothing draft-svc offers", o.only_drafters);
        goto fail;
    }
    row_spec rows[MAX_ROWS];
    int n_rows = build_rows(&o, drafters, n_drafters, rows, &err);
    if (n_rows < 0) goto fail;
    int label_w = 8; /* the table's first column fits every label */
    for (int r = 0; r < n_rows; r++)
        if ((int)strlen(rows[r].label) > label_w) label_w = (int)strlen(rows[r].label);

    char hostname[128] = "?";
    gethostname(hostname, sizeof hostname - 1);
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M", localtime(&now));
    printf("model:   %s%s\n", o.draft ? "(behind --draft) " : o.model,
           o.draft ? o.draft : "");
    printf("services: %s (draft-svc %s%s%s)\n", ip ? "in-process, loopback" : "external",
           draft_addr, o.target ? ", target " : "", o.target ? o.target : "");
    printf("load:    %d prompts (", n_prompts);
    for (int c = 0; c < n_classes; c++) printf("%s%s", c ? ", " : "", classes[c]);
    printf("), %d requests per stream, %d new tokens each, %s, tree %s\n", requests, o.max_new,
           o.samp.s.temperature > 0 ? "sampling" : "greedy",
           o.candidates || o.depth ? "fixed by --candidates/--depth" : "server policy");
    if (o.rounds > 1)
        printf("rounds:  %d, drafter order alternated; each cell: its median round, and the "
               "median of its per-round speed-ups\n", o.rounds);
    if (o.interleave)
        printf("waves:   the drafters of a stream level take turns request by request (one "
               "request per stream each), order turning round every wave\n");
    if (o.shared_prefix)
        printf("shared:  a %d-token system prompt (%s; %s) before every prompt, a new one per "
               "cell; prefix cache %s\n", shared_tokens,
               ip ? "counted by the tokenizer" : "estimated from its length",
               o.shared_prefix_file ? o.shared_prefix_file : "docs/ARCHITECTURE.md",
               o.no_prefix_cache ? "off" : (o.draft || o.target ? "as the target is configured"
                                                                : "on"));
    char threads_s[16];
    snprintf(threads_s, sizeof threads_s, "%d", o.threads ? o.threads : specd_cpu_count());
    printf("machine: %s, %ld CPUs online, %s threads, backend %s%s%s%s, %s\n\n", hostname,
           sysconf(_SC_NPROCESSORS_ONLN), threads_s, o.backend ? o.backend : "cpu",
           o.kv_dtype ? ", KV cache " : "", o.kv_dtype ? specd_kv_dtype_names[o.kv_dtype] : "",
           o.precision ? ", target precision exact" : "", date);
    fflush(stdout);

    run_ctx rc = {.ch = ch, .o = &o, .prompts = prompts, .n_prompts = n_prompts,
                  .requests = requests};
    pthread_mutex_init(&rc.mu, NULL);
    /* runs[(r * n_rows + d) * n_levels + k]: round r, row d, stream level k */
    int n_grid = n_rows * o.n_levels;
    cell *runs = calloc((size_t)(n_grid * o.rounds), sizeof *runs);
    cells = calloc((size_t)n_grid, sizeof *cells);
    if (!cells || !runs) {
        free(runs);
        specd_seterr(&err, "out of memory");
        pthread_mutex_destroy(&rc.mu);
        goto fail;
    }
    int n_cells = n_grid, n_run = 0, ok = 1;
    /* Without a shared prefix, every prompt once before the first cell (not
     * measured, drafter none): the target's prefix cache then holds every
     * prompt for every cell. Without it the grid's first cell paid the
     * prefill of every prompt and the later cells hit the cache, about 15%
     * of a 64-token request's time here, which read as a speed-up of every
     * drafter over plain in the first round. */
    if (!shared_cell) {
        static const row_spec plain = {.drafter = "none", .label = "none"};
        send_as(&rc, &plain); /* rc keeps a pointer to its name: static */
        for (int p = 0; p < rc.n_prompts && ok; p++) {
            req_rec warm;
            if (one_request(&rc, p, 1, &warm, &err) != GRPC_STATUS_OK) ok = 0;
        }
    }
    /* Within a round, each stream level runs every drafter's cell back to
     * back, so that the cells a speed-up compares (a drafter and plain at
     * the same level) are minutes apart at most: with the levels inside
     * each drafter instead, a 1-stream cell ran ten cells after its plain
     * one, and a shared host's drift between them read as a speed-up or a
     * loss (2026-11-30: plain at one stream 144 and 366 tok/s in two
     * rounds of one run). */
    for (int r = 0; r < o.rounds && ok; r++)
        for (int k = 0; k < o.n_levels && ok; k++) {
            if (o.interleave) {
                /* every row's warm-up first, then the rows wave by wave */
                for (int d = 0; d < n_rows && ok; d++)
                    if (warm_row(&rc, &rows[d], &err)) ok = 0;
                cell level[MAX_ROWS];
                if (!ok || run_level_interleaved(&rc, rows, n_rows, o.levels[k], r, classes,
                                                 n_classes, level, &err)) {
                    ok = 0;
                    break;
                }
                for (int d = 0; d < n_rows; d++) {
                    cell *c = &runs[(r * n_rows + d) * o.n_levels + k];
                    *c = level[d];
                    c->drafter = rows[d].label;
                    report_round(o.rounds, r, label_w, c);
                }
                continue;
            }
            for (int i = 0; i < n_rows && ok; i++) {
                /* odd rounds go backwards: a machine that speeds up or slows
                 * down during the run favours no drafter over the others */
                int d = r % 2 ? n_rows - 1 - i : i;
                /* With a shared prefix the warm-up runs set 0, which no cell
                 * uses, so it caches nothing a cell can hit. */
                if (shared_cell) {
                    snprintf(shared_cell, shared_cap, "Reference notes, set 0.\n\n%s",
                             shared_text);
                    rc.shared = shared_cell;
                }
                if (warm_row(&rc, &rows[d], &err)) {
                    ok = 0;
                    break;
                }
                cell *c = &runs[(r * n_rows + d) * o.n_levels + k];
                if (shared_cell) /* a first line of its own: no page of it is cached yet */
                    snprintf(shared_cell, shared_cap, "Reference notes, set %d.\n\n%s", ++n_run,
                             shared_text);
                if (run_cell(&rc, o.levels[k], classes, n_classes, c, &err)) {
                    ok = 0;
                    break;
                }
                c->drafter = rows[d].label;
                report_round(o.rounds, r, label_w, c);
                if (shared_cell)
                    fprintf(stderr, "specd bench:   TTFT first %.1f ms (%d prompt tokens), later "
                                    "%.1f ms (median of %d)\n", c->ttft_first_ms,
                            c->first_prompt_tokens, c->ttft_later_ms, c->n_later);
            }
        }
    /* Each cell: its median round by tok/s (tau, TTFT... of that round), and
     * the median over rounds of its speed-up over the plain cell of the same
     * round and stream level (0 when there is no plain row). */
    int plain_row = -1;
    for (int d = 0; d < n_rows; d++)
        if (!strcmp(rows[d].label, "none")) plain_row = d;
    for (int d = 0; ok && d < n_rows; d++)
        for (int k = 0; k < o.n_levels; k++) {
            double tok[64], sp[64];
            int n_sp = 0;
            for (int r = 0; r < o.rounds; r++) {
                const cell *c = &runs[(r * n_rows + d) * o.n_levels + k];
                tok[r] = c->tok_s;
                if (plain_row >= 0) {
                    double base = runs[(r * n_rows + plain_row) * o.n_levels + k].tok_s;
                    if (base > 0) sp[n_sp++] = c->tok_s / base;
                }
            }
            qsort(tok, (size_t)o.rounds, sizeof tok[0], cmp_double);
            double med = tok[(o.rounds - 1) / 2];
            for (int r = 0; r < o.rounds; r++)
                if (runs[(r * n_rows + d) * o.n_levels + k].tok_s == med) {
                    cells[d * o.n_levels + k] = runs[(r * n_rows + d) * o.n_levels + k];
                    break;
                }
            qsort(sp, (size_t)n_sp, sizeof sp[0], cmp_double);
            cells[d * o.n_levels + k].speedup = n_sp ? sp[(n_sp - 1) / 2] : 0;
        }
    free(runs);
    pthread_mutex_destroy(&rc.mu);
    if (!ok) goto fail;

    printf("| %-*s | streams | tok/s total | tok/s per stream |  tau | accept | trips | TTFT ms "
           "| step ms: draft, wait (fwd) | speed-up | tau by class |%s\n", label_w, "drafter",
           shared_cell ? " TTFT first ms | TTFT later ms | later/first |" : "");
    printf("|");
    for (int k = 0; k < label_w + 2; k++) putchar('-');
    printf("|--------:|------------:|-----------------:|-----:|-------:|------:|--------:"
           "|---------------------------:|---------:|--------------|%s\n",
           shared_cell ? "--------------:|--------------:|------------:|" : "");
    for (int i = 0; i < n_cells; i++) {
        const cell *c = &cells[i];
        char acc[16], sp[16], bycls[160] = "";
        if (c->have_accept) snprintf(acc, sizeof acc, "%5.1f%%", 100 * c->accept);
        else snprintf(acc, sizeof acc, "-");
        if (c->speedup > 0) snprintf(sp, sizeof sp, "%.2fx", c->speedup);
        else snprintf(sp, sizeof sp, "-");
        size_t k = 0;
        for (int j = 0; j < n_classes && k < sizeof bycls; j++)
            k += (size_t)snprintf(bycls + k, sizeof bycls - k, "%s%s %.2f", j ? ", " : "",
                                  classes[j], c->tau_cls[j]);
        char split[48];
        snprintf(split, sizeof split, "%.2f, %.2f (%.2f)", c->draft_ms, c->wait_ms, c->fwd_ms);
        printf("| %-*s | %7d | %11.1f | %16.1f | %4.2f | %6s | %5.1f | %7.1f | %26s | %8s | %s |",
               label_w, c->drafter, c->streams, c->tok_s, c->tok_s_stream, c->tau, acc, c->trips,
               c->ttft_ms, split, sp, bycls);
        if (shared_cell && c->n_later && c->ttft_first_ms > 0)
            printf(" %13.1f | %13.1f | %11.3f |", c->ttft_first_ms, c->ttft_later_ms,
                   c->ttft_later_ms / c->ttft_first_ms);
        else if (shared_cell) /* nobody started after the first request's first token */
            printf(" %13.1f | %13s | %11s |", c->ttft_first_ms, "-", "-");
        printf("\n");
    }
    /* pipelined drafting (draft_lm): how often the guess held */
    int said = 0;
    for (int i = 0; i < n_cells; i++)
        if (cells[i].ahead)
            printf("%s%s at %d streams: %ld trees drafted ahead, %.1f%% used\n",
                   said++ ? "                    " : "\npipelined drafting: ", cells[i].drafter,
                   cells[i].streams, cells[i].ahead,
                   100.0 * (double)cells[i].ahead_hits / (double)cells[i].ahead);
    if (o.json && write_json(o.json, argc, argv, &o, shared_tokens, cells, n_cells, classes,
                             n_classes, &err))
        goto fail;
    status = 0;
    goto out;
fail:
    fprintf(stderr, "specd bench --e2e: %s\n", err.msg);
out:
    free(cells);
    free(shared_text);
    free(shared_cell);
    specd_rpc_channel_free(ch);
    cli_inproc_stop(ip);
    free_prompts(prompts, n_prompts);
    return status;
}
