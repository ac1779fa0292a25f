/* redis.c -- one connection to a Redis server, on the context's libuv loop.
 *
 * Mechanism only: resolve the host name with uv_getaddrinfo, connect a
 * uv_tcp_t to each numeric address it gave in turn until one answers
 * (localhost may give ::1 first to a server on 127.0.0.1 only; the addresses
 * share the connect timeout), optionally speak TLS over it (redis_tls.c),
 * send commands as argument vectors (binary-safe) and hand each reply to
 * the owner. What the commands mean, reconnecting, AUTH and SELECT are the
 * owner's business (lua/moonjob/redis/client.lua).
 *
 * The socket is ours; hiredis 0.14 only formats commands and parses replies
 * (its reader, with our reply objects). Its asynchronous layer knows neither
 * TLS nor SSUBSCRIBE, and costs two epoll_ctl calls per command sent.
 * Commands staged during a loop turn go out together, in one write, before
 * the loop next waits (mj__redis_flush_all, from loop.c's prepare handle).
 * Replies are matched to commands by order (the replies due: a ring); the
 * pushes of a subscription (message, smessage, and a server's sunsubscribe)
 * go to the tag of their channel instead.
 *
 * One mj_redis_t is one connection: once it goes down (refused, reset, timed
 * out, closed) it stays down, every command in flight gets an error, and the
 * owner opens a new one if it wants to.
 *
 * A cut network would hang a connection for ever: a watchdog timer drops the
 * connection when connecting (and the TLS handshake) takes longer than
 * timeout_ms, or when commands are in flight and no reply came for
 * timeout_ms (counted from the last reply, or from when the first command
 * still unanswered went out: commands sent meanwhile do not push it back). Commands sent with `persistent` (SUBSCRIBE, SSUBSCRIBE) are not
 * counted: their messages come when they come; the owner PINGs a subscribed
 * connection instead (mj_redis_ping), whose answer is due within timeout_ms.
 *
 * Everything read from the server is untrusted: replies are built by our own
 * reader functions, which refuse a reply (and drop the connection) once it
 * would take more than max_reply bytes (millions of tiny array elements, say),
 * and the connection drops once the unparsed rest of a reply passes that
 * bound (the reader buffers a bulk string whole before those functions see it).
 *
 * What waits to be written is bounded (max_out: 16 times max_reply): past
 * it a command is refused (UV_ENOBUFS) rather than held while a server does
 * not read.
 *
 * Caveat: a callback may close the connection, or a reply's callback may
 * end it; the commands still in flight then hear of it once that callback
 * returned (as they did with hiredis), never in the middle of it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

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

/* ------------------------------------------------------ replies due --- */

static mj_redis_due_t *due_head(mj_redis_t *r) {
  return r->due_count ? &r->due[r->due_first] : NULL;
}

static void due_pop(mj_redis_t *r) {
  r->due_first = (r->due_first + 1) % r->due_cap;
  r->due_count--;
}

/* Room for one more (the ring doubles, its wrapped part moved after the rest). */
static int due_room(mj_redis_t *r) {
  if (r->due_count < r->due_cap) return 0;
  unsigned cap = r->due_cap ? r->due_cap * 2 : 16;
  mj_redis_due_t *grown = realloc(r->due, cap * sizeof *grown);
  if (grown == NULL) return UV_ENOMEM;
  for (unsigned i = 0; i < r->due_first; i++) grown[r->due_cap + i] = grown[i];
  r->due = grown;
  r->due_cap = cap;
  return 0;
}

static void due_push(mj_redis_t *r, mj_redis_due_kind_t kind, intptr_t tag, unsigned left) {
  mj_redis_due_t *d = &r->due[(r->due_first + r->due_count++) % r->due_cap];
  d->tag = tag;
  d->kind = kind;
  d->left = left;
}

/* ------------------------------------------------------------- states --- */

static void watchdog_cb(uv_timer_t *handle);
static void try_next(mj_redis_t *r);

static void release(mj_redis_t *r) {
  mj__list_unlink(&r->link);
  mj__list_unlink(&r->staged_link);
  mj__tls_end(r, 1);
  if (r->reader) redisReaderFree(r->reader);
  for (unsigned i = 0; i < r->nsubs; i++) free(r->subs[i].channel);
  free(r->subs);
  free(r->due);
  free(r->out);
  free(r->plain);
  free(r->wire);
  if (r->on_freed) r->on_freed(r);
}

/* r is freed once closed and no handle or request points into it. */
static void maybe_release(mj_redis_t *r) {
  if (r->closed && r->open_handles == 0 && !r->resolving) release(r);
}

static void handle_closed(uv_handle_t *handle) {
  mj_redis_t *r = handle->data;
  r->open_handles--;
  if (handle == (uv_handle_t *) &r->tcp) {
    r->tcp_open = 0;
    if (r->next_pending) { /* the address before failed: the handle is free again */
      r->next_pending = 0;
      if (!r->closed && r->state != MJ_REDIS_DOWN) try_next(r);
    }
  }
  maybe_release(r);
}

/* (the TLS session stays until the next address, or the end: callers up
 * the stack may still look at it) */
static void close_socket(mj_redis_t *r) {
  r->out_len = r->plain_len = 0;
  if (r->tcp_open && !uv_is_closing((uv_handle_t *) &r->tcp))
    uv_close((uv_handle_t *) &r->tcp, handle_closed); /* a write in flight is cancelled */
}

/* Every command in flight hears why, then every subscription (once a command). */
static void fail_all(mj_redis_t *r) {
  const char *why = r->why[0] ? r->why : "connection lost";
  while (r->due_count > 0) {
    mj_redis_due_t d = *due_head(r);
    due_pop(r);
    if (d.kind != MJ_DUE_REPLY) continue;
    if (r->pending > 0) r->pending--;
    if (r->on_reply) r->on_reply(r, d.tag, 0, NULL, why);
  }
  while (r->nsubs > 0) {
    mj_redis_sub_t s = r->subs[--r->nsubs];
    free(s.channel);
    if (s.owner && r->on_reply) r->on_reply(r, s.tag, 1, NULL, why);
  }
}

/* The connection is down for good: the commands in flight hear it, then the
 * owner, once, with why. Nothing can be sent from now on. */
static void went_down(mj_redis_t *r, const char *why) {
  if (r->state == MJ_REDIS_DOWN) return;
  int was_up = r->state == MJ_REDIS_UP;
  r->state = MJ_REDIS_DOWN;
  r->ping_pending = r->drop_due = 0;
  r->unsent = 0;
  uv_timer_stop(&r->watchdog);
  mj__list_unlink(&r->staged_link);
  if (r->why[0] == '\0') snprintf(r->why, sizeof r->why, "%s", why ? why : "connection closed");
  if (r->closed && was_up && r->tls != NULL) mj__tls_goodbye(r); /* the owner's close, before the socket's */
  close_socket(r);
  fail_all(r);
  if (r->on_state && !r->closed) r->on_state(r, 0, r->why);
}

/* Drops the connection for why (unless a reason was given first). While
 * replies are handed out, once the callback in progress returned. */
void mj__redis_fail(mj_redis_t *r, const char *why) {
  if (r->why[0] == '\0' && why) snprintf(r->why, sizeof r->why, "%s", why);
  if (r->dispatching) r->drop_due = 1;
  else went_down(r, why);
}

static void socket_failed(mj_redis_t *r, const char *what, int status) {
  char why[240];
  if (!mj__tls_unwelcome(r, why, sizeof why)) snprintf(why, sizeof why, "%s: %s", what, strerror(-status));
  mj__redis_fail(r, why);
}

/* ------------------------------------------------------------ writing --- */

/* A buffer emptied goes back to the system when it grew past this (one big
 * command must not keep its size for the life of the connection). */
#define KEEP_BYTES ((size_t) 1 << 20)

/* The bytes of commands that may wait to be written, as many replies' worth
 * as max_reply bounds (its default, 64 MiB, gives 1 GiB: the
 * client-query-buffer-limit of a Redis with default settings, past which
 * the server would drop the connection anyway). */
#define OUT_PER_REPLY 16

/* A write's buffers each hold at most PIECE bytes (uv_buf_init's length is
 * an unsigned int), NPIECES of them at most: the rest goes in the next one. */
#define PIECE ((size_t) 1 << 30)
#define NPIECES 4

static void shrink(char **buf, size_t *cap) {
  if (*cap <= KEEP_BYTES) return;
  free(*buf);
  *buf = NULL;
  *cap = 0;
}

/* data[0, len) as bufs (NPIECES at most); *total gets the bytes they hold. */
static unsigned pieces(uv_buf_t *bufs, char *data, size_t len, size_t *total) {
  unsigned n = 0;
  *total = 0;
  while (len > *total && n < NPIECES) {
    size_t k = len - *total < PIECE ? len - *total : PIECE;
    bufs[n++] = uv_buf_init(data + *total, (unsigned) k);
    *total += k;
  }
  return n;
}

static void written_cb(uv_write_t *req, int status);

/* The next part of r->wire, in a libuv write. */
static void write_wire(mj_redis_t *r) {
  uv_buf_t bufs[NPIECES];
  unsigned n = pieces(bufs, r->wire + r->wire_off, r->wire_len - r->wire_off, &r->wire_piece);
  r->writer.data = r;
  int rc = uv_write(&r->writer, (uv_stream_t *) &r->tcp, bufs, n, written_cb);
  if (rc != 0) {
    socket_failed(r, "socket error", rc);
    return;
  }
  r->writing = 1;
}

static void written_cb(uv_write_t *req, int status) {
  mj_redis_t *r = req->data;
  r->writing = 0;
  r->wire_off += r->wire_piece;
  if (status == UV_ECANCELED || r->state == MJ_REDIS_DOWN) { /* closing */
    r->wire_len = r->wire_off = 0;
    return;
  }
  if (status < 0) {
    socket_failed(r, "socket error", status);
    return;
  }
  if (r->wire_off < r->wire_len) {
    write_wire(r);
    return;
  }
  r->wire_len = r->wire_off = 0;
  shrink(&r->wire, &r->wire_cap);
  mj__redis_send(r); /* what came meanwhile */
}

/* Hands what is in r->out to the socket: written at once when the kernel
 * takes it all (the usual case: one write, no callback), else the rest goes
 * in libuv writes, and new bytes gather in r->out meanwhile. */
void mj__redis_send(mj_redis_t *r) {
  if (r->writing || r->out_len == 0 || !r->tcp_open) return;
  uv_buf_t bufs[NPIECES];
  size_t total;
  unsigned nbufs = pieces(bufs, r->out, r->out_len, &total);
  int n = uv_try_write((uv_stream_t *) &r->tcp, bufs, nbufs);
  if (n == UV_EAGAIN) n = 0;
  if (n < 0) {
    socket_failed(r, "socket error", n);
    return;
  }
  if ((size_t) n == r->out_len) {
    r->out_len = 0;
    shrink(&r->out, &r->out_cap);
    return;
  }
  char *rest = r->out; /* the buffers swap: libuv holds this one until its writes are over */
  size_t cap = r->out_cap;
  r->wire_len = r->out_len;
  r->wire_off = (size_t) n;
  r->out = r->wire;
  r->out_cap = r->wire_cap;
  r->out_len = 0;
  r->wire = rest;
  r->wire_cap = cap;
  write_wire(r);
}

/* Room for len more bytes at the end of r->out (the caller adds them to
 * out_len), or NULL: out of memory. */
char *mj__redis_out_room(mj_redis_t *r, size_t len) {
  if (mj__grow(&r->out, &r->out_cap, r->out_len + len, 4096) != 0) return NULL;
  return r->out + r->out_len;
}

/* The bytes waiting to be written: staged, encrypted, in flight. */
static size_t waiting_bytes(const mj_redis_t *r) {
  return r->out_len + r->plain_len + (r->wire_len - r->wire_off);
}

/* Stages a command's bytes for the next flush (TLS: in the clear, encrypted
 * then). 0, UV_ENOBUFS (past max_out) or UV_ENOMEM. */
static int stage(mj_redis_t *r, const char *data, size_t len) {
  if (len > r->max_out || waiting_bytes(r) > r->max_out - len) return UV_ENOBUFS;
  if (r->tls != NULL) {
    if (mj__grow(&r->plain, &r->plain_cap, r->plain_len + len, 4096) != 0) return UV_ENOMEM;
    memcpy(r->plain + r->plain_len, data, len);
    r->plain_len += len;
  } else {
    char *room = mj__redis_out_room(r, len);
    if (room == NULL) return UV_ENOMEM;
    memcpy(room, data, len);
    r->out_len += len;
  }
  if (!mj__list_linked(&r->staged_link)) mj__list_push(&r->ctx->redis_staged, &r->staged_link);
  return 0;
}

/* The commands staged go out. When none sent before awaits its reply, the
 * reply deadline starts now; else it stays the one of those before (a
 * server that stopped answering is noticed however often commands come). */
static void flush(mj_redis_t *r) {
  mj__list_unlink(&r->staged_link);
  if (r->state != MJ_REDIS_UP) return;
  if (r->unsent > 0 && (long) r->pending + r->ping_pending <= (long) r->unsent) {
    uv_update_time(&r->ctx->loop); /* the loop's cached time may be old: the caller ran long */
    r->last_progress = uv_now(&r->ctx->loop);
  }
  r->unsent = 0;
  if (r->tls != NULL) {
    if (mj__tls_encrypt(r) != 0) return;
    if (r->plain_len == 0) shrink(&r->plain, &r->plain_cap);
  }
  mj__redis_send(r);
}

/* loop.c, before the loop waits: each connection's staged commands in one write. */
void mj__redis_flush_all(mj_ctx_t *ctx) {
  while (!mj__list_empty(&ctx->redis_staged)) /* a failed flush may stage on others */
    flush(MJ_LIST_ITEM(ctx->redis_staged.next, mj_redis_t, staged_link));
}

/* ------------------------------------------------------------ reading --- */

static int is(const redisReply *reply, const char *word) {
  return reply->type == REDIS_REPLY_STRING && reply->len == strlen(word) && memcmp(reply->str, word, reply->len) == 0;
}

static int channel_is(const mj_redis_sub_t *s, const redisReply *channel, int sharded) {
  return s->sharded == (unsigned) sharded && channel->type == REDIS_REPLY_STRING && s->len == channel->len
         && memcmp(s->channel, channel->str, s->len) == 0;
}

/* A message of a channel, to every subscription of it. */
static void deliver_message(mj_redis_t *r, const redisReply *reply, int sharded) {
  for (unsigned i = 0; i < r->nsubs && r->state == MJ_REDIS_UP && !r->drop_due; i++)
    if (channel_is(&r->subs[i], reply->element[1], sharded) && r->on_reply)
      r->on_reply(r, r->subs[i].tag, 1, reply, NULL);
}

/* Another channel than subs[skip] with its tag, or NULL. */
static mj_redis_sub_t *tag_shared(mj_redis_t *r, unsigned skip) {
  for (unsigned i = 0; i < r->nsubs; i++)
    if (i != skip && r->subs[i].tag == r->subs[skip].tag) return &r->subs[i];
  return NULL;
}

static void remove_sub(mj_redis_t *r, unsigned i) {
  free(r->subs[i].channel);
  r->subs[i] = r->subs[--r->nsubs];
}

/* The server ended a subscription (a shard's slot moved: sunsubscribe): its
 * tag hears it, as its last call unless other channels share the tag. */
static void deliver_unsubscribe(mj_redis_t *r, const redisReply *reply, int sharded) {
  for (unsigned i = 0; i < r->nsubs; i++) {
    if (!channel_is(&r->subs[i], reply->element[1], sharded)) continue;
    intptr_t tag = r->subs[i].tag;
    mj_redis_sub_t *other = tag_shared(r, i);
    if (other != NULL && r->subs[i].owner) other->owner = 1; /* it hears the tag's last call now */
    remove_sub(r, i);
    if (r->on_reply) r->on_reply(r, tag, other != NULL, reply, NULL);
    return;
  }
}

/* A SUBSCRIBE the server refused (ACL, CROSSSLOT, MOVED): its channels go,
 * and its tag hears the error as its last call. */
static void subscribe_refused(mj_redis_t *r, intptr_t tag, const redisReply *reply) {
  for (unsigned i = r->nsubs; i-- > 0;)
    if (r->subs[i].tag == tag) remove_sub(r, i);
  if (r->on_reply) r->on_reply(r, tag, 0, reply, NULL);
}

static void count_subscribed(mj_redis_t *r, const redisReply *reply, int sharded) {
  if (reply->elements >= 3 && reply->element[2]->type == REDIS_REPLY_INTEGER)
    *(sharded ? &r->shard_subscribed : &r->subscribed) = (long) reply->element[2]->integer;
}

/* A push of a subscribed connection: 1 when handled, 0 for a reply to the
 * head of the replies due. */
static int pushed(mj_redis_t *r, const redisReply *reply) {
  mj_redis_due_t *head = due_head(r);
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 2 || reply->element[0]->type != REDIS_REPLY_STRING)
    return 0;
  if (r->subscribed + r->shard_subscribed <= 0 && (head == NULL || head->kind != MJ_DUE_SUBSCRIBE)) return 0;
  const redisReply *kind = reply->element[0];
  int sharded = is(kind, "smessage") || is(kind, "ssubscribe") || is(kind, "sunsubscribe");
  if (is(kind, "message") || is(kind, "smessage")) {
    deliver_message(r, reply, sharded);
  } else if (is(kind, "unsubscribe") || is(kind, "sunsubscribe")) {
    count_subscribed(r, reply, sharded);
    deliver_unsubscribe(r, reply, sharded);
  } else if ((is(kind, "subscribe") || is(kind, "ssubscribe")) && head && head->kind == MJ_DUE_SUBSCRIBE) {
    intptr_t tag = head->tag;
    if (--head->left == 0) due_pop(r);
    count_subscribed(r, reply, sharded);
    if (r->on_reply) r->on_reply(r, tag, 1, reply, NULL);
  } else if (!is(kind, "pmessage")) { /* ours has no patterns: pmessage is nobody's */
    return 0;
  }
  return 1;
}

/* A reply: to a subscription, else to the oldest command in flight. */
static void route(mj_redis_t *r, redisReply *reply) {
  r->last_progress = uv_now(&r->ctx->loop);
  r->replied = 1;
  if (pushed(r, reply)) return;
  mj_redis_due_t *head = due_head(r);
  if (head == NULL) {
    mj__redis_fail(r, "the server sent a reply to no command");
    return;
  }
  mj_redis_due_t d = *head;
  due_pop(r);
  if (d.kind == MJ_DUE_PING) {
    r->ping_pending = 0;
  } else if (d.kind == MJ_DUE_SUBSCRIBE) {
    if (reply->type == REDIS_REPLY_ERROR) subscribe_refused(r, d.tag, reply);
    else mj__redis_fail(r, "the server answered SUBSCRIBE with something else than a confirmation");
  } else {
    if (r->pending > 0) r->pending--;
    if (r->on_reply) r->on_reply(r, d.tag, 0, reply, NULL);
  }
}

/* Bytes from the server, in the clear: parsed, and each whole reply handed
 * out. Ending the connection meanwhile waits for the callback to return. */
void mj__redis_feed(mj_redis_t *r, const char *data, size_t len) {
  if (r->ping_pending) { /* the subscription's link carries bytes: it is alive */
    r->ping_pending = 0;
    r->last_progress = uv_now(&r->ctx->loop);
  }
  if (redisReaderFeed(r->reader, data, len) != REDIS_OK) {
    mj__redis_fail(r, "out of memory");
    return;
  }
  r->dispatching = 1;
  while (r->state == MJ_REDIS_UP && !r->drop_due) {
    void *reply = NULL;
    if (redisReaderGetReply(r->reader, &reply) != REDIS_OK) {
      char why[180];
      snprintf(why, sizeof why, "%s", r->reader->errstr);
      mj__redis_fail(r, why); /* (r->why says first when a reply was too large) */
      break;
    }
    if (reply == NULL) break;
    r->reply_bytes = 0;
    route(r, reply);
    free_reply(reply);
  }
  r->dispatching = 0;
  /* what is left unparsed is one reply still arriving: the reader buffers a
   * bulk string whole before our reply functions see it, so bound it here */
  if (r->state == MJ_REDIS_UP && !r->drop_due && r->reader->len - r->reader->pos > r->max_reply) {
    snprintf(r->why, sizeof r->why, "a reply from the server is larger than %zu bytes", r->max_reply);
    r->drop_due = 1;
  }
  if (r->drop_due) went_down(r, NULL);
}

/* The context's scratch buffer: the read callback is done with it (the
 * reader and OpenSSL copy what they keep) before any owner's callback runs. */
static void alloc_cb(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  mj_redis_t *r = handle->data;
  (void) suggested;
  *buf = uv_buf_init(r->ctx->scratch, sizeof r->ctx->scratch);
}

/* The server ended the connection. Before a single byte, a plaintext client
 * met a TLS port most likely (Redis closes it so). */
static void ended(mj_redis_t *r, int status) {
  char why[240];
  const char *what = status == UV_EOF ? "Server closed the connection" : strerror(-status);
  if (mj__tls_unwelcome(r, why, sizeof why)) { /* (why says it) */
  } else if (r->state == MJ_REDIS_CONNECTING) {
    snprintf(why, sizeof why, "%s during the TLS handshake", status == UV_EOF ? "the server closed the connection" : what);
  } else if (!r->heard && r->tls == NULL) {
    snprintf(why, sizeof why, "%s before any reply (a TLS port does so to plaintext: if the server's port is"
             " a TLS port, use a rediss:// URL)", what);
  } else {
    snprintf(why, sizeof why, "%s", what);
  }
  mj__redis_fail(r, why);
}

static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  mj_redis_t *r = stream->data;
  if (r->state == MJ_REDIS_DOWN || nread == 0) return;
  if (nread < 0) {
    ended(r, (int) nread);
    return;
  }
  if (r->tls != NULL) mj__tls_received(r, buf->base, (size_t) nread);
  else mj__redis_feed(r, buf->base, (size_t) nread);
  r->heard = 1;
}

/* ----------------------------------------------------------- watchdog --- */

/* (the deadline is last_progress: set by the caller, or by flush) */
static void arm_watchdog(mj_redis_t *r) {
  uint64_t every = r->timeout_ms / 4 ? r->timeout_ms / 4 : 1;
  if (!uv_is_active((uv_handle_t *) &r->watchdog))
    uv_timer_start(&r->watchdog, watchdog_cb, every, every);
}

/* This address failed (r->last_error says why): the next one once the
 * socket closed, or down when none is left. */
static void attempt_failed(mj_redis_t *r) {
  if (r->next_addr < r->naddrs && !r->closed) {
    r->next_pending = 1;
    close_socket(r);
  } else {
    try_next(r); /* none left: down, saying which addresses were tried */
  }
}

static void watchdog_cb(uv_timer_t *handle) {
  mj_redis_t *r = handle->data;
  uint64_t now = uv_now(&r->ctx->loop);
  if (mj__list_linked(&r->staged_link)) { /* staged by a timer before this one: out first */
    flush(r);
    if (r->state == MJ_REDIS_DOWN) return;
  }
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
  char why[240];
  if (r->state == MJ_REDIS_UP)
    snprintf(why, sizeof why, "no reply from the server within %llu ms", (unsigned long long) r->timeout_ms);
  else if (r->state != MJ_REDIS_CONNECTING || !mj__tls_silence(r, budget, why, sizeof why))
    snprintf(why, sizeof why, "could not connect within %llu ms", (unsigned long long) budget);
  if (r->state == MJ_REDIS_CONNECTING && r->naddrs > 1) {
    snprintf(r->last_error, sizeof r->last_error, "%s", why);
    r->last_progress = now;
    attempt_failed(r);
    return;
  }
  went_down(r, why);
}

/* ------------------------------------------------------------ connect --- */

/* Connected, and with TLS through the handshake: commands may go. */
void mj__redis_up(mj_redis_t *r) {
  r->state = MJ_REDIS_UP;
  r->last_progress = uv_now(&r->ctx->loop);
  if (r->pending == 0) uv_timer_stop(&r->watchdog);
  if (r->on_state && !r->closed) r->on_state(r, 1, NULL);
}

static void connect_cb(uv_connect_t *req, int status) {
  mj_redis_t *r = req->data;
  if (status == UV_ECANCELED || r->state != MJ_REDIS_CONNECTING || r->closed) return;
  if (status == 0) status = uv_read_start((uv_stream_t *) &r->tcp, alloc_cb, read_cb);
  if (status != 0) {
    snprintf(r->last_error, sizeof r->last_error, "%s", strerror(-status));
    attempt_failed(r);
    return;
  }
  if (r->tls == NULL) {
    mj__redis_up(r);
    return;
  }
  if (mj__tls_start(r) != 0) went_down(r, r->last_error);
}

/* Starts connecting to address i: 0, or -1 with r->last_error set (the
 * socket, when it was opened, is the caller's to close). */
static int connect_to(mj_redis_t *r, int i) {
  mj__tls_end(r, 0); /* the address before's */
  int rc = uv_tcp_init(&r->ctx->loop, &r->tcp);
  if (rc == 0) {
    r->tcp.data = r;
    r->tcp_open = 1;
    r->open_handles++;
    r->heard = r->replied = 0;
    uv_tcp_nodelay(&r->tcp, 1);
    uv_tcp_keepalive(&r->tcp, 1, 15); /* a silent subscription link ends too */
    r->connector.data = r;
    rc = uv_tcp_connect(&r->connector, &r->tcp, &r->sockaddrs[i].sa, connect_cb);
  }
  if (rc != 0) {
    snprintf(r->last_error, sizeof r->last_error, "cannot connect to %.100s:%d: %s", r->host, r->port, strerror(-rc));
    return -1;
  }
  r->state = MJ_REDIS_CONNECTING;
  r->last_progress = uv_now(&r->ctx->loop); /* each address gets its share of the timeout */
  return 0;
}

/* The next address the name resolved to; down once none is left (with the
 * last address's error, and which addresses were tried when more than one). */
static void try_next(mj_redis_t *r) {
  while (r->next_addr < r->naddrs) {
    if (connect_to(r, r->next_addr++) == 0) return;
    if (r->tcp_open) { /* goes on once the socket closed */
      attempt_failed(r);
      return;
    }
  }
  if (r->naddrs < 2) {
    went_down(r, r->last_error);
    return;
  }
  char why[sizeof r->why], tried[128] = "";
  for (int i = 0; i < r->naddrs; i++) {
    size_t used = strlen(tried);
    snprintf(tried + used, sizeof tried - used, "%s%s", i ? ", " : "", r->addrs[i]);
  }
  snprintf(why, sizeof why, "%.200s (tried every address of %.30s: %.60s)", r->last_error, r->host, tried);
  went_down(r, why);
}

/* Keeps every address (IPv4 and IPv6, no duplicates) in the resolver's order:
 * `localhost` may give ::1 first to a server listening on 127.0.0.1 only. */
static void keep_addresses(mj_redis_t *r, const struct addrinfo *res) {
  r->naddrs = r->next_addr = 0;
  for (const struct addrinfo *p = res; p != NULL && r->naddrs < MJ_REDIS_ADDRS; p = p->ai_next) {
    char ip[64] = "";
    mj_sockaddr_t sa;
    memset(&sa, 0, sizeof sa);
    if (p->ai_family == AF_INET6) {
      memcpy(&sa.in6, p->ai_addr, sizeof sa.in6);
      uv_ip6_name(&sa.in6, ip, sizeof ip);
      sa.in6.sin6_port = htons((uint16_t) r->port);
    } else if (p->ai_family == AF_INET) {
      memcpy(&sa.in, p->ai_addr, sizeof sa.in);
      uv_ip4_name(&sa.in, ip, sizeof ip);
      sa.in.sin_port = htons((uint16_t) r->port);
    }
    if (ip[0] == '\0') continue;
    int seen = 0;
    for (int i = 0; i < r->naddrs && !seen; i++) seen = strcmp(r->addrs[i], ip) == 0;
    if (seen) continue;
    snprintf(r->addrs[r->naddrs], sizeof r->addrs[0], "%s", ip);
    r->sockaddrs[r->naddrs++] = sa;
  }
}

static void resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  mj_redis_t *r = req->data;
  r->resolving = 0;
  if (status == 0) keep_addresses(r, res);
  uv_freeaddrinfo(res);
  if (r->closed || r->state == MJ_REDIS_DOWN) { /* or timed out while resolving */
    maybe_release(r);
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

static const mj_closer_t closer = {MJ_CLOSE_REDIS, close_all, mj__tls_forget_all};

/* Starts connecting to host:port (a name or a numeric address), with TLS
 * when tls is not NULL. The owner hears on_state(r, 1) once connected,
 * on_state(r, 0, why) once down (also when connecting failed), and
 * on_freed(r) after mj_redis_close once no handle or request points into r
 * any more (until then r is on the context's list). Returns 0, a libuv
 * error, or MJ_ETLS with why set (a file of tls cannot be used). */
int mj_redis_open(mj_ctx_t *ctx, mj_redis_t *r, const char *host, int port, uint64_t timeout_ms,
                  size_t max_reply, const mj_redis_tls_options_t *tls, char *why, size_t why_len) {
  struct addrinfo hints;
  if (strlen(host) >= sizeof r->host) return UV_EINVAL;
  mj__ctx_on_close(ctx, &closer); /* (the TLS contexts made end with the loop too) */
  if (tls != NULL) {
    if (mj__tls_context(ctx, tls, &r->tls, why, why_len) != 0) return MJ_ETLS;
    snprintf(r->servername, sizeof r->servername, "%s", tls->servername ? tls->servername : host);
    r->tls_cert = tls->cert != NULL;
    r->tls_ca = tls->ca != NULL;
  }
  r->reader = redisReaderCreateWithFunctions(&reply_functions);
  if (r->reader == NULL) {
    mj__tls_end(r, 1);
    return UV_ENOMEM;
  }
  redisReaderSetPrivdata(r->reader, r);
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  r->resolver.data = r;
  int rc = uv_getaddrinfo(&ctx->loop, &r->resolver, resolved, host, NULL, &hints);
  if (rc != 0) {
    redisReaderFree(r->reader);
    mj__tls_end(r, 1);
    return rc;
  }
  r->resolving = 1;
  r->ctx = ctx;
  snprintf(r->host, sizeof r->host, "%s", host);
  r->port = port;
  r->timeout_ms = timeout_ms ? timeout_ms : 1;
  r->max_reply = max_reply;
  r->max_out = max_reply > SIZE_MAX / OUT_PER_REPLY ? SIZE_MAX : max_reply * OUT_PER_REPLY;
  r->state = MJ_REDIS_RESOLVING;
  uv_timer_init(&ctx->loop, &r->watchdog);
  r->watchdog.data = r;
  r->open_handles = 1;
  mj__list_push(&ctx->redis, &r->link);
  uv_update_time(&ctx->loop);
  r->last_progress = uv_now(&ctx->loop);
  arm_watchdog(r);
  return 0;
}

/* ----------------------------------------------------------- commands --- */

static int usable(const mj_redis_t *r) {
  return r->state == MJ_REDIS_UP && !r->closed && !r->drop_due;
}

/* SUBSCRIBE 1, SSUBSCRIBE 2, another command of subscriptions -1 (their
 * replies would not fit the order of replies due), anything else 0. */
static int subscription_kind(const char *name, size_t len) {
  static const char *const others[] = {"UNSUBSCRIBE", "SUNSUBSCRIBE", "PSUBSCRIBE", "PUNSUBSCRIBE", "MONITOR"};
  if (len == 9 && strncasecmp(name, "SUBSCRIBE", 9) == 0) return 1;
  if (len == 10 && strncasecmp(name, "SSUBSCRIBE", 10) == 0) return 2;
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
    if (len == strlen(others[i]) && strncasecmp(name, others[i], len) == 0) return -1;
  return 0;
}

/* Keeps the channels of a SUBSCRIBE (argv[1..argc)). */
static int add_subs(mj_redis_t *r, int argc, const char **argv, const size_t *lens, intptr_t tag, int sharded) {
  if (r->nsubs + (unsigned) argc > r->subs_cap) {
    unsigned cap = r->subs_cap ? r->subs_cap : 4;
    while (cap < r->nsubs + (unsigned) argc) cap *= 2;
    mj_redis_sub_t *grown = realloc(r->subs, cap * sizeof *grown);
    if (grown == NULL) return UV_ENOMEM;
    r->subs = grown;
    r->subs_cap = cap;
  }
  unsigned first = r->nsubs;
  for (int i = 1; i < argc; i++) {
    mj_redis_sub_t *s = &r->subs[r->nsubs];
    s->channel = malloc(lens[i] ? lens[i] : 1);
    if (s->channel == NULL) {
      while (r->nsubs > first) free(r->subs[--r->nsubs].channel);
      return UV_ENOMEM;
    }
    memcpy(s->channel, argv[i], lens[i]);
    s->len = lens[i];
    s->tag = tag;
    s->sharded = sharded != 0;
    s->owner = i == 1;
    r->nsubs++;
  }
  return 0;
}

/* Sends a command (argc strings with their lengths). `tag` comes back with its
 * reply; a persistent command (SUBSCRIBE or SSUBSCRIBE, and only those) gets
 * its confirmations, every message of its channels, and a last call without
 * a reply when the connection ends (with an error reply: refused). Returns 0,
 * UV_ENOTCONN when the connection is not up, UV_EINVAL for a command of
 * subscriptions sent the other way (or another one of them), UV_ENOBUFS
 * when more than max_out bytes would wait to be written, or UV_ENOMEM. */
int mj_redis_command(mj_redis_t *r, int argc, const char **argv, const size_t *lens, intptr_t tag,
                     int persistent) {
  if (!usable(r)) return UV_ENOTCONN;
  int kind = subscription_kind(argv[0], lens[0]);
  if (kind < 0 || (kind > 0) != (persistent != 0) || (kind > 0 && argc < 2)) return UV_EINVAL;
  char *cmd = NULL;
  int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
  if (len < 0) return UV_ENOMEM;
  int rc = due_room(r);
  if (rc == 0 && kind > 0) rc = add_subs(r, argc, argv, lens, tag, kind == 2);
  if (rc == 0) {
    rc = stage(r, cmd, (size_t) len);
    if (rc != 0 && kind > 0)
      for (int i = 1; i < argc; i++) free(r->subs[--r->nsubs].channel);
  }
  free(cmd);
  if (rc != 0) return rc;
  due_push(r, kind ? MJ_DUE_SUBSCRIBE : MJ_DUE_REPLY, tag, kind ? (unsigned) argc - 1 : 0);
  if (!persistent) {
    r->unsent++;
    if (r->pending++ == 0) arm_watchdog(r);
  }
  return 0;
}

/* A PING on a subscribed connection, whose answer (any byte back) is due
 * within timeout_ms, or the connection drops: a subscription waits for
 * messages that may never come, so only this notices a link that died
 * silently. Its answer (["pong", ""]) is nobody's. Returns 0, UV_ENOTCONN
 * when not up, UV_EINVAL on a connection not (only) subscribed, or
 * UV_ENOBUFS / UV_ENOMEM as mj_redis_command. */
int mj_redis_ping(mj_redis_t *r) {
  static const char ping[] = "*1\r\n$4\r\nPING\r\n";
  if (!usable(r)) return UV_ENOTCONN;
  if (r->nsubs == 0 || r->pending > 0) return UV_EINVAL;
  if (r->ping_pending) return 0; /* the last one is still due */
  int rc = due_room(r);
  if (rc == 0) rc = stage(r, ping, sizeof ping - 1);
  if (rc != 0) return rc;
  due_push(r, MJ_DUE_PING, 0, 0);
  r->unsent++;
  r->ping_pending = 1;
  arm_watchdog(r);
  return 0;
}

/* Ends the connection: commands in flight get an error (their callbacks run
 * now, or once the reply callback that closes returned), no state event
 * follows, and on_freed comes once the handles closed. */
void mj_redis_close(mj_redis_t *r) {
  if (r->closed) return;
  r->closed = 1;
  if (r->why[0] == '\0') snprintf(r->why, sizeof r->why, "closed");
  if (r->dispatching) r->drop_due = 1; /* mj__redis_feed ends it after the callback */
  else went_down(r, "closed");
  if (!uv_is_closing((uv_handle_t *) &r->watchdog)) uv_close((uv_handle_t *) &r->watchdog, handle_closed);
  if (r->resolving) uv_cancel((uv_req_t *) &r->resolver);
}

/* mj_ctx_close: every connection ends with the context. */
static void close_all(mj_ctx_t *ctx) {
  MJ_LIST_EACH_SAFE(it, &ctx->redis) {
    mj_redis_close(MJ_LIST_ITEM(it, mj_redis_t, link));
  }
}
