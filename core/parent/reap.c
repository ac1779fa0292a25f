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

/* Tries each live child; try_reap unlinks the one it reaps, and may run
 * callbacks. */
static void try_reap_all(mj_ctx_t *ctx) {
  MJ_LIST_EACH_SAFE(it, &ctx->live) {
    try_reap(MJ_LIST_ITEM(it, mj_process_t, live_link));
  }
}

static void mj_sigchld_cb(uv_signal_t *handle, int signum) {
  (void) signum;
  try_reap_all(handle->data);
}

static void kill_all(mj_ctx_t *ctx);

static const mj_closer_t closer = {MJ_CLOSE_CHILDREN, kill_all, NULL};

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
    mj__ctx_on_close(ctx, &closer);
  }
  if (mj__list_empty(&ctx->live)) uv_ref((uv_handle_t *) &ctx->sigchld); /* a live child keeps the loop alive */
  mj__list_push(&ctx->live, &p->live_link);
  try_reap(p);
  return 0;
}

void mj__reap_unwatch(mj_process_t *p) {
  if (!mj__list_linked(&p->live_link)) return;
  mj__list_unlink(&p->live_link);
  if (mj__list_empty(&p->ctx->live)) uv_unref((uv_handle_t *) &p->ctx->sigchld);
}

/* Ends every live child now: SIGKILL to its process group and to itself, then
 * waits for each (a SIGKILLed process dies at once, unless the kernel holds it
 * in an uninterruptible sleep), for at most MJ_CLOSE_WAIT_MS in all. The
 * context's close, first of all; children still unreaped after that stay
 * zombies until the program exits. */
static void kill_all(mj_ctx_t *ctx) {
  MJ_LIST_EACH(it, &ctx->live) {
    mj_process_t *p = MJ_LIST_ITEM(it, mj_process_t, live_link);
    kill(-p->pid, SIGKILL);
    kill(p->pid, SIGKILL);
  }
  uint64_t deadline = uv_hrtime() + (uint64_t) MJ_CLOSE_WAIT_MS * 1000000;
  const struct timespec pause = {0, 1000000};
  while (!mj__list_empty(&ctx->live) && uv_hrtime() < deadline) {
    try_reap_all(ctx);
    if (!mj__list_empty(&ctx->live)) nanosleep(&pause, NULL);
  }
}
