/* stdio.c -- line input on the parent's own descriptors (output: output.c).
 *
 * The CLI reads NDJSON from a file or stdin without ever blocking the loop.
 *
 * Input is cut into lines here; the reader can be paused between lines, so the
 * caller bounds how much input is in memory (the CLI pauses while enough jobs
 * are queued). A line longer than max_line is not kept: the callback is told
 * it was too long and the rest of it is skipped. How bytes are read depends on
 * the descriptor: a regular file through libuv's filesystem requests (a worker
 * thread does the read, which always returns), a pipe, socket or terminal as a
 * libuv stream on the loop itself. A read of a pipe or terminal in the thread
 * pool could block for ever, and would then hold up the end of the program
 * (libuv joins its threads at exit).
 *
 * The input owns its descriptor when it is above 2: it is closed once the
 * input is freed and no read is in flight. Freeing is safe from inside the
 * input's own callbacks: delivery stops, and the memory goes once nothing
 * uses it any more (then on_freed runs).
 *
 * Blocks of lines (batch_lines > 1, what the CLI sends as one batch) from a
 * regular file are never cut at the end of what a read brought: the block
 * waits for the next read, which always returns (reads are 256 KiB, so
 * that a batch of long lines takes few round trips to the thread pool).
 * From a pipe or terminal a block holds what has arrived: a slow writer's
 * lines are not held back.
 *
 * Caveat: an input with a filesystem request in flight cannot be freed until
 * it returns; a regular file's read always does.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moonjob.h"

#define MJ_INPUT_CHUNK (256 * 1024)
#define MJ_INPUT_BLOCK (1024 * 1024) /* a block of lines holds at most this many bytes */

/* ---------------------------------------------------------------- input --- */

static int issue_read(mj_input_t *in);

/* Everything is released: buffer, descriptor, list entry. Then on_freed. */
static void release(mj_input_t *in) {
  free(in->buf);
  in->buf = NULL;
  in->len = in->cap = 0;
  if (in->fd > 2 && !in->fd_in_stream) close(in->fd); /* else it goes with the stream */
  in->fd = -1;
  mj__list_unlink(&in->link);
  if (in->on_freed) in->on_freed(in);
}

/* Releases the input if it was freed and nothing uses it any more. */
static void release_if_done(mj_input_t *in) {
  if (in->closing && !in->reading && !in->delivering && !in->stream_open) release(in);
}

/* Extends the block of lines at `start` (its first line `n` bytes long, *off
 * just past its newline) with the whole lines after it, up to batch_lines
 * lines and MJ_INPUT_BLOCK (or max_line) bytes in all, so that blocks in
 * flight stay small whatever the lines' size; a line that would pass either
 * stays for the next delivery. Returns the block's length without its last
 * newline. *short_read is set when the buffered bytes ran out first in a
 * regular file not read to its end: its next read always returns, so the
 * caller waits for it rather than cut the block short (a block cut at every
 * read's end would make batches half their size, twice as many). */
static size_t gather_lines(mj_input_t *in, const char *start, size_t n, size_t *off,
                           unsigned *count, int *short_read) {
  size_t most = in->max_line < MJ_INPUT_BLOCK ? in->max_line : MJ_INPUT_BLOCK;
  int ran_out = 1;
  while (*count < in->batch_lines && *off < in->len) {
    const char *next = in->buf + *off;
    char *nl = memchr(next, '\n', in->len - *off);
    if (nl == NULL) break;
    if ((size_t) (nl - start) > most) {
      ran_out = 0;
      break;
    }
    n = (size_t) (nl - start);
    *off += (size_t) (nl - next) + 1;
    (*count)++;
  }
  *short_read = ran_out && *count < in->batch_lines && in->mode == MJ_INPUT_FILE && !in->ended;
  return n;
}

/* Delivers complete lines while not paused; keeps the partial rest. Stops at
 * once when a callback freed the input. Not while a file's read is in
 * flight: it writes past the buffer's end, which moving the rest down would
 * misplace (a block waiting for that read may be whole again after a
 * change of batch size); the read's callback delivers. */
static void deliver_lines(mj_input_t *in) {
  size_t off = 0;
  int partial = 0; /* stopped at a line with no newline yet */
  if (in->reading) return;
  in->delivering = 1;
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
    unsigned count = 1;
    if (n <= in->max_line && in->batch_lines > 1) {
      int short_read = 0;
      n = gather_lines(in, start, n, &off, &count, &short_read);
      if (short_read) {
        off = (size_t) (start - in->buf); /* the whole block waits for the next read */
        break;
      }
    }
    in->on_line(in, start, n, n > in->max_line, count);
  }
  if (!in->closing) {
    if (off > 0) memmove(in->buf, in->buf + off, in->len - off);
    in->len -= off;
    if (partial && !in->skipping && in->len > in->max_line) {
      in->skipping = 1;
      in->on_line(in, in->buf, in->len, 1, 1);
    }
    if (in->skipping) in->len = 0;
  }
  in->delivering = 0;
}

/* The end of the input (error 0) or a read error: the lines buffered are
 * delivered, then the last one without a newline, then on_end. A callback
 * that pauses the input while whole lines are still buffered (a block that
 * waited for the read that found the end) holds the end back: the next
 * mj_input_resume delivers them and ends. */
static void finish(mj_input_t *in, int error) {
  in->ended = 1; /* a resume from the last lines' callbacks reads no more */
  in->paused = 0;
  deliver_lines(in); /* nothing more will come: flush */
  in->end_pending = !in->closing && error == 0 && in->paused && !in->skipping && in->len > 0
                    && memchr(in->buf, '\n', in->len) != NULL;
  if (in->end_pending) return;
  if (!in->closing && error == 0 && in->len > 0 && !in->skipping) {
    size_t n = in->len;
    in->len = 0;
    in->delivering = 1;
    in->on_line(in, in->buf, n, n > in->max_line, 1); /* last line without a newline */
    in->delivering = 0;
  }
  if (!in->closing) in->on_end(in, error);
}

/* Room for one more chunk after the unread bytes. */
static int make_room(mj_input_t *in) {
  return mj__grow(&in->buf, &in->cap, in->len + MJ_INPUT_CHUNK, MJ_INPUT_CHUNK);
}

/* A UTF-8 byte order mark at the very start of the input is not part of its
 * first line (some Windows editors write one): it is dropped. Returns 0 while
 * the input's first bytes may still be one (fewer than three, all its own). */
static int skip_bom(mj_input_t *in) {
  static const char bom[3] = {'\xEF', '\xBB', '\xBF'};
  size_t n = in->len < 3 ? in->len : 3;
  if (in->bom_checked) return 1;
  if (memcmp(in->buf, bom, n) != 0) {
    in->bom_checked = 1;
    return 1;
  }
  if (n < 3) return 0;
  memmove(in->buf, in->buf + 3, in->len - 3);
  in->len -= 3;
  in->bom_checked = 1;
  return 1;
}

/* Bytes arrived (n > 0), the end (n == 0), or an error (n < 0). */
static void on_bytes(mj_input_t *in, ssize_t n) {
  if (in->closing) return;
  if (n < 0) return finish(in, (int) n);
  if (n == 0) return finish(in, 0);
  in->len += (size_t) n;
  if (skip_bom(in)) deliver_lines(in);
}

/* --- regular files: one filesystem request at a time --- */

static void mj_input_read_cb(uv_fs_t *req) {
  mj_input_t *in = req->data;
  ssize_t result = req->result;
  uv_fs_req_cleanup(req);
  in->reading = 0;
  on_bytes(in, result);
  if (result > 0 && !in->paused && !in->closing) issue_read(in);
  release_if_done(in);
}

static int read_file(mj_input_t *in) {
  int rc = make_room(in);
  if (rc != 0) return rc;
  uv_buf_t buf = uv_buf_init(in->buf + in->len, (unsigned) (in->cap - in->len));
  in->req.data = in;
  rc = uv_fs_read(&in->ctx->loop, &in->req, in->fd, &buf, 1, -1, mj_input_read_cb);
  if (rc == 0) in->reading = 1;
  return rc;
}

/* --- pipes, sockets, terminals: a libuv stream --- */

static void mj_input_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  mj_input_t *in = h->data;
  (void) suggested;
  if (make_room(in) != 0) {
    *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
    return;
  }
  *buf = uv_buf_init(in->buf + in->len, (unsigned) (in->cap - in->len));
}

static void mj_input_stream_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  mj_input_t *in = s->data;
  (void) buf;
  if (nread == 0) return; /* nothing this time (EAGAIN) */
  if (nread < 0) uv_read_stop(s);
  on_bytes(in, nread == UV_EOF ? 0 : nread);
  if (in->paused && !in->ended && !in->closing) uv_read_stop(s);
}

static void mj_input_close_cb(uv_handle_t *h) {
  mj_input_t *in = h->data;
  in->stream_open = 0;
  release_if_done(in);
}

static int open_stream(mj_input_t *in) {
  int rc;
  if (in->mode == MJ_INPUT_TTY) rc = uv_tty_init(&in->ctx->loop, &in->stream.tty, in->fd, 0);
  else rc = uv_pipe_init(&in->ctx->loop, &in->stream.pipe, 0);
  if (rc != 0) return rc;
  in->stream_open = 1;
  in->stream.handle.data = in;
  if (in->mode == MJ_INPUT_PIPE) rc = uv_pipe_open(&in->stream.pipe, in->fd);
  uv_os_fd_t used;
  if (rc == 0 && uv_fileno(&in->stream.handle, &used) == 0 && used == in->fd)
    in->fd_in_stream = 1; /* libuv closes it with the stream (a terminal is reopened) */
  if (rc != 0) uv_close(&in->stream.handle, mj_input_close_cb);
  return rc;
}

static int read_stream(mj_input_t *in) {
  int rc = in->stream_open ? 0 : open_stream(in);
  if (rc == 0 && !uv_is_active(&in->stream.handle))
    rc = uv_read_start((uv_stream_t *) &in->stream.handle, mj_input_alloc_cb, mj_input_stream_cb);
  return rc;
}

static int issue_read(mj_input_t *in) {
  if (in->reading || in->ended || in->closing) return 0;
  return in->mode == MJ_INPUT_FILE ? read_file(in) : read_stream(in);
}

static void close_all(mj_ctx_t *ctx);

static const mj_closer_t closer = {MJ_CLOSE_INPUTS, close_all, NULL};

/* Sets up an input on fd (paused: mj_input_resume starts it), on the
 * context's list until it is released. on_freed, when not NULL, runs once
 * mj_input_free's release is complete. */
void mj_input_init(mj_ctx_t *ctx, mj_input_t *in, int fd, size_t max_line,
                   mj_line_cb on_line, mj_input_end_cb on_end) {
  memset(in, 0, sizeof *in);
  in->ctx = ctx;
  in->fd = fd;
  in->max_line = max_line;
  in->on_line = on_line;
  in->on_end = on_end;
  in->paused = 1;
  switch (uv_guess_handle(fd)) {
    case UV_FILE: in->mode = MJ_INPUT_FILE; break;
    case UV_TTY: in->mode = MJ_INPUT_TTY; break;
    default: in->mode = MJ_INPUT_PIPE; break;
  }
  mj__list_push(&ctx->inputs, &in->link);
  mj__ctx_on_close(ctx, &closer);
}

/* Starts or continues reading. Lines already buffered are delivered first.
 * From inside on_line (a delivery is running), the running delivery goes on;
 * a file's next read is issued when it is over, a stream's reading restarts
 * (its next bytes come on a later loop turn). An input closed by a callback
 * during this call is released before it returns. */
int mj_input_resume(mj_input_t *in) {
  if (in->closing) return 0;
  if (in->ended) { /* nothing more is read; lines a pause held at the end go on */
    in->paused = 0;
    if (in->end_pending && !in->delivering) {
      finish(in, 0);
      release_if_done(in);
    }
    return 0;
  }
  in->paused = 0;
  if (in->delivering) return in->mode == MJ_INPUT_FILE ? 0 : issue_read(in);
  if (in->len > 0) deliver_lines(in);
  if (in->closing) {
    release_if_done(in);
    return 0;
  }
  return in->paused ? 0 : issue_read(in);
}

/* No more lines are delivered until mj_input_resume. */
void mj_input_pause(mj_input_t *in) {
  in->paused = 1;
  if (in->stream_open) uv_read_stop((uv_stream_t *) &in->stream.handle);
}

/* No more lines or end. Everything is released now, or as soon as the read in
 * flight returns, the stream is closed, or the callback running returns. */
void mj_input_free(mj_input_t *in) {
  if (in->closing) return;
  in->closing = 1;
  if (in->stream_open && !uv_is_closing(&in->stream.handle))
    uv_close(&in->stream.handle, mj_input_close_cb);
  release_if_done(in);
}

/* The context is closing: every input is freed. */
static void close_all(mj_ctx_t *ctx) {
  MJ_LIST_EACH_SAFE(it, &ctx->inputs) {
    mj_input_free(MJ_LIST_ITEM(it, mj_input_t, link)); /* may unlink it */
  }
}
