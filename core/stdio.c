/* stdio.c -- line input and ordered output on the parent's own descriptors.
 *
 * The CLI reads NDJSON from a file or stdin and writes result lines to stdout
 * without ever blocking the loop: both directions go through libuv's
 * filesystem requests (a worker thread does the blocking read or write), which
 * work the same for regular files, pipes and terminals.
 *
 * Input is read one chunk at a time and cut into lines here; the reader can be
 * paused between lines, so the caller bounds how much input is in memory (the
 * CLI pauses while enough jobs are queued). A line longer than max_line is not
 * kept: the callback is told it was too long and the rest of it is skipped.
 *
 * Output keeps at most one write in flight, so bytes land in order; writes
 * made meanwhile are appended to a pending buffer that goes out next.
 *
 * Caveat: an input being read cannot be freed until its request returns; the
 * owner keeps it alive while `reading` is set.
 */
#include <stdlib.h>
#include <string.h>

#include "moonjob.h"

#define MJ_INPUT_CHUNK (64 * 1024)

/* ---------------------------------------------------------------- input --- */

static int issue_read(mj_input_t *in);

/* Delivers complete lines while not paused; keeps the partial rest. */
static void deliver_lines(mj_input_t *in) {
  size_t off = 0;
  int partial = 0; /* stopped at a line with no newline yet */
  while (!in->paused && !in->closing && off < in->len) {
    char *start = in->buf + off;
    char *nl = memchr(start, '\n', in->len - off);
    if (nl == NULL) {
      partial = 1;
      break;
    }
    size_t n = (size_t) (nl - start);
    off += n + 1;
    if (in->skipping) {
      in->skipping = 0; /* the end of a line already reported as too long */
      continue;
    }
    in->on_line(in, start, n, n > in->max_line);
  }
  memmove(in->buf, in->buf + off, in->len - off);
  in->len -= off;
  if (partial && !in->skipping && in->len > in->max_line) {
    in->skipping = 1;
    in->on_line(in, in->buf, in->len, 1);
  }
  if (in->skipping) in->len = 0;
}

static void finish(mj_input_t *in, int error) {
  if (error == 0 && in->len > 0 && !in->skipping) {
    size_t n = in->len;
    in->len = 0;
    in->on_line(in, in->buf, n, n > in->max_line); /* last line without a newline */
  }
  in->ended = 1;
  in->on_end(in, error);
}

static void mj_input_read_cb(uv_fs_t *req) {
  mj_input_t *in = req->data;
  ssize_t result = req->result;
  uv_fs_req_cleanup(req);
  in->reading = 0;
  if (in->closing) {
    free(in->buf);
    in->buf = NULL;
    return;
  }
  if (result < 0) return finish(in, (int) result);
  if (result == 0) {
    in->paused = 0;
    deliver_lines(in); /* after end of file nothing more will come: flush */
    return finish(in, 0);
  }
  in->len += (size_t) result;
  deliver_lines(in);
  if (!in->paused && !in->closing) issue_read(in);
}

static int issue_read(mj_input_t *in) {
  if (in->reading || in->ended) return 0;
  int rc = mj__grow(&in->buf, &in->cap, in->len + MJ_INPUT_CHUNK, MJ_INPUT_CHUNK);
  if (rc != 0) return rc;
  uv_buf_t buf = uv_buf_init(in->buf + in->len, (unsigned) (in->cap - in->len));
  in->req.data = in;
  rc = uv_fs_read(&in->ctx->loop, &in->req, in->fd, &buf, 1, -1, mj_input_read_cb);
  if (rc == 0) in->reading = 1;
  return rc;
}

void mj_input_init(mj_ctx_t *ctx, mj_input_t *in, int fd, size_t max_line,
                   mj_line_cb on_line, mj_input_end_cb on_end) {
  memset(in, 0, sizeof *in);
  in->ctx = ctx;
  in->fd = fd;
  in->max_line = max_line;
  in->on_line = on_line;
  in->on_end = on_end;
  in->paused = 1;
}

/* Starts or continues reading. Lines already buffered are delivered first. */
int mj_input_resume(mj_input_t *in) {
  if (in->ended || in->closing) return 0;
  in->paused = 0;
  deliver_lines(in);
  return in->paused ? 0 : issue_read(in);
}

/* No more lines are delivered until mj_input_resume. */
void mj_input_pause(mj_input_t *in) {
  in->paused = 1;
}

/* Releases the buffer now, or when the read in flight returns. */
void mj_input_free(mj_input_t *in) {
  in->closing = 1;
  if (!in->reading) {
    free(in->buf);
    in->buf = NULL;
  }
}

/* --------------------------------------------------------------- output --- */

static void start_write(mj_output_t *out);

static void mj_output_write_cb(uv_fs_t *req) {
  mj_output_t *out = req->data;
  ssize_t result = req->result;
  uv_fs_req_cleanup(req);
  if (result < 0) {
    out->error = (int) result;
    out->writing = 0;
    out->inflight_len = out->pending_len = 0;
    return;
  }
  out->inflight_off += (size_t) result;
  if (out->inflight_off < out->inflight_len) {
    out->writing = 0;
    return start_write(out); /* a short write: the rest goes next */
  }
  out->inflight_len = out->inflight_off = 0;
  out->writing = 0;
  if (out->pending_len > 0) start_write(out);
}

/* Sends what is in flight (the rest of a short write) or, when nothing is, the
 * pending bytes: the two buffers trade places. */
static void start_write(mj_output_t *out) {
  if (out->inflight_len == 0) {
    char *b = out->inflight;
    size_t c = out->inflight_cap;
    out->inflight = out->pending;
    out->inflight_cap = out->pending_cap;
    out->inflight_len = out->pending_len;
    out->inflight_off = 0;
    out->pending = b;
    out->pending_cap = c;
    out->pending_len = 0;
  }
  uv_buf_t buf = uv_buf_init(out->inflight + out->inflight_off,
                             (unsigned) (out->inflight_len - out->inflight_off));
  out->req.data = out;
  int rc = uv_fs_write(&out->ctx->loop, &out->req, out->fd, &buf, 1, -1, mj_output_write_cb);
  if (rc != 0) {
    out->error = rc;
    return;
  }
  out->writing = 1;
}

void mj_output_init(mj_ctx_t *ctx, mj_output_t *out, int fd) {
  memset(out, 0, sizeof *out);
  out->ctx = ctx;
  out->fd = fd;
}

/* Queues bytes without starting a write: several pieces can make one write. */
int mj_output_append(mj_output_t *out, const char *data, size_t len) {
  if (out->error) return out->error;
  int rc = mj__grow(&out->pending, &out->pending_cap, out->pending_len + len, MJ_INPUT_CHUNK);
  if (rc != 0) return rc;
  memcpy(out->pending + out->pending_len, data, len);
  out->pending_len += len;
  return 0;
}

/* Starts writing what is pending, unless a write is in flight (its callback
 * picks the pending bytes up). Returns 0, or the first write error seen. */
int mj_output_start(mj_output_t *out) {
  if (!out->error && !out->writing && out->pending_len > 0) start_write(out);
  return out->error;
}

void mj_output_free(mj_output_t *out) {
  if (out->writing) return; /* the buffers stay with the request in flight */
  free(out->pending);
  free(out->inflight);
  out->pending = out->inflight = NULL;
}
