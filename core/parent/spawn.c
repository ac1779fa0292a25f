/* spawn.c -- starting a child without blocking the loop.
 *
 * uv_spawn forks on the loop thread and waits there until the child has
 * exec'd: about a millisecond here, during which nothing else runs. moonjob
 * starts children from libuv's worker threads instead, with posix_spawn
 * (vfork-based in glibc, so no page tables are copied), and the loop only
 * sees the result.
 *
 * The channel is a socketpair and the output streams are pipes, all created
 * close-on-exec (pipes, so that the child can count what the parent has not
 * read yet of its output with FIONREAD on its own end: see
 * core/child/output.c); the child's ends are placed on fds 1, 2 and 3 by
 * posix_spawn's file actions, and stdin comes from /dev/null; the page it shares with the parent (a memfd,
 * frame.h) is placed on fd 4. The child gets its own session
 * (POSIX_SPAWN_SETSID: a process-group kill reaches its grandchildren, a
 * terminal's Ctrl-C does not reach it), every signal back at its default
 * disposition, and an empty signal mask (worker threads block all signals).
 *
 * Before each spawn the parent makes itself not dumpable (PR_SET_DUMPABLE 0),
 * and moonjob never makes it dumpable again: a process of the same user (a
 * child, a grandchild that left the child's group) cannot then read the
 * parent's /proc/PID/environ, maps or mem, nor trace it, so a Redis URL
 * (its password) in the parent's environment or memory stays the parent's.
 * The cost is the program's: no core dumps (unless fs.suid_dumpable says
 * otherwise) and a debugger must attach as root. A root child is kept out
 * too: it loses CAP_SYS_PTRACE, CAP_SYS_ADMIN and CAP_PERFMON, which pass
 * the kernel's check (core/child/sandbox.c). The flag is set for
 * the program's life rather than while children run: a grandchild that
 * escaped its group may outlive every child, and restoring the flag could
 * undo the kernel's own clearing of it on a change of credentials.
 *
 * Caveats: the child's PR_SET_PDEATHSIG fires when the *thread* that spawned
 * it ends; libuv's worker threads live as long as the process, so that is the
 * process's death. The arguments and environment are copied for the worker
 * thread; the
 * parent's ends of the pipes can be written to at once (frames wait in the
 * socket until the child reads them), but are read only once the spawn is
 * done, so no frame arrives before the pid is known.
 */
#define _GNU_SOURCE /* POSIX_SPAWN_SETSID, posix_spawn_file_actions_addclosefrom_np */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "moonjob.h"

extern char **environ;

typedef struct {
  uv_work_t work;
  mj_process_t *p;
  char **argv, **envp; /* deep copies, NULL-terminated */
  int child_fds[3];    /* child's stdout, stderr, channel */
  int shared_fd;       /* the page shared with the child, placed on its fd 4 */
  pid_t pid;
  int error;           /* 0 or a UV_E... code */
} mj_spawn_req_t;

static void free_strings(char **list) {
  for (char **s = list; s && *s; s++) free(*s);
  free(list);
}

static int key_overridden(const char *entry, const char *const *overrides) {
  const char *eq = strchr(entry, '=');
  size_t keylen = eq ? (size_t) (eq - entry) : strlen(entry);
  for (; overrides && *overrides; overrides++)
    if (strncmp(entry, *overrides, keylen) == 0 && (*overrides)[keylen] == '=') return 1;
  return 0;
}

/* Appends a copy of s; returns -1 when out of memory. */
static int push_copy(char **list, size_t *n, const char *s) {
  if ((list[*n] = strdup(s)) == NULL) return -1;
  (*n)++;
  return 0;
}

/* The parent's environment with the overrides replacing same-named entries,
 * deep-copied. NULL when out of memory. */
static char **copy_env(const char *const *overrides) {
  size_t n = 0, m = 0, i = 0;
  while (environ[n]) n++;
  while (overrides && overrides[m]) m++;
  char **env = calloc(n + m + 1, sizeof *env);
  if (env == NULL) return NULL;
  for (size_t k = 0; k < n; k++)
    if (!key_overridden(environ[k], overrides) && push_copy(env, &i, environ[k]) != 0) goto error;
  for (size_t k = 0; k < m; k++)
    if (push_copy(env, &i, overrides[k]) != 0) goto error;
  return env;
error:
  free_strings(env);
  return NULL;
}

static char **copy_args(char **args) {
  size_t n = 0, i = 0;
  while (args[n]) n++;
  char **copy = calloc(n + 1, sizeof *copy);
  if (copy == NULL) return NULL;
  for (size_t k = 0; k < n; k++)
    if (push_copy(copy, &i, args[k]) != 0) {
      free_strings(copy);
      return NULL;
    }
  return copy;
}

/* A close-on-exec socketpair (or pipe: fds[0] reads, fds[1] writes) whose fds
 * are above 3, so that placing the child's end on 1, 2 or 3 never lands on
 * itself. */
static int make_pair(int fds[2], int as_pipe) {
  int rc = as_pipe ? pipe2(fds, O_CLOEXEC) : socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds);
  if (rc != 0) return -errno;
  for (int i = 0; i < 2; i++) {
    if (fds[i] > 3) continue;
    int moved = fcntl(fds[i], F_DUPFD_CLOEXEC, 4);
    if (moved < 0) {
      int rc = -errno;
      close(fds[0]);
      close(fds[1]);
      return rc;
    }
    close(fds[i]);
    fds[i] = moved;
  }
  return 0;
}

/* The child's descriptors: stdin from /dev/null, its ends of the pairs on
 * 1, 2 and 3, the shared page on 4, and no other: a descriptor the parent
 * opened without close-on-exec (a joblog, a program's io.open) is closed
 * too. Returns 0 or an errno value. */
static int set_file_actions(posix_spawn_file_actions_t *actions, const mj_spawn_req_t *req) {
  int rc = posix_spawn_file_actions_addopen(actions, 0, "/dev/null", O_RDONLY, 0);
  for (int fd = 1; rc == 0 && fd <= 3; fd++)
    rc = posix_spawn_file_actions_adddup2(actions, req->child_fds[fd - 1], fd);
  if (rc == 0) rc = posix_spawn_file_actions_adddup2(actions, req->shared_fd, MJ_SHARED_FD);
  /* nothing else of the parent's reaches the child, close-on-exec or not */
  if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(actions, MJ_SHARED_FD + 1);
  return rc;
}

/* Own session, every signal at its default, nothing blocked (worker threads
 * block all signals). Returns 0 or an errno value. */
static int set_attributes(posix_spawnattr_t *attr) {
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  int rc = posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF |
                                              POSIX_SPAWN_SETSIGMASK);
  if (rc == 0) rc = posix_spawnattr_setsigdefault(attr, &all);
  if (rc == 0) rc = posix_spawnattr_setsigmask(attr, &none);
  return rc;
}

/* Worker thread: the actual posix_spawn. Every set-up call is checked. */
static void mj_spawn_work_cb(uv_work_t *work) {
  mj_spawn_req_t *req = work->data;
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  int rc = posix_spawn_file_actions_init(&actions);
  if (rc != 0) goto done;
  rc = posix_spawnattr_init(&attr);
  if (rc != 0) goto destroy_actions;
  rc = set_file_actions(&actions, req);
  if (rc == 0) rc = set_attributes(&attr);
  if (rc == 0) rc = posix_spawn(&req->pid, req->argv[0], &actions, &attr, req->argv, req->envp);
  posix_spawnattr_destroy(&attr);
destroy_actions:
  posix_spawn_file_actions_destroy(&actions);
done:
  req->error = -rc;
}

/* Loop thread: hand the outcome to process.c and free the request. */
static void mj_spawn_after_cb(uv_work_t *work, int status) {
  mj_spawn_req_t *req = work->data;
  req->p->ctx->spawning--;
  for (int i = 0; i < 3; i++) close(req->child_fds[i]);
  mj__process_spawned(req->p, req->pid, status != 0 ? status : req->error);
  free_strings(req->argv);
  free_strings(req->envp);
  free(req);
}

/* Makes the two pipes (stdout, stderr) and the channel's socketpair. Returns
 * 0 or a UV_E... code, with nothing left open on failure. */
int mj__spawn_pairs(int parent_fds[3], int child_fds[3]) {
  int pairs[3][2];
  for (int made = 0; made < 3; made++) {
    int rc = make_pair(pairs[made], made < 2);
    if (rc == 0) continue;
    for (int i = 0; i < made; i++) {
      close(pairs[i][0]);
      close(pairs[i][1]);
    }
    return rc;
  }
  for (int i = 0; i < 3; i++) {
    parent_fds[i] = pairs[i][0];
    child_fds[i] = pairs[i][1];
  }
  return 0;
}

/* Keeps children out of the parent's /proc files and memory (see the top of
 * this file). Returns 0 or a UV_E... code: a child is never started while
 * it could read its parent. */
static int hide_from_children(void) {
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return -errno;
  return 0;
}

/* Queues the spawn with the child's ends of the pairs, which it takes over
 * (closed once the child has them, or now on failure), and the shared page's
 * fd, which stays the caller's (closed by mj__process_spawned). On success
 * mj__process_spawned(p, ...) will be called on the loop thread. Returns 0 or
 * a UV_E... code. */
int mj__spawn_queue(mj_process_t *p, const mj_spawn_options_t *opts, const int child_fds[3],
                    int shared_fd) {
  int rc = hide_from_children();
  mj_spawn_req_t *req = NULL;
  if (rc != 0) goto error;
  rc = UV_ENOMEM;
  req = calloc(1, sizeof *req);
  if (req == NULL) goto error;
  req->argv = copy_args(opts->args);
  req->envp = copy_env(opts->env_overrides);
  if (req->argv == NULL || req->envp == NULL) goto error;
  memcpy(req->child_fds, child_fds, sizeof req->child_fds);
  req->shared_fd = shared_fd;
  req->p = p;
  req->work.data = req;
  rc = uv_queue_work(&p->ctx->loop, &req->work, mj_spawn_work_cb, mj_spawn_after_cb);
  if (rc != 0) goto error;
  p->ctx->spawning++;
  return 0;
error:
  for (int i = 0; i < 3; i++) close(child_fds[i]);
  if (req) {
    free_strings(req->argv);
    free_strings(req->envp);
    free(req);
  }
  return rc;
}
