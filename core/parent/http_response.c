/* http_response.c -- writing the answers of the HTTP server (http.c).
 *
 * An answer is whole (mj_http_respond: Content-Length set here) or streamed
 * (mj_http_start, mj_http_write, mj_http_finish: chunked for an HTTP/1.1
 * client, to the connection's end for HTTP/1.0), for server-sent events.
 * The status line, Date, Content-Length, Transfer-Encoding and Connection
 * are written here; the owner's other headers come as one block of
 * "Name: value\r\n" lines it has checked. After the last answer of a
 * connection (Connection: close, an HTTP/1.0 client, a rejected request),
 * the socket is shut down for writing and left to the client to close
 * (http.c's linger).
 *
 * Every write is copied and queued with libuv. Bytes the client has not
 * taken are bounded: a write made while more than max_unsent bytes wait in
 * the socket's queue drops the connection (the owner hears on_gone, and gets
 * UV_ENOBUFS), so a reader that stops reading never makes the server buffer
 * without end; one whole answer larger than the bound still goes out. A
 * queue that does not shrink for idle_timeout_ms drops it too (http.c).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "moonjob.h"

typedef struct {
  uv_write_t req;
  mj_http_conn_t *c;
  char data[];
} out_t;

static void written(uv_write_t *req, int status) {
  out_t *o = (out_t *) req;
  mj_http_conn_t *c = o->c;
  free(o);
  if (c->closing) return;
  if (status < 0) {
    mj__http_drop(c, status == UV_EPIPE || status == UV_ECONNRESET ? "the client closed the connection"
                                                                    : uv_strerror(status));
    return;
  }
  if (c->tcp.write_queue_size > 0 || c->lingering) mj__http_arm(c); /* it reads: a new deadline */
  else if (c->state == MJ_HTTP_HANDLING && !c->resume_due) uv_timer_stop(&c->timer);
}

/* Queues the parts as one write. 0, UV_ENOTCONN once gone, or UV_ENOBUFS
 * when the client does not read (the connection is dropped). */
static int send_parts(mj_http_conn_t *c, const uv_buf_t *parts, int nparts) {
  if (c->closing) return UV_ENOTCONN;
  size_t queued = c->tcp.write_queue_size;
  if (queued > c->server->limits.max_unsent) {
    char why[128];
    snprintf(why, sizeof why, "the client is not reading: %zu bytes unsent, more than max_unsent",
             queued);
    mj__http_drop(c, why);
    return UV_ENOBUFS;
  }
  size_t len = 0;
  for (int i = 0; i < nparts; i++) len += parts[i].len;
  out_t *o = malloc(sizeof *o + len);
  if (o == NULL) {
    mj__http_drop(c, "out of memory");
    return UV_ENOMEM;
  }
  o->c = c;
  size_t at = 0;
  for (int i = 0; i < nparts; i++) {
    if (parts[i].len) memcpy(o->data + at, parts[i].base, parts[i].len);
    at += parts[i].len;
  }
  uv_buf_t all = uv_buf_init(o->data, (unsigned) len);
  int rc = uv_write(&o->req, (uv_stream_t *) &c->tcp, &all, 1, written);
  if (rc != 0) {
    free(o);
    mj__http_drop(c, uv_strerror(rc));
    return UV_ENOTCONN;
  }
  if (queued == 0 && c->tcp.write_queue_size > 0) mj__http_arm(c); /* now the client must read */
  return 0;
}

/* The Date header HTTP/1.1 asks for, "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
 * (names written here: strftime's would follow the program's locale). */
static size_t date_line(char *to, size_t size) {
  static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  time_t now = time(NULL);
  struct tm t;
  if (gmtime_r(&now, &t) == NULL) return 0;
  int n = snprintf(to, size, "Date: %s, %02d %s %04d %02d:%02d:%02d GMT\r\n", days[t.tm_wday],
                   t.tm_mday, months[t.tm_mon], t.tm_year + 1900, t.tm_hour, t.tm_min, t.tm_sec);
  return n > 0 && (size_t) n < size ? (size_t) n : 0;
}

/* The status line, the owner's headers, framing and Connection, and for a
 * whole answer its body, in one write. */
static int send_head(mj_http_conn_t *c, int status, const char *headers, size_t headers_len,
                     const char *body, size_t body_len, int streaming, int close_after) {
  int http11 = c->parser.http_major == 1 && c->parser.http_minor >= 1;
  int bodiless = status == 204 || status == 304 || (status >= 100 && status < 200);
  if (close_after || c->server->closed) c->keep_alive = 0;
  char line[128], tail[192];
  const char *reason = http_status_str((enum http_status) status);
  if (strcmp(reason, "<unknown>") == 0) reason = "Status";
  snprintf(line, sizeof line, "HTTP/1.1 %d %s\r\n", status, reason);
  size_t used = date_line(tail, sizeof tail);
  if (bodiless) body_len = 0;
  else if (!streaming) used += snprintf(tail + used, sizeof tail - used, "Content-Length: %zu\r\n", body_len);
  else if (http11 && !c->head_only) {
    c->chunked = 1;
    used += snprintf(tail + used, sizeof tail - used, "Transfer-Encoding: chunked\r\n");
  } else c->keep_alive = 0; /* HTTP/1.0: the stream ends with the connection */
  if (!c->keep_alive) used += snprintf(tail + used, sizeof tail - used, "Connection: close\r\n");
  else if (!http11) used += snprintf(tail + used, sizeof tail - used, "Connection: keep-alive\r\n");
  used += snprintf(tail + used, sizeof tail - used, "\r\n");
  uv_buf_t parts[4] = {
    uv_buf_init(line, (unsigned) strlen(line)),
    uv_buf_init((char *) headers, (unsigned) headers_len),
    uv_buf_init(tail, (unsigned) used),
    uv_buf_init((char *) body, c->head_only ? 0 : (unsigned) body_len),
  };
  return send_parts(c, parts, 4);
}

static void shut_down(uv_shutdown_t *req, int status) {
  (void) req; /* the client closes, or the linger's deadline comes (http.c) */
  (void) status;
}

static int finish_answer(mj_http_conn_t *c) {
  c->finished = 1;
  if (c->keep_alive && !c->server->closed) {
    mj__http_next(c);
  } else {
    c->shutdown.data = c;
    mj__http_linger(c);
    if (!c->closing && uv_shutdown(&c->shutdown, (uv_stream_t *) &c->tcp, shut_down) != 0)
      mj__http_drop(c, "closed after the last answer");
  }
  return 0;
}

static int answerable(const mj_http_conn_t *c) {
  if (c->closing || !c->delivered || c->finished) return UV_ENOTCONN;
  return c->started ? UV_EALREADY : 0;
}

/* A whole answer: status, the owner's header lines, the body. 0, or an
 * error (UV_ENOTCONN: the client is gone). */
int mj_http_respond(mj_http_conn_t *c, int status, const char *headers, size_t headers_len,
                    const char *body, size_t body_len, int close_after) {
  int rc = answerable(c);
  if (rc != 0) return rc;
  c->started = 1;
  rc = send_head(c, status, headers, headers_len, body, body_len, 0, close_after);
  return rc != 0 ? rc : finish_answer(c);
}

/* A streamed answer's head; its body follows in mj_http_write calls. */
int mj_http_start(mj_http_conn_t *c, int status, const char *headers, size_t headers_len,
                  int close_after) {
  int rc = answerable(c);
  if (rc != 0) return rc;
  c->started = 1;
  return send_head(c, status, headers, headers_len, NULL, 0, 1, close_after);
}

/* A piece of a streamed answer (sent at once, as one chunk). */
int mj_http_write(mj_http_conn_t *c, const char *data, size_t len) {
  if (c->closing || !c->delivered || c->finished) return UV_ENOTCONN;
  if (!c->started) return UV_EINVAL;
  if (len == 0 || c->head_only) return 0; /* an empty chunk would end the stream */
  if (!c->chunked) {
    uv_buf_t part = uv_buf_init((char *) data, (unsigned) len);
    return send_parts(c, &part, 1);
  }
  char size[24];
  snprintf(size, sizeof size, "%zx\r\n", len);
  uv_buf_t parts[3] = {
    uv_buf_init(size, (unsigned) strlen(size)),
    uv_buf_init((char *) data, (unsigned) len),
    uv_buf_init("\r\n", 2),
  };
  return send_parts(c, parts, 3);
}

/* The end of a streamed answer: the connection goes on to its next request,
 * or closes. */
int mj_http_finish(mj_http_conn_t *c) {
  if (c->closing || !c->delivered || c->finished) return UV_ENOTCONN;
  if (!c->started) return UV_EINVAL;
  if (c->chunked) {
    uv_buf_t last = uv_buf_init("0\r\n\r\n", 5);
    int rc = send_parts(c, &last, 1);
    if (rc != 0) return rc;
  }
  return finish_answer(c);
}

/* A request refused before it reached the owner (400, 413, 431, 503): the
 * answer says why, and the connection closes after it. */
void mj__http_reject(mj_http_conn_t *c, int status) {
  char body[96];
  const char *reason = http_status_str((enum http_status) status);
  int len = snprintf(body, sizeof body, "%d %s\n", status, reason);
  static const char type[] = "Content-Type: text/plain; charset=utf-8\r\n";
  c->state = MJ_HTTP_HANDLING;
  c->delivered = 0;
  c->started = 1;
  c->head_only = 0;
  c->parser.http_major = c->parser.http_minor = 1;
  if (send_head(c, status, type, sizeof type - 1, body, (size_t) len, 0, 1) == 0) finish_answer(c);
}

/* "100 Continue" to a client that waits for it before sending its body. */
void mj__http_continue(mj_http_conn_t *c) {
  static const char go[] = "HTTP/1.1 100 Continue\r\n\r\n";
  if (c->continue_sent) return;
  c->continue_sent = 1;
  uv_buf_t part = uv_buf_init((char *) go, sizeof go - 1);
  send_parts(c, &part, 1);
}
