/* sandbox.c -- the child's process set-up, before any processor code runs.
 *
 * The sandbox is set before the Lua state exists, every step checked: a
 * child that cannot set it up exits with EXIT_SETUP and runs no job (its one
 * stderr line says why, and the parent reports it as ELOAD). Only fds 0-3
 * stay open (then a pidfd of the parent takes fd 4); core dumps off,
 * PR_SET_NO_NEW_PRIVS, --user (drop from root to that user), --max-procs as
 * RLIMIT_NPROC, and --memory-limit as an exact cap on the Lua heap (the
 * counting allocator, alloc.c) backed by RLIMIT_DATA for memory that bypasses
 * it. Limits are lowered hard and soft, and a root child loses
 * CAP_SYS_RESOURCE, so a processor cannot raise them back, and
 * CAP_SYS_PTRACE, CAP_SYS_ADMIN and CAP_PERFMON, so that it cannot read its
 * parent, which is not dumpable once it has started a child
 * (core/parent/spawn.c), nor its siblings: each child makes itself not
 * dumpable (PR_SET_DUMPABLE 0) before any processor code runs. stdout and stderr
 * become counted streams (output.c); the channel becomes blocking.
 *
 * Caveats: the child dies with its parent, taking its process group along (a
 * thread polling a pidfd of the parent, PR_SET_PDEATHSIG caught, an end of
 * file on the channel the parent did not announce: channel.c), so it never
 * outlives a crashed parent; one stopped (SIGSTOP) at that moment waits to be
 * continued. A grandchild that calls setsid() leaves the group and is out of
 * reach. RLIMIT_NPROC does not apply to root: a root parent that wants the
 * process cap to hold passes --user too.
 */
#include "child.h"

/* The parent is gone: the child's whole process group (the child included)
 * is killed, so that nothing a processor started outlives the parent. Only a
 * child that leads its group does so (moonjob starts each in a session of its
 * own); one started some other way must not kill its starter's group. */
static void parent_gone(void) {
  if (getpgrp() == getpid()) kill(0, SIGKILL);
  _exit(EXIT_INTERNAL);
}

/* The child cannot start: one line on stderr, exit EXIT_SETUP, which the
 * parent reports as ELOAD with that line. */
static void setup_failed(const char *why) {
  fprintf(stderr, "moonjob-child: %s\n", why);
  fflush(stderr);
  _exit(EXIT_SETUP);
}

/* A set-up call failed: the sandbox cannot be what was asked, so the child
 * runs no job (fail closed). `what` names the step; errno says why. */
static void setup_call_failed(const char *what) {
  char why[256];
  snprintf(why, sizeof why, "cannot %s: %s; the child runs no job without its sandbox", what,
           strerror(errno));
  setup_failed(why);
}

/* Drops to `user` for good (groups, gid, uid). */
static void become_user(const char *user) {
  char why[256];
  struct passwd *pw = getpwnam(user);
  if (pw == NULL) {
    snprintf(why, sizeof why, "no such user '%s' for the 'user' option", user);
    setup_failed(why);
  }
  if (setgroups(0, NULL) != 0 || setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0) {
    snprintf(why, sizeof why, "cannot become user '%s': %s (the 'user' option needs a parent "
             "running as root)", user, strerror(errno));
    setup_failed(why);
  }
}

/* The page the parent reads to know which job was taken (frame.h), on fd 4.
 * Without fd 4 (an old parent, a test harness) jobs still run; the parent then
 * cannot tell that a job was taken. A page given but not mappable fails the
 * set-up: without it the child could not tell its parent's death from a close. */
static void map_shared_page(void) {
  if (fcntl(MJ_SHARED_FD, F_GETFD) < 0) return;
  void *page = mmap(NULL, MJ_SHARED_MAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, MJ_SHARED_FD, 0);
  if (page == MAP_FAILED) setup_call_failed("map the page shared with the parent");
  shared = page;
  close(MJ_SHARED_FD);
}

/* Lowers the soft and the hard limit to `value` (a hard limit already lower
 * stays), so that a processor cannot raise it back: raising a hard limit
 * takes CAP_SYS_RESOURCE, which drop_capability removes. */
static void limit(int resource, const char *name, rlim_t value) {
  struct rlimit rl;
  char what[64];
  snprintf(what, sizeof what, "set %s", name);
  if (getrlimit(resource, &rl) != 0) setup_call_failed(what);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < value) value = rl.rlim_max;
  rl.rlim_cur = rl.rlim_max = value;
  if (setrlimit(resource, &rl) != 0) setup_call_failed(what);
}

#ifndef CAP_PERFMON /* kernel headers before 5.8 */
#define CAP_PERFMON 38
#endif

/* Without CAP_SYS_RESOURCE a process cannot raise a hard limit. Without
 * CAP_SYS_PTRACE, CAP_SYS_ADMIN and CAP_PERFMON it cannot read the
 * environment, maps or memory of a process that is not dumpable (the
 * parent, core/parent/spawn.c) nor of another user's processes, nor trace
 * them: the kernel lets any of the three read /proc/PID/environ and maps. A
 * root child has them all, so each goes from every capability set, and from
 * the bounding set when the child may change that (CAP_SETPCAP), so that
 * nothing the processor executes gets it back. Other capabilities of a root
 * child stay (use the 'user' option). */
static void drop_capability(int cap, const char *name) {
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
  const int word = CAP_TO_INDEX(cap);
  const uint32_t bit = CAP_TO_MASK(cap);
  char what[64];
  if (syscall(SYS_capget, &header, data) != 0) setup_call_failed("read the capabilities");
  snprintf(what, sizeof what, "drop %s from the bounding set", name);
  /* a kernel that does not know the capability answers -1: nothing to drop */
  if ((data[0].effective & CAP_TO_MASK(CAP_SETPCAP)) && prctl(PR_CAPBSET_READ, cap) == 1 &&
      prctl(PR_CAPBSET_DROP, cap) != 0)
    setup_call_failed(what);
  if (!((data[word].effective | data[word].permitted | data[word].inheritable) & bit)) return;
  data[word].effective &= ~bit;
  data[word].permitted &= ~bit;
  data[word].inheritable &= ~bit;
  snprintf(what, sizeof what, "drop %s", name);
  if (syscall(SYS_capset, &header, data) != 0) setup_call_failed(what);
}

/* The capabilities a root child loses (see drop_capability). */
static void drop_capabilities(void) {
  drop_capability(CAP_SYS_RESOURCE, "CAP_SYS_RESOURCE");
  drop_capability(CAP_SYS_PTRACE, "CAP_SYS_PTRACE");
  drop_capability(CAP_SYS_ADMIN, "CAP_SYS_ADMIN");
  drop_capability(CAP_PERFMON, "CAP_PERFMON");
}

/* The parent died (PR_SET_PDEATHSIG, sent as the parent's spawning thread
 * ends: libuv's worker threads end only with the process): the child's whole
 * process group goes, the child with it, so nothing a processor started
 * outlives the parent, even a parent killed by SIGKILL. The same signal sent
 * by anyone else acts as by default. */
static void on_parent_death(int signum, siginfo_t *info, void *context) {
  (void) context;
  if (info->si_pid == parent_pid || getppid() != parent_pid) parent_gone();
  signal(signum, SIG_DFL);
  raise(signum);
}

static void on_signal(int signum, void (*handler)(int, siginfo_t *, void *), const char *what) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(signum, &sa, NULL) != 0) setup_call_failed(what);
}

/* Asks for MJ_PARENT_DEATH_SIGNAL when the parent dies, then checks that
 * it did not die already (before the request, no signal would come). */
static void watch_parent(void) {
  if (prctl(PR_SET_PDEATHSIG, MJ_PARENT_DEATH_SIGNAL) != 0) setup_call_failed("set PR_SET_PDEATHSIG");
  if (getppid() != parent_pid) parent_gone();
}

/* The child holds exactly stdin, stdout, stderr and the channel once the
 * shared page is mapped: whatever else a parent left open without
 * close-on-exec (a joblog, a file of the embedding program) is closed before
 * any processor code runs. The parent's spawn.c closes them too; this covers
 * a child started some other way. */
static void close_other_descriptors(void) {
  if (close_range(MJ_SHARED_FD + 1, ~0U, 0) == 0) return;
  if (errno != ENOSYS) setup_call_failed("close inherited descriptors");
  closefrom(MJ_SHARED_FD + 1); /* kernels before 5.9: glibc walks /proc/self/fd */
}

/* A thread that waits for the parent's exit on a pidfd, then kills the group:
 * the death signal alone can be ignored or blocked by a processor (ffi, a C
 * library), a thread blocked in poll cannot be. */
static void *parent_watcher(void *arg) {
  struct pollfd p = {(int) (intptr_t) arg, POLLIN, 0};
  while (poll(&p, 1, -1) < 0 && errno == EINTR) continue;
  parent_gone();
  return NULL;
}

/* Starts parent_watcher, with every signal blocked in it (handlers run in the
 * main thread), before RLIMIT_NPROC is set (the thread counts as a process
 * of the user). Kernels without pidfd_open (before 5.3) keep the death signal
 * alone. The pidfd is close-on-exec. */
static void start_parent_watcher(void) {
  int fd = (int) syscall(SYS_pidfd_open, parent_pid, 0);
  if (fd < 0 && errno == ENOSYS) return;
  if (fd < 0) setup_call_failed("watch the parent (pidfd_open)");
  if (getppid() != parent_pid) parent_gone(); /* the pidfd may name a reused pid */
  sigset_t all, old;
  sigfillset(&all);
  pthread_attr_t attr;
  pthread_t thread;
  int rc = pthread_attr_init(&attr);
  if (rc == 0) rc = pthread_attr_setstacksize(&attr, 64 * 1024);
  if (rc == 0) rc = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (rc == 0) rc = pthread_sigmask(SIG_SETMASK, &all, &old);
  if (rc == 0) {
    rc = pthread_create(&thread, &attr, parent_watcher, (void *) (intptr_t) fd);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
  }
  pthread_attr_destroy(&attr);
  errno = rc;
  if (rc != 0) setup_call_failed("start the thread that watches the parent");
}

/* The sandbox, before the Lua state exists. Every step is checked: a child
 * whose sandbox cannot be set up exits with EXIT_SETUP and runs no job. The
 * child dies with its parent, taking its process group along; it survives
 * writes to a closed channel as errors; it sees a blocking channel whatever
 * libuv did. */
static void set_up_process(const child_options_t *o) {
  parent_pid = getppid();
  on_signal(MJ_PARENT_DEATH_SIGNAL, on_parent_death, "watch for the parent's death");
  watch_parent();
  int flags = fcntl(CHANNEL_FD, F_GETFL);
  if (flags < 0) {
    fprintf(stderr, "moonjob-child: no channel on fd %d; this program is started by moonjob\n",
            CHANNEL_FD);
    exit(2);
  }
  map_shared_page();
  close_other_descriptors();
  if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) setup_call_failed("ignore SIGPIPE");
  if (fcntl(CHANNEL_FD, F_SETFL, flags & ~O_NONBLOCK) != 0) setup_call_failed("make the channel blocking");
  /* a processor's os.execute must not hold the channel */
  if (fcntl(CHANNEL_FD, F_SETFD, FD_CLOEXEC) != 0) setup_call_failed("set close-on-exec on the channel");
  fflush(NULL);
  FILE *out = counted_stream(1, _IOLBF), *err = counted_stream(2, _IONBF);
  if (out == NULL || err == NULL) setup_call_failed("count the output on stdout and stderr");
  stdout = out; /* line-buffered: print() reaches the parent line by line */
  stderr = err;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) setup_call_failed("set PR_SET_NO_NEW_PRIVS");
  if (o->user) {
    become_user(o->user); /* before NPROC: root is exempt from it */
    watch_parent();       /* the kernel clears the death signal when credentials change */
  }
  /* Not dumpable: the other children of the pool run as the same user, and
   * would otherwise read this one's memory (another job's data) and /proc
   * files, or trace it. After become_user, which would only clear it too. */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) setup_call_failed("set PR_SET_DUMPABLE (not dumpable)");
  start_parent_watcher();
  drop_capabilities();
  limit(RLIMIT_CORE, "RLIMIT_CORE (no core files)", 0);
  if (o->max_procs > 0) limit(RLIMIT_NPROC, "RLIMIT_NPROC (max_procs)", (rlim_t) o->max_procs);
#ifndef __SANITIZE_ADDRESS__ /* ASan's shadow memory does not fit under RLIMIT_DATA: the
                                sanitized build (make sanitize) relies on the allocator alone */
  if (o->memory_limit > 0) /* a backstop for what bypasses the Lua allocator */
    limit(RLIMIT_DATA, "RLIMIT_DATA (memory_limit)", (rlim_t) o->memory_limit * 2 + 256u * 1024 * 1024);
#endif
  on_signal(MJ_INTERRUPT_SIGNAL, on_interrupt_signal, "watch for interrupts");
}
