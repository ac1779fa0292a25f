/* process.c -- one child's lifetime: its pipes, spawn glue, kill, exit, close.
 *
 * A child gets four descriptors: stdin from /dev/null, stdout and stderr on
 * pipes of their own, and the channel (a socketpair) on fd 3; the page it
 * shares with the parent (shared.c) is its fd 4. It is started off the loop
 * thread by spawn.c, in a session of its own (a kill of its process group
 * reaches its grandchildren; a Ctrl-C at the terminal does not reach it), and
 * reaped by reap.c. The rest of a process lives beside this file: channel.c
 * reads what the child sends (frames, output), send.c writes to it, shared.c
 * reads and changes the page they share.
 *
 * MJ_PROCESS_EXIT comes after every frame and output byte the child sent: on
 * the exit callback the channel and pipes are drained first, and it waits for
 * the channel's end of file too (libuv reports the two in either order; the
 * child is gone only when both happened). A pid is never signalled once the
 * child was reaped. MJ_PROCESS_CLOSED comes last, once every handle is
 * closed: the owner may then free the process.
 *
 * Caveat: draining at exit reads what the dead child left; a grandchild that
 * inherited stdout/stderr and writes later is not waited for.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moonjob.h"

/* ------------------------------------------------------------ lifetime --- */

static void close_all(mj_ctx_t *ctx);

static const mj_closer_t closer = {MJ_CLOSE_PROCESSES, close_all, NULL};

static void mj_close_cb(uv_handle_t *h) {
  mj_process_t *p = h->data;
  if (--p->open_handles > 0) return;
  mj__list_unlink(&p->open_link);
  free(p->rbuf);
  p->rbuf = NULL;
  free(p->wbuf);
  p->wbuf = NULL;
  p->wlen = p->wcap = 0;
  mj__shared_release(p);
  mj_process_event_t ev = {.kind = MJ_PROCESS_CLOSED};
  mj__process_emit(p, &ev);
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
void mj__process_gone(mj_process_t *p) {
  if (p->closing) return;
  mj__channel_drain_output(p);
  mj_process_event_t ev = {.kind = MJ_PROCESS_EXIT, .exit_status = p->exit_status,
                           .term_signal = p->term_signal};
  if (!p->closing) mj__process_emit(p, &ev);
  mj_process_close(p);
}

/* reap.c collected the child's status. What it sent before dying is read
 * first; the child counts as gone once the channel also reached end of file
 * (a grandchild that inherited it may hold it open a while longer). */
void mj__process_exited(mj_process_t *p, int64_t exit_status, int term_signal) {
  p->exited = 1;
  p->exit_status = exit_status;
  p->term_signal = term_signal;
  mj__channel_drain(p);
  if (p->channel_eof) mj__process_gone(p);
}

/* Signals the child, or its whole process group. Before the spawn is done the
 * signal is kept and sent as soon as the pid is known; a SIGKILL kept is
 * never replaced by a milder signal asked later (a close's SIGTERM after a
 * start timeout's SIGKILL), nor a whole group by the child alone. Returns
 * UV_ESRCH once the child was reaped: its pid may belong to someone else by
 * then. */
int mj_process_kill(mj_process_t *p, int signum, int whole_group) {
  if (p->exited) return UV_ESRCH;
  if (!p->spawned) {
    if (p->pending_signal != SIGKILL) p->pending_signal = signum;
    p->pending_group = p->pending_group || whole_group;
    return 0;
  }
  if (kill(whole_group ? -p->pid : p->pid, signum) != 0) return -errno;
  return 0;
}

/* Closes every process of the context, whatever its state (the context is
 * being closed: its children were killed and reaped first). */
static void close_all(mj_ctx_t *ctx) {
  MJ_LIST_EACH(it, &ctx->open) {
    mj_process_t *p = MJ_LIST_ITEM(it, mj_process_t, open_link);
    p->channel_eof = p->exited = 1;
    mj_process_close(p);
  }
}

/* ---------------------------------------------------------------- spawn --- */

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

/* A spawn that could not happen ends like a child that exited with 127. */
static void spawn_failed(mj_process_t *p, int error) {
  const char *reason = uv_strerror(error);
  mj_process_event_t ev = {.kind = MJ_PROCESS_EXIT, .exit_status = 127, .data = reason,
                           .len = strlen(reason)};
  p->exited = p->channel_eof = 1;
  mj__process_emit(p, &ev);
  mj_process_close(p);
}

/* The child cannot be watched by reap.c: kill it and wait for it here (a
 * SIGKILLed child dies at once), so it is never left unreaped. */
static void reap_now(mj_process_t *p) {
  int status = 0;
  kill(-p->pid, SIGKILL);
  kill(p->pid, SIGKILL);
  while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {}
  mj__channel_stop(p);
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
  mj__process_emit(p, &ev);
  if (p->pending_signal) mj_process_kill(p, p->pending_signal, p->pending_group);
  if (mj__reap_watch(p) != 0) return reap_now(p);
  /* Even when the child was reaped at once: another child being spawned at
   * this instant may hold a copy of the channel, so its end of file can come
   * later, and only a reading handle sees it. */
  if (!p->closing && !p->channel_eof && mj__channel_start(p) != 0) {
    mj_process_kill(p, SIGKILL, 1);
    mj__channel_stop(p);
  }
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
  mj__list_push(&ctx->open, &p->open_link); /* until every handle is closed (mj_close_cb) */
  mj__ctx_on_close(ctx, &closer);
  int rc = mj__shared_map(p);
  if (rc != 0) {
    mj__list_unlink(&p->open_link);
    return rc;
  }
  rc = mj__spawn_pairs(parent_fds, child_fds);
  if (rc != 0) {
    mj__list_unlink(&p->open_link);
    mj__shared_release(p);
    return rc;
  }
  rc = open_pipes(p, parent_fds);
  if (rc == 0) rc = mj__spawn_queue(p, opts, child_fds, p->shared_fd);
  else
    for (int i = 0; i < 3; i++) close(child_fds[i]);
  if (rc != 0) { /* no spawn is in flight: CLOSED ends it, if a handle was opened */
    if (p->open_handles == 0) {
      mj__list_unlink(&p->open_link);
      mj__shared_release(p);
    }
    mj_process_close(p);
  }
  return rc;
}
