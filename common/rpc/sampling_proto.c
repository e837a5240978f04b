/* sampling_proto.c - SamplingParams -> specd_sampling (sampling_proto.h). */
#include "common/rpc/sampling_proto.h"

#include <stdlib.h>
#include <string.h>

int specd_sampling_from_proto(const Specd__V1__SamplingParams *p, int vocab, const char *field,
                              specd_sampling_owned *out, specd_error *err) {
    memset(out, 0, sizeof *out);
    specd_sampling *s = &out->s;
    specd_sampling_init(s);
    s->temperature = 0.0f; /* a missing message means greedy */
    if (p) {
        s->temperature = p->temperature;
        s->top_k = p->top_k;
        s->top_p = p->top_p == 0.0f ? 1.0f : p->top_p;
        s->min_p = p->min_p;
        s->seed = p->seed;
        /* out-of-range enum values (proto3 keeps unknown ones) fail validate */
        s->method = (specd_sampling_method)p->method;
        s->repetition_penalty = p->repetition_penalty; /* 0 and 1 both mean off */
        s->frequency_penalty = p->frequency_penalty;
        s->presence_penalty = p->presence_penalty;
        if (p->n_logit_bias > SPECD_MAX_LOGIT_BIAS)
            return specd_seterr(err, "%s.logit_bias has %zu entries, at most %d are allowed",
                                field, p->n_logit_bias, SPECD_MAX_LOGIT_BIAS);
        if (p->n_logit_bias) {
            out->bias_ids = malloc(sizeof(int32_t) * p->n_logit_bias);
            out->bias_values = malloc(sizeof(float) * p->n_logit_bias);
            if (!out->bias_ids || !out->bias_values) {
                specd_sampling_owned_free(out);
                return specd_seterr(err, "out of memory");
            }
            for (size_t i = 0; i < p->n_logit_bias; i++) {
                out->bias_ids[i] = p->logit_bias[i]->token_id;
                out->bias_values[i] = p->logit_bias[i]->bias;
            }
            s->n_logit_bias = (int)p->n_logit_bias;
            s->bias_ids = out->bias_ids;
            s->bias_values = out->bias_values;
        }
    }
    specd_error e2 = {{0}};
    if (specd_sampling_validate(s, vocab, &e2)) {
        /* validate names the bare field ("top_p must be ..."): qualify it */
        specd_sampling_owned_free(out);
        return specd_seterr(err, "%s.%s", field, e2.msg);
    }
    return 0;
}

void specd_sampling_owned_free(specd_sampling_owned *o) {
    free(o->bias_ids);
    free(o->bias_values);
    memset(o, 0, sizeof *o);
}
