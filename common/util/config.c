/* config.c - see config.h.
 *
 * Layout of this file:
 *   1. small helpers (field access, string lists, quoting text for messages)
 *   2. value parsing: text -> typed value, shared by defaults, YAML and flags
 *   3. describing types and formatting values (errors, help, dump)
 *   4. schema checks and defaults
 *   5. the YAML reader (libyaml's event API)
 *   6. command-line flags and specd_config_load
 *   7. help and dump
 *
 * The YAML reader walks libyaml events instead of building a document tree:
 * nothing is materialized beyond the event at hand, so the first disallowed
 * construct (an alias, an unknown key, a list where a number belongs) stops
 * parsing before the rest of the input costs anything. */
#include "common/util/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "common/util/utf8.h"

/* ===================================================================== *
 * 1. Small helpers
 * ===================================================================== */

static void *field_ptr(void *cfg, const specd_cfg_field *f) { return (char *)cfg + f->offset; }

static const void *field_cptr(const void *cfg, const specd_cfg_field *f) {
    return (const char *)cfg + f->offset;
}

static char *dup_n(const char *s, size_t len) {
    char *p = malloc(len + 1);
    if (!p) return NULL;
    memcpy(p, s, len);
    p[len] = 0;
    return p;
}

static void strlist_clear(specd_cfg_strlist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

/* Appends a copy of s[0..len). *cap tracks the allocation so that long lists
 * from a file grow geometrically; pass a cap of l->n for a list whose
 * allocation is exact (every list stored in a config struct). */
static int strlist_push(specd_cfg_strlist *l, size_t *cap, const char *s, size_t len) {
    if (l->n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 4;
        char **items = realloc(l->items, ncap * sizeof *items);
        if (!items) return -1;
        l->items = items;
        *cap = ncap;
    }
    char *copy = dup_n(s, len);
    if (!copy) return -1;
    l->items[l->n++] = copy;
    return 0;
}

/* Case-insensitive comparison of s[0..len) with a NUL-terminated word. */
static bool text_is(const char *s, size_t len, const char *word) {
    return strlen(word) == len && strncasecmp(s, word, len) == 0;
}

/* Writes a printable, bounded rendering of untrusted text for an error
 * message: control bytes become \xNN and anything past 60 bytes becomes
 * "...", so a hostile value cannot flood or garble the log. */
static const char *show_text(char *buf, size_t cap, const char *s, size_t len) {
    size_t o = 0, limit = 60;
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        if (i == limit) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '\'')
            o += (size_t)snprintf(buf + o, cap - o, c == '\'' ? "\\'" : "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    buf[o] = 0;
    return buf;
}

/* Levenshtein distance, or SIZE_MAX when either side is too long to bother
 * (suggestions are for typos in names, which are short). */
static size_t edit_distance(const char *a, size_t la, const char *b, size_t lb) {
    enum { CAP = 64 };
    if (la > CAP || lb > CAP) return SIZE_MAX;
    size_t row[CAP + 1];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The field or section name closest to an unknown name, if it is close
 * enough to be a plausible typo; writes its length to *out_len. Sections
 * are the dotted prefixes of field names ("limits" of "limits.x"). */
static const char *suggest_name(const specd_cfg_field *fields, size_t n, const char *s,
                                size_t len, size_t *out_len) {
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        const char *name = fields[i].name;
        for (size_t k = 1;; k++) {
            if (name[k] != '.' && name[k] != 0) continue;
            /* Only a distance of at most 2 is ever suggested (below), and the
             * distance is at least the difference in length, so a name 3 or
             * more longer or shorter is skipped without filling the table:
             * the answer cannot change (such a name never beats one within
             * 2 edits, and when none is within 2 nothing is suggested). The
             * config fuzzer spent a sixth of its time in this loop, since
             * nearly every key it makes up is unknown. */
            size_t d = len > k + 2 || k > len + 2 ? SIZE_MAX : edit_distance(s, len, name, k);
            if (d < best_d) {
                best_d = d;
                best = name;
                *out_len = k;
            }
            if (name[k] == 0) break;
        }
    }
    /* at most two edits, and fewer than half the name, so "ab" never
     * suggests "cd" */
    if (best && best_d > 0 && best_d <= 2 && best_d * 2 < *out_len) return best;
    return NULL;
}

/* Writes " (did you mean 'x'?)" (with the given prefix, "" or "--") or "". */
static void suggestion_text(char *buf, size_t cap, const specd_cfg_field *fields, size_t n,
                            const char *s, size_t len, const char *prefix) {
    size_t slen = 0;
    const char *sug = suggest_name(fields, n, s, len, &slen);
    if (sug)
        snprintf(buf, cap, " (did you mean '%s%.*s'?)", prefix, (int)slen, sug);
    else
        buf[0] = 0;
}

/* The field named exactly s[0..len), or NULL. */
static const specd_cfg_field *find_field(const specd_cfg_field *fields, size_t n, const char *s,
                                         size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(fields[i].name) == len && memcmp(fields[i].name, s, len) == 0)
            return &fields[i];
    return NULL;
}

/* True if s[0..len) names a section: some field is called "s.<something>". */
static bool is_section(const specd_cfg_field *fields, size_t n, const char *s, size_t len) {
    if (memchr(s, 0, len)) return false; /* strncmp would stop at the NUL */
    for (size_t i = 0; i < n; i++)
        if (strncmp(fields[i].name, s, len) == 0 && fields[i].name[len] == '.') return true;
    return false;
}

/* ===================================================================== *
 * 2. Value parsing
 * ===================================================================== */

/* PARSE_RANGE: the text has the right shape but the value is out of the
 * field's bounds (or of the C type); errors then show the text as written.
 * PARSE_BAD: the text is not a value of the type at all; errors quote it. */
typedef enum { PARSE_OK, PARSE_BAD, PARSE_RANGE, PARSE_NOMEM } parse_status;

typedef union cfg_value {
    char *s;
    int64_t i;
    double d;
    bool b;
    int e;
    uint64_t u;
} cfg_value;

static bool has_bounds(const specd_cfg_field *f) { return f->min != 0 || f->max != 0; }

static bool has_fbounds(const specd_cfg_field *f) { return f->fmin != 0 || f->fmax != 0; }

/* Optional sign, then decimal digits or 0x hex digits (YAML 1.2 core). */
static parse_status parse_int64(const char *s, size_t len, int64_t *out) {
    size_t i = 0;
    bool neg = false;
    if (i < len && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
    unsigned base = 10;
    if (len - i > 2 && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
        base = 16;
        i += 2;
    }
    if (i == len) return PARSE_BAD;
    uint64_t mag = 0;
    bool overflow = false;
    for (; i < len; i++) {
        int c = (unsigned char)s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (base == 16 && isxdigit(c)) d = tolower(c) - 'a' + 10;
        else return PARSE_BAD;
        if (mag > (UINT64_MAX - (unsigned)d) / base) overflow = true;
        else mag = mag * base + (unsigned)d;
    }
    /* the magnitude of INT64_MIN is INT64_MAX + 1 */
    if (overflow || mag > (uint64_t)INT64_MAX + neg) return PARSE_RANGE;
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return PARSE_OK;
}

/* A plain decimal literal: [+-] digits [. digits] [e [+-] digits], or one
 * starting with '.'; nothing else (no hex floats, no inf/nan words). */
static bool is_decimal_literal(const char *s, size_t len) {
    size_t i = 0, digits = 0;
    if (i < len && (s[i] == '-' || s[i] == '+')) i++;
    while (i < len && isdigit((unsigned char)s[i])) i++, digits++;
    if (i < len && s[i] == '.') {
        i++;
        while (i < len && isdigit((unsigned char)s[i])) i++, digits++;
    }
    if (!digits) return false;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '-' || s[i] == '+')) i++;
        size_t exp_digits = 0;
        while (i < len && isdigit((unsigned char)s[i])) i++, exp_digits++;
        if (!exp_digits) return false;
    }
    return i == len;
}

static parse_status parse_double(const char *s, size_t len, double *out) {
    char buf[128];
    if (len >= sizeof buf || !is_decimal_literal(s, len)) return PARSE_BAD;
    memcpy(buf, s, len);
    buf[len] = 0;
    double v = strtod(buf, NULL);
    if (!isfinite(v)) return PARSE_RANGE;
    *out = v;
    return PARSE_OK;
}

static parse_status parse_bool(const char *s, size_t len, bool *out) {
    if (text_is(s, len, "true") || text_is(s, len, "yes") || text_is(s, len, "on")) {
        *out = true;
        return PARSE_OK;
    }
    if (text_is(s, len, "false") || text_is(s, len, "no") || text_is(s, len, "off")) {
        *out = false;
        return PARSE_OK;
    }
    return PARSE_BAD;
}

static parse_status parse_enum(const specd_cfg_field *f, const char *s, size_t len, int *out) {
    for (int i = 0; f->choices[i]; i++) {
        if (text_is(s, len, f->choices[i])) {
            *out = i;
            return PARSE_OK;
        }
    }
    return PARSE_BAD;
}

/* An unsigned decimal number "12" or "1.5" at s[*pos]: integer part and a
 * fraction kept as frac / 10^fdigits with trailing zeros dropped. Fractions
 * beyond 6 significant digits are refused: no duration or size a person
 * writes needs them, and the cap keeps the exact arithmetic in 64 bits. */
typedef struct decimal {
    uint64_t whole;
    uint64_t frac;
    unsigned fdigits;
} decimal;

static parse_status scan_decimal(const char *s, size_t len, size_t *pos, decimal *d) {
    size_t i = *pos, digits = 0;
    bool overflow = false;
    *d = (decimal){0, 0, 0};
    for (; i < len && isdigit((unsigned char)s[i]); i++, digits++) {
        unsigned dig = (unsigned)(s[i] - '0');
        if (d->whole > (UINT64_MAX - dig) / 10) overflow = true;
        else d->whole = d->whole * 10 + dig;
    }
    if (i < len && s[i] == '.') {
        size_t start = ++i, last_nonzero = i;
        for (; i < len && isdigit((unsigned char)s[i]); i++, digits++)
            if (s[i] != '0') last_nonzero = i + 1;
        if (last_nonzero - start > 6) return PARSE_BAD;
        for (size_t k = start; k < last_nonzero; k++) {
            d->frac = d->frac * 10 + (unsigned)(s[k] - '0');
            d->fdigits++;
        }
    }
    if (!digits) return PARSE_BAD;
    *pos = i;
    return overflow ? PARSE_RANGE : PARSE_OK;
}

/* d * mult exactly, as an integer: PARSE_BAD when the result has a fraction
 * ("0.5ms"), PARSE_RANGE when it does not fit in 64 bits. */
static parse_status scale_exact(const decimal *d, uint64_t mult, uint64_t *out) {
    uint64_t pow10 = 1;
    for (unsigned k = 0; k < d->fdigits; k++) pow10 *= 10;
    /* frac < 10^6 and mult <= 2^40, so the product fits */
    uint64_t fscaled = d->frac * mult;
    if (fscaled % pow10) return PARSE_BAD;
    if (d->whole > UINT64_MAX / mult) return PARSE_RANGE;
    uint64_t v = d->whole * mult, add = fscaled / pow10;
    if (v > UINT64_MAX - add) return PARSE_RANGE;
    *out = v + add;
    return PARSE_OK;
}

typedef struct unit {
    const char *name;
    uint64_t mult;
} unit;

static const unit DURATION_UNITS[] = {
    {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {NULL, 0},
};

/* Longest unit name at s[*pos] (so "ms" wins over "m"), matched exactly for
 * durations and ignoring case for sizes. */
static const unit *scan_unit(const unit *units, const char *s, size_t len, size_t *pos,
                             bool ignore_case) {
    const unit *best = NULL;
    size_t best_len = 0;
    for (const unit *u = units; u->name; u++) {
        size_t ul = strlen(u->name);
        if (ul > len - *pos || ul <= best_len) continue;
        int cmp = ignore_case ? strncasecmp(s + *pos, u->name, ul) : strncmp(s + *pos, u->name, ul);
        if (cmp == 0) {
            best = u;
            best_len = ul;
        }
    }
    if (best) *pos += best_len;
    return best;
}

/* One or more <number><unit> parts ("1h30m", "250ms", "1.5s"), or a bare
 * "0". Bare numbers are refused otherwise: "5" could mean 5 ms or 5 s. */
static parse_status parse_duration(const char *s, size_t len, int64_t *out) {
    if (text_is(s, len, "0")) {
        *out = 0;
        return PARSE_OK;
    }
    size_t pos = 0;
    uint64_t total = 0;
    bool range = false;
    if (len == 0) return PARSE_BAD;
    while (pos < len) {
        decimal d;
        parse_status st = scan_decimal(s, len, &pos, &d);
        if (st == PARSE_BAD) return st;
        const unit *u = scan_unit(DURATION_UNITS, s, len, &pos, false);
        if (!u) return PARSE_BAD;
        uint64_t part = 0;
        if (st == PARSE_OK) st = scale_exact(&d, u->mult, &part);
        if (st == PARSE_BAD) return st;
        if (st == PARSE_RANGE || part > (uint64_t)INT64_MAX - total) range = true;
        else total += part;
    }
    if (range) return PARSE_RANGE;
    *out = (int64_t)total;
    return PARSE_OK;
}

static const unit SIZE_UNITS[] = {
    {"B", 1},
    {"KB", 1000ull},
    {"MB", 1000000ull},
    {"GB", 1000000000ull},
    {"TB", 1000000000000ull},
    {"KiB", 1ull << 10},
    {"MiB", 1ull << 20},
    {"GiB", 1ull << 30},
    {"TiB", 1ull << 40},
    {NULL, 0},
};

/* A number of bytes, optionally with a unit ("512MiB", "4GB", "1.5 GiB",
 * "1048576"). Units ignore case: "kb" and "kB" are both 1000 bytes. */
static parse_status parse_size(const char *s, size_t len, uint64_t *out) {
    size_t pos = 0;
    decimal d;
    parse_status st = scan_decimal(s, len, &pos, &d);
    if (st == PARSE_BAD) return st;
    if (pos < len && s[pos] == ' ') pos++;
    uint64_t mult = 1;
    if (pos < len) {
        const unit *u = scan_unit(SIZE_UNITS, s, len, &pos, true);
        if (!u || pos != len) return PARSE_BAD;
        mult = u->mult;
    } else if (s[pos - 1] == ' ') {
        return PARSE_BAD;
    }
    if (st == PARSE_RANGE) return st;
    return scale_exact(&d, mult, out);
}

/* Bounds check for INT64 and DURATION values. */
static parse_status check_i64(const specd_cfg_field *f, int64_t v) {
    if (has_bounds(f) && (v < f->min || v > f->max)) return PARSE_RANGE;
    return PARSE_OK;
}

static parse_status check_u64(const specd_cfg_field *f, uint64_t v) {
    if (!has_bounds(f)) return PARSE_OK;
    if (f->min > 0 && v < (uint64_t)f->min) return PARSE_RANGE;
    if (f->max < 0 || v > (uint64_t)f->max) return PARSE_RANGE;
    return PARSE_OK;
}

/* Text -> value for every scalar type (not STRLIST, whose items are plain
 * strings). A STRING result is a malloc'd copy. */
static parse_status parse_value(const specd_cfg_field *f, const char *s, size_t len,
                                cfg_value *v) {
    parse_status st;
    switch (f->type) {
    case SPECD_CFG_STRING:
        v->s = dup_n(s, len);
        return v->s ? PARSE_OK : PARSE_NOMEM;
    case SPECD_CFG_INT64:
        st = parse_int64(s, len, &v->i);
        return st == PARSE_OK ? check_i64(f, v->i) : st;
    case SPECD_CFG_DOUBLE:
        st = parse_double(s, len, &v->d);
        if (st == PARSE_OK && has_fbounds(f) && !(v->d >= f->fmin && v->d <= f->fmax))
            st = PARSE_RANGE;
        return st;
    case SPECD_CFG_BOOL:
        return parse_bool(s, len, &v->b);
    case SPECD_CFG_ENUM:
        return parse_enum(f, s, len, &v->e);
    case SPECD_CFG_DURATION:
        st = parse_duration(s, len, &v->i);
        return st == PARSE_OK ? check_i64(f, v->i) : st;
    case SPECD_CFG_SIZE:
        st = parse_size(s, len, &v->u);
        return st == PARSE_OK ? check_u64(f, v->u) : st;
    case SPECD_CFG_STRLIST:
        break;
    }
    return PARSE_BAD;
}

/* Stores a parsed value, freeing the string it replaces. */
static void store_value(const specd_cfg_field *f, void *cfg, const cfg_value *v) {
    void *p = field_ptr(cfg, f);
    switch (f->type) {
    case SPECD_CFG_STRING:
        free(*(char **)p);
        *(char **)p = v->s;
        break;
    case SPECD_CFG_INT64:
    case SPECD_CFG_DURATION:
        *(int64_t *)p = v->i;
        break;
    case SPECD_CFG_DOUBLE:
        *(double *)p = v->d;
        break;
    case SPECD_CFG_BOOL:
        *(bool *)p = v->b;
        break;
    case SPECD_CFG_ENUM:
        *(int *)p = v->e;
        break;
    case SPECD_CFG_SIZE:
        *(uint64_t *)p = v->u;
        break;
    case SPECD_CFG_STRLIST:
        break;
    }
}

static void store_list(const specd_cfg_field *f, void *cfg, specd_cfg_strlist *list) {
    specd_cfg_strlist *dst = field_ptr(cfg, f);
    strlist_clear(dst);
    *dst = *list;
    *list = (specd_cfg_strlist){NULL, 0};
}

/* ===================================================================== *
 * 3. Describing types, formatting values
 * ===================================================================== */

/* "1h2m3s4ms"; every unit that is not zero, largest first. */
static void format_duration(char *buf, size_t cap, int64_t ms) {
    if (ms <= 0) {
        snprintf(buf, cap, "%" PRId64 "ms", ms);
        return;
    }
    size_t o = 0;
    buf[0] = 0;
    for (int i = 3; i >= 0; i--) {
        uint64_t mult = DURATION_UNITS[i].mult;
        uint64_t k = (uint64_t)ms / mult;
        ms -= (int64_t)(k * mult);
        if (k && o < cap)
            o += (size_t)snprintf(buf + o, cap - o, "%" PRIu64 "%s", k, DURATION_UNITS[i].name);
    }
}

/* The unit that writes the value with the smallest exact number (4000000000
 * is "4GB", 536870912 is "512MiB"), or plain bytes. */
static void format_size(char *buf, size_t cap, uint64_t bytes) {
    const unit *best = NULL;
    for (const unit *u = SIZE_UNITS + 1; u->name; u++)
        if (bytes && bytes % u->mult == 0 && (!best || u->mult > best->mult)) best = u;
    if (best)
        snprintf(buf, cap, "%" PRIu64 "%s", bytes / best->mult, best->name);
    else
        snprintf(buf, cap, "%" PRIu64, bytes);
}

/* Shortest %g rendering that reads back as the same double. */
static void format_double(char *buf, size_t cap, double v) {
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* " in 1..1024", " >= 1", " <= 5" or "" for an int64-bounded field, with
 * values written by fmt. */
static void format_bounds(char *buf, size_t cap, const specd_cfg_field *f,
                          void (*fmt)(char *, size_t, const specd_cfg_field *, int64_t)) {
    char lo[48], hi[48];
    buf[0] = 0;
    if (!has_bounds(f)) return;
    fmt(lo, sizeof lo, f, f->min);
    fmt(hi, sizeof hi, f, f->max);
    if (f->max == INT64_MAX)
        snprintf(buf, cap, " >= %s", lo);
    else if (f->min == INT64_MIN || (f->type == SPECD_CFG_SIZE && f->min <= 0))
        snprintf(buf, cap, " <= %s", hi);
    else
        snprintf(buf, cap, " in %s..%s", lo, hi);
}

static void fmt_bound(char *buf, size_t cap, const specd_cfg_field *f, int64_t v) {
    if (f->type == SPECD_CFG_DURATION) format_duration(buf, cap, v);
    else if (f->type == SPECD_CFG_SIZE) format_size(buf, cap, v < 0 ? 0 : (uint64_t)v);
    else snprintf(buf, cap, "%" PRId64, v);
}

static void format_fbounds(char *buf, size_t cap, const specd_cfg_field *f) {
    char lo[40], hi[40];
    buf[0] = 0;
    if (!has_fbounds(f)) return;
    format_double(lo, sizeof lo, f->fmin);
    format_double(hi, sizeof hi, f->fmax);
    if (isinf(f->fmax))
        snprintf(buf, cap, " >= %s", lo);
    else if (isinf(f->fmin))
        snprintf(buf, cap, " <= %s", hi);
    else
        snprintf(buf, cap, " in %s..%s", lo, hi);
}

/* "a|b|c" */
static void format_choices(char *buf, size_t cap, const specd_cfg_field *f) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; f->choices[i] && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? "|" : "", f->choices[i]);
}

/* What a field expects, for "'x' expects <this>, got ...". */
static void describe_type(char *buf, size_t cap, const specd_cfg_field *f) {
    char extra[200];
    switch (f->type) {
    case SPECD_CFG_STRING:
        snprintf(buf, cap, "a string");
        return;
    case SPECD_CFG_INT64:
        format_bounds(extra, sizeof extra, f, fmt_bound);
        snprintf(buf, cap, "an integer%s", extra);
        return;
    case SPECD_CFG_DOUBLE:
        format_fbounds(extra, sizeof extra, f);
        snprintf(buf, cap, "a number%s", extra);
        return;
    case SPECD_CFG_BOOL:
        snprintf(buf, cap, "true or false");
        return;
    case SPECD_CFG_ENUM:
        format_choices(extra, sizeof extra, f);
        snprintf(buf, cap, "one of %s", extra);
        return;
    case SPECD_CFG_DURATION:
        format_bounds(extra, sizeof extra, f, fmt_bound);
        snprintf(buf, cap, "a duration%s", has_bounds(f) ? extra : " like 5ms");
        return;
    case SPECD_CFG_SIZE:
        format_bounds(extra, sizeof extra, f, fmt_bound);
        snprintf(buf, cap, "a size%s", has_bounds(f) ? extra : " like 512MiB or 4GB");
        return;
    case SPECD_CFG_STRLIST:
        snprintf(buf, cap, "a list of strings");
        return;
    }
    snprintf(buf, cap, "a value");
}

/* "<where>: 'name' expects <type>, got <text>". Out-of-range values are shown
 * as written (got -4); text that is not of the type at all is quoted. */
static int value_error(specd_error *err, const char *where, const specd_cfg_field *f,
                       const char *s, size_t len, parse_status st) {
    if (st == PARSE_NOMEM) return specd_seterr(err, "%s: out of memory", where);
    char want[300], got[256];
    describe_type(want, sizeof want, f);
    show_text(got, sizeof got, s, len);
    if (st == PARSE_RANGE)
        return specd_seterr(err, "%s: '%s' expects %s, got %s", where, f->name, want, got);
    return specd_seterr(err, "%s: '%s' expects %s, got '%s'", where, f->name, want, got);
}

/* ===================================================================== *
 * 4. Schema checks and defaults
 * ===================================================================== */

/* Names are dot-separated components of [A-Za-z0-9_-], so every name is a
 * usable flag and a plain YAML key. */
static int check_name(const char *name, specd_error *err) {
    if (!name || !*name) return specd_seterr(err, "config schema: a field has no name");
    size_t depth = 1;
    for (const char *p = name; *p; p++) {
        if (*p == '.') {
            if (p == name || p[1] == '.' || p[1] == 0)
                return specd_seterr(err, "config schema: '%s' has an empty component", name);
            depth++;
        } else if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-') {
            return specd_seterr(err, "config schema: '%s' has a character other than "
                                     "letters, digits, '_', '-' and '.'", name);
        }
    }
    if (depth > SPECD_CONFIG_MAX_DEPTH)
        return specd_seterr(err, "config schema: '%s' is nested deeper than %d levels", name,
                            SPECD_CONFIG_MAX_DEPTH);
    /* --config and --help are the loader's own flags */
    if (!strcmp(name, "config") || !strcmp(name, "help"))
        return specd_seterr(err, "config schema: '%s' is a reserved flag name", name);
    return 0;
}

static int check_field(const specd_cfg_field *fields, size_t n, size_t i, specd_error *err) {
    const specd_cfg_field *f = &fields[i];
    if (check_name(f->name, err)) return -1;
    if ((unsigned)f->type > SPECD_CFG_STRLIST)
        return specd_seterr(err, "config schema: '%s' has an unknown type", f->name);
    if (f->type == SPECD_CFG_ENUM && (!f->choices || !f->choices[0]))
        return specd_seterr(err, "config schema: enum '%s' has no choices", f->name);
    if (has_bounds(f) && f->min > f->max)
        return specd_seterr(err, "config schema: '%s' has min > max", f->name);
    if (has_fbounds(f) && !(f->fmin <= f->fmax))
        return specd_seterr(err, "config schema: '%s' has fmin > fmax", f->name);
    for (size_t j = 0; j < i; j++) {
        if (!strcmp(fields[j].name, f->name))
            return specd_seterr(err, "config schema: '%s' is listed twice", f->name);
    }
    /* a name cannot be both a value and a section: "a" and "a.b" */
    if (is_section(fields, n, f->name, strlen(f->name)))
        return specd_seterr(err, "config schema: '%s' is both a field and a section", f->name);
    return 0;
}

/* Appends the items of "a,b,c" to out (an empty text adds nothing). An
 * empty item ("a,,b", "a,") is refused as a typo. */
static parse_status split_list(const char *s, specd_cfg_strlist *out, size_t *cap) {
    size_t len = strlen(s);
    if (!len) return PARSE_OK;
    for (size_t start = 0;;) {
        const char *comma = memchr(s + start, ',', len - start);
        size_t end = comma ? (size_t)(comma - s) : len;
        if (end == start) return PARSE_BAD;
        if (strlist_push(out, cap, s + start, end - start)) return PARSE_NOMEM;
        if (!comma) return PARSE_OK;
        start = end + 1;
    }
}

/* Moves every item of src to the end of dst (src ends empty). */
static int strlist_move_append(specd_cfg_strlist *dst, specd_cfg_strlist *src) {
    if (!src->n) return 0;
    char **items = realloc(dst->items, (dst->n + src->n) * sizeof *items);
    if (!items) return -1;
    memcpy(items + dst->n, src->items, src->n * sizeof *items);
    dst->items = items;
    dst->n += src->n;
    free(src->items);
    *src = (specd_cfg_strlist){NULL, 0};
    return 0;
}

/* A STRLIST from "a,b,c" text: replaces the list, or extends it when append
 * is set. Nothing changes unless the whole text is good. */
static int set_list_from_text(const specd_cfg_field *f, void *cfg, const char *text, bool append,
                              const char *where, specd_error *err) {
    specd_cfg_strlist fresh = {NULL, 0};
    size_t cap = 0;
    parse_status st = split_list(text, &fresh, &cap);
    if (st == PARSE_OK && append && strlist_move_append(field_ptr(cfg, f), &fresh))
        st = PARSE_NOMEM;
    if (st != PARSE_OK) {
        strlist_clear(&fresh);
        if (st == PARSE_BAD)
            return specd_seterr(err, "%s: '%s' has an empty item in '%s'", where, f->name, text);
        return specd_seterr(err, "%s: out of memory", where);
    }
    if (!append) store_list(f, cfg, &fresh);
    return 0;
}

/* Sets one field from text (a default or a flag value). */
static int set_from_text(const specd_cfg_field *f, void *cfg, const char *text, bool append,
                         const char *where, specd_error *err) {
    if (f->type == SPECD_CFG_STRLIST) return set_list_from_text(f, cfg, text, append, where, err);
    cfg_value v;
    parse_status st = parse_value(f, text, strlen(text), &v);
    if (st != PARSE_OK) return value_error(err, where, f, text, strlen(text), st);
    store_value(f, cfg, &v);
    return 0;
}

/* Zero value of a field (what a NULL default means). */
static void set_zero(const specd_cfg_field *f, void *cfg) {
    void *p = field_ptr(cfg, f);
    switch (f->type) {
    case SPECD_CFG_STRING: *(char **)p = NULL; break;
    case SPECD_CFG_INT64:
    case SPECD_CFG_DURATION: *(int64_t *)p = 0; break;
    case SPECD_CFG_DOUBLE: *(double *)p = 0; break;
    case SPECD_CFG_BOOL: *(bool *)p = false; break;
    case SPECD_CFG_ENUM: *(int *)p = 0; break;
    case SPECD_CFG_SIZE: *(uint64_t *)p = 0; break;
    case SPECD_CFG_STRLIST: *(specd_cfg_strlist *)p = (specd_cfg_strlist){NULL, 0}; break;
    }
}

int specd_config_defaults(const specd_cfg_field *fields, size_t n, void *out,
                          specd_error *err) {
    for (size_t i = 0; i < n; i++)
        if (check_field(fields, n, i, err)) return -1;
    /* zero everything first so that a bad default can be cleaned up with
     * specd_config_free whatever fields were already set */
    for (size_t i = 0; i < n; i++) set_zero(&fields[i], out);
    for (size_t i = 0; i < n; i++) {
        if (!fields[i].def) continue;
        if (set_from_text(&fields[i], out, fields[i].def, false, "config schema default", err)) {
            specd_config_free(fields, n, out);
            return -1;
        }
    }
    return 0;
}

void specd_config_free(const specd_cfg_field *fields, size_t n, void *out) {
    for (size_t i = 0; i < n; i++) {
        void *p = field_ptr(out, &fields[i]);
        if (fields[i].type == SPECD_CFG_STRING) {
            free(*(char **)p);
            *(char **)p = NULL;
        } else if (fields[i].type == SPECD_CFG_STRLIST) {
            strlist_clear(p);
        }
    }
}

/* ===================================================================== *
 * 5. The YAML reader
 * ===================================================================== */

/* A key path set in this document, for duplicate detection. */
typedef struct seen_key {
    char *path;
    size_t len;
    size_t line;
} seen_key;

typedef struct yaml_loader {
    const specd_cfg_field *fields;
    size_t n;
    void *out;
    const char *name; /* file name for messages */
    specd_error *err;
    yaml_parser_t parser;
    yaml_event_t ev; /* the current event, valid while have_ev */
    bool have_ev;
    seen_key *seen;
    size_t n_seen, cap_seen;
} yaml_loader;

static size_t ev_line(const yaml_loader *L) { return L->ev.start_mark.line + 1; }

static int syntax_error(yaml_loader *L) {
    const yaml_parser_t *p = &L->parser;
    const char *problem = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_MEMORY_ERROR) return specd_seterr(L->err, "%s: out of memory", L->name);
    /* the reader (encoding checks) reports a byte offset, not a mark */
    if (p->error == YAML_READER_ERROR)
        return specd_seterr(L->err, "%s: invalid text at byte %zu: %s", L->name,
                            p->problem_offset, problem);
    if (p->context)
        return specd_seterr(L->err, "%s:%zu:%zu: YAML syntax error: %s (%s on line %zu)",
                            L->name, p->problem_mark.line + 1, p->problem_mark.column + 1,
                            problem, p->context, p->context_mark.line + 1);
    return specd_seterr(L->err, "%s:%zu:%zu: YAML syntax error: %s", L->name,
                        p->problem_mark.line + 1, p->problem_mark.column + 1, problem);
}

/* Anchors, aliases and tags are refused outright. Aliases are the
 * "billion laughs" vector, an anchor is useless without them, and a tag
 * (!!str 8) would change a value's type behind the schema's back. */
static int refuse_yaml_features(yaml_loader *L) {
    const yaml_event_t *e = &L->ev;
    const yaml_char_t *anchor = NULL, *tag = NULL;
    char shown[128];
    if (e->type == YAML_ALIAS_EVENT) {
        const char *a = (const char *)e->data.alias.anchor;
        return specd_seterr(L->err, "%s:%zu: aliases (*%s) are not supported", L->name,
                            ev_line(L), show_text(shown, sizeof shown, a, strlen(a)));
    }
    if (e->type == YAML_SCALAR_EVENT) {
        anchor = e->data.scalar.anchor;
        tag = e->data.scalar.tag;
    } else if (e->type == YAML_SEQUENCE_START_EVENT) {
        anchor = e->data.sequence_start.anchor;
        tag = e->data.sequence_start.tag;
    } else if (e->type == YAML_MAPPING_START_EVENT) {
        anchor = e->data.mapping_start.anchor;
        tag = e->data.mapping_start.tag;
    }
    if (anchor) {
        const char *a = (const char *)anchor;
        return specd_seterr(L->err, "%s:%zu: anchors (&%s) are not supported", L->name,
                            ev_line(L), show_text(shown, sizeof shown, a, strlen(a)));
    }
    if (tag) {
        const char *t = (const char *)tag;
        return specd_seterr(L->err, "%s:%zu: tags (%s) are not supported", L->name, ev_line(L),
                            show_text(shown, sizeof shown, t, strlen(t)));
    }
    return 0;
}

/* Moves to the next event; the previous one is released. */
static int next_event(yaml_loader *L) {
    if (L->have_ev) yaml_event_delete(&L->ev);
    L->have_ev = false;
    if (!yaml_parser_parse(&L->parser, &L->ev)) return syntax_error(L);
    L->have_ev = true;
    return refuse_yaml_features(L);
}

static bool ev_is(const yaml_loader *L, yaml_event_type_t t) { return L->ev.type == t; }

static const char *scalar_text(const yaml_loader *L) {
    return (const char *)L->ev.data.scalar.value;
}

static size_t scalar_len(const yaml_loader *L) { return L->ev.data.scalar.length; }

/* A plain ~, null or nothing at all: YAML's null. */
static bool scalar_is_null(const yaml_loader *L) {
    if (L->ev.data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *s = scalar_text(L);
    size_t len = scalar_len(L);
    return len == 0 || text_is(s, len, "~") || text_is(s, len, "null");
}

/* "a list", "a mapping" or the quoted scalar - for "got ..." in messages. */
static const char *ev_kind(const yaml_loader *L, char *buf, size_t cap) {
    if (ev_is(L, YAML_SEQUENCE_START_EVENT)) return "a list";
    if (ev_is(L, YAML_MAPPING_START_EVENT)) return "a mapping";
    if (!ev_is(L, YAML_SCALAR_EVENT)) return "something else";
    char shown[128];
    snprintf(buf, cap, "'%s'", show_text(shown, sizeof shown, scalar_text(L), scalar_len(L)));
    return buf;
}

/* "file:line" of the current event, the prefix of value errors. */
static void where(const yaml_loader *L, char *buf, size_t cap) {
    snprintf(buf, cap, "%s:%zu", L->name, ev_line(L));
}

/* Records path as set on `line`; an error if this document set it before.
 * Takes ownership of path. */
static int remember_key(yaml_loader *L, char *path, size_t len, size_t line) {
    for (size_t i = 0; i < L->n_seen; i++) {
        if (L->seen[i].len == len && memcmp(L->seen[i].path, path, len) == 0) {
            char shown[128];
            specd_seterr(L->err, "%s:%zu: duplicate key '%s' (first set on line %zu)", L->name,
                         line, show_text(shown, sizeof shown, path, len), L->seen[i].line);
            free(path);
            return -1;
        }
    }
    if (L->n_seen == L->cap_seen) {
        size_t ncap = L->cap_seen ? L->cap_seen * 2 : 16;
        seen_key *s = realloc(L->seen, ncap * sizeof *s);
        if (!s) {
            free(path);
            return specd_seterr(L->err, "%s: out of memory", L->name);
        }
        L->seen = s;
        L->cap_seen = ncap;
    }
    L->seen[L->n_seen++] = (seen_key){path, len, line};
    return 0;
}

/* A scalar value for a non-list field. */
static int apply_scalar(yaml_loader *L, const specd_cfg_field *f) {
    char loc[300], want[300], shown[256];
    const char *s = scalar_text(L);
    size_t len = scalar_len(L);
    where(L, loc, sizeof loc);
    if (f->type == SPECD_CFG_STRLIST) {
        if (scalar_is_null(L)) {
            specd_cfg_strlist empty = {NULL, 0};
            store_list(f, L->out, &empty);
            return 0;
        }
        return specd_seterr(L->err, "%s: '%s' expects a list of strings, got '%s'", loc, f->name,
                            show_text(shown, sizeof shown, s, len));
    }
    describe_type(want, sizeof want, f);
    if (scalar_is_null(L)) {
        if (f->type != SPECD_CFG_STRING)
            return specd_seterr(L->err, "%s: '%s' expects %s, got no value", loc, f->name, want);
        cfg_value none = {.s = NULL};
        store_value(f, L->out, &none);
        return 0;
    }
    if (memchr(s, 0, len))
        return specd_seterr(L->err, "%s: '%s' contains a NUL character", loc, f->name);
    /* YAML types a quoted scalar as a string whatever it looks like */
    bool typed = f->type == SPECD_CFG_INT64 || f->type == SPECD_CFG_DOUBLE ||
                 f->type == SPECD_CFG_BOOL;
    if (typed && L->ev.data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return specd_seterr(L->err, "%s: '%s' expects %s, got the quoted string '%s'", loc,
                            f->name, want, show_text(shown, sizeof shown, s, len));
    cfg_value v;
    parse_status st = parse_value(f, s, len, &v);
    if (st != PARSE_OK) return value_error(L->err, loc, f, s, len, st);
    store_value(f, L->out, &v);
    return 0;
}

/* The items of a YAML sequence, for a STRLIST field. The list replaces the
 * field's value only once it is complete. */
static int load_list(yaml_loader *L, const specd_cfg_field *f) {
    specd_cfg_strlist list = {NULL, 0};
    size_t cap = 0;
    char loc[300];
    for (;;) {
        if (next_event(L)) goto fail;
        if (ev_is(L, YAML_SEQUENCE_END_EVENT)) break;
        where(L, loc, sizeof loc);
        if (!ev_is(L, YAML_SCALAR_EVENT)) {
            char kind[160];
            specd_seterr(L->err, "%s: '%s' expects a list of strings, got %s as an item", loc,
                         f->name, ev_kind(L, kind, sizeof kind));
            goto fail;
        }
        if (scalar_is_null(L)) {
            specd_seterr(L->err, "%s: '%s' has an empty item", loc, f->name);
            goto fail;
        }
        if (memchr(scalar_text(L), 0, scalar_len(L))) {
            specd_seterr(L->err, "%s: '%s' contains a NUL character", loc, f->name);
            goto fail;
        }
        if (strlist_push(&list, &cap, scalar_text(L), scalar_len(L))) {
            specd_seterr(L->err, "%s: out of memory", L->name);
            goto fail;
        }
    }
    store_list(f, L->out, &list);
    return 0;
fail:
    strlist_clear(&list);
    return -1;
}

static int load_value(yaml_loader *L, const specd_cfg_field *f) {
    if (next_event(L)) return -1;
    if (ev_is(L, YAML_SCALAR_EVENT)) return apply_scalar(L, f);
    if (ev_is(L, YAML_SEQUENCE_START_EVENT) && f->type == SPECD_CFG_STRLIST)
        return load_list(L, f);
    char loc[300], want[300], kind[160];
    where(L, loc, sizeof loc);
    describe_type(want, sizeof want, f);
    return specd_seterr(L->err, "%s: '%s' expects %s, got %s", loc, f->name, want,
                        ev_kind(L, kind, sizeof kind));
}

static int load_mapping(yaml_loader *L, const char *prefix, size_t plen);

/* The value of a section key: a mapping of its settings, or nothing at all
 * (a section whose every line is commented out). */
static int load_section(yaml_loader *L, const char *path, size_t len) {
    if (next_event(L)) return -1;
    if (ev_is(L, YAML_MAPPING_START_EVENT)) return load_mapping(L, path, len);
    if (ev_is(L, YAML_SCALAR_EVENT) && scalar_is_null(L)) return 0;
    char loc[300], kind[160];
    where(L, loc, sizeof loc);
    return specd_seterr(L->err, "%s: '%.*s' is a section and expects a mapping, got %s", loc,
                        (int)len, path, ev_kind(L, kind, sizeof kind));
}

/* "prefix.key" (or "key" at top level), malloc'd. */
static char *join_path(const char *prefix, size_t plen, const char *key, size_t klen,
                       size_t *out_len) {
    size_t len = plen + (plen ? 1 : 0) + klen;
    char *p = malloc(len + 1);
    if (!p) return NULL;
    memcpy(p, prefix, plen);
    if (plen) p[plen] = '.';
    memcpy(p + len - klen, key, klen);
    p[len] = 0;
    *out_len = len;
    return p;
}

/* One key of a mapping: the current event is the key scalar. */
static int load_key(yaml_loader *L, const char *prefix, size_t plen) {
    size_t line = ev_line(L), len;
    char *path = join_path(prefix, plen, scalar_text(L), scalar_len(L), &len);
    if (!path) return specd_seterr(L->err, "%s: out of memory", L->name);
    const specd_cfg_field *f = find_field(L->fields, L->n, path, len);
    if (!f && !is_section(L->fields, L->n, path, len)) {
        char shown[128], sug[160];
        suggestion_text(sug, sizeof sug, L->fields, L->n, path, len, "");
        specd_seterr(L->err, "%s:%zu: unknown key '%s'%s", L->name, line,
                     show_text(shown, sizeof shown, path, len), sug);
        free(path);
        return -1;
    }
    if (remember_key(L, path, len, line)) return -1;
    /* the seen list owns path and outlives this call */
    return f ? load_value(L, f) : load_section(L, path, len);
}

/* The keys of a mapping whose MAPPING_START is the current event. */
static int load_mapping(yaml_loader *L, const char *prefix, size_t plen) {
    for (;;) {
        if (next_event(L)) return -1;
        if (ev_is(L, YAML_MAPPING_END_EVENT)) return 0;
        char kind[160];
        if (!ev_is(L, YAML_SCALAR_EVENT))
            return specd_seterr(L->err, "%s:%zu: keys must be plain names, got %s", L->name,
                                ev_line(L), ev_kind(L, kind, sizeof kind));
        if (load_key(L, prefix, plen)) return -1;
    }
}

/* The whole stream: nothing, or one document whose root is a mapping (or
 * null, as in a file holding just "---"). */
static int load_stream(yaml_loader *L) {
    if (next_event(L)) return -1; /* STREAM_START */
    if (next_event(L)) return -1;
    if (ev_is(L, YAML_STREAM_END_EVENT)) return 0;
    if (next_event(L)) return -1; /* the root node */
    if (ev_is(L, YAML_MAPPING_START_EVENT)) {
        if (load_mapping(L, "", 0)) return -1;
    } else if (!ev_is(L, YAML_SCALAR_EVENT) || !scalar_is_null(L)) {
        char kind[160];
        return specd_seterr(L->err, "%s:%zu: the top level must be a mapping of settings, got %s",
                            L->name, ev_line(L), ev_kind(L, kind, sizeof kind));
    }
    if (next_event(L)) return -1; /* DOCUMENT_END */
    if (next_event(L)) return -1;
    if (!ev_is(L, YAML_STREAM_END_EVENT))
        return specd_seterr(L->err, "%s:%zu: only one YAML document is allowed", L->name,
                            ev_line(L));
    return 0;
}

int specd_config_load_mem(const specd_cfg_field *fields, size_t n, const char *buf,
                          size_t len, const char *name_for_errors, void *out,
                          specd_error *err) {
    const char *name = name_for_errors ? name_for_errors : "config";
    if (len > SPECD_CONFIG_MAX_BYTES)
        return specd_seterr(err, "%s: %zu bytes is more than the %u bytes a configuration may "
                                 "have", name, len, SPECD_CONFIG_MAX_BYTES);
    yaml_loader L = {.fields = fields, .n = n, .out = out, .name = name, .err = err};
    if (!yaml_parser_initialize(&L.parser)) return specd_seterr(err, "%s: out of memory", name);
    yaml_parser_set_input_string(&L.parser, (const unsigned char *)buf, len);
    int rc = load_stream(&L);
    if (L.have_ev) yaml_event_delete(&L.ev);
    yaml_parser_delete(&L.parser);
    for (size_t i = 0; i < L.n_seen; i++) free(L.seen[i].path);
    free(L.seen);
    return rc;
}

/* Reads at most SPECD_CONFIG_MAX_BYTES + 1 bytes, so that an oversized (or
 * endless, like /dev/zero) file is refused without reading it all. */
static char *read_bounded(const char *path, size_t *len, specd_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        specd_seterr(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = SPECD_CONFIG_MAX_BYTES + 1;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(fp);
        specd_seterr(err, "%s: out of memory", path);
        return NULL;
    }
    *len = fread(buf, 1, cap, fp);
    int failed = ferror(fp), saved_errno = errno; /* a directory fails here: EISDIR */
    fclose(fp);
    if (failed) {
        free(buf);
        specd_seterr(err, "%s: cannot read: %s", path, strerror(saved_errno));
        return NULL;
    }
    if (*len == cap) {
        free(buf);
        specd_seterr(err, "%s: file is larger than the %u bytes a configuration may have", path,
                     SPECD_CONFIG_MAX_BYTES);
        return NULL;
    }
    return buf;
}

int specd_config_load_file(const specd_cfg_field *fields, size_t n, const char *path,
                           void *out, specd_error *err) {
    size_t len = 0;
    char *buf = read_bounded(path, &len, err);
    if (!buf) return -1;
    int rc = specd_config_load_mem(fields, n, buf, len, path, out, err);
    free(buf);
    return rc;
}

/* ===================================================================== *
 * 6. Command-line flags
 * ===================================================================== */

static bool is_help_flag(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

/* The value of a flag that takes one: after '=' or the next argument. A
 * next argument starting with "--" is taken for a forgotten value rather
 * than swallowed ("--listen --threads=4"). */
static const char *flag_value(int argc, char **argv, int *i, const char *eq, size_t nlen,
                              specd_error *err) {
    if (eq) return eq + 1;
    if (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2)) {
        specd_seterr(err, "command line: '--%.*s' needs a value", (int)nlen, argv[*i] + 2);
        return NULL;
    }
    return argv[++*i];
}

/* One "--name[=value]" argument at argv[*i]. touched[] marks lists already
 * replaced by an earlier flag, so later ones append. */
static int apply_one_flag(const specd_cfg_field *fields, size_t n, int argc, char **argv, int *i,
                          void *out, bool *touched, specd_error *err) {
    const char *name = argv[*i] + 2, *eq = strchr(name, '=');
    size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
    if (nlen == 6 && !strncmp(name, "config", 6))
        return flag_value(argc, argv, i, eq, nlen, err) ? 0 : -1;
    const specd_cfg_field *f = find_field(fields, n, name, nlen);
    if (!f) {
        char shown[128], sug[160];
        suggestion_text(sug, sizeof sug, fields, n, name, nlen, "--");
        return specd_seterr(err, "command line: unknown flag '--%s'%s",
                            show_text(shown, sizeof shown, name, nlen), sug);
    }
    const char *value = f->type == SPECD_CFG_BOOL && !eq ? "true"
                                                         : flag_value(argc, argv, i, eq, nlen, err);
    if (!value) return -1;
    size_t idx = (size_t)(f - fields);
    bool append = f->type == SPECD_CFG_STRLIST && touched[idx];
    touched[idx] = true;
    return set_from_text(f, out, value, append, "command line", err);
}

int specd_config_apply_flags(const specd_cfg_field *fields, size_t n, int argc, char **argv,
                             void *out, int *n_left, specd_error *err) {
    bool *touched = calloc(n ? n : 1, sizeof *touched);
    /* positional arguments first, then everything else, to permute argv */
    char **order = malloc((size_t)(argc > 0 ? argc : 1) * sizeof *order);
    if (!touched || !order) {
        free(touched);
        free(order);
        return specd_seterr(err, "command line: out of memory");
    }
    int n_pos = 0, n_other = 0, rc = 0;
    bool only_positional = false;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *a = argv[i];
        int first = i;
        if (!only_positional && !strcmp(a, "--")) {
            only_positional = true;
        } else if (!only_positional && is_help_flag(a)) {
            rc = 1;
        } else if (!only_positional && !strncmp(a, "--", 2)) {
            rc = apply_one_flag(fields, n, argc, argv, &i, out, touched, err);
        } else if (!only_positional && a[0] == '-' && a[1]) {
            char shown[128];
            rc = specd_seterr(err, "command line: unknown flag '%s'",
                              show_text(shown, sizeof shown, a, strlen(a)));
        } else if (!n_left) {
            char shown[128];
            rc = specd_seterr(err, "command line: unexpected argument '%s'",
                              show_text(shown, sizeof shown, a, strlen(a)));
        } else {
            order[n_pos++] = argv[i];
            continue;
        }
        /* a flag and the value it consumed, kept after the positionals */
        for (int k = first; k <= i && k < argc; k++) order[argc - 1 - n_other++] = argv[k];
    }
    if (rc == 0 && n_left) {
        /* flags were stored back to front; restore their order */
        for (int k = 0; k < n_pos; k++) argv[1 + k] = order[k];
        for (int k = 0; k < n_other; k++) argv[1 + n_pos + k] = order[argc - 1 - k];
        *n_left = n_pos;
    }
    free(order);
    free(touched);
    return rc;
}

/* The last "--config PATH" / "--config=PATH" before "--", or NULL. */
static int find_config_path(int argc, char **argv, const char **path, specd_error *err) {
    *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strncmp(argv[i], "--config=", 9)) {
            *path = argv[i] + 9;
        } else if (!strcmp(argv[i], "--config")) {
            if (!(*path = flag_value(argc, argv, &i, NULL, 6, err))) return -1;
        }
    }
    if (*path && !**path) return specd_seterr(err, "command line: '--config' needs a value");
    return 0;
}

int specd_config_load(const specd_cfg_field *fields, size_t n, int argc, char **argv,
                      void *out, specd_error *err) {
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (is_help_flag(argv[i])) return 1;
    const char *path;
    if (find_config_path(argc, argv, &path, err)) return -1;
    if (specd_config_defaults(fields, n, out, err)) return -1;
    int rc = path ? specd_config_load_file(fields, n, path, out, err) : 0;
    if (rc == 0) rc = specd_config_apply_flags(fields, n, argc, argv, out, NULL, err);
    if (rc != 0) specd_config_free(fields, n, out);
    return rc;
}

/* ===================================================================== *
 * 7. Help and dump
 * ===================================================================== */

/* "--name=TYPE" as shown in the help's first column. */
static void flag_synopsis(char *buf, size_t cap, const specd_cfg_field *f) {
    char choices[200];
    switch (f->type) {
    case SPECD_CFG_BOOL: snprintf(buf, cap, "--%s[=BOOL]", f->name); return;
    case SPECD_CFG_ENUM:
        format_choices(choices, sizeof choices, f);
        snprintf(buf, cap, "--%s=%s", f->name, choices);
        return;
    case SPECD_CFG_STRING: snprintf(buf, cap, "--%s=STRING", f->name); return;
    case SPECD_CFG_INT64: snprintf(buf, cap, "--%s=INT", f->name); return;
    case SPECD_CFG_DOUBLE: snprintf(buf, cap, "--%s=NUM", f->name); return;
    case SPECD_CFG_DURATION: snprintf(buf, cap, "--%s=DURATION", f->name); return;
    case SPECD_CFG_SIZE: snprintf(buf, cap, "--%s=SIZE", f->name); return;
    case SPECD_CFG_STRLIST: snprintf(buf, cap, "--%s=A,B,...", f->name); return;
    }
    snprintf(buf, cap, "--%s", f->name);
}

static void help_line(FILE *fp, const char *synopsis, const char *text) {
    enum { COLUMN = 34 };
    if (strlen(synopsis) + 2 < COLUMN)
        fprintf(fp, "  %-*s%s\n", COLUMN - 2, synopsis, text);
    else
        fprintf(fp, "  %s\n  %-*s%s\n", synopsis, COLUMN - 2, "", text);
}

void specd_config_print_help(const specd_cfg_field *fields, size_t n, FILE *fp) {
    help_line(fp, "--config=PATH", "YAML file with these settings (flags override it)");
    help_line(fp, "-h, --help", "print this help and exit");
    for (size_t i = 0; i < n; i++) {
        const specd_cfg_field *f = &fields[i];
        char synopsis[300], bounds[200], text[1024];
        flag_synopsis(synopsis, sizeof synopsis, f);
        bounds[0] = 0;
        if (f->type == SPECD_CFG_DOUBLE) format_fbounds(bounds, sizeof bounds, f);
        else if (f->type != SPECD_CFG_ENUM) format_bounds(bounds, sizeof bounds, f, fmt_bound);
        bool show_def = f->def && !(f->flags & SPECD_CFG_SECRET);
        snprintf(text, sizeof text, "%s%s%s%s%s%s%s", f->help ? f->help : "",
                 *bounds || show_def ? " (" : "", *bounds ? bounds + 1 : "",
                 *bounds && show_def ? ", " : "", show_def ? "default: " : "",
                 show_def ? f->def : "", *bounds || show_def ? ")" : "");
        help_line(fp, synopsis, text);
    }
}

/* Characters a YAML double-quoted scalar keeps as written: the printable
 * set of YAML 1.2 (section 5.1) minus the line breaks U+0085, U+2028 and
 * U+2029, which a double-quoted scalar would fold, and the BOM. */
static bool yaml_keeps(uint32_t cp) {
    if (cp < 0x80) return cp >= 0x20 && cp != 0x7f;
    if (cp < 0xa0 || cp == 0x2028 || cp == 0x2029 || cp == 0xfeff) return false;
    return cp <= 0xd7ff || (cp >= 0xe000 && cp <= 0xfffd) || cp >= 0x10000;
}

/* A YAML double-quoted scalar that reads back byte for byte: quotes,
 * backslashes and every character YAML would not keep are escaped. Bytes
 * that are not UTF-8 (only a flag can supply them) have no YAML spelling
 * and are written as they are. */
static void dump_string(FILE *fp, const char *s) {
    const uint8_t *p = (const uint8_t *)s;
    size_t left = strlen(s), len;
    fputc('"', fp);
    for (; left; p += len, left -= len) {
        if (specd_utf8_next(p, left, &len) != SPECD_UTF8_OK) {
            fwrite(p, 1, len, fp);
            continue;
        }
        uint32_t cp = specd_utf8_decode(p, len);
        if (cp == '"' || cp == '\\') fprintf(fp, "\\%c", (int)cp);
        else if (cp == '\n') fputs("\\n", fp);
        else if (cp == '\t') fputs("\\t", fp);
        else if (yaml_keeps(cp)) fwrite(p, 1, len, fp);
        else if (cp <= 0xff) fprintf(fp, "\\x%02X", (unsigned)cp);
        else if (cp <= 0xffff) fprintf(fp, "\\u%04X", (unsigned)cp);
        else fprintf(fp, "\\U%08X", (unsigned)cp);
    }
    fputc('"', fp);
}

static void dump_list(FILE *fp, const specd_cfg_strlist *l, int indent) {
    if (!l->n) {
        fputs(" []\n", fp);
        return;
    }
    fputc('\n', fp);
    for (size_t i = 0; i < l->n; i++) {
        fprintf(fp, "%*s- ", indent + 2, "");
        dump_string(fp, l->items[i]);
        fputc('\n', fp);
    }
}

/* True when the field holds nothing: a NULL string or an empty list (shown
 * as such even for secrets, since absence reveals nothing). */
static bool is_unset(const specd_cfg_field *f, const void *p) {
    if (f->type == SPECD_CFG_STRING) return *(char *const *)p == NULL;
    if (f->type == SPECD_CFG_STRLIST) return ((const specd_cfg_strlist *)p)->n == 0;
    return false;
}

static void dump_leaf(FILE *fp, const specd_cfg_field *f, const void *cfg, const char *key,
                      int indent) {
    const void *p = field_cptr(cfg, f);
    char buf[64];
    fprintf(fp, "%*s%s:", indent, "", key);
    if ((f->flags & SPECD_CFG_SECRET) && !is_unset(f, p)) {
        fputs(" \"<redacted>\"\n", fp);
        return;
    }
    switch (f->type) {
    case SPECD_CFG_STRING:
        fputc(' ', fp);
        if (*(char *const *)p) dump_string(fp, *(char *const *)p);
        else fputc('~', fp);
        break;
    case SPECD_CFG_INT64: fprintf(fp, " %" PRId64, *(const int64_t *)p); break;
    case SPECD_CFG_DOUBLE:
        format_double(buf, sizeof buf, *(const double *)p);
        fprintf(fp, " %s", buf);
        break;
    case SPECD_CFG_BOOL: fputs(*(const bool *)p ? " true" : " false", fp); break;
    case SPECD_CFG_ENUM: {
        int v = *(const int *)p, count = 0;
        while (f->choices[count]) count++;
        if (v >= 0 && v < count) fprintf(fp, " %s", f->choices[v]);
        else fprintf(fp, " %d", v);
        break;
    }
    case SPECD_CFG_DURATION:
        format_duration(buf, sizeof buf, *(const int64_t *)p);
        fprintf(fp, " %s", buf);
        break;
    case SPECD_CFG_SIZE:
        format_size(buf, sizeof buf, *(const uint64_t *)p);
        fprintf(fp, " %s", buf);
        break;
    case SPECD_CFG_STRLIST: dump_list(fp, p, indent); return;
    }
    fputc('\n', fp);
}

/* True if a field before index i is also under the section base[0..len). */
static bool section_printed(const specd_cfg_field *fields, size_t i, const char *base,
                            size_t len) {
    for (size_t j = 0; j < i; j++)
        if (!strncmp(fields[j].name, base, len) && fields[j].name[len] == '.') return true;
    return false;
}

/* Every field under the section base[0..plen) ("" = top level), in table
 * order, each subsection printed once where its first field appears. The
 * section name is borrowed from a field name, so no copies are needed. */
static void dump_level(const specd_cfg_field *fields, size_t n, const void *cfg,
                       const char *base, size_t plen, int indent, FILE *fp) {
    for (size_t i = 0; i < n; i++) {
        const char *name = fields[i].name;
        if (plen && (strncmp(name, base, plen) || name[plen] != '.')) continue;
        const char *rest = name + (plen ? plen + 1 : 0);
        const char *dot = strchr(rest, '.');
        if (!dot) {
            dump_leaf(fp, &fields[i], cfg, rest, indent);
            continue;
        }
        size_t sec_len = (size_t)(dot - name);
        if (section_printed(fields, i, name, sec_len)) continue;
        fprintf(fp, "%*s%.*s:\n", indent, "", (int)(dot - rest), rest);
        dump_level(fields, n, cfg, name, sec_len, indent + 2, fp);
    }
}

void specd_config_dump(const specd_cfg_field *fields, size_t n, const void *cfg, FILE *fp) {
    dump_level(fields, n, cfg, "", 0, 0, fp);
}
