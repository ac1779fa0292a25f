/* reap.c -- learning that children exited, without stealing anyone's status.
 *
 * Children are started by posix_spawn (spawn.c), not uv_spawn, so libuv does
 * not reap them: moonjob watches SIGCHLD itself (a uv_signal_t, so the
 * handler runs on the loop) and calls waitpid(pid, WNOHANG) for each of its
 * own live children only. Never waitpid(-1): other code's children (a
 * processor's os.execute runs in the child, but the embedding program may
 * have its own) keep their statuses.
 *
 * A pid stays on the list until its status was collected: until then it
 * cannot be reused, which is what makes signalling it safe. The same holds
 * for its process group id, so the group is killed between the child's exit
 * (seen with WNOWAIT) and its reaping: grandchildren never outlive a child.
 *
 * The signal handle keeps the loop alive while some child is not reaped, as
 * a uv_process_t would.
 *
 * Caveat: a SIGCHLD costs a scan of the live children (size of the pools).
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "moonjob.h"

/* Collects the status of p if it exited. Returns 1 when it did. Before the
 * child is reaped, its process group is SIGKILLed: nothing a processor
 * started outlives its child, and while the dead leader is unreaped its group
 * id cannot be reused, so the kill can reach no one else. */
static int try_reap(mj_process_t *p) {
  int status;
  siginfo_t info;
  pid_t r;
  memset(&info, 0, sizeof info);
  if (waitid(P_PID, (id_t) p->pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != p->pid)
    return 0;
  kill(-p->pid, SIGKILL);
  do r = waitpid(p->pid, &status, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r != p->pid) return 0;
  int64_t code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  int signum = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  mj__reap_unwatch(p);
  mj__process_exited(p, code, signum);
  return 1;
}

static void mj_sigchld_cb(uv_signal_t *handle, int signum) {
  mj_ctx_t *ctx = handle->data;
  (void) signum;
  mj_process_t *p = ctx->live, *next;
  for (; p != NULL; p = next) {
    next = p->next_live; /* try_reap unlinks p and may run callbacks */
    try_reap(p);
  }
}

/* Puts a freshly spawned child on the watch list; reaps it at once if it
 * already died (its SIGCHLD may have come before it was on the list). */
int mj__reap_watch(mj_process_t *p) {
  mj_ctx_t *ctx = p->ctx;
  if (!ctx->sigchld_started) {
    int rc = uv_signal_init(&ctx->loop, &ctx->sigchld);
    if (rc == 0) rc = uv_signal_start(&ctx->sigchld, mj_sigchld_cb, SIGCHLD);
    if (rc != 0) return rc;
    ctx->sigchld.data = ctx;
    ctx->sigchld_started = 1;
  }
  if (ctx->live == NULL) uv_ref((uv_handle_t *) &ctx->sigchld); /* a live child keeps the loop alive */
  p->next_live = ctx->live;
  p->prev_live = NULL;
  if (ctx->live) ctx->live->prev_live = p;
  ctx->live = p;
  p->watched = 1;
  try_reap(p);
  return 0;
}

void mj__reap_unwatch(mj_process_t *p) {
  if (!p->watched) return;
  p->watched = 0;
  if (p->prev_live) p->prev_live->next_live = p->next_live;
  else p->ctx->live = p->next_live;
  if (p->next_live) p->next_live->prev_live = p->prev_live;
  p->next_live = p->prev_live = NULL;
  if (p->ctx->live == NULL) uv_unref((uv_handle_t *) &p->ctx->sigchld);
}

/* Ends every live child now: SIGKILL to its process group and to itself, then
 * waits for each (a SIGKILLed process dies at once, unless the kernel holds it
 * in an uninterruptible sleep), for at most timeout_ms in all. Used when the
 * context is closed; children still unreaped after that stay zombies until the
 * program exits. */
void mj__reap_kill_all(mj_ctx_t *ctx, uint64_t timeout_ms) {
  for (mj_process_t *p = ctx->live; p != NULL; p = p->next_live) {
    kill(-p->pid, SIGKILL);
    kill(p->pid, SIGKILL);
  }
  uint64_t deadline = uv_hrtime() + timeout_ms * 1000000;
  const struct timespec pause = {0, 1000000};
  while (ctx->live != NULL && uv_hrtime() < deadline) {
    mj_process_t *p = ctx->live, *next;
    for (; p != NULL; p = next) {
      next = p->next_live;
      try_reap(p);
    }
    if (ctx->live != NULL) nanosleep(&pause, NULL);
  }
}
