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
 * Caveat: hooks do not run in JIT-compiled loops nor inside C functions:
 * there the parent's hard kill is what ends the job.
 */
#include "child.h"

#define TRACEBACK_KEY "moonjob.interrupt_traceback"

static lua_State *volatile running_L;          /* set while channel.run runs a job */
static volatile sig_atomic_t interrupt_pending; /* the parent asked to stop the job */

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

/* channel.interrupt_traceback() -> where the last interrupted job stood, or nil */
static int channel_interrupt_traceback(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, TRACEBACK_KEY);
  return 1;
}
