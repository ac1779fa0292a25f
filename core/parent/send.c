/* send.c -- writing to a child: frames, the stage, INTERRUPT's signal, end of input.
 *
 * Sending tries a direct write first; what the kernel did not take is queued
 * without a copy (the caller keeps the bytes until MJ_PROCESS_SENT). Small
 * JOB frames sent from inside the loop are staged and written together, once
 * per loop turn (see "stage" below). Up to MJ_MAX_INFLIGHT JOB frames may be
 * in flight to a child (pipelining, frame.h): each gets a random token and
 * the next sequence number, and joins the jobs in flight, which channel.c
 * ends as the child answers. An INTERRUPT frame is followed by
 * MJ_INTERRUPT_SIGNAL once it is written whole and its job is the one the
 * child runs (interrupt_written).
 *
 * Caveat: a stage that cannot be written kills the child (flush_stage): the
 * two ends would no longer count the same JOB frames.
 */
#include <stdlib.h>
#include <string.h>

#include "moonjob.h"

/* -------------------------------------------------------------- writes --- */

/* A frame the kernel did not take at once: the header is copied here (the
 * caller's is on its stack), the payload stays in the caller's memory. */
typedef struct {
  uv_write_t req;
  mj_process_t *p;
  mj_frame_header_t hdr;
} mj_send_req_t;

/* An INTERRUPT frame is wholly written: the shared page counts it (a child
 * about to start a job then looks in its channel), and the signal follows
 * (see core/child/interrupt.c) while its job is the head; a job still queued
 * behind the head gets it when it becomes the head (frame_delivered, in
 * channel.c). A job over by now gets nothing. */
static void interrupt_written(mj_process_t *p, uint64_t token) {
  if (p->shared) __atomic_add_fetch(&p->shared->interrupts, 1, __ATOMIC_RELEASE);
  for (unsigned i = 0; i < p->nin; i++) {
    mj_inflight_t *f = mj__inflight_at(p, i);
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
  mj__process_emit(send->p, &ev);
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

static int flush_stage(mj_process_t *p);

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
  MJ_LIST_EACH(it, &ctx->open) {
    mj_process_t *p = MJ_LIST_ITEM(it, mj_process_t, open_link);
    if (p->closing || p->exited) p->wlen = 0; /* the child is gone: nobody reads it */
    else flush_stage(p);
  }
}

/* ---------------------------------------------------------------- send --- */

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
    target = mj__inflight_find(p, job);
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
    mj_inflight_t *f = mj__inflight_at(p, p->nin++);
    memset(f, 0, sizeof *f);
    f->job = job;
    f->token = token;
    f->seq = p->seq = mj_seq_next(p->seq);
  }
  return rc;
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
