/* child.c -- the child program: embeds LuaJIT and runs one processor's jobs.
 *
 * The parent starts this program with the channel socket on fd 3 and the
 * child's stdout/stderr on pipes of their own. Mechanism lives here: the
 * process set-up, and a tiny `moonjob.channel` module (recv/send of frames on
 * fd 3, blocking). Policy lives in Lua: main() requires `moonjob.child.runner`, which
 * reads the INIT frame, loads the processor file and runs jobs one at a time
 * until the channel reaches end-of-file. The parent may send several JOB
 * frames ahead (pipelining, frame.h): the child reads the channel ahead and
 * queues them, and starts each through the shared gate, which also tells it
 * which ones the parent took back.
 *
 * Interruption (soft timeout, cancel): the parent sends an INTERRUPT frame,
 * then, once the frame is written and its job is the one the child runs,
 * MJ_INTERRUPT_SIGNAL. A signal that comes before the job's channel.run is
 * ignored, but its frame is then already in the channel (the shared page
 * counts it), and channel.run looks there before it starts the job. While a
 * job runs under channel.run, the signal handler sets a count hook that looks
 * for an INTERRUPT about the job (a signal meant for a job already over finds
 * none: the hook goes) and then raises an error at every Lua instruction
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
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
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
static uint32_t job_seq;                       /* and its sequence number */
static const char kept_marker;                 /* channel.KEPT: the batch area's results */
static double job_number;                      /* what Lua sees for it: 1, 2, 3... */
static struct rusage job_start_usage;          /* taken when the job starts */
static uint64_t job_start_ns;                  /* and when, on the monotonic clock */
static uint64_t monotonic_ns(void);
static struct rusage last_usage;               /* taken when the last job ended */
static int last_usage_valid;
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

/* How many bytes the child has written to stdout and stderr so far: what the
 * parent has read (it publishes the count in the shared page) plus what the
 * pipe still holds (FIONREAD, which a pipe answers on its writing end too).
 * The parent's count and the pipe change together while it reads, so both
 * are taken between two equal, even readings of output_seq (a seqlock).
 * Without the shared page, or when a stream is not a pipe (a terminal, a
 * file), the counts are MJ_OUTPUT_UNKNOWN: the parent then reads all there
 * is. */
static void output_written(uint64_t written[2]) {
  static int pipes = -1; /* are fds 1 and 2 pipes? (asked once) */
  written[0] = written[1] = MJ_OUTPUT_UNKNOWN;
  if (pipes < 0) {
    struct stat st[2];
    pipes = fstat(1, &st[0]) == 0 && fstat(2, &st[1]) == 0 && S_ISFIFO(st[0].st_mode) &&
            S_ISFIFO(st[1].st_mode);
  }
  if (shared == NULL || !pipes) return;
  for (int tries = 0; tries < 100000; tries++) {
    uint32_t before = __atomic_load_n(&shared->output_seq, __ATOMIC_ACQUIRE);
    if (before & 1) { /* the parent is reading */
      sched_yield();
      continue;
    }
    uint64_t read[2] = {__atomic_load_n(&shared->output_read[0], __ATOMIC_ACQUIRE),
                        __atomic_load_n(&shared->output_read[1], __ATOMIC_ACQUIRE)};
    int unread[2] = {0, 0};
    for (int i = 0; i < 2; i++)
      if (ioctl(1 + i, FIONREAD, &unread[i]) != 0) return;
    if (__atomic_load_n(&shared->output_seq, __ATOMIC_ACQUIRE) != before) continue;
    for (int i = 0; i < 2; i++) written[i] = read[i] + (uint64_t) unread[i];
    return;
  }
}

/* ------------------------------------------------------ reading ahead --- */

/* The child reads its channel ahead, in as large pieces as the kernel gives,
 * into `in`, and cuts it into frames there. INIT and JOB frames wait in
 * `queued` (their payload stays in the buffer) until channel.recv hands them
 * to Lua one at a time; INTERRUPT frames are kept aside in `interrupts`
 * while their job is queued or running, so that a job interrupted while it
 * waited is found before it starts, and a running one when the signal comes.
 * A frame whose payload cannot be held (malloc refused) is skipped and
 * handed over without its payload. */
typedef struct {
  uint32_t type, seq;
  uint64_t token;
  size_t off;   /* payload offset in in.buf */
  uint32_t len;
  int dropped;  /* the payload could not be held */
} queued_t;

#define MAX_INTERRUPTS (MJ_MAX_INFLIGHT + 2)
#define READ_CHUNK (64 * 1024)
#define KEEP_BUFFER (1024 * 1024) /* free a larger buffer once it is empty */

static struct {
  char *buf;
  size_t len, cap, parsed; /* bytes held; cut into frames up to `parsed` */
  size_t discard;          /* bytes still to drop of a frame that could not be held */
} in;

/* The queued frames: an array that grows (jobs the parent took back still
 * arrive after as many new ones, so no fixed bound holds), used from
 * first_queued on. Every whole frame held is cut at once, so an INTERRUPT
 * behind any number of JOB frames is always seen. */
static queued_t *queued;
static unsigned nqueued, first_queued, queued_cap;
static uint32_t jobs_received;   /* JOB frames read: the sequence number (frame.h) */
static uint32_t interrupts_seen; /* shared->interrupts when the channel was last read */

static struct {
  uint64_t token;
  char *payload;
  size_t len;
} interrupts[MAX_INTERRUPTS];
static unsigned ninterrupts;

static queued_t *queued_at(unsigned i) {
  return &queued[first_queued + i];
}

/* A new slot at the end of the queue, or NULL when memory is refused. */
static queued_t *queue_slot(void) {
  if (first_queued + nqueued == queued_cap) {
    if (first_queued > 0) {
      memmove(queued, queued + first_queued, nqueued * sizeof *queued);
      first_queued = 0;
    } else {
      unsigned cap = queued_cap ? queued_cap * 2 : 64;
      queued_t *grown = realloc(queued, cap * sizeof *queued);
      if (grown == NULL) return NULL;
      queued = grown;
      queued_cap = cap;
    }
  }
  return &queued[first_queued + nqueued++];
}

static int is_queued_job(uint64_t token) {
  for (unsigned i = 0; i < nqueued; i++)
    if (queued_at(i)->type == MJ_FRAME_JOB && queued_at(i)->token == token) return 1;
  return 0;
}

static int find_interrupt(uint64_t token) {
  for (unsigned i = 0; i < ninterrupts; i++)
    if (interrupts[i].token == token) return (int) i;
  return -1;
}

static void forget_interrupt(uint64_t token) {
  int i = find_interrupt(token);
  if (i < 0) return;
  free(interrupts[i].payload);
  interrupts[i] = interrupts[--ninterrupts];
}

/* An INTERRUPT frame: kept while its job is queued or running (the parent
 * sends at most one per job); one about a job already over is dropped. */
static void keep_interrupt(uint64_t token, const char *payload, size_t len) {
  if (token == 0 || find_interrupt(token) >= 0 || ninterrupts == MAX_INTERRUPTS) return;
  if (token != job_token && !is_queued_job(token)) return;
  char *copy = malloc(len ? len : 1);
  if (copy == NULL) len = 0; /* the job still stops, with the default reason */
  else memcpy(copy, payload, len);
  interrupts[ninterrupts].token = token;
  interrupts[ninterrupts].payload = copy;
  interrupts[ninterrupts++].len = len;
}

static void pass_recalled(uint32_t seq);

/* True when the parent took job `seq` back (the shared gate, frame.h). */
static int recalled(uint32_t seq) {
  return shared != NULL && mj_gate_recalled(__atomic_load_n(&shared->gate, __ATOMIC_ACQUIRE), seq);
}

/* Cuts the bytes held into frames, as far as whole frames go. A JOB frame
 * the parent took back already is dropped here; one it takes back later is
 * dropped when its turn comes (channel.recv). */
static void cut_frames(void) {
  while (in.discard == 0 && in.len - in.parsed >= sizeof(mj_frame_header_t)) {
    mj_frame_header_t h;
    memcpy(&h, in.buf + in.parsed, sizeof h);
    size_t off = in.parsed + sizeof h;
    if (in.len - off < h.len) return;
    uint32_t seq = h.type == MJ_FRAME_JOB ? mj_seq_next(jobs_received) : 0;
    if (h.type == MJ_FRAME_INTERRUPT) {
      keep_interrupt(h.job, in.buf + off, h.len);
    } else if (h.type == MJ_FRAME_JOB && recalled(seq)) {
      jobs_received = seq;
      /* between jobs with nothing queued, every job before it is passed: the gate
         moves on, so a run of recalls never drifts out of the sequence window */
      if (nqueued == 0 && job_token == 0) pass_recalled(seq);
    } else {
      queued_t *q = queue_slot();
      if (q == NULL) return; /* cut later, once frames went */
      q->type = h.type;
      q->token = h.job;
      q->off = off;
      q->len = h.len;
      q->dropped = 0;
      q->seq = seq;
      if (h.type == MJ_FRAME_JOB) jobs_received = seq;
    }
    in.parsed = off + h.len;
  }
}

/* Moves what is still needed (the queued frames and the bytes not cut yet)
 * to the start of the buffer; frees a large buffer once nothing is held. */
static void compact(void) {
  size_t from = nqueued && !queued_at(0)->dropped ? queued_at(0)->off - sizeof(mj_frame_header_t)
                                                  : in.parsed;
  for (unsigned i = 0; i < nqueued; i++)
    if (!queued_at(i)->dropped && queued_at(i)->off - sizeof(mj_frame_header_t) < from)
      from = queued_at(i)->off - sizeof(mj_frame_header_t);
  if (from == 0) return;
  memmove(in.buf, in.buf + from, in.len - from);
  in.len -= from;
  in.parsed -= from;
  for (unsigned i = 0; i < nqueued; i++)
    if (!queued_at(i)->dropped) queued_at(i)->off -= from;
  if (in.len == 0 && in.cap > KEEP_BUFFER) {
    free(in.buf);
    in.buf = NULL;
    in.cap = 0;
  }
}

/* Room to read into: a chunk, or the rest of the frame being cut. When a
 * frame cannot be held, it is queued without its payload and its bytes are
 * dropped as they come. Returns 0, or -1 when even a chunk cannot be had. */
static int make_room(void) {
  size_t need = in.len + READ_CHUNK;
  if (in.discard == 0 && in.len - in.parsed >= sizeof(mj_frame_header_t)) {
    mj_frame_header_t h;
    memcpy(&h, in.buf + in.parsed, sizeof h);
    size_t whole = in.parsed + sizeof h + h.len;
    if (whole > need) need = whole;
  }
  if (need <= in.cap) return 0;
  size_t cap = in.cap ? in.cap : READ_CHUNK;
  while (cap < need) cap *= 2;
  char *grown = realloc(in.buf, cap);
  if (grown != NULL) {
    in.buf = grown;
    in.cap = cap;
    return 0;
  }
  if (in.len - in.parsed < sizeof(mj_frame_header_t)) return -1;
  mj_frame_header_t h; /* a frame too large to hold: queued without payload */
  memcpy(&h, in.buf + in.parsed, sizeof h);
  if (sizeof h + (size_t) h.len <= in.len - in.parsed) return -1; /* whole, only not cut yet */
  queued_t *q = queue_slot();
  if (q == NULL) return -1;
  q->type = h.type;
  q->token = h.job;
  q->off = 0;
  q->len = 0;
  q->dropped = 1;
  q->seq = h.type == MJ_FRAME_JOB ? (jobs_received = mj_seq_next(jobs_received)) : 0;
  /* (a recalled one is dropped when its turn comes: its payload is not here) */
  size_t held = in.len - in.parsed - sizeof h;
  in.discard = h.len - held;
  in.len = in.parsed; /* its header and payload bytes so far are dropped */
  return in.len + READ_CHUNK <= in.cap ? 0 : -1;
}

/* Reads what the channel holds (waiting for at least a byte when `wait`),
 * and cuts it into frames. Returns 1 when bytes came, 0 at end of file, -1
 * when nothing came (EAGAIN) or on error (errno set). */
static int pull(int wait) {
  compact();
  if (make_room() != 0) {
    errno = ENOMEM;
    return -1;
  }
  ssize_t r;
  do {
    r = recv(CHANNEL_FD, in.buf + in.len, in.cap - in.len, wait ? 0 : MSG_DONTWAIT);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return r == 0 ? 0 : -1;
  size_t got = (size_t) r;
  if (in.discard > 0) { /* the rest of a frame that could not be held */
    size_t drop = got < in.discard ? got : in.discard;
    memmove(in.buf + in.len, in.buf + in.len + drop, got - drop);
    in.discard -= drop;
    got -= drop;
  }
  in.len += got;
  cut_frames();
  return 1;
}

/* Reads, without waiting, what the channel holds when the parent wrote an
 * INTERRUPT since the last look (the shared page counts them): it is then
 * in the channel, since it is counted once written whole. */
static void look_for_interrupts(void) {
  uint32_t written = shared ? __atomic_load_n(&shared->interrupts, __ATOMIC_ACQUIRE) : 0;
  if (shared != NULL && written == interrupts_seen) return;
  interrupts_seen = written;
  while (pull(0) > 0) {}
}

/* ----------------------------------------------- moonjob.channel module --- */

/* Marks job `seq` started in the shared gate, unless the parent recalled it
 * (frame.h). Returns 1 when it may run, 0 when it was recalled. */
static int start_job(uint32_t seq) {
  if (shared == NULL) return 1;
  uint64_t g = __atomic_load_n(&shared->gate, __ATOMIC_ACQUIRE);
  if (mj_gate_started(g, seq)) return 1; /* again (start_arriving_job): its batch word stays */
  do {
    if (mj_gate_recalled(g, seq)) return 0;
    /* its lines, should it be a batch, before the parent can see it started;
     * the batch word changes before this job writes the area (the gate's
     * compare-and-swap below orders them), so that a parent copying the last
     * batch's kept results can tell (mj_process_batch_same) */
    __atomic_store_n(&shared->batch, MJ_BATCH(seq, 0, MJ_BATCH_LINES_MAX), __ATOMIC_RELEASE);
    __atomic_store_n(&shared->batch_kept, MJ_KEPT(0, 0), __ATOMIC_RELEASE);
  } while (!__atomic_compare_exchange_n(&shared->gate, &g, mj_gate_start(g, seq), 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
  return 1;
}

/* Job `seq`, recalled, is dropped now that its turn came: the gate says the
 * child got this far, so the recalled range stops being pending once passed
 * (a later recall then need not be joined to it, frame.h). */
static void pass_recalled(uint32_t seq) {
  if (shared == NULL) return;
  uint64_t g = __atomic_load_n(&shared->gate, __ATOMIC_ACQUIRE), next;
  do {
    if (!mj_gate_recalled(g, seq)) return;
    next = seq == MJ_GATE_TO(g) ? MJ_GATE(seq, seq, seq) : MJ_GATE(seq, mj_seq_next(seq), MJ_GATE_TO(g));
  } while (!__atomic_compare_exchange_n(&shared->gate, &g, next, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE));
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

/* The job the child runs next starts as soon as its header is in, while a
 * large payload still arrives: a job whose data takes longer to receive than
 * the parent's ack_timeout must not read as left untaken. Starting the same
 * job again once it is whole changes nothing (start_job is idempotent). */
static void start_arriving_job(void) {
  mj_frame_header_t h;
  if (in.discard > 0 || in.len - in.parsed < sizeof h) return;
  memcpy(&h, in.buf + in.parsed, sizeof h);
  if (h.type == MJ_FRAME_JOB) start_job(mj_seq_next(jobs_received));
}

/* The next INIT or JOB frame, reading (and waiting) as needed; NULL at end
 * of file. Raises on a read error. Sets *waited when it had to wait. */
static queued_t *next_frame(lua_State *L, int *waited) {
  while (nqueued == 0) {
    *waited = 1;
    start_arriving_job();
    int r = pull(1);
    if (r == 0 || (r < 0 && errno != ENOMEM)) channel_ended();
    if (r == 0) return NULL;
    if (r < 0) luaL_error(L, "channel read failed: %s", strerror(errno));
  }
  return queued_at(0);
}

static void drop_first_frame(void) {
  first_queued++;
  if (--nqueued == 0) first_queued = 0;
}

/* channel.recv() -> type, job, payload | type, job, false (the payload did
 * not fit in memory) | nil at end-of-file. A JOB frame is the job the child
 * starts now: the shared gate says so (a job the parent recalled is dropped
 * unread, and the next one read), its token becomes the current one, and
 * Lua sees a local number instead of it. Raises on a read error. */
static int channel_recv(lua_State *L) {
  queued_t *q;
  for (;;) {
    int waited = 0;
    q = next_frame(L, &waited);
    if (q == NULL) return 0;
    if (q->type != MJ_FRAME_JOB) break;
    if (start_job(q->seq)) {
      job_token = q->token;
      job_seq = q->seq;
      job_number += 1;
      /* CPU time counts from here: measured anew after a wait, else from the end of the last job */
      if (waited || !last_usage_valid) getrusage(RUSAGE_SELF, &job_start_usage);
      else job_start_usage = last_usage;
      job_start_ns = monotonic_ns(); /* its run time too: the parent's clock would count its own idle time */
      break;
    }
    pass_recalled(q->seq);
    forget_interrupt(q->token);
    drop_first_frame();
  }
  lua_pushinteger(L, (lua_Integer) q->type);
  lua_pushnumber(L, q->type == MJ_FRAME_JOB ? job_number : 0);
  if (q->dropped || !push_payload(L, in.buf + q->off, q->len)) lua_pushboolean(L, 0);
  drop_first_frame();
  return 3;
}

static double ms_of(struct timeval tv) {
  return tv.tv_sec * 1e3 + tv.tv_usec / 1e3;
}

/* The job's run time and CPU time since it started, and the peak RSS so
 * far. The reading is kept as the next job's start when that one starts
 * without waiting. */
static mj_job_usage_t job_usage(void) {
  mj_job_usage_t u = {0, 0, 0, {0, 0}};
  if (job_start_ns != 0) u.wall_ms = (double) (monotonic_ns() - job_start_ns) / 1e6;
  last_usage_valid = 0;
  if (getrusage(RUSAGE_SELF, &last_usage) != 0) return u;
  last_usage_valid = 1;
  u.cpu_ms = ms_of(last_usage.ru_utime) + ms_of(last_usage.ru_stime) -
             ms_of(job_start_usage.ru_utime) - ms_of(job_start_usage.ru_stime);
  u.max_rss_kb = (double) last_usage.ru_maxrss;
  return u;
}

/* channel.send(type, job, part...) sends one frame whose payload is the
 * concatenation of the string parts, without concatenating them in memory.
 * Frames about a job carry the current job's token (`job` is ignored: only
 * the job in hand can be answered). A frame that ends a job carries its usage
 * and how far its output goes (the caller flushed stdio first), and the job
 * is then over: no INTERRUPT can concern it any more.
 * Raises when the channel is closed. */
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
    output_written(usage.output);
  }
  for (int i = 0; i < nparts; i++, n++) {
    size_t len;
    const char *s;
    if (lua_touserdata(L, 3 + i) == &kept_marker) { /* channel.KEPT */
      s = shared ? (const char *) shared + MJ_SHARED_SIZE : "";
      len = shared ? MJ_KEPT_BYTES(__atomic_load_n(&shared->batch_kept, __ATOMIC_RELAXED)) : 0;
    } else {
      s = luaL_checklstring(L, 3 + i, &len);
    }
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
  if (MJ_FRAME_ENDS_JOB(h.type) && h.job != 0) {
    forget_interrupt(job_token);
    job_token = 0;
  }
  return 0;
}

/* The batch functions and the clock below are also exported for the
 * runner's FFI (moonjob_*: the program is linked with -rdynamic), so that the
 * per-line loop of a batch stays compiled; the channel.* versions are the
 * same for a build without the export. */

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* Starts the next line of the batch in hand. Returns when it started (ms on
 * the monotonic clock, also left in the shared page for the parent, should
 * the child die in it), or -1 when the parent took it back. */
double moonjob_batch_next(void) {
  uint64_t now = monotonic_ns();
  if (shared == NULL) return (double) now / 1e6;
  uint64_t b = __atomic_load_n(&shared->batch, __ATOMIC_ACQUIRE), next;
  do {
    uint32_t started = MJ_BATCH_STARTED(b);
    if (MJ_BATCH_SEQ(b) != job_seq || started >= MJ_BATCH_LIMIT(b)) return -1;
    next = MJ_BATCH(job_seq, started + 1, MJ_BATCH_LIMIT(b));
  } while (!__atomic_compare_exchange_n(&shared->batch, &b, next, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE));
  __atomic_store_n(&shared->batch_line_started, now, __ATOMIC_RELAXED);
  return (double) now / 1e6;
}

static int channel_batch_next(lua_State *L) {
  lua_pushnumber(L, moonjob_batch_next());
  return 1;
}

/* channel.batch_keep(text) -> true when the result text of the line just
 * finished went into the batch area (the parent reads it there should the
 * child die before the job's DONE frame, which carries channel.KEPT); false
 * when it does not fit (nothing kept: the runner ends the batch and sends the
 * text itself). */
int moonjob_batch_keep(const void *text, size_t len) {
  if (shared == NULL) return 0;
  uint64_t k = __atomic_load_n(&shared->batch_kept, __ATOMIC_RELAXED);
  size_t used = MJ_KEPT_BYTES(k);
  if (len > MJ_BATCH_AREA - used) return 0;
  memcpy((char *) shared + MJ_SHARED_SIZE + used, text, len);
  __atomic_store_n(&shared->batch_kept, MJ_KEPT(MJ_KEPT_LINES(k) + 1, used + len), __ATOMIC_RELEASE);
  return 1;
}

static int channel_batch_keep(lua_State *L) {
  size_t len;
  const char *text = luaL_checklstring(L, 1, &len);
  lua_pushboolean(L, moonjob_batch_keep(text, len));
  return 1;
}

/* Where the line that starts at text[from] (0-based) ends: the offset of its
 * newline, or len. */
size_t moonjob_line_end(const char *text, size_t from, size_t len) {
  const char *nl = from < len ? memchr(text + from, '\n', len - from) : NULL;
  return nl ? (size_t) (nl - text) : len;
}

/* ------------------------------------------------------ counted output --- */

/* stdout and stderr are replaced, before Lua opens its io library, by stdio
 * streams that write to fds 1 and 2 and count their writes, so that a batch
 * of lines can end after a line that wrote output and the parent can tag
 * that output with the line (moonjob_output_mark, runner.lua). Caveat: what
 * bypasses stdio (a command run by os.execute, a write(2) through the FFI)
 * is not counted. */
static uint32_t output_writes;

static ssize_t counted_write(void *cookie, const char *buf, size_t size) {
  int fd = (int) (intptr_t) cookie;
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, buf + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t) n;
  }
  output_writes++;
  return done > 0 || size == 0 ? (ssize_t) done : -1;
}

static FILE *counted_stream(int fd, int mode) {
  cookie_io_functions_t io = {.write = counted_write};
  FILE *f = fopencookie((void *) (intptr_t) fd, "w", io);
  if (f == NULL || setvbuf(f, NULL, mode, BUFSIZ) != 0) return NULL;
  return f;
}

/* A mark that changes whenever stdout or stderr was written: what stdout
 * holds unwritten (a partial line) is written first, so it counts as written
 * by the line that printed it. */
uint32_t moonjob_output_mark(void) {
  if (__fpending(stdout) > 0) fflush(stdout);
  return output_writes;
}

static int channel_output_mark(lua_State *L) {
  lua_pushnumber(L, moonjob_output_mark());
  return 1;
}

/* ----------------------------------------------------------------- UTF-8 --- */

/* Where text[0, len) stops being UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), as a 1-based byte position, or 0 when
 * it is UTF-8. moonjob.codec.json checks every line and string with it in the
 * child, through the FFI (Lua's pattern matching took 12% of a batch line);
 * runs of ASCII are skipped eight bytes at a time. */
size_t moonjob_utf8_error_at(const char *text, size_t len) {
  const unsigned char *s = (const unsigned char *) text;
  size_t i = 0;
  while (i < len) {
    if (i + 8 <= len) {
      uint64_t word;
      memcpy(&word, s + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t n;
    unsigned low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 1;
    else if (c == 0xE0) n = 2, low = 0xA0;
    else if (c == 0xED) n = 2, high = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) n = 2;
    else if (c == 0xF0) n = 3, low = 0x90;
    else if (c == 0xF4) n = 3, high = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) n = 3;
    else return i + 1;
    if (i + n >= len) return i + 1; /* cut short by the end */
    if (s[i + 1] < low || s[i + 1] > high) return i + 1;
    for (size_t k = 2; k <= n; k++)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i + 1;
    i += n + 1;
  }
  return 0;
}

/* channel.now() -> milliseconds on the monotonic clock (a batch times its
 * lines with it). */
double moonjob_now_ms(void) {
  return (double) monotonic_ns() / 1e6;
}

static int channel_now(lua_State *L) {
  lua_pushnumber(L, moonjob_now_ms());
  return 1;
}

/* True when an INTERRUPT for the job in hand was written by the parent:
 * looks in the channel first if the parent wrote one since the last look. */
static int interrupt_for_job(void) {
  look_for_interrupts();
  return job_token != 0 && find_interrupt(job_token) >= 0;
}

static void raise_interrupt(lua_State *L) {
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

/* Set by the signal handler: looks for an INTERRUPT about the job in hand
 * (the parent signals once that frame is written whole); without one the
 * signal was for a job already over, and the hook goes. With one it raises at
 * every Lua instruction until the job's protected call returns. The first
 * time, the traceback of where the job stood is kept in the registry. */
static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void) ar;
  if (!interrupt_pending) {
    if (!interrupt_for_job()) {
      lua_sethook(L, NULL, 0, 0);
      return;
    }
    interrupt_pending = 1;
  }
  raise_interrupt(L);
}

static void set_interrupt_hook(lua_State *L) {
  lua_sethook(L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* Only the parent may interrupt, and only while a job runs. */
static void on_interrupt_signal(int signum, siginfo_t *info, void *context) {
  (void) signum;
  (void) context;
  int saved_errno = errno;
  lua_State *L = running_L;
  if (L != NULL && info->si_pid == parent_pid) set_interrupt_hook(L);
  errno = saved_errno;
}

/* channel.run(handler, fn, arg) -> ok, value, interrupted, out_of_memory
 * Calls fn(arg) in protected mode with handler as the message handler; while
 * it runs, the parent's interrupt signal makes it fail, and memory_limit holds
 * strictly. A job the parent interrupted before it started fails before any
 * of its code runs. `interrupted` tells whether the interrupt happened (the
 * job may have failed for that reason; channel.interrupt() says why);
 * `out_of_memory` that the job failed because the heap was full (the handler
 * does not run then, or failed itself). After a failure the heap is
 * collected, and the runner has HEAP_RESERVE bytes past the limit to report
 * it. */
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
  if (interrupt_for_job()) { /* interrupted before it started */
    interrupt_pending = 1;
    set_interrupt_hook(L);
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

/* channel.interrupt() -> the payload of the INTERRUPT frame about the job in
 * hand (the parent's {code, message, reason}), or nil. */
static int channel_interrupt(lua_State *L) {
  int i = job_token != 0 ? find_interrupt(job_token) : -1;
  if (i < 0) return 0;
  lua_pushlstring(L, interrupts[i].payload ? interrupts[i].payload : "", interrupts[i].len);
  return 1;
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
    {"interrupt", channel_interrupt}, {"batch_next", channel_batch_next},
    {"batch_keep", channel_batch_keep}, {"now", channel_now}, {"output_mark", channel_output_mark},
    {NULL, NULL}};
  lua_newtable(L);
  luaL_register(L, NULL, funcs);
#define MJ_SET_TYPE(name)               \
  lua_pushinteger(L, MJ_FRAME_##name); \
  lua_setfield(L, -2, #name);
  MJ_FRAME_TYPES(MJ_SET_TYPE)
#undef MJ_SET_TYPE
  lua_pushlightuserdata(L, (void *) &kept_marker);
  lua_setfield(L, -2, "KEPT");
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
  void *page = mmap(NULL, MJ_SHARED_MAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, MJ_SHARED_FD, 0);
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

/* Runs require("moonjob.child.runner").main(). Returns the process exit status. A
 * memory error before READY is a set-up failure (memory_limit too small). */
static int run_runner(lua_State *L) {
  int rc;
  lua_pushcfunction(L, traceback);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "moonjob.child.runner");
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
