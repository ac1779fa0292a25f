/* redis.c -- one connection to a Redis server, on the context's libuv loop.
 *
 * Mechanism only: resolve the host name with uv_getaddrinfo (hiredis 0.14
 * would call a blocking getaddrinfo), connect to each numeric address it gave
 * in turn until one answers (localhost may give ::1 first to a server on
 * 127.0.0.1 only; the addresses share the connect timeout), with
 * hiredis's asynchronous API, watch the socket with a uv_poll_t of our own
 * (the adapter below), send commands as argument vectors (binary-safe), and
 * hand each reply to the owner. What the commands mean, reconnecting, AUTH and
 * SELECT are the owner's business (lua/moonjob/redis/client.lua).
 *
 * One mj_redis_t is one connection: once it goes down (refused, reset, timed
 * out, closed) it stays down, every command in flight gets an error, and the
 * owner opens a new one if it wants to.
 *
 * hiredis 0.14 has no timeouts of its own, so a cut network would hang a
 * connection for ever: a watchdog timer drops the connection when connecting
 * takes longer than timeout_ms, or when commands are in flight and no reply
 * came for timeout_ms. Commands sent with `persistent` (SUBSCRIBE) are not
 * counted: their replies come when they come; the owner PINGs a subscribed
 * connection instead (mj_redis_ping), whose answer is due within timeout_ms.
 *
 * Everything read from the server is untrusted: replies are built by our own
 * reader functions, which refuse a reply (and drop the connection) once it
 * would take more than max_reply bytes (millions of tiny array elements, say),
 * and poll_cb drops the connection once the unparsed rest of a reply passes
 * that bound (hiredis buffers a bulk string whole before those functions see it).
 *
 * Caveats: hiredis frees its context itself after an error; r->ac is cleared
 * in its callbacks and never used after. Freeing from inside a reply
 * callback is deferred by hiredis until the callback returns; from inside
 * onConnect it is not (0.14 goes on using the context), so a drop or close
 * asked for there waits for the next loop turn (later()).
 */
#include <stdio.h>
#include <string.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "moonjob.h"

/* ------------------------------------------------------ reply objects --- */

/* Each object of a reply is charged to the connection; past max_reply the
 * reader gets NULL ("out of memory" to hiredis) and the connection drops. */
static void *charge(const redisReadTask *task, size_t bytes) {
  mj_redis_t *r = task->privdata;
  if (r->reply_bytes + bytes > r->max_reply) {
    snprintf(r->why, sizeof r->why, "a reply from the server is larger than %zu bytes", r->max_reply);
    return NULL;
  }
  r->reply_bytes += bytes;
  if (r->ping_pending) { /* the subscription's link carries bytes: it is alive */
    r->ping_pending = 0;
    r->last_progress = uv_now(&r->ctx->loop);
  }
  return calloc(1, sizeof(redisReply));
}

static void *link_to_parent(const redisReadTask *task, redisReply *reply) {
  if (task->parent != NULL) {
    redisReply *parent = task->parent->obj;
    parent->element[task->idx] = reply;
  }
  return reply;
}

static void *create_string(const redisReadTask *task, char *str, size_t len) {
  redisReply *reply = charge(task, sizeof *reply + len + 1);
  if (reply == NULL) return NULL;
  reply->str = malloc(len + 1);
  if (reply->str == NULL) {
    free(reply);
    return NULL;
  }
  memcpy(reply->str, str, len);
  reply->str[len] = '\0';
  reply->len = len;
  reply->type = task->type;
  return link_to_parent(task, reply);
}

static void *create_array(const redisReadTask *task, int elements) {
  size_t count = elements > 0 ? (size_t) elements : 0;
  redisReply *reply = charge(task, sizeof *reply + count * sizeof(redisReply *));
  if (reply == NULL) return NULL;
  if (count > 0) {
    reply->element = calloc(count, sizeof(redisReply *));
    if (reply->element == NULL) {
      free(reply);
      return NULL;
    }
  }
  reply->elements = count;
  reply->type = REDIS_REPLY_ARRAY;
  return link_to_parent(task, reply);
}

static void *create_integer(const redisReadTask *task, long long value) {
  redisReply *reply = charge(task, sizeof *reply);
  if (reply == NULL) return NULL;
  reply->type = REDIS_REPLY_INTEGER;
  reply->integer = value;
  return link_to_parent(task, reply);
}

static void *create_nil(const redisReadTask *task) {
  redisReply *reply = charge(task, sizeof *reply);
  if (reply == NULL) return NULL;
  reply->type = REDIS_REPLY_NIL;
  return link_to_parent(task, reply);
}

static void free_reply(void *object) {
  redisReply *reply = object;
  if (reply == NULL) return;
  for (size_t i = 0; i < reply->elements; i++) free_reply(reply->element[i]);
  free(reply->element);
  free(reply->str);
  free(reply);
}

static redisReplyObjectFunctions reply_functions = {
  create_string, create_array, create_integer, create_nil, free_reply,
};

/* ------------------------------------------------------------- states --- */

static void watchdog_cb(uv_timer_t *handle);

/* A drop or close asked for inside onConnect happens on the next loop turn,
 * through the watchdog timer (which then sees drop_pending). */
static void later(mj_redis_t *r) {
  r->drop_pending = 1;
  uv_timer_start(&r->watchdog, watchdog_cb, 0, 0);
}

static void try_next(mj_redis_t *r);

static void handle_closed(uv_handle_t *handle) {
  mj_redis_t *r = handle->data;
  if (handle == (uv_handle_t *) &r->poll) {
    r->poll_open = 0;
    if (r->next_pending) { /* the address before failed: the poll handle is free again */
      r->next_pending = 0;
      if (!r->closed && r->state != MJ_REDIS_DOWN) try_next(r);
    }
  }
  if (--r->open_handles == 0 && !r->resolving) {
    mj__list_unlink(&r->link);
    if (r->on_freed) r->on_freed(r);
  }
}

/* The connection is down for good: the owner hears it once, with why. */
static void went_down(mj_redis_t *r, const char *why) {
  if (r->state == MJ_REDIS_DOWN) return;
  r->state = MJ_REDIS_DOWN;
  r->ping_pending = 0;
  uv_timer_stop(&r->watchdog);
  if (r->why[0] == '\0') snprintf(r->why, sizeof r->why, "%s", why ? why : "connection closed");
  if (r->on_state && !r->closed) r->on_state(r, 0, r->why);
}

/* Drops the connection: hiredis runs every pending callback with no reply
 * (the owner sees r->why), then its cleanup hook closes our poll handle. */
static void drop(mj_redis_t *r, const char *why) {
  if (r->why[0] == '\0' && why) snprintf(r->why, sizeof r->why, "%s", why);
  if (r->in_connect) { /* hiredis 0.14 still uses the context */
    later(r);
    return;
  }
  redisAsyncContext *ac = r->ac;
  if (ac == NULL) {
    went_down(r, why);
    return;
  }
  int deferred = (ac->c.flags & REDIS_IN_CALLBACK) != 0;
  redisAsyncFree(ac); /* inside one of its callbacks, hiredis frees it on return */
  if (!deferred) {
    r->ac = NULL;
    went_down(r, why);
  }
}

/* ------------------------------------------------------------ adapter --- */

static void poll_cb(uv_poll_t *handle, int status, int events) {
  mj_redis_t *r = handle->data;
  if (r->ac == NULL) return;
  if (status < 0) { /* let hiredis find out what happened: refused, reset, closed */
    if (r->state == MJ_REDIS_CONNECTING) redisAsyncHandleWrite(r->ac);
    else redisAsyncHandleRead(r->ac);
    if (r->ac == NULL || r->state == MJ_REDIS_DOWN) return;
    char why[96];
    snprintf(why, sizeof why, "socket error: %s", uv_strerror(status));
    drop(r, why);
    return;
  }
  if (events & UV_READABLE) {
    redisAsyncHandleRead(r->ac);
    /* what is left unparsed is one reply still arriving: hiredis buffers a
     * bulk string whole before our reader functions see it, so bound it here */
    redisReader *reader = r->ac != NULL ? r->ac->c.reader : NULL;
    if (reader != NULL && reader->len - reader->pos > r->max_reply) {
      snprintf(r->why, sizeof r->why, "a reply from the server is larger than %zu bytes", r->max_reply);
      drop(r, NULL);
      return;
    }
  }
  if (r->ac != NULL && (events & UV_WRITABLE)) redisAsyncHandleWrite(r->ac);
}

static void watch(mj_redis_t *r) {
  if (r->poll_open && !uv_is_closing((uv_handle_t *) &r->poll)) {
    if (r->events) uv_poll_start(&r->poll, r->events, poll_cb);
    else uv_poll_stop(&r->poll);
  }
}

static void ev_add_read(void *data) { mj_redis_t *r = data; r->events |= UV_READABLE; watch(r); }
static void ev_del_read(void *data) { mj_redis_t *r = data; r->events &= ~UV_READABLE; watch(r); }
static void ev_add_write(void *data) { mj_redis_t *r = data; r->events |= UV_WRITABLE; watch(r); }
static void ev_del_write(void *data) { mj_redis_t *r = data; r->events &= ~UV_WRITABLE; watch(r); }

static void ev_cleanup(void *data) {
  mj_redis_t *r = data;
  if (r->poll_open && !uv_is_closing((uv_handle_t *) &r->poll))
    uv_close((uv_handle_t *) &r->poll, handle_closed);
}

static int attach(mj_redis_t *r, redisAsyncContext *ac) {
  int rc = uv_poll_init(&r->ctx->loop, &r->poll, ac->c.fd);
  if (rc != 0) return rc;
  r->poll.data = r;
  r->poll_open = 1;
  r->open_handles++;
  ac->ev.data = r;
  ac->ev.addRead = ev_add_read;
  ac->ev.delRead = ev_del_read;
  ac->ev.addWrite = ev_add_write;
  ac->ev.delWrite = ev_del_write;
  ac->ev.cleanup = ev_cleanup;
  return 0;
}

/* ----------------------------------------------------------- watchdog --- */

static void watchdog_cb(uv_timer_t *handle) {
  mj_redis_t *r = handle->data;
  if (r->drop_pending) { /* asked for inside on_connect */
    r->drop_pending = 0;
    if (r->close_pending) mj_redis_close(r);
    else drop(r, NULL);
    return;
  }
  uint64_t now = uv_now(&r->ctx->loop);
  int waiting = r->state == MJ_REDIS_RESOLVING || r->state == MJ_REDIS_CONNECTING || r->pending > 0
                || r->ping_pending;
  if (!waiting) {
    uv_timer_stop(&r->watchdog);
    return;
  }
  /* a name with several addresses shares the connect timeout among them */
  uint64_t budget = r->timeout_ms;
  if (r->state == MJ_REDIS_CONNECTING && r->naddrs > 1)
    budget = r->timeout_ms / r->naddrs ? r->timeout_ms / r->naddrs : 1;
  if (now - r->last_progress < budget) return;
  if (r->state == MJ_REDIS_CONNECTING && r->ac != NULL && r->naddrs > 1) {
    /* this address does not answer: the next one, once the poll handle closed */
    redisAsyncContext *ac = r->ac;
    snprintf(r->last_error, sizeof r->last_error, "could not connect within %llu ms",
             (unsigned long long) budget);
    r->ac = NULL;
    r->last_progress = now;
    int more = r->next_addr < r->naddrs;
    r->next_pending = more;
    redisAsyncFree(ac); /* not connected: no disconnect callback; our cleanup closes the poll */
    if (!more) try_next(r); /* none left: down, saying which addresses were tried */
    return;
  }
  char why[96];
  if (r->state == MJ_REDIS_UP)
    snprintf(why, sizeof why, "no reply from the server within %llu ms", (unsigned long long) r->timeout_ms);
  else
    snprintf(why, sizeof why, "could not connect within %llu ms", (unsigned long long) r->timeout_ms);
  drop(r, why);
}

static void arm_watchdog(mj_redis_t *r) {
  uint64_t every = r->timeout_ms / 4 ? r->timeout_ms / 4 : 1;
  uv_update_time(&r->ctx->loop); /* the loop's cached time may be old: the caller ran long */
  r->last_progress = uv_now(&r->ctx->loop);
  if (!uv_is_active((uv_handle_t *) &r->watchdog))
    uv_timer_start(&r->watchdog, watchdog_cb, every, every);
}

/* ------------------------------------------------------------ connect --- */

static void on_connect(const redisAsyncContext *ac, int status) {
  mj_redis_t *r = ac->data;
  if (status != REDIS_OK) {
    r->ac = NULL; /* hiredis frees it after this callback */
    snprintf(r->last_error, sizeof r->last_error, "%s", ac->errstr);
    if (r->next_addr < r->naddrs && !r->closed) r->next_pending = 1; /* once the poll closed */
    else try_next(r); /* none left: down, saying which addresses were tried */
    return;
  }
  r->state = MJ_REDIS_UP;
  redisEnableKeepAlive((redisContext *) &ac->c); /* a silent subscription link ends too */
  r->last_progress = uv_now(&r->ctx->loop);
  if (r->pending == 0) uv_timer_stop(&r->watchdog);
  r->in_connect = 1;
  if (r->on_state && !r->closed) r->on_state(r, 1, NULL);
  r->in_connect = 0;
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  mj_redis_t *r = ac->data;
  r->ac = NULL; /* hiredis frees it after this callback */
  went_down(r, status == REDIS_OK ? "connection closed" : ac->errstr);
}

/* Starts connecting to one numeric address: 0, or -1 with r->last_error set. */
static int connect_to(mj_redis_t *r, const char *ip) {
  redisAsyncContext *ac = redisAsyncConnect(ip, r->port);
  if (ac == NULL) {
    snprintf(r->last_error, sizeof r->last_error, "out of memory");
    return -1;
  }
  if (ac->err) {
    snprintf(r->last_error, sizeof r->last_error, "cannot connect to %.100s:%d: %s", r->host, r->port, ac->errstr);
    redisAsyncFree(ac);
    return -1;
  }
  ac->data = r;
  ac->c.reader->fn = &reply_functions;
  redisReaderSetPrivdata(ac->c.reader, r);
  int rc = attach(r, ac);
  if (rc != 0) {
    redisAsyncFree(ac);
    snprintf(r->last_error, sizeof r->last_error, "%s", uv_strerror(rc));
    return -1;
  }
  r->ac = ac;
  r->state = MJ_REDIS_CONNECTING;
  r->last_progress = uv_now(&r->ctx->loop); /* each address gets its share of the timeout */
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  return 0;
}

/* The next address the name resolved to; down once none is left (with the
 * last address's error, and which addresses were tried when more than one). */
static void try_next(mj_redis_t *r) {
  while (r->next_addr < r->naddrs)
    if (connect_to(r, r->addrs[r->next_addr++]) == 0) return;
  if (r->naddrs < 2) {
    went_down(r, r->last_error);
    return;
  }
  char why[sizeof r->why], tried[128] = "";
  for (int i = 0; i < r->naddrs; i++) {
    size_t used = strlen(tried);
    snprintf(tried + used, sizeof tried - used, "%s%s", i ? ", " : "", r->addrs[i]);
  }
  snprintf(why, sizeof why, "%.70s (tried every address of %.30s: %.50s)", r->last_error, r->host, tried);
  went_down(r, why);
}

/* Keeps every address (IPv4 and IPv6, no duplicates) in the resolver's order:
 * `localhost` may give ::1 first to a server listening on 127.0.0.1 only. */
static void keep_addresses(mj_redis_t *r, const struct addrinfo *res) {
  r->naddrs = r->next_addr = 0;
  for (const struct addrinfo *p = res; p != NULL && r->naddrs < MJ_REDIS_ADDRS; p = p->ai_next) {
    char ip[64] = "";
    if (p->ai_family == AF_INET6) uv_ip6_name((const struct sockaddr_in6 *) p->ai_addr, ip, sizeof ip);
    else if (p->ai_family == AF_INET) uv_ip4_name((const struct sockaddr_in *) p->ai_addr, ip, sizeof ip);
    if (ip[0] == '\0') continue;
    int seen = 0;
    for (int i = 0; i < r->naddrs && !seen; i++) seen = strcmp(r->addrs[i], ip) == 0;
    if (!seen) snprintf(r->addrs[r->naddrs++], sizeof r->addrs[0], "%s", ip);
  }
}

static void resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  mj_redis_t *r = req->data;
  r->resolving = 0;
  if (status == 0) keep_addresses(r, res);
  uv_freeaddrinfo(res);
  if (r->closed || r->state == MJ_REDIS_DOWN) { /* closed, or timed out while resolving */
    if (r->closed && r->open_handles == 0) {
      mj__list_unlink(&r->link);
      if (r->on_freed) r->on_freed(r);
    }
    return;
  }
  if (status != 0 || r->naddrs == 0) {
    char why[160];
    snprintf(why, sizeof why, "cannot resolve %.100s: %s", r->host,
             status != 0 ? uv_strerror(status) : "no IPv4 or IPv6 address");
    went_down(r, why);
    return;
  }
  try_next(r);
}

static void close_all(mj_ctx_t *ctx);

static const mj_closer_t closer = {MJ_CLOSE_REDIS, close_all, NULL};

/* Starts connecting to host:port (a name or a numeric address). The owner
 * hears on_state(r, 1) once connected, on_state(r, 0, why) once down (also
 * when connecting failed), and on_freed(r) after mj_redis_close once no handle
 * or request points into r any more (until then r is on the context's list).
 * Returns 0 or a libuv error. */
int mj_redis_open(mj_ctx_t *ctx, mj_redis_t *r, const char *host, int port,
                  uint64_t timeout_ms, size_t max_reply) {
  struct addrinfo hints;
  if (strlen(host) >= sizeof r->host) return UV_EINVAL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  r->resolver.data = r;
  int rc = uv_getaddrinfo(&ctx->loop, &r->resolver, resolved, host, NULL, &hints);
  if (rc != 0) return rc;
  r->resolving = 1;
  r->ctx = ctx;
  snprintf(r->host, sizeof r->host, "%s", host);
  r->port = port;
  r->timeout_ms = timeout_ms ? timeout_ms : 1;
  r->max_reply = max_reply;
  r->state = MJ_REDIS_RESOLVING;
  uv_timer_init(&ctx->loop, &r->watchdog);
  r->watchdog.data = r;
  r->open_handles = 1;
  mj__list_push(&ctx->redis, &r->link);
  mj__ctx_on_close(ctx, &closer);
  arm_watchdog(r);
  return 0;
}

/* ----------------------------------------------------------- commands --- */

static void reply_cb(redisAsyncContext *ac, void *reply, void *privdata) {
  mj_redis_t *r = ac->data;
  intptr_t tag = (intptr_t) privdata;
  int persistent = (int) (tag & 1);
  if (!persistent && r->pending > 0) r->pending--;
  if (reply != NULL) r->last_progress = uv_now(&r->ctx->loop);
  r->reply_bytes = 0;
  if (r->on_reply) {
    const char *error = reply == NULL ? (r->why[0] ? r->why : "connection lost") : NULL;
    r->on_reply(r, tag >> 1, persistent, reply, error);
  }
}

/* Sends a command (argc strings with their lengths). `tag` comes back with its
 * reply; a persistent command (SUBSCRIBE) gets every message of the channel
 * and a last call without a reply when the connection ends. Returns 0, or
 * UV_ENOTCONN when the connection is not up. */
int mj_redis_command(mj_redis_t *r, int argc, const char **argv, const size_t *lens, intptr_t tag,
                     int persistent) {
  if (r->state != MJ_REDIS_UP || r->ac == NULL || r->closed || r->close_pending) return UV_ENOTCONN;
  void *privdata = (void *) ((tag << 1) | (persistent ? 1 : 0));
  if (redisAsyncCommandArgv(r->ac, reply_cb, privdata, argc, argv, lens) != REDIS_OK)
    return UV_ENOTCONN;
  if (!persistent && r->pending++ == 0) arm_watchdog(r);
  return 0;
}

/* A PING on a subscribed connection, whose answer (any byte back) is due
 * within timeout_ms, or the connection drops: a subscription waits for
 * messages that may never come, so only this notices a link that died
 * silently. The PING goes into hiredis's output buffer with no callback:
 * hiredis 0.14 would keep a callback for it for ever (its answer, ["pong",
 * ""], is taken for a pattern message and dropped). Returns 0, UV_ENOTCONN
 * when not up, or UV_EINVAL on a connection not (only) subscribed. */
int mj_redis_ping(mj_redis_t *r) {
  static const char ping[] = "*1\r\n$4\r\nPING\r\n";
  if (r->state != MJ_REDIS_UP || r->ac == NULL || r->closed || r->close_pending) return UV_ENOTCONN;
  if (!(r->ac->c.flags & REDIS_SUBSCRIBED) || r->ac->replies.head != NULL) return UV_EINVAL;
  if (r->ping_pending) return 0; /* the last one is still due */
  if (redisAppendFormattedCommand(&r->ac->c, ping, sizeof ping - 1) != REDIS_OK) return UV_ENOMEM;
  ev_add_write(r);
  if (r->pending == 0) arm_watchdog(r);
  r->ping_pending = 1;
  return 0;
}

/* Ends the connection: commands in flight get an error (their callbacks run
 * now), no state event follows, and on_freed comes once the handles closed. */
void mj_redis_close(mj_redis_t *r) {
  if (r->closed) return;
  if (r->in_connect) { /* the context cannot be freed yet: on the next turn */
    r->close_pending = 1;
    later(r);
    return;
  }
  r->closed = 1;
  if (r->ac != NULL) drop(r, "closed");
  r->state = MJ_REDIS_DOWN;
  if (!uv_is_closing((uv_handle_t *) &r->watchdog))
    uv_close((uv_handle_t *) &r->watchdog, handle_closed);
  if (r->resolving) uv_cancel((uv_req_t *) &r->resolver);
}

/* mj_ctx_close: every connection ends with the context. */
static void close_all(mj_ctx_t *ctx) {
  MJ_LIST_EACH_SAFE(it, &ctx->redis) {
    mj_redis_close(MJ_LIST_ITEM(it, mj_redis_t, link));
  }
}
