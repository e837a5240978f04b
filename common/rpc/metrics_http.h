/* metrics_http.h - the plain HTTP listener that serves GET /metrics.
 *
 * libmicrohttpd (Debian's libmicrohttpd-dev) does the HTTP: parsing, keep-
 * alive, timeouts. We only answer: GET (or HEAD) /metrics gives the
 * registry's text exposition (metrics.h) with the Prometheus content type,
 * any other path 404, any other method 405. One internal polling thread;
 * at most 16 connections, 10 s idle timeout and 32 KiB of request memory
 * each, so a misbehaving scraper cannot exhaust the service. */
#ifndef SPECD_METRICS_HTTP_H
#define SPECD_METRICS_HTTP_H

#include "common/util/error.h"
#include "common/rpc/metrics.h"

typedef struct specd_metrics_http specd_metrics_http;

/* Listens on "host:port", "[v6]:port" or ":port" (every address; port 0 =
 * any free one) and serves r. NULL + err naming the address on failure. */
specd_metrics_http *specd_metrics_http_start(const char *listen, specd_metrics *r,
                                             specd_error *err);

/* What a service's main() does with its `metrics.listen` key: NULL or ""
 * leaves *out NULL (metrics off) and returns 0; otherwise starts the
 * listener on the process registry, says so on stderr ("<service>: metrics
 * on http://ADDR/metrics"), and returns 0, or -1 + err. */
int specd_metrics_http_serve(const char *listen, const char *service, specd_metrics_http **out,
                             specd_error *err);

/* The port actually bound. */
int specd_metrics_http_port(const specd_metrics_http *h);

/* Stops the listener (waits for its thread) and frees it. NULL is a no-op. */
void specd_metrics_http_stop(specd_metrics_http *h);

/* Splits "host:port" / "[v6]:port" / ":port" into host (empty = any) and a
 * port in 0..65535: 0, or -1 + err naming `what` when malformed. Shared with
 * tests. */
int specd_metrics_split_hostport(const char *addr, char *host, size_t host_cap, int *port,
                                 const char *what, specd_error *err);

#endif
