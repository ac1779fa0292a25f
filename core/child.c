/* child.c -- the child program: embeds LuaJIT and runs one processor's jobs.
 *
 * The parent starts this program with the channel socket on fd 3 and the
 * child's stdout/stderr on pipes of their own. Mechanism lives here: the
 * process set-up, and a tiny `moonjob.channel` module (recv/send of frames on
 * fd 3, blocking). Policy lives in Lua: main() requires `moonjob.runner`, which
 * reads the INIT frame, loads the processor file and runs jobs one at a time
 * until the channel reaches end-of-file.
 *
 * Interruption (soft timeout, cancel): the parent sends an INTERRUPT frame,
 * then, once the frame is written, MJ_INTERRUPT_SIGNAL. A signal that comes
 * before the job's channel.run is ignored, but its frame is then already in
 * the channel, and channel.run looks there before it starts the job. While a
 * job runs under channel.run, the signal
 * handler sets a count hook that raises an error at every Lua instruction
 * until the job's protected call returns, so a user's pcall cannot swallow it.
 * The traceback at the first interruption is kept for the error. Hooks do not
 * run in JIT-compiled loops nor inside C functions: there the parent's hard
 * kill is what ends the job.
 *
 * The sandbox (set before any processor code runs, every step checked: a
 * child that cannot set it up exits with EXIT_SETUP and runs no job): only
 * fds 0-3 stay open (then a pidfd of the parent takes fd 4); core dumps
 * off, PR_SET_NO_NEW_PRIVS, --user (drop from root to that user),
 * --max-procs as RLIMIT_NPROC, and --memory-limit as an exact cap on the Lua
 * heap (a counting allocator that refuses growth past it) backed by
 * RLIMIT_DATA for memory that bypasses it. Limits are lowered
 * hard and soft, and a root child loses CAP_SYS_RESOURCE, so a processor
 * cannot raise them back.
 *
 * Caveats: the child dies with its parent, taking its process group along (a
 * thread polling a pidfd of the parent, PR_SET_PDEATHSIG caught, an end of
 * file on the channel the parent did not announce), so it never outlives a
 * crashed parent; one stopped (SIGSTOP) at that moment waits to be continued. A grandchild that calls setsid() leaves the
 * group and is out of reach. Writes to a closed channel raise a Lua error
 * (SIGPIPE is ignored) and the runner exits. RLIMIT_NPROC does not apply to
 * root: a root parent that wants the process cap to hold passes --user too.
 */
#define _GNU_SOURCE /* close_range */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include <linux/capability.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "frame.h"

#define CHANNEL_FD 3
#define EXIT_INTERNAL 70 /* EX_SOFTWARE: the runner itself failed */
#define EXIT_SETUP 78    /* EX_CONFIG: the child could not set itself up; its one
                            stderr line says why, and the parent reports it as ELOAD */
#define HEAP_RESERVE (1024 * 1024) /* heap the runner may use past memory_limit to report */
#define TRACEBACK_KEY "moonjob.interrupt_traceback"
#define MJ_PARENT_DEATH_SIGNAL SIGHUP /* PR_SET_PDEATHSIG; caught: see on_parent_death */

static pid_t parent_pid;
static mj_shared_t *shared;                    /* the page shared with the parent, or NULL */
static uint64_t job_token;                     /* token of the job in hand (frame.h) */
static double job_number;                      /* what Lua sees for it: 1, 2, 3... */
static struct rusage job_start_usage;          /* taken when a JOB frame arrives */
static lua_State *volatile running_L;          /* set while channel.run runs a job */
static int ready_sent;                         /* READY went out: set-up is over */
static volatile sig_atomic_t interrupt_pending; /* the parent asked to stop the job */

/* The Lua heap's accounting (memory_limit). Growth past `limit` is refused
 * while `strict` (set-up, loading, a job); otherwise the runner may use
 * HEAP_RESERVE more, so that it can still build and send the error of a job
 * that filled the heap (the job's data may still be referenced). */
typedef struct {
  size_t used, limit;
  int strict;
  int refused; /* growth was refused since the last job started */
} heap_t;

static heap_t heap;

/* ---------------------------------------------------------------- I/O --- */

/* The parent is gone: the child's whole process group (the child included)
 * is killed, so that nothing a processor started outlives the parent. Only a
 * child that leads its group does so (moonjob starts each in a session of its
 * own); one started some other way must not kill its starter's group. */
static void parent_gone(void) {
  if (getpgrp() == getpid()) kill(0, SIGKILL);
  _exit(EXIT_INTERNAL);
}

/* The channel ended (end of file, or a write found it closed). The parent
 * marks the shared page before it ends the channel on purpose; otherwise it
 * died, maybe an instant before its death signal reaches the child: the child
 * must not exit quietly and leave its group behind. */
static void channel_ended(void) {
  if (shared != NULL && !__atomic_load_n(&shared->input_ended, __ATOMIC_ACQUIRE)) parent_gone();
}

/* Reads exactly n bytes. Returns 1 when done, 0 on end-of-file before the
 * first byte, -1 on error or end-of-file in the middle (errno set). */
static int read_exact(int fd, void *buf, size_t n) {
  char *p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, p + got, n - got);
    if (r > 0) {
      got += (size_t) r;
    } else if (r == 0) {
      if (got == 0) return 0;
      errno = EPIPE;
      return -1;
    } else if (errno != EINTR) {
      return -1;
    }
  }
  return 1;
}

/* Writes every byte of iov[0..n). Returns 0, or -1 with errno set. */
static int write_all(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    ssize_t w = writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    while (n > 0 && (size_t) w >= iov->iov_len) {
      w -= (ssize_t) iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *) iov->iov_base + w;
      iov->iov_len -= (size_t) w;
    }
  }
  return 0;
}

/* True when bytes written to stdout or stderr are not yet read by the parent.
 * Both are socketpairs made by libuv; SIOCOUTQ counts what the peer has not
 * consumed. Anything else (a terminal, a file) counts as pending: safe. */
static int output_pending(void) {
  for (int fd = 1; fd <= 2; fd++) {
    int unread = 0;
    if (ioctl(fd, SIOCOUTQ, &unread) != 0 || unread > 0) return 1;
  }
  return 0;
}

/* ----------------------------------------------- moonjob.channel module --- */

/* The job number Lua sees for a frame's token: the current job's number for
 * its token, 0 for any other (an INTERRUPT about a job already over). A JOB
 * frame makes its token the current one and tells the parent, through the
 * shared page, that the job was taken: as soon as its header is read, so a
 * large payload still arriving never reads as a job left untaken. The token
 * itself never reaches Lua. */
static double number_for(const mj_frame_header_t *h) {
  if (h->type == MJ_FRAME_JOB) {
    job_token = h->job;
    job_number += 1;
    if (shared) __atomic_store_n(&shared->taken, job_token, __ATOMIC_RELEASE);
    return job_number;
  }
  return (h->job != 0 && h->job == job_token) ? job_number : 0;
}

/* Reads and drops n bytes of the channel. Returns 1, or -1 (errno set). */
static int skip_bytes(int fd, size_t n) {
  char sink[65536];
  while (n > 0) {
    size_t step = n < sizeof sink ? n : sizeof sink;
    if (read_exact(fd, sink, step) != 1) return -1;
    n -= step;
  }
  return 1;
}

typedef struct {
  const char *bytes;
  size_t len;
} payload_t;

/* Under lua_cpcall: the payload as a Lua string, left in the registry. */
static int store_payload(lua_State *L) {
  payload_t *p = lua_touserdata(L, 1);
  lua_pushlstring(L, p->bytes, p->len);
  lua_setfield(L, LUA_REGISTRYINDEX, "moonjob.payload");
  return 0;
}

/* Pushes the payload as a string; false when the Lua heap cannot hold it
 * (memory_limit): the caller reports that instead of raising. */
static int push_payload(lua_State *L, const char *bytes, size_t len) {
  payload_t p = {bytes, len};
  if (lua_cpcall(L, store_payload, &p) != 0) {
    lua_pop(L, 1);
    lua_gc(L, LUA_GCCOLLECT, 0);
    return 0;
  }
  lua_getfield(L, LUA_REGISTRYINDEX, "moonjob.payload");
  lua_pushnil(L);
  lua_setfield(L, LUA_REGISTRYINDEX, "moonjob.payload");
  return 1;
}

/* channel.recv() -> type, job, payload | type, job, false (the payload did
 * not fit in memory: read and dropped) | nil at end-of-file.
 * Raises on a read error or a frame cut short. */
static int channel_recv(lua_State *L) {
  mj_frame_header_t h;
  int r = read_exact(CHANNEL_FD, &h, sizeof h);
  if (r <= 0) channel_ended();
  if (r == 0) return 0;
  if (r < 0) return luaL_error(L, "channel read failed: %s", strerror(errno));
  if (h.type == MJ_FRAME_JOB) getrusage(RUSAGE_SELF, &job_start_usage);
  lua_pushinteger(L, (lua_Integer) h.type);
  lua_pushnumber(L, (lua_Number) number_for(&h));
  char *payload = malloc(h.len ? h.len : 1);
  if (payload == NULL) {
    if (skip_bytes(CHANNEL_FD, h.len) < 0) {
      channel_ended();
      return luaL_error(L, "channel read failed: %s", strerror(errno));
    }
    lua_pushboolean(L, 0);
    return 3;
  }
  r = h.len ? read_exact(CHANNEL_FD, payload, h.len) : 1;
  if (r <= 0) {
    channel_ended();
    free(payload);
    return luaL_error(L, "channel read failed: %s", r == 0 ? "end of file" : strerror(errno));
  }
  if (!push_payload(L, payload, h.len)) lua_pushboolean(L, 0);
  free(payload);
  return 3;
}

static double ms_of(struct timeval tv) {
  return tv.tv_sec * 1e3 + tv.tv_usec / 1e3;
}

/* CPU time since the job arrived, and the peak RSS so far. */
static mj_job_usage_t job_usage(void) {
  struct rusage now;
  mj_job_usage_t u = {0, 0};
  if (getrusage(RUSAGE_SELF, &now) != 0) return u;
  u.cpu_ms = ms_of(now.ru_utime) + ms_of(now.ru_stime) -
             ms_of(job_start_usage.ru_utime) - ms_of(job_start_usage.ru_stime);
  u.max_rss_kb = (double) now.ru_maxrss;
  return u;
}

/* channel.send(type, job, part...) sends one frame whose payload is the
 * concatenation of the string parts, without concatenating them in memory.
 * Frames about a job carry the current job's token (`job` is ignored: only
 * the job in hand can be answered). A frame that ends a job carries
 * MJ_FRAME_FLAG_OUTPUT when output is still unread (the caller flushed stdio
 * first). Raises when the channel is closed. */
static int channel_send(lua_State *L) {
  enum { MAX_PARTS = 4 };
  mj_frame_header_t h;
  mj_job_usage_t usage;
  struct iovec iov[2 + MAX_PARTS];
  int nparts = lua_gettop(L) - 2, n = 1;
  size_t total = 0;
  luaL_argcheck(L, nparts <= MAX_PARTS, 2 + MAX_PARTS + 1, "too many payload parts");
  h.type = (uint32_t) luaL_checkinteger(L, 1);
  luaL_checknumber(L, 2);
  h.job = (h.type == MJ_FRAME_READY || h.type == MJ_FRAME_LOADERR) ? 0 : job_token;
  if (MJ_FRAME_ENDS_JOB(h.type)) {
    usage = job_usage();
    iov[n].iov_base = &usage;
    iov[n++].iov_len = sizeof usage;
    total += sizeof usage;
    if (output_pending()) h.type |= MJ_FRAME_FLAG_OUTPUT;
  }
  for (int i = 0; i < nparts; i++, n++) {
    size_t len;
    const char *s = luaL_checklstring(L, 3 + i, &len);
    iov[n].iov_base = (void *) s;
    iov[n].iov_len = len;
    total += len;
  }
  if (total > UINT32_MAX) return luaL_error(L, "frame too large (%f bytes)", (double) total);
  h.len = (uint32_t) total;
  iov[0].iov_base = &h;
  iov[0].iov_len = sizeof h;
  if (write_all(CHANNEL_FD, iov, n) < 0) {
    int saved_errno = errno;
    if (saved_errno == EPIPE || saved_errno == ECONNRESET) channel_ended();
    return luaL_error(L, "channel write failed: %s", strerror(saved_errno));
  }
  if (h.type == MJ_FRAME_READY) {
    ready_sent = 1;
    heap.strict = 0;
  }
  return 0;
}

/* Raises at every Lua instruction once the parent interrupted the job. The
 * first time, the traceback of where the job stood is kept in the registry. */
static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void) ar;
  if (!interrupt_pending) return;
  lua_getfield(L, LUA_REGISTRYINDEX, TRACEBACK_KEY);
  int taken = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (!taken) {
    luaL_traceback(L, L, "interrupted here", 0); /* level 0: the interrupted function */
    lua_setfield(L, LUA_REGISTRYINDEX, TRACEBACK_KEY);
  }
  lua_pushliteral(L, "moonjob: the job was interrupted");
  lua_error(L);
}

/* True when an INTERRUPT for the job in hand waits in the channel. The
 * parent signals only once that frame is written, so a signal that came
 * before channel.run set running_L left its frame here to be found. */
static int interrupt_queued(void) {
  mj_frame_header_t h;
  ssize_t r = recv(CHANNEL_FD, &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
  return r == (ssize_t) sizeof h && h.type == MJ_FRAME_INTERRUPT && job_token != 0 &&
         h.job == job_token;
}

/* Only the parent may interrupt, and only while a job runs. */
static void on_interrupt_signal(int signum, siginfo_t *info, void *context) {
  (void) signum;
  (void) context;
  int saved_errno = errno;
  lua_State *L = running_L;
  if (L != NULL && info->si_pid == parent_pid) {
    interrupt_pending = 1;
    lua_sethook(L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  }
  errno = saved_errno;
}

/* channel.run(handler, fn, arg) -> ok, value, interrupted, out_of_memory
 * Calls fn(arg) in protected mode with handler as the message handler; while
 * it runs, the parent's interrupt signal makes it fail, and memory_limit holds
 * strictly. `interrupted` tells whether the interrupt happened (the job may
 * have failed for that reason); `out_of_memory` that the job failed because
 * the heap was full (the handler does not run then, or failed itself). After
 * a failure the heap is collected, and the runner has HEAP_RESERVE bytes past
 * the limit to report it. */
static int channel_run(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 3);
  lua_pushnil(L);
  lua_setfield(L, LUA_REGISTRYINDEX, TRACEBACK_KEY);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  interrupt_pending = 0;
  heap.strict = 1;
  heap.refused = 0;
  running_L = L;
  if (interrupt_queued()) { /* interrupted before it started */
    interrupt_pending = 1;
    lua_sethook(L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  }
  int rc = lua_pcall(L, 1, 1, 1);
  running_L = NULL;
  lua_sethook(L, NULL, 0, 0);
  heap.strict = 0;
  int interrupted = interrupt_pending;
  interrupt_pending = 0;
  /* out of heap: directly, or while the message handler itself allocated */
  int out_of_memory = rc == LUA_ERRMEM || (rc == LUA_ERRERR && heap.refused);
  if (rc != 0) lua_gc(L, LUA_GCCOLLECT, 0); /* the job's garbage goes before the runner goes on */
  lua_pushboolean(L, rc == 0);
  lua_insert(L, -2);
  lua_pushboolean(L, interrupted);
  lua_pushboolean(L, out_of_memory);
  return 4;
}

/* channel.strict(on): while on, the Lua heap may not pass memory_limit at all
 * (the runner loads the processor so); off, the runner has a small reserve. */
static int channel_strict(lua_State *L) {
  heap.strict = lua_toboolean(L, 1);
  return 0;
}

/* channel.interrupt_traceback() -> where the last interrupted job stood, or nil */
static int channel_interrupt_traceback(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, TRACEBACK_KEY);
  return 1;
}

static int open_channel(lua_State *L) {
  static const luaL_Reg funcs[] = {
    {"recv", channel_recv}, {"send", channel_send}, {"run", channel_run},
    {"interrupt_traceback", channel_interrupt_traceback}, {"strict", channel_strict},
    {NULL, NULL}};
  lua_newtable(L);
  luaL_register(L, NULL, funcs);
#define MJ_SET_TYPE(name)               \
  lua_pushinteger(L, MJ_FRAME_##name); \
  lua_setfield(L, -2, #name);
  MJ_FRAME_TYPES(MJ_SET_TYPE)
#undef MJ_SET_TYPE
  return 1;
}

/* -------------------------------------------------------------- main --- */

/* Options from the command line: the limits must be in place before the
 * Lua state exists. */
typedef struct {
  size_t memory_limit; /* bytes of Lua heap, 0 for none */
  long max_procs;      /* RLIMIT_NPROC, 0 to leave it */
  const char *user;    /* run as this user (the parent must be root), or NULL */
} child_options_t;

/* A whole number in decimal digits only, at most max. Returns 0 or -1. */
static int parse_whole(const char *text, unsigned long long max, unsigned long long *out) {
  if (*text == '\0' || strspn(text, "0123456789") != strlen(text)) return -1;
  errno = 0;
  unsigned long long v = strtoull(text, NULL, 10);
  if (errno != 0 || v > max) return -1;
  *out = v;
  return 0;
}

static int parse_options(int argc, char **argv, child_options_t *o) {
  memset(o, 0, sizeof *o);
  for (int i = 1; i + 1 < argc; i += 2) {
    unsigned long long v;
    if (strcmp(argv[i], "--user") == 0) {
      o->user = argv[i + 1];
    } else if (strcmp(argv[i], "--memory-limit") == 0) {
      if (parse_whole(argv[i + 1], (unsigned long long) 1 << 46, &v) != 0) return -1;
      o->memory_limit = (size_t) v;
    } else if (strcmp(argv[i], "--max-procs") == 0) {
      if (parse_whole(argv[i + 1], 2147483647ULL, &v) != 0) return -1;
      o->max_procs = (long) v;
    } else {
      return -1;
    }
  }
  return argc % 2 == 1 ? 0 : -1;
}

/* ------------------------------------------------------------ sandbox --- */

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
  void *page = mmap(NULL, MJ_SHARED_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, MJ_SHARED_FD, 0);
  if (page == MAP_FAILED) setup_call_failed("map the page shared with the parent");
  shared = page;
  close(MJ_SHARED_FD);
}

/* Lowers the soft and the hard limit to `value` (a hard limit already lower
 * stays), so that a processor cannot raise it back: raising a hard limit
 * takes CAP_SYS_RESOURCE, which drop_resource_capability removes. */
static void limit(int resource, const char *name, rlim_t value) {
  struct rlimit rl;
  char what[64];
  snprintf(what, sizeof what, "set %s", name);
  if (getrlimit(resource, &rl) != 0) setup_call_failed(what);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < value) value = rl.rlim_max;
  rl.rlim_cur = rl.rlim_max = value;
  if (setrlimit(resource, &rl) != 0) setup_call_failed(what);
}

/* Without CAP_SYS_RESOURCE a process cannot raise a hard limit; a root child
 * has it, so it goes from every capability set, and from the bounding set
 * when the child may change that (CAP_SETPCAP), so that nothing the processor
 * executes gets it back. Other capabilities of a root child stay (use the
 * 'user' option). */
static void drop_resource_capability(void) {
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
  const uint32_t bit = 1u << CAP_SYS_RESOURCE; /* CAP_SYS_RESOURCE < 32: word 0 */
  if (syscall(SYS_capget, &header, data) != 0) setup_call_failed("read the capabilities");
  if ((data[0].effective & (1u << CAP_SETPCAP)) && prctl(PR_CAPBSET_READ, CAP_SYS_RESOURCE) == 1 &&
      prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE) != 0)
    setup_call_failed("drop CAP_SYS_RESOURCE from the bounding set");
  if (!((data[0].effective | data[0].permitted | data[0].inheritable) & bit)) return;
  data[0].effective &= ~bit;
  data[0].permitted &= ~bit;
  data[0].inheritable &= ~bit;
  if (syscall(SYS_capset, &header, data) != 0) setup_call_failed("drop CAP_SYS_RESOURCE");
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
 * any processor code runs. spawn.c closes them too; this covers a child
 * started some other way. */
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
  if (setvbuf(stdout, NULL, _IOLBF, 0) != 0) setup_call_failed("line-buffer stdout"); /* print() reaches the parent line by line */
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) setup_call_failed("set PR_SET_NO_NEW_PRIVS");
  if (o->user) {
    become_user(o->user); /* before NPROC: root is exempt from it */
    watch_parent();       /* the kernel clears the death signal when credentials change */
  }
  start_parent_watcher();
  drop_resource_capability();
  limit(RLIMIT_CORE, "RLIMIT_CORE (no core files)", 0);
  if (o->max_procs > 0) limit(RLIMIT_NPROC, "RLIMIT_NPROC (max_procs)", (rlim_t) o->max_procs);
#ifndef __SANITIZE_ADDRESS__ /* ASan's shadow memory does not fit under RLIMIT_DATA: the
                                sanitized build (make sanitize) relies on the allocator alone */
  if (o->memory_limit > 0) /* a backstop for what bypasses the Lua allocator */
    limit(RLIMIT_DATA, "RLIMIT_DATA (memory_limit)", (rlim_t) o->memory_limit * 2 + 256u * 1024 * 1024);
#endif
  on_signal(MJ_INTERRUPT_SIGNAL, on_interrupt_signal, "watch for interrupts");
}

/* ------------------------------------------------------- memory limit --- */

/* A Lua allocator that counts bytes and refuses growth past the limit: the
 * allocation fails with "not enough memory" inside the job. Shrinking is never
 * refused (LuaJIT raises on a refused shrink too). */
static void *limited_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  heap_t *heap = ud;
  if (ptr == NULL) osize = 0;
  if (nsize == 0) {
    free(ptr);
    heap->used -= osize;
    return NULL;
  }
  size_t cap = heap->limit + (heap->strict ? 0 : HEAP_RESERVE);
  if (nsize > osize && heap->used + (nsize - osize) > cap) {
    heap->refused = 1;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (p != NULL) heap->used = heap->used - osize + nsize;
  return p;
}

static lua_State *new_state(const child_options_t *o) {
  if (o->memory_limit == 0) return luaL_newstate();
  heap.limit = o->memory_limit;
  heap.strict = 1; /* until READY: set-up and loading count in full */
  return lua_newstate(limited_alloc, &heap);
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
  return 1;
}

static void setup_out_of_memory(void) {
  char why[160];
  snprintf(why, sizeof why, "memory_limit (%zu bytes) is too small to start the processor",
           heap.limit);
  setup_failed(why);
}

/* An error outside any protected call: never silent. */
static int panic(lua_State *L) {
  if (!ready_sent && heap.refused) setup_out_of_memory();
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "moonjob-child: unprotected Lua error: %s\n", msg ? msg : "(not a string)");
  fflush(stderr);
  _exit(EXIT_INTERNAL);
}

/* The libraries and moonjob.channel, run by lua_cpcall. */
static int set_up_state(lua_State *L) {
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, open_channel);
  lua_setfield(L, -2, "moonjob.channel");
  return 0;
}

/* Runs require("moonjob.runner").main(). Returns the process exit status. A
 * memory error before READY is a set-up failure (memory_limit too small). */
static int run_runner(lua_State *L) {
  int rc;
  lua_pushcfunction(L, traceback);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "moonjob.runner");
  rc = lua_pcall(L, 1, 1, 1);
  if (rc != 0) goto error;
  lua_getfield(L, -1, "main");
  rc = lua_pcall(L, 0, 1, 1);
  if (rc != 0) goto error;
  return (int) luaL_optinteger(L, -1, 0);
error:
  if (!ready_sent && (rc == LUA_ERRMEM || heap.refused)) setup_out_of_memory();
  fprintf(stderr, "moonjob-child: %s\n", lua_tostring(L, -1));
  return EXIT_INTERNAL;
}

int main(int argc, char **argv) {
  child_options_t options;
  if (parse_options(argc, argv, &options) != 0) {
    fprintf(stderr, "usage: moonjob-child [--memory-limit BYTES] [--max-procs N] [--user NAME]"
            " (whole numbers)\n");
    return 2;
  }
  set_up_process(&options);
  lua_State *L = new_state(&options);
  if (L == NULL) {
    if (options.memory_limit > 0) setup_out_of_memory();
    setup_failed("cannot create a Lua state");
  }
  lua_atpanic(L, panic);
  int rc = lua_cpcall(L, set_up_state, NULL);
  if (rc == LUA_ERRMEM) setup_out_of_memory();
  if (rc != 0) setup_failed(lua_tostring(L, -1) ? lua_tostring(L, -1) : "cannot open the Lua libraries");
  int status = run_runner(L);
  fflush(stdout);
  _exit(status); /* skip lua_close: the OS frees everything at once */
}
