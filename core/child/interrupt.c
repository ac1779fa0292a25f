/* interrupt.c -- stopping a running job: the signal, the hook, channel.run.
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
 * The traceback at the first interruption is kept for the error. The frames
 * themselves are kept aside by channel.c (find_interrupt).
 *
 * Per-line deadlines (a batch of lines run with a timeout, child/batch.lua):
 * each line has its own soft deadline, which the child enforces itself, with
 * no system call per line. One POSIX timer (CLOCK_MONOTONIC, signalling
 * MJ_INTERRUPT_SIGNAL with si_code SI_TIMER) is armed when the batch starts;
 * it always fires at or before the deadline of the line running, since a
 * later line starts later. Its handler compares the running line's start
 * (noted by moonjob_batch_next, exports.c) with now: past the deadline, it
 * marks that line timed out and sets the same hook, which then raises until
 * the line's protected call (channel.protect) returns; else it re-arms for
 * the running line's own deadline. A line is "running" from its
 * batch_next to its moonjob_batch_line_done: the runner's own work between
 * lines is never interrupted. The hard deadline stays the parent's
 * (pool/deadlines.lua reads the line's start in the shared page).
 *
 * Caveats: hooks do not run in JIT-compiled loops nor inside C functions:
 * there the parent's hard kill is what ends the job (or the line). The line
 * timer signals only a batch that runs longer than the timeout, and then may
 * do so during a line still within its deadline (it re-arms there): a
 * processor's system call that does not restart after a handled signal
 * (poll, nanosleep) may see EINTR then, as at any signal.
 */
#include "child.h"

#define TRACEBACK_KEY "moonjob.interrupt_traceback"

static lua_State *volatile running_L;          /* set while channel.run runs a job */
static volatile sig_atomic_t interrupt_pending; /* the parent asked to stop the job */

/* The per-line deadlines of the batch in hand (see above). */
static timer_t line_timer;
static int line_timer_made;                     /* line_timer exists */
static volatile uint64_t line_timeout_ns;       /* each line's timeout; 0: none */
static volatile uint64_t line_started_ns;       /* when the running line started */
static volatile uint32_t lines_begun;           /* lines started in this child, a counter */
static volatile sig_atomic_t line_running;      /* from batch_next to batch_line_done */
static volatile uint32_t line_timed_out;        /* lines_begun of the line past its deadline, 0: none */

/* A line of a batch starts (moonjob_batch_next) at `now`. */
static void line_began(uint64_t now) {
  line_started_ns = now;
  lines_begun = lines_begun + 1 ? lines_begun + 1 : 1; /* never 0: "none" */
  line_running = 1;
}

/* True while the line running is the one the timer found past its deadline. */
static int line_past_deadline(void) {
  return line_running && line_timed_out != 0 && line_timed_out == lines_begun;
}

/* Arms the line timer for `due` (monotonic ns); 0 disarms it. Async-signal-safe. */
static void arm_line_timer(uint64_t due) {
  struct itimerspec when;
  memset(&when, 0, sizeof when);
  when.it_value.tv_sec = (time_t) (due / 1000000000u);
  when.it_value.tv_nsec = (long) (due % 1000000000u);
  if (line_timer_made) timer_settime(line_timer, TIMER_ABSTIME, &when, NULL);
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
    if (interrupt_for_job()) {
      interrupt_pending = 1;
    } else if (!line_past_deadline()) { /* nor a line past its deadline: it ended meanwhile */
      lua_sethook(L, NULL, 0, 0);
      return;
    }
  }
  raise_interrupt(L);
}

static void set_interrupt_hook(lua_State *L) {
  lua_sethook(L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* The line timer fired: the running line is past its deadline (it is
 * interrupted, and the timer re-armed a timeout on, at or before the next
 * line's deadline), or the timer re-armed for the running line's deadline. */
static void on_line_timer(void) {
  uint64_t timeout = line_timeout_ns;
  if (timeout == 0) return; /* no batch with a timeout in hand */
  uint64_t now = monotonic_ns(), due = now + timeout;
  if (line_running) {
    uint64_t line_due = line_started_ns + timeout;
    if (now >= line_due) {
      line_timed_out = lines_begun;
      lua_State *L = running_L;
      if (L != NULL) set_interrupt_hook(L);
    } else {
      due = line_due;
    }
  }
  arm_line_timer(due);
}

/* Only the parent may interrupt, and only while a job runs; the line timer
 * (SI_TIMER) interrupts a line past its deadline. */
static void on_interrupt_signal(int signum, siginfo_t *info, void *context) {
  (void) signum;
  (void) context;
  int saved_errno = errno;
  lua_State *L = running_L;
  if (info->si_code == SI_TIMER) on_line_timer();
  else if (L != NULL && info->si_pid == parent_pid) set_interrupt_hook(L);
  errno = saved_errno;
}

/* channel.line_timeout(seconds): each line of the batch in hand has that
 * soft deadline (0: none, the timer is disarmed). Raises when the timer
 * cannot be made. */
static int channel_line_timeout(lua_State *L) {
  double seconds = luaL_checknumber(L, 1);
  if (seconds > 0 && !line_timer_made) {
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_SIGNAL;
    ev.sigev_signo = MJ_INTERRUPT_SIGNAL;
    if (timer_create(CLOCK_MONOTONIC, &ev, &line_timer) != 0)
      return luaL_error(L, "cannot make the line timer: %s", strerror(errno));
    line_timer_made = 1;
  }
  line_running = 0;
  line_timed_out = 0;
  line_timeout_ns = seconds > 0 ? (uint64_t) (seconds * 1e9) : 0;
  if (line_timeout_ns > 0) arm_line_timer(monotonic_ns() + line_timeout_ns);
  else if (line_timer_made) arm_line_timer(0);
  return 0;
}

/* The line running ended (its processor returned, or it was blank): from
 * here to the next line's start nothing is interrupted for a deadline. */
void moonjob_batch_line_done(void) {
  line_running = 0;
}

static int channel_batch_line_done(lua_State *L) {
  (void) L;
  moonjob_batch_line_done();
  return 0;
}

/* channel.protect(handler, fn, arg) -> ok, value, timed_out
 * Calls fn(arg) in protected mode (handler: the message handler), as xpcall
 * does, for the lines of a batch: `timed_out` says that it failed because the
 * line running passed its deadline (the timer's interrupt, which stops at
 * this call's end; the parent's own interrupt goes on up to channel.run). */
static int channel_protect(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 3);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  int rc = lua_pcall(L, 1, 1, 1);
  int past = line_past_deadline();
  line_running = 0;
  line_timed_out = 0;
  if (past && !interrupt_pending) {
    lua_sethook(L, NULL, 0, 0);
    lua_pushnil(L);
    lua_setfield(L, LUA_REGISTRYINDEX, TRACEBACK_KEY);
  }
  lua_pushboolean(L, rc == 0);
  lua_insert(L, -2);
  lua_pushboolean(L, past && rc != 0);
  return 3;
}

/* channel.run(handler, fn, arg) -> ok, value, interrupted, out_of_memory
 * Calls fn(arg) in protected mode with handler as the message handler; while
 * it runs, the parent's interrupt signal makes it fail, and memory_limit holds
 * strictly. A job the parent interrupted before it started fails before any
 * of its code runs. `interrupted` tells whether the interrupt happened (the
 * job may have failed for that reason; channel.interrupt() says why);
 * `out_of_memory` that the job failed because the heap was full (the handler
 * does not run then, or failed itself). After a failure the heap is
 * collected (but not a full heap: the runner reports it and the child
 * ends), and the runner has HEAP_RESERVE bytes past the limit to report it. */
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
  line_running = 0;
  lua_sethook(L, NULL, 0, 0);
  heap.strict = 0;
  int interrupted = interrupt_pending;
  interrupt_pending = 0;
  /* out of heap: directly, or while the message handler itself allocated */
  int out_of_memory = rc == LUA_ERRMEM || (rc == LUA_ERRERR && heap.refused);
  /* the job's garbage goes before the runner goes on; but not after a full
   * heap (gigabytes take seconds to collect): the runner reports it, and the
   * child ends (runner.lua) */
  if (rc != 0 && !out_of_memory) lua_gc(L, LUA_GCCOLLECT, 0);
  lua_pushboolean(L, rc == 0);
  lua_insert(L, -2);
  lua_pushboolean(L, interrupted);
  lua_pushboolean(L, out_of_memory);
  return 4;
}

/* channel.interrupt_traceback() -> where the last interrupted job stood, or nil */
static int channel_interrupt_traceback(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, TRACEBACK_KEY);
  return 1;
}
