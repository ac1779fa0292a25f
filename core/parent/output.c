/* output.c -- ordered output on one of the parent's own descriptors (the
 * CLI's stdout), with a record of what the descriptor took.
 *
 * Writes never block the loop and land in order. How bytes go out depends on
 * the descriptor:
 *  - a pipe or a terminal is opened again, non-blocking, through
 *    /proc/self/fd (a description of our own: the one shared with the shell
 *    keeps its flags), and written on the loop whenever it has room; a socket
 *    is written with send(MSG_DONTWAIT). On a pipe each write ends at a
 *    newline and is no longer than the pipe surely takes whole (all of it
 *    when it is empty, else PIPE_BUF, which lands whole or not at all): a
 *    line is never cut by a reader that is slow, and nothing waits in a
 *    thread on a reader that never reads (the program ends when it wants to).
 *    A pipe that cannot be opened again (no /proc; a pipe made by another
 *    user, `sudo -u u moonjob ... | reader`) is written as it is, blocking,
 *    on the loop too: never more than it surely takes, so no write waits.
 *  - anything else (a regular file, /dev/null; a terminal that cannot be
 *    opened again) is written by blocking writes in libuv's thread pool, one
 *    at a time.
 * A reader that goes away (`| head`) is seen at once, not at the next write:
 * the output's error becomes EPIPE.
 *
 * The record (record_fd, the CLI's joblog) gets each whole line right after
 * the descriptor took it, on the same thread, so it holds exactly the lines
 * written, whatever ends the program (SIGKILL included) between two writes.
 * Its space is reserved before the lines are written (fallocate, 64 KiB
 * ahead, given back at the end): a full disk under the record stops the
 * output before it prints a line the record cannot hold. A
 * line the descriptor took only part of is recorded once its newline is
 * written. After a write error on a regular file (a full disk), the part of a
 * line it took is cut off again when the file ends there: the file ends with
 * whole lines. After the first write error or record error nothing more is
 * written, and what was pending is dropped.
 *
 * On the loop, what is appended during a turn goes out at the start of the
 * next (an idle handle: the loop does not wait in between), as one write and
 * one record, however many lines it holds; or at once when the owner asks
 * (mj_output_flush: the CLI draws its progress line after its results).
 *
 * An output released while bytes are still pending goes on writing them
 * while the loop runs, then frees itself; a loop closed first drops them.
 *
 * Caveat: a line longer than PIPE_BUF can be cut on a pipe (its end is then
 * written when the pipe has room again), and a socket's writes can be cut
 * anywhere.
 */
#define _GNU_SOURCE /* memrchr */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moonjob.h"

#define MJ_OUTPUT_FIRST (64 * 1024)
#define MJ_RECORD_AHEAD (64 * 1024) /* the record's space reserved at a time */

static void start_work(mj_output_t *out);
static void stream_flush(mj_output_t *out);
static void unreserve_record(mj_output_t *out);

static void free_output(mj_output_t *out) {
  mj__list_unlink(&out->link); /* already off it once its loop closed */
  if (out->wfd >= 0 && out->wfd != out->fd) close(out->wfd);
  unreserve_record(out);
  if (out->record_fd >= 0) close(out->record_fd);
  free(out->pending);
  free(out->inflight);
  free(out->carry);
  free(out);
}

/* Frees an output that was released once nothing uses its memory any more. */
static void free_if_done(mj_output_t *out) {
  if (out->orphaned && !out->writing && !out->watching && !out->soon_open) free_output(out);
}

/* ------------------------------------------------------------ the record --- */

/* Writes all of data to fd: 0, or the error. */
static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    data += n;
    len -= (size_t) n;
  }
  return 0;
}

/* The descriptor took `data` (n > 0 bytes): its whole lines go to the
 * record, with the start of a line an earlier write took; the part after its
 * last newline waits for the rest of its line. Returns 0 or the record's
 * error. Runs on whichever thread wrote (one write at a time). */
static int record_written(mj_output_t *out, const char *data, size_t n) {
  const char *nl = memrchr(data, '\n', n);
  size_t whole = nl ? (size_t) (nl - data) + 1 : 0;
  out->torn = nl ? n - whole : out->torn + n;
  if (out->record_fd < 0) return 0;
  int rc = 0;
  if (whole > 0 && out->carry_len > 0) rc = write_all(out->record_fd, out->carry, out->carry_len);
  if (whole > 0) out->carry_len = 0;
  if (rc == 0 && whole > 0) rc = write_all(out->record_fd, data, whole);
  if (rc == 0 && n > whole) {
    rc = mj__grow(&out->carry, &out->carry_cap, out->carry_len + n - whole, 256);
    if (rc == 0) memcpy(out->carry + out->carry_len, data + whole, n - whole);
    if (rc == 0) out->carry_len += n - whole;
  }
  return rc;
}

/* Makes sure the record has room for `need` more bytes before they are
 * written to the descriptor: space is reserved ahead in the record's file
 * (fallocate, keeping its size), so a full disk refuses the record before
 * the line is printed rather than after. Returns 0 or the record's error; a
 * record that cannot reserve (a pipe, a file system without fallocate) is
 * only written. */
static int reserve_record(mj_output_t *out, size_t need) {
  if (out->record_fd < 0 || out->record_unreserved) return 0;
  struct stat st;
  if (fstat(out->record_fd, &st) != 0) return -errno;
  off_t end = st.st_size + (off_t) need;
  if (end <= out->record_reserved) return 0;
  off_t ahead = st.st_size + (need < MJ_RECORD_AHEAD ? MJ_RECORD_AHEAD : (off_t) need);
  if (fallocate(out->record_fd, FALLOC_FL_KEEP_SIZE, st.st_size, ahead - st.st_size) != 0)
    ahead = end; /* the disk is nearly full: what this write needs, if it fits */
  if (ahead == end && fallocate(out->record_fd, FALLOC_FL_KEEP_SIZE, st.st_size, (off_t) need) != 0)
    ahead = 0;
  if (ahead > 0) {
    out->record_reserved = ahead;
    return 0;
  }
  if (errno == ENOSPC || errno == EDQUOT || errno == EFBIG) return -errno;
  out->record_unreserved = 1;
  return 0;
}

/* The space reserved past the record's end is given back. */
static void unreserve_record(mj_output_t *out) {
  struct stat st;
  if (out->record_fd >= 0 && out->record_reserved > 0 && fstat(out->record_fd, &st) == 0 &&
      S_ISREG(st.st_mode) && out->record_reserved > st.st_size)
    if (ftruncate(out->record_fd, st.st_size) != 0) return;
}

/* A write to a regular file failed after part of a line: that part is cut
 * off when the file ends where it did, so a later run appending to the file
 * starts on a line of its own. */
static void cut_torn_line(mj_output_t *out) {
  struct stat st;
  off_t at = lseek(out->wfd, 0, SEEK_CUR);
  if (out->torn == 0 || at < (off_t) out->torn || fstat(out->wfd, &st) != 0) return;
  if (!S_ISREG(st.st_mode) || st.st_size != at) return;
  if (ftruncate(out->wfd, at - (off_t) out->torn) == 0) {
    lseek(out->wfd, at - (off_t) out->torn, SEEK_SET);
    out->torn = 0;
  }
}

/* -------------------------------------- files: writes in the thread pool --- */

/* In the thread pool: writes what is in flight, recording each part taken. */
static void mj_output_work_cb(uv_work_t *req) {
  mj_output_t *out = req->data;
  const char *p = out->inflight;
  size_t left = out->inflight_len;
  int error = 0, record_error = reserve_record(out, left + out->carry_len);
  while (left > 0 && !record_error) {
    ssize_t n = write(out->wfd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = -errno;
      break;
    }
    record_error = record_written(out, p, (size_t) n);
    p += n;
    left -= (size_t) n;
  }
  if (error != 0) cut_torn_line(out);
  out->work_written = out->inflight_len - left;
  out->work_error = error;
  out->work_record_error = record_error;
}

/* After any error nothing more goes out: what waits is dropped. */
static void drop_pending(mj_output_t *out) {
  out->pending_len = out->pending_off = 0;
}

static void mj_output_work_done_cb(uv_work_t *req, int status) {
  mj_output_t *out = req->data;
  out->writing = 0;
  out->written += (double) out->work_written;
  out->inflight_len = 0;
  if (status < 0 && out->error == 0) out->error = status;
  if (out->work_error && out->error == 0) out->error = out->work_error;
  if (out->work_record_error && out->record_error == 0) out->record_error = out->work_record_error;
  if (out->error || out->record_error) drop_pending(out);
  else if (out->pending_len > 0 && out->ctx) start_work(out); /* the rest goes next */
  free_if_done(out);
}

/* Hands the pending bytes to the thread pool: the two buffers trade places. */
static void start_work(mj_output_t *out) {
  char *b = out->inflight;
  size_t c = out->inflight_cap;
  out->inflight = out->pending;
  out->inflight_cap = out->pending_cap;
  out->inflight_len = out->pending_len;
  out->pending = b;
  out->pending_cap = c;
  out->pending_len = 0;
  out->work.data = out;
  int rc = uv_queue_work(&out->ctx->loop, &out->work, mj_output_work_cb, mj_output_work_done_cb);
  if (rc != 0) {
    out->error = rc;
    out->inflight_len = 0;
    return;
  }
  out->writing = 1;
}

/* ------------------------- pipes, sockets, terminals: writes on the loop --- */

static void mj_output_poll_close_cb(uv_handle_t *h) {
  mj_output_t *out = h->data;
  out->watching = 0;
  free_if_done(out);
}

static void mj_output_soon_close_cb(uv_handle_t *h) {
  mj_output_t *out = h->data;
  out->soon_open = 0;
  free_if_done(out);
}

/* Closes the watch and the end-of-turn flush. */
static void close_poll(mj_output_t *out) {
  if (out->watching && !uv_is_closing((uv_handle_t *) &out->poll))
    uv_close((uv_handle_t *) &out->poll, mj_output_poll_close_cb);
  if (out->soon_open && !uv_is_closing((uv_handle_t *) &out->soon))
    uv_close((uv_handle_t *) &out->soon, mj_output_soon_close_cb);
}

/* The turn's results go out together: one write (and one record) for all
 * that was appended since the last, not one per line. */
static void mj_output_soon_cb(uv_idle_t *soon) {
  mj_output_t *out = soon->data;
  uv_idle_stop(soon);
  if (!out->waiting) stream_flush(out);
}

static void mj_output_poll_cb(uv_poll_t *poll, int status, int events);

/* Watches for room (while bytes wait: the loop stays alive for them) or only
 * for the reader going away (the kernel flags a pipe's writing end with an
 * error, which the watch reports as a status below 0). */
static void watch(mj_output_t *out, int for_room) {
  if (!out->watching || uv_is_closing((uv_handle_t *) &out->poll)) return;
  if (out->orphaned && !for_room) return close_poll(out);
  out->waiting = for_room != 0;
  if (for_room) uv_ref((uv_handle_t *) &out->poll);
  else uv_unref((uv_handle_t *) &out->poll);
  uv_poll_start(&out->poll, for_room ? UV_WRITABLE : UV_DISCONNECT, mj_output_poll_cb);
}

static void mj_output_poll_cb(uv_poll_t *poll, int status, int events) {
  mj_output_t *out = poll->data;
  if (status < 0) { /* the reader went away */
    if (out->error == 0) out->error = UV_EPIPE;
    drop_pending(out);
    uv_poll_stop(poll);
    if (out->orphaned) close_poll(out);
    return;
  }
  if (events & UV_WRITABLE) return stream_flush(out);
  if (!out->waiting) uv_poll_stop(poll); /* a socket's peer stopped sending: it may still read */
}

/* The bytes a pipe surely takes now without cutting a write: all of it when
 * it is empty (every page slot is free), else PIPE_BUF (a write that small
 * lands whole or not at all; how full its slots are is not known: pages may
 * be partly filled). */
static size_t pipe_room(const mj_output_t *out) {
  int unread;
  if (out->pipe_size <= PIPE_BUF || ioctl(out->wfd, FIONREAD, &unread) != 0 || unread != 0) return PIPE_BUF;
  return out->pipe_size;
}

/* The length of the next write from `p` (`left` bytes wait): on a pipe, what
 * it surely takes whole, ending at a newline (or one longer line), so that a
 * slow reader never gets a line cut by a stop. */
static size_t next_piece(const mj_output_t *out, const char *p, size_t left) {
  if (!out->pipe || left <= PIPE_BUF) return left;
  size_t room = pipe_room(out);
  if (left <= room) return left;
  const char *nl = memrchr(p, '\n', room);
  if (nl == NULL && out->wfd == out->fd) return room; /* blocking: never more than it takes */
  if (nl == NULL) nl = memchr(p + room, '\n', left - room);
  return nl ? (size_t) (nl - p) + 1 : left;
}

/* Whether a pipe written as it is (blocking, shared) has a free slot now:
 * then what next_piece gives it lands without waiting. */
static int shared_pipe_has_room(const mj_output_t *out) {
  struct pollfd p = {.fd = out->wfd, .events = POLLOUT};
  int n;
  do n = poll(&p, 1, 0);
  while (n < 0 && errno == EINTR);
  return n != 0; /* an error, or the reader gone, shows in the write */
}

static ssize_t write_some(const mj_output_t *out, const char *p, size_t n) {
  ssize_t r;
  if (out->pipe && out->wfd == out->fd && !shared_pipe_has_room(out)) return -EAGAIN;
  do {
    r = out->socket ? send(out->wfd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : write(out->wfd, p, n);
  } while (r < 0 && errno == EINTR);
  return r < 0 ? -errno : r;
}

/* Writes what is pending until it is out or the descriptor is full (then
 * waits for room). */
static void stream_flush(mj_output_t *out) {
  while (!out->error && !out->record_error && out->pending_off < out->pending_len) {
    const char *p = out->pending + out->pending_off;
    size_t piece = next_piece(out, p, out->pending_len - out->pending_off);
    out->record_error = reserve_record(out, piece + out->carry_len);
    if (out->record_error) break;
    ssize_t n = write_some(out, p, piece);
    if (n == -EAGAIN || n == -EWOULDBLOCK) return watch(out, 1);
    if (n < 0) {
      out->error = (int) n;
      break;
    }
    out->record_error = record_written(out, p, (size_t) n);
    out->pending_off += (size_t) n;
    out->written += (double) n;
  }
  if (out->error || out->record_error || out->pending_off == out->pending_len) drop_pending(out);
  watch(out, 0);
}

/* A pipe or terminal opened again, non-blocking, with a description of our
 * own: its descriptor, -1 when it cannot be (no /proc: the thread pool then
 * writes it), or UV_EPIPE for a pipe with no reader left. */
static int open_nonblocking(int fd) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int wfd = open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (wfd < 0 && errno == ENXIO) return UV_EPIPE;
  return wfd;
}

/* Decides how fd is written; a pipe, socket or terminal gets its watch. */
static void set_up(mj_output_t *out) {
  struct stat st;
  out->wfd = out->fd;
  if (fstat(out->fd, &st) != 0) return;
  out->socket = S_ISSOCK(st.st_mode) != 0;
  out->pipe = S_ISFIFO(st.st_mode) != 0;
  if (out->pipe || (S_ISCHR(st.st_mode) && isatty(out->fd))) {
    int wfd = open_nonblocking(out->fd);
    if (wfd == UV_EPIPE) out->error = UV_EPIPE;
    if (wfd == UV_EPIPE || (wfd < 0 && !out->pipe)) return;
    if (wfd >= 0) out->wfd = wfd; /* else a pipe we may not open (another user's, no /proc) */
    if (out->pipe) {
      int size = fcntl(out->wfd, F_GETPIPE_SZ);
      out->pipe_size = size > 0 ? (size_t) size : 0;
    }
  } else if (!out->socket) {
    return;
  }
  int flags = fcntl(out->wfd, F_GETFL);
  if (flags < 0 || uv_poll_init(&out->ctx->loop, &out->poll, out->wfd) != 0) {
    if (out->wfd != out->fd) close(out->wfd); /* the thread pool writes fd as it is */
    out->wfd = out->fd;
    return;
  }
  if (out->wfd == out->fd) fcntl(out->wfd, F_SETFL, flags); /* shared with whoever started us */
  out->poll.data = out;
  out->watching = out->streaming = 1;
  if (uv_idle_init(&out->ctx->loop, &out->soon) == 0) {
    out->soon.data = out;
    out->soon_open = 1;
  }
  watch(out, 0);
}

/* ------------------------------------------------------------ interface --- */

static void detach_all(mj_ctx_t *ctx);

static const mj_closer_t closer = {MJ_CLOSE_OUTPUTS, NULL, detach_all};

/* A new output on fd, or NULL when out of memory. record_fd (or -1): whole
 * lines written are copied there; the output owns it. Release it with
 * mj_output_release. */
mj_output_t *mj_output_new(mj_ctx_t *ctx, int fd, int record_fd) {
  mj_output_t *out = calloc(1, sizeof *out);
  if (out == NULL) return NULL;
  out->ctx = ctx;
  out->fd = fd;
  out->record_fd = record_fd;
  mj__list_push(&ctx->outputs, &out->link);
  mj__ctx_on_close(ctx, &closer);
  set_up(out);
  return out;
}

/* Queues bytes without starting a write: several pieces can make one write. */
int mj_output_append(mj_output_t *out, const char *data, size_t len) {
  if (out->error) return out->error;
  if (out->pending_off > 0 && out->pending_off == out->pending_len) drop_pending(out);
  if (out->pending_off >= MJ_OUTPUT_FIRST && out->pending_off * 2 >= out->pending_len) {
    memmove(out->pending, out->pending + out->pending_off, out->pending_len - out->pending_off);
    out->pending_len -= out->pending_off;
    out->pending_off = 0;
  }
  int rc = mj__grow(&out->pending, &out->pending_cap, out->pending_len + len, MJ_OUTPUT_FIRST);
  if (rc != 0) return rc;
  memcpy(out->pending + out->pending_len, data, len);
  out->pending_len += len;
  return 0;
}

/* Starts writing what is pending, unless a write is in flight or the
 * descriptor is full (what is pending goes next). Returns 0, or the first
 * write error seen. */
int mj_output_start(mj_output_t *out) {
  if (out->ctx == NULL) return UV_ECANCELED; /* its loop is closed */
  if (out->error || out->record_error || out->pending_len == out->pending_off) return out->error;
  if (out->streaming) {
    if (out->waiting) return 0; /* the watch writes once there is room */
    if (!out->soon_open) stream_flush(out);
    else if (!uv_is_active((uv_handle_t *) &out->soon)) uv_idle_start(&out->soon, mj_output_soon_cb);
  } else if (!out->writing) {
    start_work(out);
  }
  return out->error;
}

/* Writes what is pending now, on the caller's turn, instead of at the start
 * of the next (the CLI's progress line is drawn right after its results are
 * out): only on a pipe, terminal or socket with room; a full one goes on
 * waiting for room, and a regular file keeps its thread pool's order. */
int mj_output_flush(mj_output_t *out) {
  if (out->ctx == NULL) return UV_ECANCELED;
  if (!out->streaming || out->waiting || out->error || out->record_error) return out->error;
  if (out->soon_open) uv_idle_stop(&out->soon);
  if (out->pending_len > out->pending_off) stream_flush(out);
  return out->error;
}

/* Bytes given and not yet written. */
size_t mj_output_pending(const mj_output_t *out) {
  return out->pending_len - out->pending_off + (out->writing ? out->inflight_len : 0);
}

/* The owner lets go: bytes still pending are written first (while the loop
 * runs), then the output frees itself. */
void mj_output_release(mj_output_t *out) {
  mj_output_start(out);
  out->orphaned = 1;
  if (out->error || out->record_error || out->pending_len == out->pending_off) close_poll(out);
  free_if_done(out);
}

/* The owner is done with the output: what is still pending is dropped (not
 * written, not recorded), the record's reserved space is given back, and
 * the output frees itself once no write is in flight. */
void mj_output_close(mj_output_t *out) {
  drop_pending(out);
  if (!out->writing) unreserve_record(out);
  mj_output_release(out);
}

/* The context's loop is closed (no request is in flight any more): outputs
 * still held by their owners no longer write, the orphaned ones are freed. */
static void detach_all(mj_ctx_t *ctx) {
  MJ_LIST_EACH_SAFE(it, &ctx->outputs) {
    mj_output_t *out = MJ_LIST_ITEM(it, mj_output_t, link);
    mj__list_unlink(it);
    out->ctx = NULL;
    out->writing = 0;
    out->watching = out->soon_open = 0; /* closed with every other handle */
    out->streaming = 0;
    drop_pending(out);
    if (out->orphaned) free_output(out);
  }
}
