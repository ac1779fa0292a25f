/* moonjob.h -- internal interfaces of the parent's C core (moonjob.core).
 *
 * The core is mechanism only: one libuv loop per Lua state (loop.c); child
 * processes (process.c: a child's lifetime; spawn.c and reap.c start and
 * reap it; channel.c reads its frames and output, send.c writes to it,
 * shared.c reads and changes the page they share); line input and ordered
 * output on the parent's own descriptors for the CLI (stdio.c, output.c);
 * connections to Redis (redis.c); an HTTP/1.1 server (http.c,
 * http_response.c). The Lua bindings (bind/) turn the C events below into
 * calls of Lua functions; all policy (which job goes where, retries, events)
 * is Lua.
 *
 * The core's lists are one intrusive type (list.h). What a part holds in a
 * context is on a list of the context's, and the part registers how it ends
 * with the context (mj_closer_t), so loop.c closes it without naming them.
 *
 * Errors are negative libuv codes (UV_E...), 0 on success. Names: mj_ for
 * the bindings' interface, mj__ for what only the core's own files share.
 */
#ifndef MJ_MOONJOB_H
#define MJ_MOONJOB_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <uv.h>

#include "frame.h"
#include "list.h"

/* ------------------------------------------------------------ buffers --- */

/* Grows *buf (capacity *cap) to hold at least `need` bytes, doubling from
 * `first`. Returns 0, or UV_ENOMEM with the buffer unchanged. */
static inline int mj__grow(char **buf, size_t *cap, size_t need, size_t first) {
  if (*cap >= need) return 0;
  size_t grown_cap = *cap ? *cap : first;
  while (grown_cap < need) grown_cap *= 2;
  char *grown = realloc(*buf, grown_cap);
  if (grown == NULL) return UV_ENOMEM;
  *buf = grown;
  *cap = grown_cap;
  return 0;
}

/* ------------------------------------------------------------ loop.c --- */

typedef struct mj_process_s mj_process_t;
typedef struct mj_ctx_s mj_ctx_t;

#define MJ_NSTOP_SIGNALS 3              /* SIGINT, SIGTERM, SIGHUP (loop.c) */
#define MJ_CLOSE_WAIT_MS 2000           /* mj_ctx_close waits at most this long for spawns in
                                          flight and the loop's last requests, and as long
                                          again for the children to be reaped */

/* The order in which the core's parts end when their context closes
 * (mj_ctx_close), first to last. Children are killed and reaped before their
 * processes' handles are closed: a process closes only once its child is
 * gone, and a pid is never signalled once reaped. Inputs, Redis connections
 * and HTTP servers follow, in the order they always had. Outputs end nothing
 * then: once the loop is closed they let go of it (what is still pending is
 * dropped, the released ones are freed). */
typedef enum {
  MJ_CLOSE_CHILDREN,                   /* reap.c */
  MJ_CLOSE_PROCESSES,                  /* process.c */
  MJ_CLOSE_INPUTS,                     /* stdio.c */
  MJ_CLOSE_REDIS,                      /* redis.c */
  MJ_CLOSE_HTTP,                       /* http.c */
  MJ_CLOSE_OUTPUTS,                    /* output.c */
  MJ_CLOSE_TURNS
} mj_close_turn_t;

/* How a part ends with the context: a constant of the part's, registered on
 * the context once the part holds something there (mj__ctx_on_close). */
typedef struct {
  mj_close_turn_t turn;
  void (*close)(mj_ctx_t *ctx);        /* ends what it holds, or NULL; the close
                                          callbacks come as the loop runs on */
  void (*detach)(mj_ctx_t *ctx);       /* the loop is closed: lets go of it, or NULL */
} mj_closer_t;

struct mj_ctx_s {
  uv_loop_t loop;
  uv_signal_t sigchld;                 /* reap.c: our children's exits */
  int sigchld_started;
  mj_list_t live;                      /* reap.c: children not reaped yet */
  mj_list_t open;                      /* process.c: processes whose handles are open */
  uv_prepare_t flush_before;           /* send.c's stages written before the loop waits */
  uv_check_t flush_after;              /* and once it handled its events */
  mj_list_t inputs;                    /* stdio.c: inputs not freed yet */
  mj_list_t outputs;                   /* output.c: outputs not freed yet */
  mj_list_t redis;                     /* redis.c: connections not freed yet */
  mj_list_t redis_staged;              /* redis.c: connections with commands staged this turn */
  mj_list_t tls;                       /* redis_tls.c: the TLS client contexts made so far */
  mj_list_t http;                      /* http.c: servers not freed yet */
  const mj_closer_t *closers[MJ_CLOSE_TURNS]; /* the parts to end on close, by turn */
  uv_async_t wakeup;                   /* wakes the loop from the SIGINT handler */
  volatile sig_atomic_t interrupted;   /* the stop signal caught, 0 for none */
  int stop_signal;                     /* the signal that stopped the last run */
  int running;                         /* inside uv_run: the loop is not reentrant */
  int embedded;                        /* a host loop watches the backend fd (mj_ctx_fd) */
  int ncaught;                         /* stop signals caught now: 1 during a wait, all
                                          once held (mj_ctx_hold_stop_signals) */
  struct sigaction previous[MJ_NSTOP_SIGNALS]; /* their handlers before, put back after */
  void *data;                          /* owner's context (the Lua state) */
  uint64_t tokens[64];                 /* send.c: random job tokens, drawn in batches */
  unsigned ntokens;                    /* tokens not used yet */
  int spawning;                        /* spawn.c: spawns queued on worker threads */
  char scratch[64 * 1024];             /* channel.c: output read buffer, used synchronously */
};

#define MJ_EINTERRUPTED (-10000)       /* mj_ctx_run stopped by a stop signal */
#define MJ_EREENTERED (-10001)         /* mj_ctx_run called from a callback */

int mj_ctx_init(mj_ctx_t *ctx);
int mj_ctx_run(mj_ctx_t *ctx, uv_run_mode mode);
void mj_ctx_catch_sigint(mj_ctx_t *ctx, int on);
int mj_ctx_hold_stop_signals(mj_ctx_t *ctx);
int mj_ctx_close(mj_ctx_t *ctx);
int mj_ctx_fd(mj_ctx_t *ctx);
int mj_ctx_step(mj_ctx_t *ctx);
int mj_ctx_timeout(mj_ctx_t *ctx);
void mj_ctx_touch(mj_ctx_t *ctx);
void mj__ctx_on_close(mj_ctx_t *ctx, const mj_closer_t *closer);

/* ------------------------------ process.c, channel.c, send.c, shared.c --- */

typedef enum {
  MJ_PROCESS_SPAWNED,  /* the child runs: its pid is known */
  MJ_PROCESS_FRAME,    /* a whole frame arrived: header, payload; for a frame
                          larger than MJ_PIECE, the last piece (`streamed`) */
  MJ_PROCESS_PART,     /* a piece of a frame larger than MJ_PIECE: data, len */
  MJ_PROCESS_SENT,     /* a send that returned MJ_SEND_QUEUED is over: its
                          parts' memory may be released (sends end in order) */
  MJ_PROCESS_OUTPUT,   /* bytes on the child's stdout (stream 1) or stderr (2) */
  MJ_PROCESS_OVERSIZE, /* a frame header announced more than max_frame bytes */
  MJ_PROCESS_PROTOCOL, /* a frame broke the protocol (`data`: why); the channel
                          is no longer read */
  MJ_PROCESS_EXIT,     /* the child exited and its channel reached end of file;
                          everything it sent was delivered. A spawn that failed
                          ends here too, with exit status 127 and `data` set
                          to the reason */
  MJ_PROCESS_CLOSED    /* every handle is closed: the memory may be released */
} mj_process_event_kind;

typedef struct {
  mj_process_event_kind kind;
  const mj_frame_header_t *header;     /* FRAME */
  const char *data;                    /* FRAME payload, OUTPUT bytes */
  size_t len;                          /* OUTPUT length, OVERSIZE announced length */
  int stream;                          /* OUTPUT: 1 stdout, 2 stderr */
  int64_t exit_status;                 /* EXIT */
  int term_signal;                     /* EXIT */
  const mj_job_usage_t *usage;         /* FRAME that ends a job, else NULL */
  uint64_t job;                        /* FRAME: the job number the parent sent */
  int streamed;                        /* FRAME: PART events came first; `len` is
                                          the last piece's length */
} mj_process_event_t;

/* What the child may send next (frame_violation in channel.c). */
typedef enum {
  MJ_CHILD_STARTING, /* READY or LOADERR */
  MJ_CHILD_READY,    /* PROGRESS, LOG, DONE, FAIL with the head job's token, if any */
  MJ_CHILD_ENDED     /* nothing (after LOADERR or a protocol error) */
} mj_child_state_t;

/* A JOB frame sent and not yet ended by the child. */
typedef struct {
  uint64_t job;                        /* the parent's number for it */
  uint64_t token;                      /* its random token */
  uint32_t seq;                        /* its sequence number (frame.h) */
  unsigned interrupted : 1;            /* an INTERRUPT for it was written */
  unsigned signal_due : 1;             /* signal it once it is the head */
} mj_inflight_t;

typedef void (*mj_process_event_cb)(mj_process_t *p, const mj_process_event_t *ev);

struct mj_process_s {
  uv_pipe_t channel;
  uv_pipe_t output[2];                 /* the child's stdout and stderr */
  mj_ctx_t *ctx;
  mj_process_event_cb on_event;
  void *data;                          /* owner's slot */
  char *rbuf;                          /* channel bytes not yet delivered */
  size_t rlen, rcap;
  uint32_t max_frame;
  int pid;                             /* 0 until the spawn is done */
  int pending_signal;                  /* asked for before the pid was known */
  int pending_group;
  int open_handles;                    /* handles whose close_cb is still due */
  int64_t exit_status;
  int term_signal;
  mj_child_state_t state;              /* what the child may send next */
  mj_frame_header_t big;               /* the frame being streamed in pieces */
  mj_job_usage_t big_usage;
  size_t big_left;                     /* its payload bytes still to come */
  mj_inflight_t inflight[MJ_MAX_INFLIGHT]; /* JOB frames sent, not ended: a ring, oldest
                                          (the head, the one the child runs) first */
  unsigned nin, first;                 /* how many; the head's slot */
  uint32_t seq;                        /* sequence number of the last JOB frame sent */
  uint64_t out_read[2];                /* bytes read from stdout, stderr (channel.c) */
  const char *held[2];                 /* a chunk read, not delivered yet, and its length */
  size_t held_len[2];
  char *wbuf;                          /* the stage: small JOB frames not written yet */
  size_t wlen, wcap;
  mj_shared_t *shared;                 /* the page shared with the child, or NULL */
  int shared_fd;                       /* its memfd until the spawn is done, else -1 */
  mj_list_t live_link;                 /* on ctx->live while reap.c watches it */
  mj_list_t open_link;                 /* on ctx->open while a handle is open */
  unsigned spawned : 1, exited : 1, closing : 1, channel_eof : 1, streaming : 1;
};

typedef struct {
  const char *file;                    /* program to run */
  char **args;                         /* NULL-terminated, args[0] = file */
  const char *const *env_overrides;    /* NULL-terminated "KEY=VALUE" list, or NULL */
  uint32_t max_frame;                  /* largest payload accepted from the child */
} mj_spawn_options_t;

/* process.c */
int mj_process_spawn(mj_ctx_t *ctx, mj_process_t *p, const mj_spawn_options_t *opts,
                     mj_process_event_cb on_event);
int mj_process_kill(mj_process_t *p, int signum, int whole_group);

/* Frames larger than this reach the owner in pieces of about this size, so no
 * callback copies more than a piece at a time (60 MB results never stall
 * the loop). */
#define MJ_PIECE (256 * 1024)
#define MJ_SEND_QUEUED 1               /* mj_process_send: the parts are still in use */
#define MJ_STAGE_FRAME (64 * 1024)     /* JOB frames up to this size may be staged */
#define MJ_STAGE_SIZE (256 * 1024)     /* a stage past this is written at once */

/* send.c */
int mj_process_send(mj_process_t *p, uint32_t type, uint64_t job, const uv_buf_t *parts,
                    unsigned nparts);
int mj_process_end_input(mj_process_t *p);

/* shared.c */
int mj_process_started(mj_process_t *p, uint64_t job);
unsigned mj_process_recall(mj_process_t *p, uint64_t from, uint64_t *jobs, unsigned max);

/* A batch of lines in the child (mj_process_batch, frame.h). */
typedef struct {
  uint32_t started;    /* lines the child started */
  uint32_t kept_lines; /* lines whose results are in `kept` */
  uint32_t kept_bytes;
  const char *kept;    /* the results, in the shared batch area */
  uint64_t line_started_ns; /* when the child started its last line (CLOCK_MONOTONIC) */
  uint64_t word;       /* the batch word read (for mj_process_batch_same) */
} mj_batch_state_t;

int mj_process_batch(mj_process_t *p, uint64_t job, mj_batch_state_t *state);
int mj_process_batch_same(mj_process_t *p, const mj_batch_state_t *state);
int mj_process_batch_cut(mj_process_t *p, uint64_t job);

/* Internal: process.c <- spawn.c, reap.c and channel.c */
void mj__process_spawned(mj_process_t *p, int pid, int error);
void mj__process_exited(mj_process_t *p, int64_t exit_status, int term_signal);
void mj__process_gone(mj_process_t *p);

/* Internal: send.c <- loop.c (the stages, written once per loop turn) */
void mj__process_flush_all(mj_ctx_t *ctx);

/* Internal: channel.c and shared.c <- process.c */
int mj__channel_start(mj_process_t *p);
void mj__channel_stop(mj_process_t *p);
void mj__channel_drain(mj_process_t *p);
void mj__channel_drain_output(mj_process_t *p);
int mj__shared_map(mj_process_t *p);
void mj__shared_release(mj_process_t *p);

/* Internal: what the parts of a process share. The owner's callback, and
 * the jobs in flight: a ring that send.c adds to, channel.c ends the head of
 * and shared.c (a recall) cuts short. */
static inline void mj__process_emit(mj_process_t *p, mj_process_event_t *ev) {
  p->on_event(p, ev);
}

/* The i-th job in flight, 0 being the head. */
static inline mj_inflight_t *mj__inflight_at(mj_process_t *p, unsigned i) {
  return &p->inflight[(p->first + i) % MJ_MAX_INFLIGHT];
}

static inline mj_inflight_t *mj__inflight_find(mj_process_t *p, uint64_t job) {
  for (unsigned i = 0; i < p->nin; i++)
    if (mj__inflight_at(p, i)->job == job) return mj__inflight_at(p, i);
  return NULL;
}

/* ----------------------------------------------------- spawn.c, reap.c --- */

int mj__spawn_pairs(int parent_fds[3], int child_fds[3]);
int mj__spawn_queue(mj_process_t *p, const mj_spawn_options_t *opts, const int child_fds[3],
                    int shared_fd);
int mj__reap_watch(mj_process_t *p);
void mj__reap_unwatch(mj_process_t *p);

/* ----------------------------------------------------------- stdio.c --- */

typedef struct mj_input_s mj_input_t;
/* A line (count 1), or with batch_lines > 1 a block of `count` whole lines
 * joined by their newlines (without the last one). */
typedef void (*mj_line_cb)(mj_input_t *in, const char *line, size_t len, int too_long,
                           unsigned count);
typedef void (*mj_input_end_cb)(mj_input_t *in, int error);
typedef void (*mj_input_freed_cb)(mj_input_t *in);

typedef enum { MJ_INPUT_FILE, MJ_INPUT_PIPE, MJ_INPUT_TTY } mj_input_mode_t;

struct mj_input_s {
  uv_fs_t req;                         /* MJ_INPUT_FILE: the read in flight */
  union {                              /* MJ_INPUT_PIPE, MJ_INPUT_TTY */
    uv_handle_t handle;
    uv_pipe_t pipe;
    uv_tty_t tty;
  } stream;
  mj_ctx_t *ctx;
  int fd;
  mj_input_mode_t mode;
  mj_line_cb on_line;
  mj_input_end_cb on_end;
  mj_input_freed_cb on_freed;          /* optional: the input released everything */
  void *data;
  char *buf;                           /* unread bytes: [0, len) */
  size_t len, cap, max_line;
  unsigned batch_lines;                /* whole lines delivered at once, at most (0, 1: one) */
  int skipping;                        /* inside a line longer than max_line */
  mj_list_t link;                      /* on the context's list of inputs */
  unsigned reading : 1, paused : 1, ended : 1, closing : 1, delivering : 1, stream_open : 1,
      fd_in_stream : 1, bom_checked : 1, /* bom_checked: the start was looked at (skip_bom) */
      end_pending : 1;                 /* ended, with whole lines a pause held back (finish) */
};

typedef struct mj_output_s mj_output_t;
/* output.c: ordered writes on one of the parent's own descriptors (stdout). */
struct mj_output_s {
  uv_work_t work;                      /* a regular file: the write in libuv's thread pool */
  uv_poll_t poll;                      /* a pipe, socket or terminal: writable, reader gone */
  uv_idle_t soon;                      /* and its flush at the end of the loop's turn */
  mj_ctx_t *ctx;
  int fd;                              /* the descriptor given */
  int wfd;                             /* the one written: fd, or a non-blocking opening of it */
  int record_fd;                       /* -1, or where each whole line written is copied */
  char *pending, *inflight;            /* bytes waiting ([pending_off, pending_len)); in the pool */
  size_t pending_len, pending_off, pending_cap, inflight_len, inflight_cap;
  char *carry;                         /* the start of a line written, not its end: not recorded */
  size_t carry_len, carry_cap, torn;   /* torn: bytes written since the last newline */
  double written;                      /* bytes the descriptor took, in all */
  off_t record_reserved;               /* the record's space is reserved up to here */
  size_t pipe_size;                    /* a pipe's capacity (0: unknown) */
  size_t work_written;                 /* set by the thread pool's write, read when it is over */
  int work_error, work_record_error;
  int error, record_error;             /* first write error, first record error: sticky */
  int record_unreserved;               /* the record cannot reserve space: only written (set
                                          in the thread pool: not a bit beside the flags
                                          the loop sets meanwhile) */
  mj_list_t link;                      /* on the context's list of outputs */
  unsigned writing : 1, orphaned : 1,  /* orphaned: released, frees itself when done */
      watching : 1, waiting : 1,       /* poll is open; it waits for room */
      streaming : 1, socket : 1, pipe : 1, /* written on the loop; with send(); a pipe */
      soon_open : 1;                   /* `soon` is open */
};

void mj_input_init(mj_ctx_t *ctx, mj_input_t *in, int fd, size_t max_line,
                   mj_line_cb on_line, mj_input_end_cb on_end);
int mj_input_resume(mj_input_t *in);
void mj_input_pause(mj_input_t *in);
void mj_input_free(mj_input_t *in);

mj_output_t *mj_output_new(mj_ctx_t *ctx, int fd, int record_fd);
int mj_output_append(mj_output_t *out, const char *data, size_t len);
int mj_output_start(mj_output_t *out);
int mj_output_flush(mj_output_t *out);
size_t mj_output_pending(const mj_output_t *out);
void mj_output_release(mj_output_t *out);
void mj_output_close(mj_output_t *out);

/* ---------------------------------------------- redis.c, redis_tls.c --- */

struct redisReader;
struct redisReply;
struct ssl_st;
struct ssl_ctx_st;
typedef struct mj_redis_s mj_redis_t;

#define MJ_REDIS_ADDRS 8 /* addresses of a name tried, at most */

typedef enum { MJ_REDIS_RESOLVING, MJ_REDIS_CONNECTING, MJ_REDIS_UP, MJ_REDIS_DOWN } mj_redis_state_t;

/* A reply (NULL with `error` set when the connection ended first). */
typedef void (*mj_redis_reply_cb)(mj_redis_t *r, intptr_t tag, int persistent,
                                  const struct redisReply *reply, const char *error);
/* up = 1: connected; up = 0: down for good, with why. */
typedef void (*mj_redis_state_cb)(mj_redis_t *r, int up, const char *why);
typedef void (*mj_redis_freed_cb)(mj_redis_t *r);

/* TLS for a connection (mj_redis_open): files (NULL: the default) and the
 * name to check the server's certificate against (NULL: the host). */
typedef struct {
  const char *ca;                      /* the CAs trusted (a PEM file or a hashed directory);
                                          NULL: the system's trust store */
  const char *cert, *key;              /* a client certificate (chain) and its key; key
                                          NULL: in the cert file */
  const char *servername;              /* sent (SNI, unless an IP address) and checked */
} mj_redis_tls_options_t;

/* A reply due, in the order the commands went out. */
typedef enum { MJ_DUE_REPLY, MJ_DUE_SUBSCRIBE, MJ_DUE_PING } mj_redis_due_kind_t;
typedef struct {
  intptr_t tag;
  unsigned kind : 2;                   /* mj_redis_due_kind_t */
  unsigned left : 30;                  /* SUBSCRIBE: confirmations still due (one a channel) */
} mj_redis_due_t;

/* A channel subscribed to (SUBSCRIBE, or SSUBSCRIBE: sharded). The channels
 * of one command share its tag; the first (owner) hears the tag's last call. */
typedef struct {
  char *channel;
  size_t len;
  intptr_t tag;
  unsigned sharded : 1, owner : 1;
} mj_redis_sub_t;

typedef union {
  struct sockaddr sa;
  struct sockaddr_in in;
  struct sockaddr_in6 in6;
} mj_sockaddr_t;

struct mj_redis_s {
  mj_ctx_t *ctx;
  uv_getaddrinfo_t resolver;
  uv_connect_t connector;
  uv_tcp_t tcp;                        /* the address being tried, then the connection */
  uv_write_t writer;                   /* the write of `wire` in flight */
  uv_timer_t watchdog;                 /* connect and reply timeouts */
  struct redisReader *reader;          /* hiredis 0.14's, with our reply objects */
  char host[256];
  int port;
  char addrs[MJ_REDIS_ADDRS][64];      /* what the name resolved to, tried in order */
  mj_sockaddr_t sockaddrs[MJ_REDIS_ADDRS];
  int naddrs, next_addr;
  char last_error[240];                /* why the last address tried failed */
  uint64_t timeout_ms;
  size_t max_reply;                    /* bytes one reply may take */
  size_t reply_bytes;                  /* taken by the reply being read */
  unsigned pending;                    /* commands whose reply is due (not SUBSCRIBE, PING) */
  unsigned unsent;                     /* of those and a PING: staged, not flushed yet */
  uint64_t last_progress;              /* loop time: connect started, last reply, or the
                                          first command still unanswered went out */
  mj_redis_state_t state;
  char why[320];                       /* why it went down */
  char *out, *plain, *wire;            /* bytes for the socket not handed to libuv yet; TLS:
                                          commands staged, to encrypt; the writes in flight */
  size_t out_len, out_cap, plain_len, plain_cap, wire_cap;
  size_t wire_len, wire_off, wire_piece; /* wire's bytes, those written, the write in flight's */
  size_t max_out;                      /* bytes of commands that may wait to be written */
  mj_redis_due_t *due;                 /* replies due: a ring, oldest first */
  unsigned due_first, due_count, due_cap;
  mj_redis_sub_t *subs;                /* channels subscribed to */
  unsigned nsubs, subs_cap;
  long subscribed;                     /* the server's count of our (shard) channels: > 0
                                          while the connection is in subscribed mode */
  long shard_subscribed;
  struct ssl_ctx_st *tls;              /* TLS: the client context (a reference), or NULL */
  struct ssl_st *ssl;                  /* the session of the address being tried */
  char servername[256];                /* the name the certificate must be for */
  int open_handles;
  mj_redis_reply_cb on_reply;
  mj_redis_state_cb on_state;
  mj_redis_freed_cb on_freed;
  void *data;                          /* owner's */
  mj_list_t link;                      /* on the context's list of connections */
  mj_list_t staged_link;               /* on ctx->redis_staged while commands wait */
  unsigned resolving : 1, tcp_open : 1, closed : 1, writing : 1;
  unsigned next_pending : 1;           /* the next address, once the socket closed */
  unsigned ping_pending : 1;           /* a PING on a subscription awaits any byte back */
  unsigned dispatching : 1, drop_due : 1; /* replies being handed out: ending waits */
  unsigned heard : 1;                  /* a byte came from the server on this socket */
  unsigned replied : 1;                /* a reply came on this socket */
  unsigned tls_heard : 1;              /* a TLS record came (not plaintext) */
  unsigned tls_cert : 1, tls_ca : 1;   /* a client certificate, a ca= given (for messages) */
  unsigned tls_asked : 1;              /* the server asked for a client certificate */
  unsigned tls_blocked : 1;            /* a write waits for the session to read first */
};

/* redis.c */
int mj_redis_open(mj_ctx_t *ctx, mj_redis_t *r, const char *host, int port, uint64_t timeout_ms,
                  size_t max_reply, const mj_redis_tls_options_t *tls, char *why, size_t why_len);
int mj_redis_command(mj_redis_t *r, int argc, const char **argv, const size_t *lens,
                     intptr_t tag, int persistent);
int mj_redis_ping(mj_redis_t *r);
void mj_redis_close(mj_redis_t *r);

#define MJ_ETLS (-10002)               /* mj_redis_open: the TLS options cannot be used (why) */

/* Internal: redis.c <- loop.c (commands staged, written once per loop turn) */
void mj__redis_flush_all(mj_ctx_t *ctx);

/* Internal: redis_tls.c <- redis.c */
int mj__tls_context(mj_ctx_t *ctx, const mj_redis_tls_options_t *o, struct ssl_ctx_st **out,
                    char *why, size_t why_len);
int mj__tls_start(mj_redis_t *r);
void mj__tls_received(mj_redis_t *r, const char *data, size_t len);
int mj__tls_encrypt(mj_redis_t *r);
void mj__tls_goodbye(mj_redis_t *r);
void mj__tls_end(mj_redis_t *r, int for_good);
int mj__tls_silence(mj_redis_t *r, uint64_t ms, char *why, size_t why_len);
int mj__tls_unwelcome(mj_redis_t *r, char *why, size_t why_len);
void mj__tls_forget_all(mj_ctx_t *ctx);

/* Internal: redis.c <- redis_tls.c */
void mj__redis_up(mj_redis_t *r);
void mj__redis_feed(mj_redis_t *r, const char *data, size_t len);
void mj__redis_fail(mj_redis_t *r, const char *why);
void mj__redis_send(mj_redis_t *r);
char *mj__redis_out_room(mj_redis_t *r, size_t len);

/* ------------------------------------------------ http.c, http_response.c --- */

#include <http_parser.h>

typedef struct mj_http_server_s mj_http_server_t;
typedef struct mj_http_conn_s mj_http_conn_t;

/* Bounds a client cannot exceed (0 in mj_http_listen: the default). */
typedef struct {
  size_t max_header;          /* request line and header bytes (431 past it): 16 KiB */
  size_t max_body;            /* request body bytes (413 past it): 1 MiB */
  unsigned max_connections;   /* open at once; more are closed as soon as accepted: 256 */
  uint64_t idle_timeout_ms;   /* a request not whole by then, or a response the
                                 client takes nothing of for that long: closed. 10 s */
  size_t max_unsent;          /* response bytes queued and not yet taken by the
                                 client; a write past them drops it: 1 MiB */
} mj_http_limits_t;

/* A header of the request: its name lower-cased, offsets into conn->head. */
typedef struct {
  uint32_t name_off, name_len, value_off, value_len;
} mj_http_field_t;

/* A whole request, handed to on_request (c->data is the owner's from then
 * on); it is answered with mj_http_respond, or mj_http_start, mj_http_write
 * and mj_http_finish, at once or on a later loop turn. on_gone comes when the
 * connection ends before the answer was finished: the owner lets go of c. */
typedef void (*mj_http_request_cb)(mj_http_conn_t *c);
typedef void (*mj_http_gone_cb)(mj_http_conn_t *c, const char *why);
typedef void (*mj_http_freed_cb)(mj_http_server_t *s);

typedef enum {
  MJ_HTTP_READING,   /* waiting for a whole request */
  MJ_HTTP_HANDLING,  /* one delivered: the owner answers it */
  MJ_HTTP_CLOSING    /* answered for the last time, or gone */
} mj_http_conn_state_t;

struct mj_http_conn_s {
  uv_tcp_t tcp;
  uv_timer_t timer;                    /* the idle deadline, or the next request's turn */
  uv_shutdown_t shutdown;
  http_parser parser;
  mj_http_server_t *server;
  mj_http_conn_state_t state;
  char *in;                            /* bytes read, not parsed yet: [in_off, in_len) */
  size_t in_off, in_len, in_cap;
  char *head;                          /* the URL, then header names and values */
  size_t head_len, head_cap, url_len;
  mj_http_field_t *fields;
  size_t nfields, fields_cap;
  char *body;
  size_t body_len, body_cap;
  int reject;                          /* a status to answer at once (400, 413, 431) */
  int open_handles;
  char peer[64];                       /* the client's address */
  int peer_port;
  void *data;                          /* owner's, while it holds the request */
  mj_list_t link;                      /* on the server's connections */
  unsigned keep_alive : 1, in_field_value : 1, complete : 1, started : 1, finished : 1,
      chunked : 1, head_only : 1, resume_due : 1, lingering : 1, reading : 1, closing : 1,
      delivered : 1, continue_sent : 1;
};

struct mj_http_server_s {
  mj_ctx_t *ctx;
  uv_tcp_t listener;
  mj_http_limits_t limits;
  mj_list_t conns;                     /* its open connections */
  unsigned nconns;
  int open_handles;                    /* the listener and every connection */
  mj_http_request_cb on_request;
  mj_http_gone_cb on_gone;
  mj_http_freed_cb on_freed;
  void *data;                          /* owner's */
  mj_list_t link;                      /* on the context's servers */
  unsigned closed : 1;
};

/* http.c */
int mj_http_listen(mj_ctx_t *ctx, mj_http_server_t *s, const char *host, int port,
                   const mj_http_limits_t *limits, char *why, size_t why_len);
int mj_http_port(mj_http_server_t *s);
void mj_http_close(mj_http_server_t *s);
void mj__http_drop(mj_http_conn_t *c, const char *why);
void mj__http_arm(mj_http_conn_t *c);
void mj__http_next(mj_http_conn_t *c);
void mj__http_linger(mj_http_conn_t *c);

/* http_response.c */
int mj_http_respond(mj_http_conn_t *c, int status, const char *headers, size_t headers_len,
                    const char *body, size_t body_len, int close_after);
int mj_http_start(mj_http_conn_t *c, int status, const char *headers, size_t headers_len,
                  int close_after);
int mj_http_write(mj_http_conn_t *c, const char *data, size_t len);
int mj_http_finish(mj_http_conn_t *c);
void mj__http_reject(mj_http_conn_t *c, int status);
void mj__http_continue(mj_http_conn_t *c);

#endif
