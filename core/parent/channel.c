/* channel.c -- what a child sends: frames on its channel, output on its pipes.
 *
 * Channel bytes are cut into frames here (frame.h); the payload is never
 * looked at. Every header is checked as soon as it is complete against what
 * the child may send in its state, and against the random token of the job in
 * hand, the head of the jobs in flight (frame_violation): anything else is
 * reported as MJ_PROCESS_PROTOCOL and the channel is no longer read. A frame
 * up to MJ_PIECE bytes is delivered whole; a larger one in pieces, so that no
 * callback copies more than a piece. A frame that ends a job ends the head:
 * send.c adds the jobs in flight in the order sent, and the child answers
 * them in that order.
 *
 * Ordering guarantee, which libuv alone does not give: before a frame that
 * ends a job is delivered, whatever the child wrote to stdout/stderr up to
 * the end of that job is delivered first, and nothing after it (the frame
 * counts the bytes: see "Output attribution" below), so output is attributed
 * to the right job even when the next one already runs. READY counts the
 * bytes too: what the child printed while it loaded comes before it, and
 * belongs to no job.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moonjob.h"

#define MJ_READ_CHUNK (64 * 1024)
#define MJ_KEEP_BUFFER (256 * 1024)  /* shrink the frame buffer above this when idle */

/* -------------------------------------------------------- output pipes --- */

/* Output attribution. The child may run the next job the instant it sent
 * the last one's ending frame, so bytes read from stdout or stderr may belong
 * to a job that ended after they were written, or to one after it. Each
 * job-ending frame says how many bytes the child had written to each stream
 * when the job ended (mj_job_usage_t.output); the parent counts what it
 * reads (out_read, published in the shared page, between two increments of
 * output_seq, so the child can count what it wrote: see
 * core/child/output.c). A chunk read is held while the channel is drained
 * (any frame that ends a job before some of those bytes is in the channel by
 * then: the child writes it first); each ending frame first gets the bytes
 * before its count (read now if not read yet), and the rest goes to the job
 * that runs next. */

static void emit_output(mj_process_t *p, int stream, const char *data, size_t len) {
  mj_process_event_t ev = {.kind = MJ_PROCESS_OUTPUT, .data = data, .len = len, .stream = stream};
  mj__process_emit(p, &ev);
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
void mj__channel_drain_output(mj_process_t *p) {
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

static void mj_output_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  mj_process_t *p = s->data;
  int i = (s == (uv_stream_t *) &p->output[0]) ? 0 : 1;
  end_output_read(p, i, nread);
  if (nread < 0) uv_read_stop(s);
  if (nread <= 0) return;
  p->held[i] = buf->base;
  p->held_len[i] = (size_t) nread;
  mj__channel_drain(p); /* frames that end jobs before some of these bytes take theirs */
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

void mj__channel_stop(mj_process_t *p) {
  if (p->channel_eof) return;
  p->channel_eof = 1;
  uv_read_stop((uv_stream_t *) &p->channel);
  if (p->exited) mj__process_gone(p);
}

/* ------------------------------------------------------------ protocol --- */

static mj_inflight_t *head(mj_process_t *p) {
  return p->nin ? mj__inflight_at(p, 0) : NULL;
}

/* Why a header the child sent breaks the protocol, or NULL when the child may
 * send it now: READY and LOADERR only while starting (job 0), job frames only
 * with the head job's token, frames that end a job or the start-up with room
 * for their usage block. */
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
  mj__process_emit(p, &ev);
  mj__channel_stop(p); /* last: the exit event may follow at once */
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
    return mj__process_emit(p, &ev);
  }
  p->streaming = 0;
  if (MJ_FRAME_ENDS_JOB(p->big.type)) deliver_output_upto(p, p->big_usage.output);
  if (p->closing) return;
  mj_process_event_t ev = {.kind = MJ_PROCESS_FRAME, .header = &p->big, .data = data, .len = n,
                           .streamed = 1, .job = head_job(p)};
  if (MJ_FRAME_ENDS_JOB(p->big.type)) ev.usage = &p->big_usage;
  frame_delivered(p, p->big.type);
  mj__process_emit(p, &ev);
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
  mj__process_emit(p, &ev);
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
    mj__process_emit(p, &ev);
    mj__channel_stop(p); /* last: the exit event may follow at once */
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
    mj__channel_stop(p);
  }
}

/* Reads, without blocking, all the child left in the channel. */
void mj__channel_drain(mj_process_t *p) {
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
      if (n == 0 || errno != EAGAIN) mj__channel_stop(p);
      return;
    }
  }
}

int mj__channel_start(mj_process_t *p) {
  int rc = uv_read_start((uv_stream_t *) &p->channel, mj_channel_alloc_cb, mj_channel_read_cb);
  for (int i = 0; rc == 0 && i < 2; i++)
    rc = uv_read_start((uv_stream_t *) &p->output[i], mj_output_alloc_cb, mj_output_read_cb);
  return rc;
}
