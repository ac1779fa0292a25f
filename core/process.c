/* process.c -- a child process, its channel and its output pipes.
 *
 * A child gets four descriptors: stdin from /dev/null, stdout and stderr on
 * pipes of their own, and the channel (a socketpair) on fd 3. It is
 * started off the loop thread by spawn.c, in a session of its own (a kill of
 * its process group reaches its grandchildren; a Ctrl-C at the terminal does
 * not reach it), and reaped by reap.c.
 *
 * Channel bytes are cut into frames here (frame.h); the payload is never
 * looked at. Every header is checked as soon as it is complete against what
 * the child may send in its state, and against the random token of the job in
 * hand, the head of the jobs in flight (frame_violation): anything else is
 * reported as MJ_PROCESS_PROTOCOL
 * and the channel is no longer read. A frame up to MJ_PIECE bytes is
 * delivered whole; a larger one in pieces, so that no callback copies more
 * than a piece. Sending tries a direct write first; what the kernel did not
 * take is queued without a copy (the caller keeps the bytes until
 * MJ_PROCESS_SENT). Up to MJ_MAX_INFLIGHT JOB frames may be in flight to a
 * child (pipelining, frame.h): they are kept here in the order sent, and the
 * child answers them in that order. The page shared with the child (a memfd
 * on its fd 4) tells which job it started (mj_process_started), and lets the
 * parent take back the jobs it has not started (mj_process_recall).
 *
 * Ordering guarantees, which libuv alone does not give:
 *  - before a frame that ends a job is delivered, whatever the child wrote to
 *    stdout/stderr up to the end of that job is delivered first, and nothing
 *    after it (the frame counts the bytes: see "Output attribution" below),
 *    so output is attributed to the right job even when the next one already
 *    runs;
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

/* Output attribution. The child may run the next job the instant it sent
 * the last one's ending frame, so bytes read from stdout or stderr may belong
 * to a job that ended after they were written, or to one after it. Each
 * job-ending frame says how many bytes the child had written to each stream
 * when the job ended (mj_job_usage_t.output); the parent counts what it
 * reads (out_read, published in the shared page, between two increments of
 * output_seq, so the child can count what it wrote: see child.c). A chunk
 * read is held while the channel is drained (any frame that ends a job
 * before some of those bytes is in the channel by then: the child writes it
 * first); each ending frame first gets the bytes before its count (read now
 * if not read yet), and the rest goes to the job that runs next. */

static void emit_output(mj_process_t *p, int stream, const char *data, size_t len) {
  mj_process_event_t ev = {.kind = MJ_PROCESS_OUTPUT, .data = data, .len = len, .stream = stream};
  emit(p, &ev);
}

static void begin_output_read(mj_process_t *p) {
  if (p->shared) __atomic_add_fetch(&p->shared->output_seq, 1, __ATOMIC_ACQ_REL);
}

static void end_output_read(mj_process_t *p, int i, ssize_t n) {
  if (n > 0) p->out_read[i] += (uint64_t) n;
  if (p->shared == NULL) return;
  __atomic_store_n(&p->shared->output_read[i], p->out_read[i], __ATOMIC_RELEASE);
  if (__atomic_load_n(&p->shared->output_seq, __ATOMIC_ACQUIRE) & 1)
    __atomic_add_fetch(&p->shared->output_seq, 1, __ATOMIC_ACQ_REL);
}

/* Reads up to `want` bytes of stream i into buf, without blocking, counted. */
static ssize_t read_output(mj_process_t *p, int i, char *buf, size_t want) {
  uv_os_fd_t fd;
  if (p->closing || uv_fileno((uv_handle_t *) &p->output[i], &fd) != 0) return -1;
  ssize_t n;
  begin_output_read(p);
  do {
    n = read(fd, buf, want);
  } while (n < 0 && errno == EINTR);
  end_output_read(p, i, n);
  return n;
}

/* Delivers the held bytes of stream i up to stream offset `upto`. */
static void emit_held(mj_process_t *p, int i, uint64_t upto) {
  uint64_t held_from = p->out_read[i] - p->held_len[i];
  if (p->held_len[i] == 0 || upto <= held_from) return;
  size_t n = upto - held_from < p->held_len[i] ? (size_t) (upto - held_from) : p->held_len[i];
  const char *data = p->held[i];
  p->held[i] += n;
  p->held_len[i] -= n;
  emit_output(p, i + 1, data, n);
}

/* Everything the child wrote to its streams up to upto[i] (MJ_OUTPUT_UNKNOWN:
 * all there is) is delivered: held bytes first, then read now. */
static void deliver_output_upto(mj_process_t *p, const uint64_t upto[2]) {
  char chunk[16 * 1024];
  for (int i = 0; i < 2 && !p->closing; i++) {
    emit_held(p, i, upto[i]);
    if (p->held_len[i] > 0) continue; /* the held bytes go past upto: all read */
    while (!p->closing && p->out_read[i] < upto[i]) {
      uint64_t left = upto[i] - p->out_read[i];
      ssize_t n = read_output(p, i, chunk, left < sizeof chunk ? (size_t) left : sizeof chunk);
      if (n <= 0) break;
      emit_output(p, i + 1, chunk, (size_t) n);
    }
  }
}

/* Reads whatever is waiting on the child's stdout and stderr, without
 * blocking, and delivers it (the child is gone). */
static void drain_output(mj_process_t *p) {
  const uint64_t all[2] = {MJ_OUTPUT_UNKNOWN, MJ_OUTPUT_UNKNOWN};
  deliver_output_upto(p, all);
}

/* The context's scratch buffer: the read callback consumes it before it
 * returns (held chunks are delivered before it returns too). */
static void mj_output_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  mj_process_t *p = h->data;
  (void) suggested;
  begin_output_read(p); /* libuv reads next, then always calls the read callback */
  *buf = uv_buf_init(p->ctx->scratch, sizeof p->ctx->scratch);
}

static void drain_channel(mj_process_t *p);

static void mj_output_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  mj_process_t *p = s->data;
  int i = (s == (uv_stream_t *) &p->output[0]) ? 0 : 1;
  end_output_read(p, i, nread);
  if (nread < 0) uv_read_stop(s);
  if (nread <= 0) return;
  p->held[i] = buf->base;
  p->held_len[i] = (size_t) nread;
  drain_channel(p); /* frames that end jobs before some of these bytes take theirs */
  if (!p->closing && p->held_len[i] > 0) emit_output(p, i + 1, p->held[i], p->held_len[i]);
  p->held_len[i] = 0;
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

/* The i-th job in flight, 0 being the head. */
static mj_inflight_t *inflight_at(mj_process_t *p, unsigned i) {
  return &p->inflight[(p->first + i) % MJ_MAX_INFLIGHT];
}

static mj_inflight_t *head(mj_process_t *p) {
  return p->nin ? inflight_at(p, 0) : NULL;
}

static mj_inflight_t *find_inflight(mj_process_t *p, uint64_t job) {
  for (unsigned i = 0; i < p->nin; i++)
    if (inflight_at(p, i)->job == job) return inflight_at(p, i);
  return NULL;
}

/* Why a header the child sent breaks the protocol, or NULL when the child may
 * send it now: READY and LOADERR only while starting (job 0), job frames only
 * with the head job's token, job-ending frames with room for their usage
 * block, the output flag only on those. */
static const char *frame_violation(mj_process_t *p, const mj_frame_header_t *h) {
  uint32_t type = h->type & MJ_FRAME_TYPE_MASK;
  const char *why = NULL;
  if (h->type & ~MJ_FRAME_TYPE_MASK) return "a frame header with unknown flags";
  switch (type) {
    case MJ_FRAME_READY:
    case MJ_FRAME_LOADERR:
      if (p->state != MJ_CHILD_STARTING) why = "a start-up frame after start-up";
      else if (h->job != 0) why = "a start-up frame with a job token";
      break;
    case MJ_FRAME_DONE:
    case MJ_FRAME_FAIL:
    case MJ_FRAME_PROGRESS:
    case MJ_FRAME_LOG:
      if (p->state != MJ_CHILD_READY || p->nin == 0) why = "a job frame while no job was running";
      else if (h->job != head(p)->token) why = "a job frame with a wrong job token";
      break;
    default:
      return "a frame of unknown type";
  }
  if (why == NULL && MJ_FRAME_ENDS_JOB(type) && h->len < sizeof(mj_job_usage_t))
    why = "a job-ending frame too short";
  return why;
}

/* The child broke the protocol: nothing more it sends is read. */
static void protocol_error(mj_process_t *p, const char *why) {
  mj_process_event_t ev = {.kind = MJ_PROCESS_PROTOCOL, .data = why, .len = strlen(why)};
  p->state = MJ_CHILD_ENDED;
  emit(p, &ev);
  stop_channel(p); /* last: the exit event may follow at once */
}

/* The child state after a whole frame of `type`: a job-ending frame ends the
 * head, and the next job in flight becomes the head (the child starts it next);
 * an INTERRUPT written for it while it was queued gets its signal now. */
static void frame_delivered(mj_process_t *p, uint32_t type) {
  if (type == MJ_FRAME_READY) {
    p->state = MJ_CHILD_READY;
  } else if (type == MJ_FRAME_LOADERR) {
    p->state = MJ_CHILD_ENDED;
  } else if ((type == MJ_FRAME_DONE || type == MJ_FRAME_FAIL) && p->nin > 0) {
    p->first = (p->first + 1) % MJ_MAX_INFLIGHT;
    p->nin--;
    mj_inflight_t *next = head(p);
    if (next != NULL && next->signal_due) {
      next->signal_due = 0;
      mj_process_kill(p, MJ_INTERRUPT_SIGNAL, 0);
    }
  }
}

/* The parent's number for the head job, 0 when none. */
static uint64_t head_job(mj_process_t *p) {
  return p->nin ? head(p)->job : 0;
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
  if (MJ_FRAME_ENDS_JOB(p->big.type)) deliver_output_upto(p, p->big_usage.output);
  if (p->closing) return;
  mj_process_event_t ev = {.kind = MJ_PROCESS_FRAME, .header = &p->big, .data = data, .len = n,
                           .streamed = 1, .job = head_job(p)};
  if (MJ_FRAME_ENDS_JOB(p->big.type)) ev.usage = &p->big_usage;
  frame_delivered(p, p->big.type);
  emit(p, &ev);
}

/* A whole frame (header at `at`) of at most MJ_PIECE bytes. */
static void deliver_whole(mj_process_t *p, mj_frame_header_t hdr, const char *at) {
  mj_process_event_t ev = {.kind = MJ_PROCESS_FRAME, .header = &hdr,
                           .data = at + MJ_FRAME_HEADER_SIZE, .job = hdr.job ? head_job(p) : 0};
  mj_job_usage_t usage;
  if (MJ_FRAME_ENDS_JOB(hdr.type)) {
    memcpy(&usage, ev.data, sizeof usage); /* the child's usage block comes first */
    deliver_output_upto(p, usage.output); /* what the job printed, before it ends */
    if (p->closing) return;
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
  if (p->shared != NULL) munmap(p->shared, MJ_SHARED_MAP_SIZE);
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

static int flush_stage(mj_process_t *p);

static void mj_close_cb(uv_handle_t *h) {
  mj_process_t *p = h->data;
  if (--p->open_handles > 0) return;
  unlink_open(p);
  free(p->rbuf);
  p->rbuf = NULL;
  free(p->wbuf);
  p->wbuf = NULL;
  p->wlen = p->wcap = 0;
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
                           .term_signal = p->term_signal};
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

/* Wraps the parent's ends of the pipes and the socketpair in libuv pipes (stdout, stderr,
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
  if (ftruncate(fd, MJ_SHARED_MAP_SIZE) == 0)
    page = mmap(NULL, MJ_SHARED_MAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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

/* An INTERRUPT frame is wholly written: the shared page counts it (a child
 * about to start a job then looks in its channel), and the signal follows
 * (see child.c) while its job is the head; a job still queued behind the head
 * gets it when it becomes the head (frame_delivered). A job over by now gets
 * nothing. */
static void interrupt_written(mj_process_t *p, uint64_t token) {
  if (p->shared) __atomic_add_fetch(&p->shared->interrupts, 1, __ATOMIC_RELEASE);
  for (unsigned i = 0; i < p->nin; i++) {
    mj_inflight_t *f = inflight_at(p, i);
    if (f->token != token) continue;
    if (i == 0) mj_process_kill(p, MJ_INTERRUPT_SIGNAL, 0);
    else f->signal_due = 1;
    return;
  }
}

static void mj_write_cb(uv_write_t *req, int status) {
  mj_send_req_t *send = req->data;
  mj_process_event_t ev = {.kind = MJ_PROCESS_SENT};
  /* a failed write shows up as the child's exit or EOF */
  if (status == 0 && send->hdr.type == MJ_FRAME_INTERRUPT) interrupt_written(send->p, send->hdr.job);
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

/* ---------------------------------------------------------------- stage --- */

/* Small JOB frames sent from inside the loop (a callback dispatching jobs as
 * others end) are copied into the process's stage and written together, in
 * one write per process per loop turn, when the loop is about to wait or has
 * handled its events (mj__process_flush_all, from loop.c's flusher): one
 * system call, and one wake-up of the child, for many frames. Every other
 * write flushes the stage first, so frames keep their order. */

/* Copies the frame in bufs[0..n) (total bytes) to the stage. Returns 0, or
 * UV_ENOBUFS when it does not fit (the caller writes it now instead). */
static int stage(mj_process_t *p, const uv_buf_t *bufs, unsigned n, size_t total) {
  if (p->wlen + total > MJ_STAGE_SIZE) {
    int rc = flush_stage(p);
    if (rc < 0) return rc;
  }
  if (mj__grow(&p->wbuf, &p->wcap, p->wlen + total, 4096) != 0) return UV_ENOBUFS;
  for (unsigned i = 0; i < n; i++) {
    memcpy(p->wbuf + p->wlen, bufs[i].base, bufs[i].len);
    p->wlen += bufs[i].len;
  }
  return 0;
}

static void mj_stage_write_cb(uv_write_t *req, int status) {
  (void) status; /* a failed write shows up as the child's exit or EOF */
  free(req);
}

/* Writes the stage: directly what the kernel takes, the rest queued (a copy
 * that lives with its request). Returns 0 or UV_E...: the staged frames are
 * then lost, so the child and the parent no longer count the same JOB frames
 * (frame.h's sequence numbers): the child is killed (its jobs, which it never
 * started, go back to the queue at its exit). */
static int flush_stage(mj_process_t *p) {
  if (p->wlen == 0) return 0;
  size_t len = p->wlen;
  p->wlen = 0;
  int written = 0, rc = 0;
  uv_buf_t buf = uv_buf_init(p->wbuf, (unsigned) len);
  if (p->channel.write_queue_size == 0) {
    written = uv_try_write((uv_stream_t *) &p->channel, &buf, 1);
    if (written == UV_EAGAIN) written = 0;
    if (written < 0) {
      rc = written;
      goto failed;
    }
  }
  if ((size_t) written == len) return 0;
  uv_write_t *req = malloc(sizeof *req + (len - (size_t) written));
  if (req == NULL) {
    rc = UV_ENOMEM;
    goto failed;
  }
  char *rest = (char *) (req + 1);
  memcpy(rest, p->wbuf + written, len - (size_t) written);
  buf = uv_buf_init(rest, (unsigned) (len - (size_t) written));
  rc = uv_write(req, (uv_stream_t *) &p->channel, &buf, 1, mj_stage_write_cb);
  if (rc == 0) return 0;
  free(req);
failed:
  mj_process_kill(p, SIGKILL, 1);
  return rc;
}

/* The loop is about to wait, or has handled its events: every stage goes out
 * (a walk over the context's children, a few per pool). */
void mj__process_flush_all(mj_ctx_t *ctx) {
  for (mj_process_t *p = ctx->open; p != NULL; p = p->next_open) {
    if (p->closing || p->exited) p->wlen = 0; /* the child is gone: nobody reads it */
    else flush_stage(p);
  }
}

/* Sends one frame whose payload is the concatenation of parts. A JOB frame
 * gets a fresh random token and the next sequence number, and joins the jobs
 * in flight (the child must be ready, with fewer than MJ_MAX_INFLIGHT); an
 * INTERRUPT frame takes the token of job `job` in flight (nothing is sent
 * once that job is over, nor twice), and MJ_INTERRUPT_SIGNAL follows it as
 * soon as the kernel holds all of it (see interrupt_written). Returns 0 when
 * the kernel took every byte; MJ_SEND_QUEUED when the rest is queued without
 * a copy: the parts' memory must then stay valid until the MJ_PROCESS_SENT
 * event; or UV_E... (UV_EPIPE once the process is closing, UV_EBUSY for a
 * JOB while the child is not ready or holds MJ_MAX_INFLIGHT jobs). */
int mj_process_send(mj_process_t *p, uint32_t type, uint64_t job, const uv_buf_t *parts,
                    unsigned nparts) {
  enum { MAX_PARTS = 4 };
  uv_buf_t bufs[1 + MAX_PARTS];
  mj_frame_header_t hdr;
  size_t total = 0;
  if (p->closing || p->exited) return UV_EPIPE;
  if (nparts > MAX_PARTS) return UV_EINVAL;
  uint64_t token = 0;
  mj_inflight_t *target = NULL;
  if (type == MJ_FRAME_JOB) {
    if (p->state != MJ_CHILD_READY || p->nin >= MJ_MAX_INFLIGHT) return UV_EBUSY;
    token = draw_token(p->ctx);
    if (token == 0) return UV_EIO;
  } else if (type == MJ_FRAME_INTERRUPT) {
    target = find_inflight(p, job);
    if (target == NULL || target->interrupted) return 0; /* that job is over, or asked already */
    job = target->token;
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
  if (type == MJ_FRAME_JOB && p->ctx->running && total <= MJ_STAGE_FRAME) {
    rc = stage(p, bufs, nparts + 1, total); /* written with the others at the end of the turn */
    if (rc == 0) goto sent;
    if (rc != UV_ENOBUFS) return rc; /* the stage could not be written: the child is killed */
  }
  rc = flush_stage(p); /* what was staged goes first */
  if (rc < 0) return rc;
  if (p->channel.write_queue_size == 0) { /* else frames would overtake queued ones */
    written = uv_try_write((uv_stream_t *) &p->channel, bufs, nparts + 1);
    if (written == UV_EAGAIN) written = 0;
    if (written < 0) return written;
  }
  if ((size_t) written < total) rc = queue_rest(p, bufs, nparts + 1, (size_t) written);
  if (rc >= 0 && target != NULL) target->interrupted = 1;
  if (rc == 0 && type == MJ_FRAME_INTERRUPT) interrupt_written(p, hdr.job);
sent:
  if (rc >= 0 && token != 0) { /* the child owes frames about it once it is the head */
    mj_inflight_t *f = inflight_at(p, p->nin++);
    memset(f, 0, sizeof *f);
    f->job = job;
    f->token = token;
    f->seq = p->seq = mj_seq_next(p->seq);
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

/* 1 when the child started job `job` (it swapped the job's sequence number
 * into the shared page's gate, frame.h), 0 when not yet, -1 when the job is
 * not in flight (ended, recalled, or never sent here). */
int mj_process_started(mj_process_t *p, uint64_t job) {
  const mj_inflight_t *f = find_inflight(p, job);
  if (f == NULL) return -1;
  if (p->shared == NULL) return 0;
  return mj_gate_started(__atomic_load_n(&p->shared->gate, __ATOMIC_ACQUIRE), f->seq);
}

/* Takes back the jobs in flight that the child has not started, from job
 * `from` on (0: from the first it has not started; nothing when `from` was
 * started): one compare-and-swap on the shared gate marks them recalled, so
 * the child drops them unread and never starts them (frame.h), even if it is
 * about to. A range recalled before and not yet passed by the child is
 * joined, and the jobs sent between the two are taken back too. They leave
 * the jobs in flight; their numbers go to jobs[0..n), n returned (the caller
 * passes room for MJ_MAX_INFLIGHT). A dead child's gate still answers: what
 * it never started is recalled. */
unsigned mj_process_recall(mj_process_t *p, uint64_t from, uint64_t *jobs, unsigned max) {
  unsigned first = 0;
  while (from != 0 && first < p->nin && inflight_at(p, first)->job != from) first++;
  if (p->shared == NULL || first >= p->nin) return 0;
  uint64_t g = __atomic_load_n(&p->shared->gate, __ATOMIC_ACQUIRE);
  uint32_t lo;
  for (;;) {
    unsigned i = first;
    if (from == 0)
      while (i < p->nin && mj_gate_started(g, inflight_at(p, i)->seq)) i++;
    if (i == p->nin || mj_gate_started(g, inflight_at(p, i)->seq)) return 0;
    uint32_t hi = p->seq;
    lo = inflight_at(p, i)->seq;
    if (mj_gate_pending(g)) {
      if (mj_seq_after(lo, MJ_GATE_FROM(g))) lo = MJ_GATE_FROM(g);
      if (mj_seq_after(MJ_GATE_TO(g), hi)) hi = MJ_GATE_TO(g);
    }
    uint64_t recalled = MJ_GATE(MJ_GATE_STARTED(g), lo, hi);
    if (__atomic_compare_exchange_n(&p->shared->gate, &g, recalled, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      break; /* else g now holds what the child swapped in: look again */
  }
  unsigned keep = 0, n = 0;
  while (keep < p->nin && mj_seq_after(lo, inflight_at(p, keep)->seq)) keep++;
  for (unsigned i = keep; i < p->nin && n < max; i++) jobs[n++] = inflight_at(p, i)->job;
  p->nin = keep;
  return n;
}

/* The shared `batch` word of job `job`, when it is in flight and the child
 * started it as a batch of lines (frame.h); 0 otherwise. */
static uint64_t batch_word(mj_process_t *p, uint64_t job) {
  const mj_inflight_t *f = find_inflight(p, job);
  if (f == NULL || p->shared == NULL) return 0;
  if (!mj_gate_started(__atomic_load_n(&p->shared->gate, __ATOMIC_ACQUIRE), f->seq)) return 0;
  uint64_t b = __atomic_load_n(&p->shared->batch, __ATOMIC_ACQUIRE);
  return MJ_BATCH_SEQ(b) == f->seq ? b : 0;
}

/* Where batch job `job` stands in the child (frame.h): the lines it started,
 * and the lines and bytes of results it kept in the batch area (*kept points
 * at them; they stay readable after the child's death, until the process is
 * freed). Returns 0, or -1 when `job` is not a batch the child started.
 * While the child lives it may move on to its next job, which reuses the
 * area: copy the kept bytes, then ask mj_process_batch_same. */
int mj_process_batch(mj_process_t *p, uint64_t job, mj_batch_state_t *state) {
  uint64_t b = batch_word(p, job);
  if (b == 0) return -1;
  state->word = b;
  uint64_t k = __atomic_load_n(&p->shared->batch_kept, __ATOMIC_ACQUIRE);
  state->started = MJ_BATCH_STARTED(b);
  state->kept_lines = MJ_KEPT_LINES(k);
  state->kept_bytes = MJ_KEPT_BYTES(k) <= MJ_BATCH_AREA ? MJ_KEPT_BYTES(k) : 0;
  state->kept = (const char *) p->shared + MJ_SHARED_SIZE;
  state->line_started_ns = __atomic_load_n(&p->shared->batch_line_started, __ATOMIC_RELAXED);
  return 0;
}

/* After a copy of what mj_process_batch pointed at: 1 when the child was
 * still on that batch all along (the copy is whole), 0 when it may have moved
 * on to another job and reused the area (seqlock reader, frame.h; the child
 * changes the batch word before its next job writes the area). */
int mj_process_batch_same(mj_process_t *p, const mj_batch_state_t *state) {
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  uint64_t b = __atomic_load_n(&p->shared->batch, __ATOMIC_RELAXED);
  return MJ_BATCH_SEQ(b) == MJ_BATCH_SEQ(state->word);
}

/* Takes back the lines of batch job `job` that the child has not started,
 * except its first line: one compare-and-swap lowers its limit to the lines
 * started (at least 1), so the child starts no more of them and ends the job
 * with what ran. The first line stays with the child even when it has not
 * reached it yet, so that every batch makes progress (a child slow to reach
 * its batches would otherwise have them all taken back). Returns the new
 * limit (the lines after it are the caller's again), or -1 when `job` is not
 * a batch the child started. */
int mj_process_batch_cut(mj_process_t *p, uint64_t job) {
  uint64_t b = batch_word(p, job);
  if (b == 0) return -1;
  for (;;) {
    uint32_t keep = MJ_BATCH_STARTED(b) > 0 ? MJ_BATCH_STARTED(b) : 1;
    if (keep > MJ_BATCH_LIMIT(b)) keep = MJ_BATCH_LIMIT(b);
    uint64_t cut = MJ_BATCH(MJ_BATCH_SEQ(b), MJ_BATCH_STARTED(b), keep);
    if (__atomic_compare_exchange_n(&p->shared->batch, &b, cut, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      return (int) keep;
    if (MJ_BATCH_SEQ(b) != MJ_BATCH_SEQ(cut)) return -1; /* the child moved on to another job */
  }
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
  int flushed = flush_stage(p);
  if (flushed < 0) return flushed;
  if (p->shared) __atomic_store_n(&p->shared->input_ended, 1, __ATOMIC_RELEASE);
  uv_shutdown_t *req = malloc(sizeof *req);
  if (req == NULL) return UV_ENOMEM;
  int rc = uv_shutdown(req, (uv_stream_t *) &p->channel, mj_shutdown_cb);
  if (rc != 0) free(req);
  return rc;
}

