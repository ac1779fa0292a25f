/* process.c -- a child process, its channel and its output pipes.
 *
 * A child gets four descriptors: stdin from /dev/null, stdout and stderr on
 * socketpairs of their own, and the channel (a socketpair) on fd 3. It is
 * started off the loop thread by spawn.c, in a session of its own (a kill of
 * its process group reaches its grandchildren; a Ctrl-C at the terminal does
 * not reach it), and reaped by reap.c.
 *
 * Channel bytes are cut into frames here (frame.h); the payload is never
 * looked at. Every header is checked as soon as it is complete against what
 * the child may send in its state, and against the random token of the job in
 * hand (frame_violation): anything else is reported as MJ_PROCESS_PROTOCOL
 * and the channel is no longer read. A frame up to MJ_PIECE bytes is
 * delivered whole; a larger one in pieces, so that no callback copies more
 * than a piece. Sending tries a direct write first; what the kernel did not
 * take is queued without a copy (the caller keeps the bytes until
 * MJ_PROCESS_SENT). The page shared with the child (a memfd on its fd 4) tells
 * whether it took its current job (mj_process_taken).
 *
 * Ordering guarantees, which libuv alone does not give:
 *  - before a frame that ends a job is delivered, whatever the child wrote to
 *    stdout/stderr is read and delivered first (the child flushes both, and
 *    flags the frame when some of it is still unread: MJ_FRAME_FLAG_OUTPUT),
 *    so output is attributed to the right job, at no cost when there is none;
 *  - MJ_PROCESS_EXIT comes after every frame and output byte the child sent:
 *    on the exit callback the channel and pipes are drained first, and it
 *    waits for the channel's end of file too (libuv reports the two in either
 *    order; the child is gone only when both happened).
 * A pid is never signalled once the child was reaped.
 *
 * Caveat: draining at exit reads what the dead child left; a grandchild that
 * inherited stdout/stderr and writes later is not waited for.
 */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

#include "moonjob.h"

#define MJ_READ_CHUNK (64 * 1024)
#define MJ_KEEP_BUFFER (256 * 1024)  /* shrink the frame buffer above this when idle */

static void emit(mj_process_t *p, mj_process_event_t *ev) {
  p->on_event(p, ev);
}

/* -------------------------------------------------------- output pipes --- */

/* The context's scratch buffer: the read callback consumes it at once. */
static void mj_output_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  mj_process_t *p = h->data;
  (void) suggested;
  *buf = uv_buf_init(p->ctx->scratch, sizeof p->ctx->scratch);
}

static void emit_output(mj_process_t *p, int stream, const char *data, size_t len) {
  mj_process_event_t ev = {.kind = MJ_PROCESS_OUTPUT, .data = data, .len = len, .stream = stream};
  emit(p, &ev);
}

static void mj_output_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  mj_process_t *p = s->data;
  int stream = (s == (uv_stream_t *) &p->output[0]) ? 1 : 2;
  if (nread > 0) emit_output(p, stream, buf->base, (size_t) nread);
  else if (nread < 0) uv_read_stop(s);
}

/* Reads whatever is waiting on the child's stdout and stderr, without
 * blocking, and delivers it. */
static void drain_output(mj_process_t *p) {
  char chunk[16 * 1024];
  for (int i = 0; i < 2; i++) {
    uv_os_fd_t fd;
    if (p->closing || uv_fileno((uv_handle_t *) &p->output[i], &fd) != 0) continue;
    for (;;) {
      ssize_t n = read(fd, chunk, sizeof chunk);
      if (n > 0) emit_output(p, i + 1, chunk, (size_t) n);
      else if (n < 0 && errno == EINTR) continue;
      else break;
      if (p->closing) return;
    }
  }
}

/* ------------------------------------------------------------- channel --- */

/* Room for the rest of the frame being read (of the piece, for a frame read
 * in pieces), at least one chunk. The buffer never grows past a piece. */
static void mj_channel_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  mj_process_t *p = h->data;
  size_t want = MJ_READ_CHUNK, rest = 0;
  (void) suggested;
  if (p->streaming) {
    rest = p->big_left < MJ_PIECE ? p->big_left : MJ_PIECE;
  } else if (p->rlen >= MJ_FRAME_HEADER_SIZE) {
    mj_frame_header_t hdr;
    memcpy(&hdr, p->rbuf, sizeof hdr);
    if (hdr.len <= MJ_PIECE) rest = MJ_FRAME_HEADER_SIZE + (size_t) hdr.len;
  }
  if (rest > p->rlen && rest - p->rlen > want) want = rest - p->rlen;
  if (mj__grow(&p->rbuf, &p->rcap, p->rlen + want, MJ_READ_CHUNK) != 0) {
    *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
    return;
  }
  *buf = uv_buf_init(p->rbuf + p->rlen, (unsigned) (p->rcap - p->rlen));
}

static void mj_process_gone(mj_process_t *p);

static void stop_channel(mj_process_t *p) {
  if (p->channel_eof) return;
  p->channel_eof = 1;
  uv_read_stop((uv_stream_t *) &p->channel);
  if (p->exited) mj_process_gone(p);
}

/* ------------------------------------------------------------ protocol --- */

/* Why a header the child sent breaks the protocol, or NULL when the child may
 * send it now: READY and LOADERR only while starting (job 0), job frames only
 * with the current job's token, job-ending frames with room for their usage
 * block, the output flag only on those. */
static const char *frame_violation(const mj_process_t *p, const mj_frame_header_t *h) {
  uint32_t type = h->type & MJ_FRAME_TYPE_MASK;
  if (h->type & ~(MJ_FRAME_TYPE_MASK | MJ_FRAME_FLAG_OUTPUT)) return "a frame header with unknown flags";
  if ((h->type & MJ_FRAME_FLAG_OUTPUT) && !MJ_FRAME_ENDS_JOB(type)) return "a frame header with unknown flags";
  if (MJ_FRAME_ENDS_JOB(type) && h->len < sizeof(mj_job_usage_t)) return "a job-ending frame too short";
  switch (type) {
    case MJ_FRAME_READY:
    case MJ_FRAME_LOADERR:
      if (p->state != MJ_CHILD_STARTING) return "a start-up frame after start-up";
      return h->job == 0 ? NULL : "a start-up frame with a job token";
    case MJ_FRAME_DONE:
    case MJ_FRAME_FAIL:
    case MJ_FRAME_PROGRESS:
    case MJ_FRAME_LOG:
      if (p->state != MJ_CHILD_BUSY) return "a job frame while no job was running";
      return h->job == p->token ? NULL : "a job frame with a wrong job token";
    default:
      return "a frame of unknown type";
  }
}

/* The child broke the protocol: nothing more it sends is read. */
static void protocol_error(mj_process_t *p, const char *why) {
  mj_process_event_t ev = {.kind = MJ_PROCESS_PROTOCOL, .data = why, .len = strlen(why)};
  p->state = MJ_CHILD_ENDED;
  emit(p, &ev);
  stop_channel(p); /* last: the exit event may follow at once */
}

/* The child state after a whole frame of `type`. */
static void frame_delivered(mj_process_t *p, uint32_t type) {
  if (type == MJ_FRAME_READY) {
    p->state = MJ_CHILD_IDLE;
  } else if (type == MJ_FRAME_LOADERR) {
    p->state = MJ_CHILD_ENDED;
  } else if (type == MJ_FRAME_DONE || type == MJ_FRAME_FAIL) {
    p->state = MJ_CHILD_IDLE;
    p->token = 0;
  }
}

/* A random job token, never 0. Tokens are drawn from the kernel 64 at a time. */
static uint64_t draw_token(mj_ctx_t *ctx) {
  for (;;) {
    if (ctx->ntokens == 0) {
      if (uv_random(NULL, NULL, ctx->tokens, sizeof ctx->tokens, 0, NULL) != 0) return 0;
      ctx->ntokens = sizeof ctx->tokens / sizeof ctx->tokens[0];
    }
    uint64_t t = ctx->tokens[--ctx->ntokens];
    if (t != 0) return t;
  }
}

/* A frame larger than MJ_PIECE starts: its header (and usage block) are
 * consumed, its payload comes as pieces. */
static void start_stream(mj_process_t *p, const mj_frame_header_t *hdr, const char *after) {
  p->big = *hdr;
  p->big_left = hdr->len;
  if (MJ_FRAME_ENDS_JOB(hdr->type & MJ_FRAME_TYPE_MASK)) {
    memcpy(&p->big_usage, after, sizeof p->big_usage);
    p->big_left -= sizeof p->big_usage;
  }
  p->big.len = (uint32_t) p->big_left;
  p->streaming = 1;
}

/* Bytes of the streamed frame's payload: a PART, or the FRAME that ends it. */
static void deliver_piece(mj_process_t *p, const char *data, size_t n) {
  p->big_left -= n;
  if (p->big_left > 0) {
    mj_process_event_t ev = {.kind = MJ_PROCESS_PART, .header = &p->big, .data = data, .len = n};
    return emit(p, &ev);
  }
  p->streaming = 0;
  if (p->big.type & MJ_FRAME_FLAG_OUTPUT) drain_output(p);
  p->big.type &= MJ_FRAME_TYPE_MASK;
  mj_process_event_t ev = {.kind = MJ_PROCESS_FRAME, .header = &p->big, .data = data, .len = n,
                           .streamed = 1, .job = p->job};
  if (MJ_FRAME_ENDS_JOB(p->big.type)) ev.usage = &p->big_usage;
  frame_delivered(p, p->big.type);
  emit(p, &ev);
}

/* A whole frame (header at `at`) of at most MJ_PIECE bytes. */
static void deliver_whole(mj_process_t *p, mj_frame_header_t hdr, const char *at) {
  if (hdr.type & MJ_FRAME_FLAG_OUTPUT) drain_output(p);
  hdr.type &= MJ_FRAME_TYPE_MASK;
  mj_process_event_t ev = {.kind = MJ_PROCESS_FRAME, .header = &hdr,
                           .data = at + MJ_FRAME_HEADER_SIZE, .job = hdr.job ? p->job : 0};
  mj_job_usage_t usage;
  if (MJ_FRAME_ENDS_JOB(hdr.type)) {
    memcpy(&usage, ev.data, sizeof usage); /* the child's usage block comes first */
    ev.usage = &usage;
    ev.data += sizeof usage;
    hdr.len -= (uint32_t) sizeof usage;
  }
  ev.len = hdr.len;
  frame_delivered(p, hdr.type);
  emit(p, &ev);
}

/* Consumes what it can from `avail` bytes at `at`: a piece of a streamed
 * frame, a header that starts one, or a whole frame. Returns the bytes
 * consumed, 0 when more must be read first (or the channel was stopped). */
static size_t deliver_one(mj_process_t *p, const char *at, size_t avail) {
  if (p->streaming) {
    size_t n = avail < p->big_left ? avail : p->big_left;
    if (n < p->big_left && n < MJ_PIECE) return 0; /* a whole piece, or the end */
    deliver_piece(p, at, n);
    return n;
  }
  if (avail < MJ_FRAME_HEADER_SIZE) return 0;
  mj_frame_header_t hdr;
  memcpy(&hdr, at, sizeof hdr);
  const char *why = frame_violation(p, &hdr);
  if (why != NULL) {
    protocol_error(p, why);
    return 0;
  }
  if (hdr.len > p->max_frame) {
    mj_process_event_t ev = {.kind = MJ_PROCESS_OVERSIZE, .len = hdr.len, .header = &hdr};
    p->state = MJ_CHILD_ENDED;
    emit(p, &ev);
    stop_channel(p); /* last: the exit event may follow at once */
    return 0;
  }
  if (hdr.len > MJ_PIECE) {
    int ends = MJ_FRAME_ENDS_JOB(hdr.type & MJ_FRAME_TYPE_MASK);
    size_t lead = MJ_FRAME_HEADER_SIZE + (ends ? sizeof(mj_job_usage_t) : 0);
    if (avail < lead) return 0;
    start_stream(p, &hdr, at + MJ_FRAME_HEADER_SIZE);
    return lead;
  }
  if (avail - MJ_FRAME_HEADER_SIZE < hdr.len) return 0;
  deliver_whole(p, hdr, at);
  return MJ_FRAME_HEADER_SIZE + hdr.len;
}

/* Delivers every whole frame and piece in the buffer, keeps the partial rest.
 * Each header is checked as soon as it is complete, before its payload is
 * awaited: a processor writing garbage to the channel is caught at once. */
static void deliver_frames(mj_process_t *p) {
  size_t off = 0;
  while (!p->closing && !p->channel_eof) {
    size_t used = deliver_one(p, p->rbuf + off, p->rlen - off);
    if (used == 0) break;
    off += used;
  }
  if (p->closing || p->channel_eof) {
    p->rlen = 0;
    return;
  }
  if (off > 0) memmove(p->rbuf, p->rbuf + off, p->rlen - off);
  p->rlen -= off;
  if (p->rlen == 0 && p->rcap > MJ_KEEP_BUFFER) {
    free(p->rbuf);
    p->rbuf = NULL;
    p->rcap = 0;
  }
}

static void mj_channel_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  mj_process_t *p = s->data;
  (void) buf;
  if (nread > 0) {
    p->rlen += (size_t) nread;
    deliver_frames(p);
  } else if (nread < 0) {
    stop_channel(p);
  }
}

/* Reads, without blocking, all the child left in the channel. */
static void drain_channel(mj_process_t *p) {
  uv_os_fd_t fd;
  if (p->channel_eof || p->closing || uv_fileno((uv_handle_t *) &p->channel, &fd) != 0) return;
  while (!p->closing && !p->channel_eof) {
    uv_buf_t buf;
    mj_channel_alloc_cb((uv_handle_t *) &p->channel, MJ_READ_CHUNK, &buf);
    if (buf.base == NULL) return;
    ssize_t n = read(fd, buf.base, buf.len);
    if (n > 0) {
      p->rlen += (size_t) n;
      deliver_frames(p);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n == 0 || errno != EAGAIN) stop_channel(p);
      return;
    }
  }
}

/* ------------------------------------------------------------ lifetime --- */

static void release_shared(mj_process_t *p) {
  if (p->shared_fd >= 0) close(p->shared_fd);
  p->shared_fd = -1;
  if (p->shared != NULL) munmap(p->shared, MJ_SHARED_SIZE);
  p->shared = NULL;
}

static void link_open(mj_process_t *p) {
  p->next_open = p->ctx->open;
  p->prev_open = NULL;
  if (p->ctx->open) p->ctx->open->prev_open = p;
  p->ctx->open = p;
}

static void unlink_open(mj_process_t *p) {
  if (p->prev_open) p->prev_open->next_open = p->next_open;
  else if (p->ctx->open == p) p->ctx->open = p->next_open;
  if (p->next_open) p->next_open->prev_open = p->prev_open;
  p->next_open = p->prev_open = NULL;
}

static void mj_close_cb(uv_handle_t *h) {
  mj_process_t *p = h->data;
  if (--p->open_handles > 0) return;
  unlink_open(p);
  free(p->rbuf);
  p->rbuf = NULL;
  release_shared(p);
  mj_process_event_t ev = {.kind = MJ_PROCESS_CLOSED};
  emit(p, &ev);
}

/* Handles never initialised (still zeroed, no loop) are skipped. */
static void close_handle(uv_handle_t *h) {
  if (h->loop != NULL && !uv_is_closing(h)) uv_close(h, mj_close_cb);
}

/* Closes every handle of the process. Only called once the child was reaped
 * (or never started). MJ_PROCESS_CLOSED follows. */
static void mj_process_close(mj_process_t *p) {
  if (p->closing) return;
  p->closing = 1;
  close_handle((uv_handle_t *) &p->channel);
  close_handle((uv_handle_t *) &p->output[0]);
  close_handle((uv_handle_t *) &p->output[1]);
}

/* Both the exit status and the channel's end of file are in: the child is
 * gone. Reported once, then every handle is closed. */
static void mj_process_gone(mj_process_t *p) {
  if (p->closing) return;
  drain_output(p);
  mj_process_event_t ev = {.kind = MJ_PROCESS_EXIT, .exit_status = p->exit_status,
                           .term_signal = p->term_signal, .taken = mj_process_taken(p)};
  if (!p->closing) emit(p, &ev);
  mj_process_close(p);
}

/* reap.c collected the child's status. What it sent before dying is read
 * first; the child counts as gone once the channel also reached end of file
 * (a grandchild that inherited it may hold it open a while longer). */
void mj__process_exited(mj_process_t *p, int64_t exit_status, int term_signal) {
  p->exited = 1;
  p->exit_status = exit_status;
  p->term_signal = term_signal;
  drain_channel(p);
  if (p->channel_eof) mj_process_gone(p);
}

/* ---------------------------------------------------------------- spawn --- */

/* Closes every process of the context, whatever its state (the context is
 * being closed: its children were killed and reaped first). */
void mj__process_close_all(mj_ctx_t *ctx) {
  for (mj_process_t *p = ctx->open; p != NULL; p = p->next_open) {
    p->channel_eof = p->exited = 1;
    mj_process_close(p);
  }
}

/* Wraps the parent's ends of the socketpairs in libuv pipes (stdout, stderr,
 * channel). Each fd is closed here if it could not be wrapped. */
static int open_pipes(mj_process_t *p, const int fds[3]) {
  uv_pipe_t *pipes[3] = {&p->output[0], &p->output[1], &p->channel};
  int rc = 0;
  for (int i = 0; i < 3; i++) {
    if (rc == 0) rc = uv_pipe_init(&p->ctx->loop, pipes[i], 0);
    if (rc == 0) {
      pipes[i]->data = p;
      p->open_handles++;
      rc = uv_pipe_open(pipes[i], fds[i]);
      if (rc == 0) continue;
    }
    close(fds[i]);
  }
  return rc;
}

static int start_reading(mj_process_t *p) {
  int rc = uv_read_start((uv_stream_t *) &p->channel, mj_channel_alloc_cb, mj_channel_read_cb);
  for (int i = 0; rc == 0 && i < 2; i++)
    rc = uv_read_start((uv_stream_t *) &p->output[i], mj_output_alloc_cb, mj_output_read_cb);
  return rc;
}

/* A spawn that could not happen ends like a child that exited with 127. */
static void spawn_failed(mj_process_t *p, int error) {
  const char *reason = uv_strerror(error);
  mj_process_event_t ev = {.kind = MJ_PROCESS_EXIT, .exit_status = 127, .data = reason,
                           .len = strlen(reason)};
  p->exited = p->channel_eof = 1;
  emit(p, &ev);
  mj_process_close(p);
}

/* The child cannot be watched by reap.c: kill it and wait for it here (a
 * SIGKILLed child dies at once), so it is never left unreaped. */
static void reap_now(mj_process_t *p) {
  int status = 0;
  kill(-p->pid, SIGKILL);
  kill(p->pid, SIGKILL);
  while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {}
  stop_channel(p);
  mj__process_exited(p, WIFEXITED(status) ? WEXITSTATUS(status) : 0,
                     WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* spawn.c is done: the child runs (pid) or could not start (error). The
 * child is always reaped: if it cannot be watched it is killed and reaped at
 * once, and if it cannot be read from it is killed and its exit reported. */
void mj__process_spawned(mj_process_t *p, int pid, int error) {
  if (p->shared_fd >= 0) close(p->shared_fd); /* the child has its copy */
  p->shared_fd = -1;
  if (error != 0) return spawn_failed(p, error);
  p->spawned = 1;
  p->pid = pid;
  mj_process_event_t ev = {.kind = MJ_PROCESS_SPAWNED};
  emit(p, &ev);
  if (p->pending_signal) mj_process_kill(p, p->pending_signal, p->pending_group);
  if (mj__reap_watch(p) != 0) return reap_now(p);
  /* Even when the child was reaped at once: another child being spawned at
   * this instant may hold a copy of the channel, so its end of file can come
   * later, and only a reading handle sees it. */
  if (!p->closing && !p->channel_eof && start_reading(p) != 0) {
    mj_process_kill(p, SIGKILL, 1);
    stop_channel(p);
  }
}

/* One page shared with the child (its fd 4). Returns 0 or a UV_E... code. */
static int map_shared(mj_process_t *p) {
  int fd = memfd_create("moonjob-shared", MFD_CLOEXEC);
  if (fd < 0) return -errno;
  if (fd <= MJ_SHARED_FD) { /* placing it on fd 4 in the child must never land on itself */
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, MJ_SHARED_FD + 1);
    int rc = -errno;
    close(fd);
    if (moved < 0) return rc;
    fd = moved;
  }
  void *page = MAP_FAILED;
  if (ftruncate(fd, MJ_SHARED_SIZE) == 0)
    page = mmap(NULL, MJ_SHARED_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED) {
    int rc = -errno;
    close(fd);
    return rc;
  }
  p->shared = page;
  p->shared_fd = fd;
  return 0;
}

/* Starts the child in the background: MJ_PROCESS_SPAWNED then frames and
 * output follow, or MJ_PROCESS_EXIT (127) if it cannot start. Frames may be
 * sent at once. Returns 0, or a negative code when nothing was started; if
 * p->open_handles is non-zero then, MJ_PROCESS_CLOSED still follows and p
 * must live until then. */
int mj_process_spawn(mj_ctx_t *ctx, mj_process_t *p, const mj_spawn_options_t *opts,
                     mj_process_event_cb on_event) {
  int parent_fds[3], child_fds[3];
  memset(p, 0, sizeof *p);
  p->ctx = ctx;
  p->on_event = on_event;
  p->max_frame = opts->max_frame;
  p->state = MJ_CHILD_STARTING;
  p->shared_fd = -1;
  link_open(p);
  int rc = map_shared(p);
  if (rc != 0) {
    unlink_open(p);
    return rc;
  }
  rc = mj__spawn_pairs(parent_fds, child_fds);
  if (rc != 0) {
    unlink_open(p);
    release_shared(p);
    return rc;
  }
  rc = open_pipes(p, parent_fds);
  if (rc == 0) rc = mj__spawn_queue(p, opts, child_fds, p->shared_fd);
  else
    for (int i = 0; i < 3; i++) close(child_fds[i]);
  if (rc != 0) { /* no spawn is in flight: CLOSED ends it, if a handle was opened */
    if (p->open_handles == 0) {
      unlink_open(p);
      release_shared(p);
    }
    mj_process_close(p);
  }
  return rc;
}

/* ------------------------------------------------------------- control --- */

/* A frame the kernel did not take at once: the header is copied here (the
 * caller's is on its stack), the payload stays in the caller's memory. */
typedef struct {
  uv_write_t req;
  mj_process_t *p;
  mj_frame_header_t hdr;
} mj_send_req_t;

/* An INTERRUPT frame is followed by the signal once it is written (see
 * child.c), and only while its job is still the child's. */
static void signal_interrupt(mj_process_t *p, uint64_t token) {
  if (p->state == MJ_CHILD_BUSY && p->token == token) mj_process_kill(p, MJ_INTERRUPT_SIGNAL, 0);
}

static void mj_write_cb(uv_write_t *req, int status) {
  mj_send_req_t *send = req->data;
  mj_process_event_t ev = {.kind = MJ_PROCESS_SENT};
  /* a failed write shows up as the child's exit or EOF */
  if (status == 0 && send->hdr.type == MJ_FRAME_INTERRUPT) signal_interrupt(send->p, send->hdr.job);
  emit(send->p, &ev);
  free(send);
}

/* Queues what try_write left: bufs[0..n) past the first `skip` bytes. The
 * header's bytes are taken from the request's own copy. */
static int queue_rest(mj_process_t *p, const uv_buf_t *bufs, unsigned n, size_t skip) {
  enum { MAX_BUFS = 5 };
  uv_buf_t rest[MAX_BUFS];
  unsigned nrest = 0;
  mj_send_req_t *send = malloc(sizeof *send);
  if (send == NULL) return UV_ENOMEM;
  memcpy(&send->hdr, bufs[0].base, sizeof send->hdr);
  send->p = p;
  send->req.data = send;
  for (unsigned i = 0; i < n; i++) {
    char *base = i == 0 ? (char *) &send->hdr : bufs[i].base;
    if (skip >= bufs[i].len) {
      skip -= bufs[i].len;
      continue;
    }
    rest[nrest++] = uv_buf_init(base + skip, (unsigned) (bufs[i].len - skip));
    skip = 0;
  }
  int rc = uv_write(&send->req, (uv_stream_t *) &p->channel, rest, nrest, mj_write_cb);
  if (rc != 0) free(send);
  return rc == 0 ? MJ_SEND_QUEUED : rc;
}

/* Sends one frame whose payload is the concatenation of parts. A JOB frame
 * gets a fresh random token (the child must be idle); an INTERRUPT frame the
 * current job's token (nothing is sent once that job is over), and
 * MJ_INTERRUPT_SIGNAL follows it as soon as the kernel holds all of it. Returns 0 when
 * the kernel took every byte; MJ_SEND_QUEUED when the rest is queued without
 * a copy: the parts' memory must then stay valid until the MJ_PROCESS_SENT
 * event; or UV_E... (UV_EPIPE once the process is closing, UV_EBUSY for a
 * JOB while the child is not idle). */
int mj_process_send(mj_process_t *p, uint32_t type, uint64_t job, const uv_buf_t *parts,
                    unsigned nparts) {
  enum { MAX_PARTS = 4 };
  uv_buf_t bufs[1 + MAX_PARTS];
  mj_frame_header_t hdr;
  size_t total = 0;
  if (p->closing || p->exited) return UV_EPIPE;
  if (nparts > MAX_PARTS) return UV_EINVAL;
  uint64_t token = 0;
  if (type == MJ_FRAME_JOB) {
    if (p->state != MJ_CHILD_IDLE) return UV_EBUSY;
    token = draw_token(p->ctx);
    if (token == 0) return UV_EIO;
  } else if (type == MJ_FRAME_INTERRUPT) {
    if (p->state != MJ_CHILD_BUSY || p->job != job) return 0; /* that job is over */
    job = p->token;
  }
  for (unsigned i = 0; i < nparts; i++) {
    bufs[1 + i] = parts[i];
    total += parts[i].len;
  }
  if (total > UINT32_MAX) return UV_E2BIG;
  hdr.len = (uint32_t) total;
  hdr.type = type;
  hdr.job = token ? token : job;
  bufs[0] = uv_buf_init((char *) &hdr, sizeof hdr);
  total += sizeof hdr;
  int rc = 0, written = 0;
  if (p->channel.write_queue_size == 0) { /* else frames would overtake queued ones */
    written = uv_try_write((uv_stream_t *) &p->channel, bufs, nparts + 1);
    if (written == UV_EAGAIN) written = 0;
    if (written < 0) return written;
  }
  if ((size_t) written < total) rc = queue_rest(p, bufs, nparts + 1, (size_t) written);
  else if (type == MJ_FRAME_INTERRUPT) signal_interrupt(p, hdr.job);
  if (rc >= 0 && token != 0) { /* the child now owes frames about this job only */
    p->state = MJ_CHILD_BUSY;
    p->job = job;
    p->token = token;
  }
  return rc;
}

/* Signals the child, or its whole process group. Before the spawn is done the
 * signal is kept and sent as soon as the pid is known. Returns UV_ESRCH once
 * the child was reaped: its pid may belong to someone else by then. */
int mj_process_kill(mj_process_t *p, int signum, int whole_group) {
  if (p->exited) return UV_ESRCH;
  if (!p->spawned) {
    p->pending_signal = signum;
    p->pending_group = whole_group;
    return 0;
  }
  if (kill(whole_group ? -p->pid : p->pid, signum) != 0) return -errno;
  return 0;
}

/* True when the child has read the JOB frame of its current job: it stored
 * the job's token in the page it shares with the parent (frame.h). */
int mj_process_taken(const mj_process_t *p) {
  return p->shared != NULL && p->token != 0 &&
         __atomic_load_n(&p->shared->taken, __ATOMIC_ACQUIRE) == p->token;
}

static void mj_shutdown_cb(uv_shutdown_t *req, int status) {
  (void) status;
  free(req);
}

/* Closes the writing side of the channel once queued frames are sent: the
 * child sees end-of-file and exits when idle. The shared page says it was on
 * purpose (an end of file without that tells the child its parent died). */
int mj_process_end_input(mj_process_t *p) {
  if (p->closing || p->exited) return UV_EPIPE;
  if (p->shared) __atomic_store_n(&p->shared->input_ended, 1, __ATOMIC_RELEASE);
  uv_shutdown_t *req = malloc(sizeof *req);
  if (req == NULL) return UV_ENOMEM;
  int rc = uv_shutdown(req, (uv_stream_t *) &p->channel, mj_shutdown_cb);
  if (rc != 0) free(req);
  return rc;
}

