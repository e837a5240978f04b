/* metrics_http.c - GET /metrics over libmicrohttpd (see metrics_http.h). */
#include "common/rpc/metrics_http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

/* The content type of the text exposition format that Prometheus asks for. */
#define PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define MAX_CONNECTIONS 16
#define IDLE_TIMEOUT_S 10
#define CONNECTION_MEMORY (32u << 10)

struct specd_metrics_http {
    struct MHD_Daemon *d;
    specd_metrics *reg;
    int port;
};

int specd_metrics_split_hostport(const char *addr, char *host, size_t host_cap, int *port,
                                 const char *what, specd_error *err) {
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || !colon[1])
        return specd_seterr(err, "%s: expected host:port, got '%s'", what, addr ? addr : "");
    const char *h = addr;
    size_t hlen = (size_t)(colon - addr);
    if (hlen && h[0] == '[') { /* [v6]:port */
        if (h[hlen - 1] != ']' || hlen < 2)
            return specd_seterr(err, "%s: unbalanced '[' in '%s'", what, addr);
        h++;
        hlen -= 2;
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535)
        return specd_seterr(err, "%s: port must be 0..65535, got '%s'", what, colon + 1);
    if (hlen >= host_cap) return specd_seterr(err, "%s: host too long in '%s'", what, addr);
    memcpy(host, h, hlen);
    host[hlen] = 0;
    *port = (int)p;
    return 0;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *type,
                             void *body, size_t len, enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    (void)upload_data;
    specd_metrics_http *h = cls;
    /* A request body (none is expected) is read and dropped: the first call
     * only announces the request, later ones carry body bytes. */
    if (!*con_cls) {
        *con_cls = h;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    static char not_found[] = "not found: the only path is /metrics\n";
    static char bad_method[] = "method not allowed: use GET\n";
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", bad_method,
                     sizeof bad_method - 1, MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/metrics"))
        return reply(c, MHD_HTTP_NOT_FOUND, "text/plain", not_found, sizeof not_found - 1,
                     MHD_RESPMEM_PERSISTENT);
    size_t len = 0;
    char *text = specd_metrics_render(h->reg, &len);
    if (!text) return MHD_NO; /* out of memory: drop the connection */
    return reply(c, MHD_HTTP_OK, PROM_CONTENT_TYPE, text, len, MHD_RESPMEM_MUST_FREE);
}

specd_metrics_http *specd_metrics_http_start(const char *listen, specd_metrics *r,
                                             specd_error *err) {
    char host[256];
    int port;
    if (specd_metrics_split_hostport(listen, host, sizeof host, &port, "metrics.listen", err))
        return NULL;
    char port_s[8];
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, port_s, &hints, &ai);
    if (gai) {
        specd_seterr(err, "metrics.listen: cannot resolve '%s': %s", listen, gai_strerror(gai));
        return NULL;
    }
    specd_metrics_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        specd_seterr(err, "metrics.listen: out of memory");
        return NULL;
    }
    h->reg = r;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        specd_seterr(err, "metrics.listen: cannot listen on %s (address in use or invalid)",
                     listen);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : port;
    return h;
}

int specd_metrics_http_serve(const char *listen, const char *service, specd_metrics_http **out,
                             specd_error *err) {
    *out = NULL;
    if (!listen || !listen[0]) return 0;
    if (!(*out = specd_metrics_http_start(listen, specd_metrics_global(), err))) return -1;
    fprintf(stderr, "%s: metrics on http://%s/metrics (port %d)\n", service, listen,
            specd_metrics_http_port(*out));
    return 0;
}

int specd_metrics_http_port(const specd_metrics_http *h) { return h ? h->port : 0; }

void specd_metrics_http_stop(specd_metrics_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
