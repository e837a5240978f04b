/* sampling_proto.h - SamplingParams (the wire form) -> specd_sampling.
 *
 * One conversion for both services, so a request means the same thing to
 * draft-svc's drafters (q) and to target-svc's verifier (p). The unset-field
 * conventions of the proto (top_p 0 = off, repetition_penalty 0 = off, a
 * missing message = greedy) are resolved here. */
#ifndef SPECD_SAMPLING_PROTO_H
#define SPECD_SAMPLING_PROTO_H

#include "common/util/error.h"
#include "common/spec/sampling.h"
#include "specd.pb-c.h"

/* Holds the logit-bias arrays the converted specd_sampling points into. */
typedef struct specd_sampling_owned {
    specd_sampling s;
    int32_t *bias_ids;
    float *bias_values;
} specd_sampling_owned;

/* Converts p (NULL = greedy) and validates the result against vocab
 * (specd_sampling_validate). 0, or -1 + err naming the field
 * ("request.sampling.top_p must be ..."); field is the prefix. */
int specd_sampling_from_proto(const Specd__V1__SamplingParams *p, int vocab, const char *field,
                              specd_sampling_owned *out, specd_error *err);
void specd_sampling_owned_free(specd_sampling_owned *o);

#endif
