/* http.c -- an HTTP/1.1 server on the context's libuv loop: listening,
 * connections, and requests read with Debian's libhttp-parser.
 *
 * Mechanism only: the server hands each whole request (method, URL, headers
 * lower-cased, body) to its owner, which answers it through http_response.c,
 * at once or on a later loop turn. Which paths exist and what they answer is
 * the owner's business (the Lua binding, bind/http.c).
 *
 * One request at a time per connection: once a request is whole the parser
 * pauses, and the next one (pipelined bytes kept in c->in) is parsed only
 * after the answer was finished, on the next loop turn; so answers go out in
 * the order the requests came. Meanwhile the socket is still read (a client
 * that leaves is noticed at once, which a server-sent event stream needs),
 * but only up to READ_CHUNK bytes of the requests that follow.
 *
 * Every bound holds against a hostile client: header bytes (431), body bytes
 * (413), connections (more are closed as soon as accepted), a deadline for a
 * whole request from the moment the connection waits for one (a slow or
 * half-sent request, an idle keep-alive connection: closed), and the bytes
 * queued for a client that does not read (http_response.c drops it). A
 * request the owner never answers is held until its connection closes.
 *
 * Caveats: the header bound counts the URL, names and values, not the
 * separators (the parser's own 80 KiB bound on the raw header also holds);
 * an end of file from the client, also a half-close after its request,
 * ends the connection; Upgrade and CONNECT requests are answered like any
 * other, then the connection is closed.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "moonjob.h"

#define READ_CHUNK (64 * 1024)

static const mj_http_limits_t default_limits = {
  16 * 1024, 1024 * 1024, 256, 10000, 1024 * 1024,
};

/* ------------------------------------------------------------ servers --- */

static void close_all(mj_ctx_t *ctx);

static const mj_closer_t closer = {MJ_CLOSE_HTTP, close_all, NULL};

static void maybe_freed(mj_http_server_t *s) {
  if (!s->closed || s->open_handles > 0) return;
  mj__list_unlink(&s->link);
  if (s->on_freed) s->on_freed(s);
}

/* -------------------------------------------------------- connections --- */

static void conn_closed(uv_handle_t *h) {
  mj_http_conn_t *c = h->data;
  if (--c->open_handles > 0) return;
  mj_http_server_t *s = c->server;
  mj__list_unlink(&c->link);
  s->nconns--;
  free(c->in);
  free(c->head);
  free(c->fields);
  free(c->body);
  free(c);
  s->open_handles--;
  maybe_freed(s);
}

/* The connection ends now; an owner holding its request hears why. */
void mj__http_drop(mj_http_conn_t *c, const char *why) {
  if (c->closing) return;
  c->closing = 1;
  c->state = MJ_HTTP_CLOSING;
  if (c->delivered && !c->finished) {
    c->delivered = 0;
    if (c->server->on_gone) c->server->on_gone(c, why);
  }
  uv_close((uv_handle_t *) &c->tcp, conn_closed);
  uv_close((uv_handle_t *) &c->timer, conn_closed);
}

static void next_request(mj_http_conn_t *c);

static void timer_cb(uv_timer_t *t) {
  mj_http_conn_t *c = t->data;
  if (c->resume_due) {
    c->resume_due = 0;
    next_request(c);
  } else if (c->lingering) {
    mj__http_drop(c, "closed after the last answer");
  } else if (c->state == MJ_HTTP_READING) {
    mj__http_drop(c, "no whole request within the idle timeout");
  } else if (c->tcp.write_queue_size > 0) {
    mj__http_drop(c, "the client took nothing of the answer within the idle timeout");
  }
}

/* The idle deadline starts (again) now; a next request's turn comes first. */
void mj__http_arm(mj_http_conn_t *c) {
  if (c->closing || c->resume_due) return;
  uv_timer_start(&c->timer, timer_cb, c->server->limits.idle_timeout_ms, 0);
}

/* The answer is finished and the connection stays: the next request is
 * parsed on the next loop turn (never inside the owner's call). */
void mj__http_next(mj_http_conn_t *c) {
  if (c->closing) return;
  c->resume_due = 1;
  uv_timer_start(&c->timer, timer_cb, 0, 0);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  mj_http_conn_t *c = h->data;
  if (c->in_off > 0) { /* what was parsed goes: the rest moves to the front */
    memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
    c->in_len -= c->in_off;
    c->in_off = 0;
  }
  if (mj__grow(&c->in, &c->in_cap, c->in_len + READ_CHUNK, READ_CHUNK) != 0) {
    *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
    return;
  }
  *buf = uv_buf_init(c->in + c->in_len, (unsigned) (c->in_cap - c->in_len));
}

static void pump(mj_http_conn_t *c);

static void read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  mj_http_conn_t *c = st->data;
  if (n == 0 || c->closing) return;
  if (n < 0) {
    mj__http_drop(c, n == UV_EOF ? "the client closed the connection" : uv_strerror((int) n));
    return;
  }
  if (c->lingering) return; /* after the last answer: read only to close cleanly */
  c->in_len += (size_t) n;
  if (c->state == MJ_HTTP_READING) pump(c);
  else if (c->in_len - c->in_off >= READ_CHUNK) { /* the next requests wait their turn */
    uv_read_stop(st);
    c->reading = 0;
  }
}

static int start_reading(mj_http_conn_t *c) {
  if (c->reading || c->closing) return 0;
  int rc = uv_read_start((uv_stream_t *) &c->tcp, alloc_cb, read_cb);
  if (rc != 0) {
    mj__http_drop(c, uv_strerror(rc));
    return rc;
  }
  c->reading = 1;
  return 0;
}

/* After the last answer: the rest of what the client sends is read and
 * thrown away until it closes (or the deadline), so that closing does not
 * reset a connection whose answer the client has not read yet. */
void mj__http_linger(mj_http_conn_t *c) {
  c->state = MJ_HTTP_CLOSING;
  c->lingering = 1;
  c->resume_due = 0;
  start_reading(c);
  if (!c->closing) uv_timer_start(&c->timer, timer_cb, c->server->limits.idle_timeout_ms, 0);
}

/* ------------------------------------------------------------ parsing --- */

static int take_head(mj_http_conn_t *c, const char *at, size_t len, int lower) {
  if (c->head_len + len > c->server->limits.max_header) {
    c->reject = 431;
    return -1;
  }
  if (mj__grow(&c->head, &c->head_cap, c->head_len + len, 1024) != 0) {
    c->reject = 503;
    return -1;
  }
  char *to = c->head + c->head_len;
  for (size_t i = 0; i < len; i++) to[i] = lower ? (char) tolower((unsigned char) at[i]) : at[i];
  c->head_len += len;
  return 0;
}

static int on_message_begin(http_parser *p) {
  mj_http_conn_t *c = p->data;
  c->head_len = c->url_len = c->nfields = c->body_len = 0;
  c->in_field_value = c->continue_sent = 0;
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t len) {
  mj_http_conn_t *c = p->data;
  if (take_head(c, at, len, 0) != 0) return -1;
  c->url_len += len;
  return 0;
}

/* A name may come in pieces (across reads): a new field starts after a value. */
static int on_header_field(http_parser *p, const char *at, size_t len) {
  mj_http_conn_t *c = p->data;
  if (c->nfields == 0 || c->in_field_value) {
    size_t need = (c->nfields + 1) * sizeof *c->fields, cap = c->fields_cap * sizeof *c->fields;
    char *fields = (char *) c->fields;
    if (mj__grow(&fields, &cap, need, 16 * sizeof *c->fields) != 0) {
      c->reject = 503;
      return -1;
    }
    c->fields = (mj_http_field_t *) fields;
    c->fields_cap = cap / sizeof *c->fields;
    c->fields[c->nfields++] = (mj_http_field_t) {(uint32_t) c->head_len, 0, 0, 0};
    c->in_field_value = 0;
  }
  if (take_head(c, at, len, 1) != 0) return -1;
  c->fields[c->nfields - 1].name_len += (uint32_t) len;
  return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
  mj_http_conn_t *c = p->data;
  mj_http_field_t *f = &c->fields[c->nfields - 1];
  if (!c->in_field_value) {
    c->in_field_value = 1;
    f->value_off = (uint32_t) c->head_len;
  }
  if (take_head(c, at, len, 0) != 0) return -1;
  f->value_len += (uint32_t) len;
  return 0;
}

static int field_is(const mj_http_conn_t *c, const mj_http_field_t *f, const char *name,
                    const char *value) {
  size_t nlen = strlen(name), vlen = strlen(value);
  return f->name_len == nlen && memcmp(c->head + f->name_off, name, nlen) == 0
         && f->value_len == vlen && strncasecmp(c->head + f->value_off, value, vlen) == 0;
}

static int on_headers_complete(http_parser *p) {
  mj_http_conn_t *c = p->data;
  c->keep_alive = http_should_keep_alive(p) && !p->upgrade && p->method != HTTP_CONNECT;
  if ((p->flags & F_CONTENTLENGTH) && p->content_length > c->server->limits.max_body) {
    c->reject = 413;
    return -1;
  }
  for (size_t i = 0; i < c->nfields; i++) /* the client waits for a go before its body */
    if (p->http_major == 1 && p->http_minor >= 1 && field_is(c, &c->fields[i], "expect", "100-continue"))
      mj__http_continue(c);
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  mj_http_conn_t *c = p->data;
  if (c->body_len + len > c->server->limits.max_body) {
    c->reject = 413;
    return -1;
  }
  if (mj__grow(&c->body, &c->body_cap, c->body_len + len, 4096) != 0) {
    c->reject = 503;
    return -1;
  }
  memcpy(c->body + c->body_len, at, len);
  c->body_len += len;
  return 0;
}

static int on_message_complete(http_parser *p) {
  mj_http_conn_t *c = p->data;
  c->complete = 1;
  http_parser_pause(p, 1); /* the next request waits for this one's answer */
  return 0;
}

static const http_parser_settings settings = {
  .on_message_begin = on_message_begin,
  .on_url = on_url,
  .on_header_field = on_header_field,
  .on_header_value = on_header_value,
  .on_headers_complete = on_headers_complete,
  .on_body = on_body,
  .on_message_complete = on_message_complete,
};

static void deliver(mj_http_conn_t *c) {
  c->complete = 0;
  c->state = MJ_HTTP_HANDLING;
  c->delivered = 1;
  c->started = c->finished = c->chunked = 0;
  c->head_only = c->parser.method == HTTP_HEAD;
  if (c->tcp.write_queue_size == 0) uv_timer_stop(&c->timer); /* the owner takes its time */
  c->server->on_request(c);
}

/* Parses what was read, up to the end of one whole request. */
static void pump(mj_http_conn_t *c) {
  while (c->state == MJ_HTTP_READING && !c->closing && c->in_off < c->in_len) {
    size_t n = http_parser_execute(&c->parser, &settings, c->in + c->in_off, c->in_len - c->in_off);
    c->in_off += n;
    if (c->closing) return; /* a write in a callback (100 Continue) found the client gone */
    if (c->complete) {
      deliver(c);
      return;
    }
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    if (e != HPE_OK) {
      mj__http_reject(c, c->reject ? c->reject : e == HPE_HEADER_OVERFLOW ? 431 : 400);
      return;
    }
  }
  if (c->in_off == c->in_len) c->in_off = c->in_len = 0;
}

static void next_request(mj_http_conn_t *c) {
  if (c->closing) return;
  c->state = MJ_HTTP_READING;
  c->delivered = 0;
  http_parser_pause(&c->parser, 0);
  mj__http_arm(c);
  if (start_reading(c) == 0) pump(c);
}

/* ---------------------------------------------------------- accepting --- */

static void free_closed(uv_handle_t *h) {
  free(h);
}

static void peer_of(mj_http_conn_t *c) {
  struct sockaddr_storage a;
  int len = sizeof a;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *) &a, &len) != 0) return;
  if (a.ss_family == AF_INET6) {
    uv_ip6_name((struct sockaddr_in6 *) &a, c->peer, sizeof c->peer);
    c->peer_port = ntohs(((struct sockaddr_in6 *) &a)->sin6_port);
  } else if (a.ss_family == AF_INET) {
    uv_ip4_name((struct sockaddr_in *) &a, c->peer, sizeof c->peer);
    c->peer_port = ntohs(((struct sockaddr_in *) &a)->sin_port);
  }
}

static void on_connection(uv_stream_t *listener, int status) {
  mj_http_server_t *s = listener->data;
  if (status < 0) return;
  mj_http_conn_t *c = calloc(1, sizeof *c);
  uv_tcp_t *spare = c ? &c->tcp : malloc(sizeof *spare); /* out of memory: taken and closed */
  if (spare == NULL) return;
  uv_tcp_init(&s->ctx->loop, spare);
  if (uv_accept(listener, (uv_stream_t *) spare) != 0 || c == NULL || s->closed
      || s->nconns >= s->limits.max_connections) {
    uv_close((uv_handle_t *) spare, free_closed); /* the connection's first member: c itself */
    return;
  }
  c->server = s;
  c->tcp.data = c->timer.data = c->parser.data = c;
  uv_timer_init(&s->ctx->loop, &c->timer);
  c->open_handles = 2;
  mj__list_push(&s->conns, &c->link);
  s->nconns++;
  s->open_handles++;
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  uv_tcp_nodelay(&c->tcp, 1);
  peer_of(c);
  c->state = MJ_HTTP_READING;
  mj__http_arm(c);
  start_reading(c);
}

/* ---------------------------------------------------------- listening --- */

static void listener_closed(uv_handle_t *h) {
  mj_http_server_t *s = h->data;
  s->open_handles--;
  maybe_freed(s);
}

static void limits_or_defaults(mj_http_limits_t *to, const mj_http_limits_t *given) {
  *to = default_limits;
  if (given == NULL) return;
  if (given->max_header) to->max_header = given->max_header;
  if (given->max_body) to->max_body = given->max_body;
  if (given->max_connections) to->max_connections = given->max_connections;
  if (given->idle_timeout_ms) to->idle_timeout_ms = given->idle_timeout_ms;
  if (given->max_unsent) to->max_unsent = given->max_unsent;
}

/* Listens on host (an IPv4 or IPv6 literal) and port (0: a free one, see
 * mj_http_port). The owner sets on_request, on_gone, on_freed and data
 * first. Returns 0, or a libuv error with `why` said for a person; either
 * way on_freed comes once mj_http_close (or, on an error, the server
 * itself) closed everything, and s must live until then. */
int mj_http_listen(mj_ctx_t *ctx, mj_http_server_t *s, const char *host, int port,
                   const mj_http_limits_t *limits, char *why, size_t why_len) {
  struct sockaddr_storage addr;
  int v6 = strchr(host, ':') != NULL;
  int rc = v6 ? uv_ip6_addr(host, port, (struct sockaddr_in6 *) &addr)
              : uv_ip4_addr(host, port, (struct sockaddr_in *) &addr);
  if (rc != 0) {
    snprintf(why, why_len, "cannot listen on '%.100s': not an IPv4 or IPv6 address "
             "(give a literal such as 127.0.0.1 or ::1, not a name)", host);
    return UV_EINVAL;
  }
  s->ctx = ctx;
  mj__list_init(&s->conns);
  limits_or_defaults(&s->limits, limits);
  uv_tcp_init(&ctx->loop, &s->listener);
  s->listener.data = s;
  s->open_handles = 1;
  mj__list_push(&ctx->http, &s->link); /* until every handle closed (maybe_freed) */
  mj__ctx_on_close(ctx, &closer);
  rc = uv_tcp_bind(&s->listener, (struct sockaddr *) &addr, v6 ? UV_TCP_IPV6ONLY : 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *) &s->listener, 128, on_connection);
  if (rc != 0) {
    snprintf(why, why_len, "cannot listen on %s%.100s%s port %d: %s (%s)", v6 ? "[" : "", host,
             v6 ? "]" : "", port, uv_strerror(rc), uv_err_name(rc));
    mj_http_close(s);
  }
  return rc;
}

/* The port listened on (the one picked for port 0), or -1. */
int mj_http_port(mj_http_server_t *s) {
  struct sockaddr_storage a;
  int len = sizeof a;
  if (s->closed || uv_tcp_getsockname(&s->listener, (struct sockaddr *) &a, &len) != 0) return -1;
  if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *) &a)->sin6_port);
  return ntohs(((struct sockaddr_in *) &a)->sin_port);
}

/* Stops listening and ends every connection now (owners holding a request
 * hear on_gone); on_freed comes once every handle closed. */
void mj_http_close(mj_http_server_t *s) {
  if (s->closed) return;
  s->closed = 1;
  uv_close((uv_handle_t *) &s->listener, listener_closed);
  MJ_LIST_EACH(it, &s->conns) {
    mj__http_drop(MJ_LIST_ITEM(it, mj_http_conn_t, link), "the server closed");
  }
}

/* mj_ctx_close: every server ends with the context. */
static void close_all(mj_ctx_t *ctx) {
  MJ_LIST_EACH_SAFE(it, &ctx->http) {
    mj_http_close(MJ_LIST_ITEM(it, mj_http_server_t, link));
  }
}
