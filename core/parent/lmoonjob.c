/* lmoonjob.c -- the Lua face of the C core: luaopen_moonjob_core.
 *
 * Every Lua-facing function lives here, next to one checker per userdata type
 * that also rejects an object already closed. The loop context is a userdata
 * kept as upvalue 1 of every function (no global Lua state in C).
 *
 * C events reach Lua through one protected-call helper with a traceback
 * handler (lmj_call): an error there is printed and the loop carries on. The
 * Lua layer (moonjob/init.lua) protects user callbacks itself, so an error
 * reaching lmj_call is a bug in moonjob.
 *
 * Objects with libuv handles (processes, timers, inputs) hold a registry
 * reference to themselves while a handle is open, so the garbage collector
 * never frees memory libuv still points to.
 *
 * Caveat: loading the module sets SIGPIPE to "ignore" when it was left at its
 * default. A write to a child that just died must come back as EPIPE, not kill
 * the parent (libuv writes to sockets without MSG_NOSIGNAL). A handler the
 * program installed itself is left alone.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>

#include <hiredis/hiredis.h>

#include "moonjob.h"

#define LMJ_CTX "moonjob.ctx"
#define LMJ_THREAD "moonjob.thread"
#define LMJ_PROCESS "moonjob.process"
#define LMJ_TIMER "moonjob.timer"
#define LMJ_INPUT "moonjob.input"
#define LMJ_OUTPUT "moonjob.output"
#define LMJ_REDIS "moonjob.redis"

/* The loop context is malloc'd and the userdata holds a pointer to it: when
 * the Lua state closes, a request still in libuv's thread pool may point into
 * it, and it must then outlive the state (see lmj_ctx_gc). */
typedef struct {
  mj_ctx_t ctx;
  lua_State *L;      /* the thread running the loop, for callbacks: the caller
                        of core.run while it runs, else the context's own thread */
  int finalizing;    /* the Lua state is closing: no more calls into Lua */
} lmj_ctx_t;

/* ------------------------------------------------------------- helpers --- */

static lmj_ctx_t *lmj_ctx(lua_State *L) {
  return *(lmj_ctx_t **) lua_touserdata(L, lua_upvalueindex(1));
}

/* A number argument that fits [min, max], else a "bad argument" error. */
static double lmj_check_range(lua_State *L, int idx, double min, double max) {
  double v = luaL_checknumber(L, idx);
  if (!(v >= min && v <= max))
    luaL_argerror(L, idx, lua_pushfstring(L, "must be a number from %f to %f", min, max));
  return v;
}

/* The luv "fail" convention: nil, "ECODE: message", "ECODE". */
static int lmj_fail(lua_State *L, int code) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", uv_err_name(code), uv_strerror(code));
  lua_pushstring(L, uv_err_name(code));
  return 3;
}

static int lmj_traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
  return 1;
}

/* Calls the function below its nargs arguments on the loop's thread, in
 * protected mode. On error the traceback goes to stderr; nothing propagates
 * into libuv. */
static void lmj_call(lua_State *L, int nargs) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, lmj_traceback);
  lua_insert(L, base);
  if (lua_pcall(L, nargs, 0, base) != 0) {
    fprintf(stderr, "moonjob: internal error in a callback: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  lua_remove(L, base);
}

static void lmj_unref(lua_State *L, int *ref) {
  luaL_unref(L, LUA_REGISTRYINDEX, *ref);
  *ref = LUA_NOREF;
}

static int lmj_ref_function(lua_State *L, int idx) {
  luaL_checktype(L, idx, LUA_TFUNCTION);
  lua_pushvalue(L, idx);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* ---------------------------------------------------------------- loop --- */

/* What core.run and core.step return for rc: alive (a boolean), or nil,
 * "interrupted", signum, or nil, "reentered". */
static int lmj_push_run_result(lua_State *L, lmj_ctx_t *c, int rc) {
  if (rc == MJ_EINTERRUPTED) {
    lua_pushnil(L);
    lua_pushliteral(L, "interrupted");
    lua_pushinteger(L, c->ctx.stop_signal);
    return 3;
  }
  if (rc == MJ_EREENTERED) {
    lua_pushnil(L);
    lua_pushliteral(L, "reentered");
    return 2;
  }
  lua_pushboolean(L, rc != 0);
  return 1;
}

/* core.run([mode]): "default", "once" (waits for one event) or "nowait". */
static int lmj_run(lua_State *L) {
  static const char *const modes[] = {"default", "once", "nowait", NULL};
  static const uv_run_mode values[] = {UV_RUN_DEFAULT, UV_RUN_ONCE, UV_RUN_NOWAIT};
  lmj_ctx_t *c = lmj_ctx(L);
  uv_run_mode mode = values[luaL_checkoption(L, 1, "default", modes)];
  lua_State *previous = c->L;
  c->L = L;
  int rc = mj_ctx_run(&c->ctx, mode);
  c->L = previous;
  return lmj_push_run_result(L, c, rc);
}

/* core.step() -> alive | nil, why: runs what is ready for a host loop and
 * returns at once (mj_ctx_step); alive is false once nothing is left to watch. */
static int lmj_step(lua_State *L) {
  lmj_ctx_t *c = lmj_ctx(L);
  lua_State *previous = c->L;
  c->L = L;
  int rc = mj_ctx_step(&c->ctx);
  c->L = previous;
  return lmj_push_run_result(L, c, rc);
}

/* core.backend_fd() -> the descriptor a host loop watches (mj_ctx_fd). */
static int lmj_backend_fd(lua_State *L) {
  lua_pushinteger(L, mj_ctx_fd(&lmj_ctx(L)->ctx));
  return 1;
}

/* core.backend_timeout() -> milliseconds until core.step() is due even
 * without the descriptor, or nil when only the descriptor can bring work. */
static int lmj_backend_timeout(lua_State *L) {
  int ms = mj_ctx_timeout(&lmj_ctx(L)->ctx);
  if (ms < 0) lua_pushnil(L);
  else lua_pushinteger(L, ms);
  return 1;
}

/* core.catch_sigint(on): while on, Ctrl-C makes core.run return nil,
 * "interrupted" instead of reaching the program's own SIGINT handler. */
static int lmj_catch_sigint(lua_State *L) {
  mj_ctx_catch_sigint(&lmj_ctx(L)->ctx, lua_toboolean(L, 1));
  return 0;
}

/* core.hold_stop_signals() -> true | false: from now on SIGINT, SIGTERM and
 * SIGHUP only make core.run return nil, "interrupted", signum (false when
 * another Lua state of the process holds them). For the command line. */
static int lmj_hold_stop_signals(lua_State *L) {
  lua_pushboolean(L, mj_ctx_hold_stop_signals(&lmj_ctx(L)->ctx) == 0);
  return 1;
}

/* core.running() -> true inside a callback of the loop (it cannot be run). */
static int lmj_running(lua_State *L) {
  lua_pushboolean(L, lmj_ctx(L)->ctx.running);
  return 1;
}

static int lmj_hrtime(lua_State *L) {
  lua_pushnumber(L, (lua_Number) uv_hrtime());
  return 1;
}

static int lmj_cpu_count(lua_State *L) {
  lua_pushinteger(L, (lua_Integer) uv_available_parallelism());
  return 1;
}

/* core.isatty(fd) -> true when fd is a terminal */
static int lmj_isatty(lua_State *L) {
  lua_pushboolean(L, uv_guess_handle((uv_file) luaL_checkinteger(L, 1)) == UV_TTY);
  return 1;
}

static int lmj_getpid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer) getpid());
  return 1;
}

int luaopen_moonjob_core(lua_State *L);

/* core.child_path() -> the moonjob-child program installed beside this module. */
static int lmj_child_path(lua_State *L) {
  Dl_info info;
  if (dladdr((void *) luaopen_moonjob_core, &info) == 0 || info.dli_fname == NULL)
    return luaL_error(L, "cannot locate the moonjob.core module on disk");
  const char *slash = strrchr(info.dli_fname, '/');
  if (slash == NULL) lua_pushliteral(L, ".");
  else lua_pushlstring(L, info.dli_fname, (size_t) (slash - info.dli_fname));
  lua_pushliteral(L, "/moonjob-child");
  lua_concat(L, 2);
  return 1;
}

/* core.realpath(path) -> the absolute path, symbolic links resolved | nil,
 * err, code. Blocks (a synchronous libuv fs call). */
static int lmj_realpath(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  uv_fs_t req;
  int rc = uv_fs_realpath(NULL, &req, path, NULL);
  if (rc == 0) lua_pushstring(L, req.ptr);
  uv_fs_req_cleanup(&req);
  if (rc != 0) return lmj_fail(L, rc);
  return 1;
}

/* ------------------------------------------------------------- process --- */

typedef struct {
  mj_process_t p;
  lmj_ctx_t *lctx;
  int cb_ref;    /* on_event function */
  int self_ref;  /* keeps the userdata alive until every handle is closed */
  int parts_ref; /* the pieces of a frame arriving in pieces (MJ_PIECE), or LUA_NOREF */
  int nparts;
  int sends_ref; /* strings of queued sends, kept until libuv is done with them */
  int sends_head, sends_tail;
} lmj_process_t;

static lmj_process_t *lmj_check_process(lua_State *L, int idx) {
  lmj_process_t *lp = luaL_checkudata(L, idx, LMJ_PROCESS);
  if (lp->self_ref == LUA_NOREF) luaL_argerror(L, idx, "the process is closed");
  return lp;
}

/* Appends a piece of a frame arriving in pieces to the process's list. */
static void lmj_add_piece(lua_State *L, lmj_process_t *lp, const char *data, size_t len) {
  if (lp->parts_ref == LUA_NOREF) {
    lua_newtable(L);
    lp->parts_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lp->nparts = 0;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, lp->parts_ref);
  lua_pushlstring(L, data, len);
  lua_rawseti(L, -2, ++lp->nparts);
  lua_pop(L, 1);
}

/* Pushes a frame's payload: a string, or the list of its pieces. */
static void lmj_push_payload(lua_State *L, lmj_process_t *lp, const mj_process_event_t *ev) {
  if (!ev->streamed) {
    lua_pushlstring(L, ev->data, ev->len);
    return;
  }
  lmj_add_piece(L, lp, ev->data, ev->len);
  lua_rawgeti(L, LUA_REGISTRYINDEX, lp->parts_ref);
  lmj_unref(L, &lp->parts_ref);
}

/* Keeps the send's strings (stack slots first..last) until its SENT event. */
static void lmj_keep_sent(lua_State *L, lmj_process_t *lp, int first, int last) {
  if (lp->sends_ref == LUA_NOREF) {
    lua_newtable(L);
    lp->sends_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lp->sends_head = lp->sends_tail = 1;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, lp->sends_ref);
  lua_createtable(L, last - first + 1, 0);
  for (int i = first; i <= last; i++) {
    lua_pushvalue(L, i);
    lua_rawseti(L, -2, i - first + 1);
  }
  lua_rawseti(L, -2, lp->sends_tail++);
  lua_pop(L, 1);
}

/* The oldest queued send is over (sends end in order). */
static void lmj_release_sent(lua_State *L, lmj_process_t *lp) {
  if (lp->sends_ref == LUA_NOREF) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, lp->sends_ref);
  lua_pushnil(L);
  lua_rawseti(L, -2, lp->sends_head++);
  lua_pop(L, 1);
}

static void lmj_process_event_cb(mj_process_t *p, const mj_process_event_t *ev) {
  lmj_process_t *lp = (lmj_process_t *) p;
  lua_State *L = lp->lctx->L;
  int nargs = 1;
  if (lp->lctx->finalizing) return;
  if (ev->kind == MJ_PROCESS_PART) return lmj_add_piece(L, lp, ev->data, ev->len);
  if (ev->kind == MJ_PROCESS_SENT) return lmj_release_sent(L, lp);
  lua_rawgeti(L, LUA_REGISTRYINDEX, lp->cb_ref);
  switch (ev->kind) {
    case MJ_PROCESS_SPAWNED:
      lua_pushliteral(L, "spawned");
      lua_pushinteger(L, p->pid);
      nargs = 2;
      break;
    case MJ_PROCESS_FRAME:
      lua_pushliteral(L, "frame");
      lua_pushinteger(L, (lua_Integer) ev->header->type);
      lua_pushnumber(L, (lua_Number) ev->job);
      lmj_push_payload(L, lp, ev);
      nargs = 4;
      if (ev->usage) {
        lua_pushnumber(L, ev->usage->cpu_ms);
        lua_pushnumber(L, ev->usage->max_rss_kb);
        lua_pushnumber(L, ev->usage->wall_ms);
        nargs = 7;
      }
      break;
    case MJ_PROCESS_OUTPUT:
      if (ev->stream == 1) lua_pushliteral(L, "stdout");
      else lua_pushliteral(L, "stderr");
      lua_pushlstring(L, ev->data, ev->len);
      nargs = 2;
      break;
    case MJ_PROCESS_OVERSIZE:
      lua_pushliteral(L, "oversize");
      lua_pushnumber(L, (lua_Number) ev->len);
      nargs = 2;
      break;
    case MJ_PROCESS_PROTOCOL:
      lua_pushliteral(L, "protocol");
      lua_pushlstring(L, ev->data, ev->len);
      nargs = 2;
      break;
    case MJ_PROCESS_EXIT:
      lua_pushliteral(L, "exit");
      lua_pushnumber(L, (lua_Number) ev->exit_status);
      lua_pushinteger(L, ev->term_signal);
      if (ev->data) lua_pushlstring(L, ev->data, ev->len); /* the spawn failed: why */
      else lua_pushnil(L);
      nargs = 4;
      break;
    case MJ_PROCESS_CLOSED:
      lua_pushliteral(L, "closed");
      break;
    case MJ_PROCESS_PART:
    case MJ_PROCESS_SENT:
      break; /* handled above */
  }
  lmj_call(L, nargs);
  if (ev->kind == MJ_PROCESS_CLOSED) {
    lmj_unref(L, &lp->cb_ref);
    lmj_unref(L, &lp->parts_ref);
    lmj_unref(L, &lp->sends_ref);
    lmj_unref(L, &lp->self_ref);
  }
}

/* Reads the list field `name` (stack slot idx: a table of strings, or nil)
 * into a NULL-terminated array allocated as a userdata, so an error raised
 * later leaks nothing; `first` (if not NULL) goes before the list. The
 * strings stay owned by the table, which the caller keeps on the stack. */
static const char **lmj_string_array(lua_State *L, int idx, const char *name, const char *first) {
  if (!lua_isnil(L, idx) && !lua_istable(L, idx))
    luaL_error(L, "core.spawn: '%s' must be a list of strings, not a %s", name, luaL_typename(L, idx));
  int n = lua_isnil(L, idx) ? 0 : (int) lua_objlen(L, idx);
  int extra = first ? 1 : 0;
  const char **a = lua_newuserdata(L, (size_t) (n + extra + 1) * sizeof *a);
  if (first) a[0] = first;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);
    if (lua_type(L, -1) != LUA_TSTRING) /* a number converted here could be collected */
      luaL_error(L, "core.spawn: %s[%d] must be a string, not a %s", name, i, luaL_typename(L, -1));
    a[i - 1 + extra] = lua_tostring(L, -1);
    lua_pop(L, 1); /* the string stays referenced by the table */
  }
  a[n + extra] = NULL;
  return a;
}

/* core.spawn{ file=, args={...}, env={"K=V",...}, max_frame=, on_event=fn }
 *   -> process | nil, err, code */
static int lmj_spawn(lua_State *L) {
  lmj_ctx_t *c = lmj_ctx(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "file");       /* 2 */
  lua_getfield(L, 1, "args");       /* 3 */
  lua_getfield(L, 1, "env");        /* 4 */
  lua_getfield(L, 1, "max_frame");  /* 5 */
  lua_getfield(L, 1, "on_event");   /* 6 */
  if (lua_type(L, 2) != LUA_TSTRING) luaL_error(L, "core.spawn: 'file' must be a string");
  const char *file = lua_tostring(L, 2);
  luaL_checktype(L, 6, LUA_TFUNCTION);
  mj_spawn_options_t opts;
  opts.file = file;
  opts.max_frame = 64u * 1024 * 1024 + 65536;
  if (!lua_isnil(L, 5))
    opts.max_frame = (uint32_t) lmj_check_range(L, 5, 0, UINT32_MAX - MJ_FRAME_HEADER_SIZE);
  opts.args = (char **) lmj_string_array(L, 3, "args", file);   /* 7 */
  opts.env_overrides = lmj_string_array(L, 4, "env", NULL);    /* 8 */

  lmj_process_t *lp = lua_newuserdata(L, sizeof *lp);
  memset(lp, 0, sizeof *lp);
  luaL_getmetatable(L, LMJ_PROCESS);
  lua_setmetatable(L, -2);
  lp->lctx = c;
  lp->parts_ref = lp->sends_ref = LUA_NOREF;
  lp->cb_ref = lmj_ref_function(L, 6);
  lua_pushvalue(L, -1);
  lp->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  int rc = mj_process_spawn(&c->ctx, &lp->p, &opts, lmj_process_event_cb);
  mj_ctx_touch(&c->ctx);
  if (rc != 0) {
    if (lp->p.open_handles == 0) { /* no CLOSED event will come */
      lmj_unref(L, &lp->cb_ref);
      lmj_unref(L, &lp->self_ref);
    }
    return lmj_fail(L, rc);
  }
  return 1;
}

/* process:send(type, job, part1 [, part2 ...]) -> true | nil, err, code */
static int lmj_process_send(lua_State *L) {
  lmj_process_t *lp = lmj_check_process(L, 1);
  uint32_t type = (uint32_t) lmj_check_range(L, 2, 0, MJ_FRAME_TYPE_MASK);
  uint64_t job = (uint64_t) lmj_check_range(L, 3, 0, 9007199254740992.0);
  uv_buf_t parts[4];
  unsigned n = (unsigned) (lua_gettop(L) - 3);
  luaL_argcheck(L, n <= 4, 8, "at most 4 payload parts");
  for (unsigned i = 0; i < n; i++) {
    size_t len;
    const char *s = luaL_checklstring(L, 4 + (int) i, &len);
    parts[i] = uv_buf_init((char *) s, (unsigned) len);
  }
  int rc = mj_process_send(&lp->p, type, job, parts, n);
  mj_ctx_touch(lp->p.ctx);
  if (rc < 0) return lmj_fail(L, rc);
  if (rc == MJ_SEND_QUEUED) lmj_keep_sent(L, lp, 4, 3 + (int) n);
  lua_pushboolean(L, 1);
  return 1;
}

static int lmj_signal_number(lua_State *L, int idx) {
  static const char *const names[] = {"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP",
                                      "SIGUSR1", "SIGUSR2", "SIGSTOP", "SIGCONT", NULL};
  static const int numbers[] = {SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGUSR1, SIGUSR2,
                                SIGSTOP, SIGCONT};
  if (lua_type(L, idx) == LUA_TNUMBER) return (int) lmj_check_range(L, idx, 0, 64);
  return numbers[luaL_checkoption(L, idx, "SIGTERM", names)];
}

/* process:kill([signal [, whole_group]]) -> true | nil, err, code */
static int lmj_process_kill(lua_State *L) {
  lmj_process_t *lp = lmj_check_process(L, 1);
  int rc = mj_process_kill(&lp->p, lmj_signal_number(L, 2), lua_toboolean(L, 3));
  mj_ctx_touch(lp->p.ctx);
  if (rc != 0) return lmj_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* process:set_max_frame(n): frames the child sends may have up to n payload
 * bytes from now on (core.spawn's max_frame). */
static int lmj_process_set_max_frame(lua_State *L) {
  lmj_process_t *lp = lmj_check_process(L, 1);
  lp->p.max_frame = (uint32_t) lmj_check_range(L, 2, 0, UINT32_MAX - MJ_FRAME_HEADER_SIZE);
  return 0;
}

/* process:end_input() -> true | nil, err, code: the child reads end-of-file. */
static int lmj_process_end_input(lua_State *L) {
  lmj_process_t *lp = lmj_check_process(L, 1);
  int rc = mj_process_end_input(&lp->p);
  mj_ctx_touch(lp->p.ctx);
  if (rc != 0) return lmj_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* process:started(job) -> true when the child started job `job` (it may be
 * running it, or have died running it), false when not yet, nil when that job
 * is not in flight to this child. */
static int lmj_process_started(lua_State *L) {
  lmj_process_t *lp = lmj_check_process(L, 1);
  uint64_t job = (uint64_t) lmj_check_range(L, 2, 0, 9007199254740992.0);
  int started = mj_process_started(&lp->p, job);
  if (started < 0) lua_pushnil(L);
  else lua_pushboolean(L, started);
  return 1;
}

/* process:recall([from]) -> { job, ... }: the jobs in flight the child has
 * not started (from job `from` on; all without it), taken back (it will
 * never start them), oldest first. */
static int lmj_process_recall(lua_State *L) {
  lmj_process_t *lp = lmj_check_process(L, 1);
  uint64_t jobs[MJ_MAX_INFLIGHT];
  uint64_t from = lua_isnoneornil(L, 2) ? 0 : (uint64_t) lmj_check_range(L, 2, 1, 9007199254740992.0);
  unsigned n = mj_process_recall(&lp->p, from, jobs, MJ_MAX_INFLIGHT);
  lua_createtable(L, (int) n, 0);
  for (unsigned i = 0; i < n; i++) {
    lua_pushnumber(L, (lua_Number) jobs[i]);
    lua_rawseti(L, -2, (int) i + 1);
  }
  return 1;
}

/* Where batch job `job` (argument 2) stands in process 1's child: 0, or -1
 * when it is not a batch of lines the child started. */
static int lmj_batch_state(lua_State *L, lmj_process_t **lp, mj_batch_state_t *state) {
  *lp = lmj_check_process(L, 1);
  uint64_t job = (uint64_t) lmj_check_range(L, 2, 0, 9007199254740992.0);
  return mj_process_batch(&(*lp)->p, job, state);
}

/* process:batch(job) -> started, kept_lines, kept_text, line_ms: where batch
 * job `job` stands in the child (readable after its death too), and how long
 * ago (ms) its last line started; nil when `job` is not a batch of lines the
 * child started. */
static int lmj_process_batch(lua_State *L) {
  lmj_process_t *lp;
  mj_batch_state_t state;
  if (lmj_batch_state(L, &lp, &state) != 0) return 0;
  lua_pushnumber(L, state.started);
  lua_pushnumber(L, state.kept_lines);
  lua_pushlstring(L, state.kept, state.kept_bytes);
  if (!mj_process_batch_same(&lp->p, &state)) return 0; /* the child moved on meanwhile */
  uint64_t now = uv_hrtime();
  lua_pushnumber(L, now > state.line_started_ns ? (double) (now - state.line_started_ns) / 1e6 : 0);
  return 4;
}

/* process:batch_started(job) -> the lines of batch job `job` the child has
 * started, or nil when the shared area is not that batch's: what
 * process:batch gives first, without copying the kept results (the command
 * line asks it for each line a batch prints). */
static int lmj_process_batch_started(lua_State *L) {
  lmj_process_t *lp;
  mj_batch_state_t state;
  if (lmj_batch_state(L, &lp, &state) != 0) return 0;
  lua_pushnumber(L, state.started);
  return 1;
}

/* process:batch_cut(job) -> lines kept: the child starts no lines of batch
 * job `job` past that many (its lines started, at least 1); nil when `job`
 * is not a batch the child started. */
static int lmj_process_batch_cut(lua_State *L) {
  lmj_process_t *lp = lmj_check_process(L, 1);
  uint64_t job = (uint64_t) lmj_check_range(L, 2, 0, 9007199254740992.0);
  int started = mj_process_batch_cut(&lp->p, job);
  if (started < 0) return 0;
  lua_pushnumber(L, started);
  return 1;
}

static int lmj_process_tostring(lua_State *L) {
  lmj_process_t *lp = luaL_checkudata(L, 1, LMJ_PROCESS);
  lua_pushfstring(L, "<moonjob.process pid %d%s>", lp->p.pid,
                  lp->p.exited ? " exited" : "");
  return 1;
}

/* --------------------------------------------------------------- timer --- */

typedef struct {
  uv_timer_t timer;
  lmj_ctx_t *lctx;
  int cb_ref;
  int self_ref;
} lmj_timer_t;

static lmj_timer_t *lmj_check_timer(lua_State *L, int idx) {
  lmj_timer_t *t = luaL_checkudata(L, idx, LMJ_TIMER);
  if (t->self_ref == LUA_NOREF) luaL_argerror(L, idx, "the timer is closed");
  return t;
}

static void lmj_timer_cb(uv_timer_t *handle) {
  lmj_timer_t *t = handle->data;
  lua_State *L = t->lctx->L;
  if (t->lctx->finalizing) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->cb_ref);
  lmj_call(L, 0);
}

/* core.timer(fn) -> timer; fn runs on each expiry. */
static int lmj_timer_new(lua_State *L) {
  lmj_ctx_t *c = lmj_ctx(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lmj_timer_t *t = lua_newuserdata(L, sizeof *t);
  luaL_getmetatable(L, LMJ_TIMER);
  lua_setmetatable(L, -2);
  uv_timer_init(&c->ctx.loop, &t->timer);
  t->timer.data = t;
  t->lctx = c;
  t->cb_ref = lmj_ref_function(L, 1);
  lua_pushvalue(L, -1);
  t->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

/* timer:start(ms [, repeat_ms]): ms from now. libuv counts from the loop's
 * cached time, which is as old as the loop's last turn: a program that did
 * not run the loop for a while (a REPL at its prompt, a blocking call) would
 * see the timer fire at once. So the cached time is brought up to date. */
static int lmj_timer_start(lua_State *L) {
  lmj_timer_t *t = lmj_check_timer(L, 1);
  double ms = lmj_check_range(L, 2, 0, 1e15);
  double rep = lua_isnoneornil(L, 3) ? 0 : lmj_check_range(L, 3, 0, 1e15);
  uv_update_time(t->timer.loop);
  uv_timer_start(&t->timer, lmj_timer_cb, (uint64_t) ms, (uint64_t) rep);
  mj_ctx_touch(&t->lctx->ctx);
  return 0;
}

static int lmj_timer_stop(lua_State *L) {
  uv_timer_stop(&lmj_check_timer(L, 1)->timer);
  return 0;
}

/* timer:unref(): an active timer no longer keeps a blocking run going. */
static int lmj_timer_unref(lua_State *L) {
  uv_unref((uv_handle_t *) &lmj_check_timer(L, 1)->timer);
  return 0;
}

static void lmj_timer_close_cb(uv_handle_t *handle) {
  lmj_timer_t *t = handle->data;
  lua_State *L = t->lctx->L;
  if (t->lctx->finalizing) return;
  lmj_unref(L, &t->self_ref);
}

static int lmj_timer_close(lua_State *L) {
  lmj_timer_t *t = luaL_checkudata(L, 1, LMJ_TIMER);
  if (t->cb_ref == LUA_NOREF) return 0;
  lmj_unref(L, &t->cb_ref);
  uv_close((uv_handle_t *) &t->timer, lmj_timer_close_cb);
  mj_ctx_touch(&t->lctx->ctx);
  return 0;
}

/* --------------------------------------------------------------- input --- */

typedef struct {
  mj_input_t in;
  lmj_ctx_t *lctx;
  int line_ref, end_ref, self_ref;
} lmj_input_t;

static lmj_input_t *lmj_check_input(lua_State *L, int idx) {
  lmj_input_t *li = luaL_checkudata(L, idx, LMJ_INPUT);
  if (li->line_ref == LUA_NOREF) luaL_argerror(L, idx, "the input is closed");
  return li;
}

static void lmj_line_cb(mj_input_t *in, const char *line, size_t len, int too_long,
                        unsigned count) {
  lmj_input_t *li = (lmj_input_t *) in;
  lua_State *L = li->lctx->L;
  if (li->lctx->finalizing) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, li->line_ref);
  if (too_long) lua_pushnil(L);
  else lua_pushlstring(L, line, len);
  lua_pushnumber(L, (lua_Number) len);
  lua_pushnumber(L, (lua_Number) count);
  lmj_call(L, 3);
}

static void lmj_input_end_cb(mj_input_t *in, int error) {
  lmj_input_t *li = (lmj_input_t *) in;
  lua_State *L = li->lctx->L;
  if (li->lctx->finalizing) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, li->end_ref);
  if (error) lua_pushfstring(L, "%s: %s", uv_err_name(error), uv_strerror(error));
  else lua_pushnil(L);
  lmj_call(L, 1);
}

/* The C side let go of everything: the userdata may be collected. */
static void lmj_input_freed_cb(mj_input_t *in) {
  lmj_input_t *li = (lmj_input_t *) in;
  if (li->lctx->finalizing) return;
  lmj_unref(li->lctx->L, &li->self_ref);
}

/* core.input(fd, max_line, on_line(line|nil, len, count), on_end(err|nil)) -> input,
 * paused: call input:resume() to start. A nil line was longer than max_line.
 * The input owns fd when it is above 2 (closed by input:close()). */
static int lmj_input_new(lua_State *L) {
  lmj_ctx_t *c = lmj_ctx(L);
  int fd = (int) lmj_check_range(L, 1, 0, INT_MAX);
  size_t max_line = (size_t) lmj_check_range(L, 2, 1, 2147483648.0);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  luaL_checktype(L, 4, LUA_TFUNCTION);
  lmj_input_t *li = lua_newuserdata(L, sizeof *li);
  luaL_getmetatable(L, LMJ_INPUT);
  lua_setmetatable(L, -2);
  mj_input_init(&c->ctx, &li->in, fd, max_line, lmj_line_cb, lmj_input_end_cb);
  li->in.on_freed = lmj_input_freed_cb;
  li->lctx = c;
  li->line_ref = lmj_ref_function(L, 3);
  li->end_ref = lmj_ref_function(L, 4);
  lua_pushvalue(L, -1);
  li->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

static int lmj_input_resume(lua_State *L) {
  lmj_input_t *li = lmj_check_input(L, 1);
  int rc = mj_input_resume(&li->in);
  mj_ctx_touch(&li->lctx->ctx);
  if (rc != 0) return lmj_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* input:batch(n): deliver up to n whole lines at once, as one block (the
 * callback's third argument counts them); 1 delivers each line alone. */
static int lmj_input_batch(lua_State *L) {
  lmj_check_input(L, 1)->in.batch_lines = (unsigned) lmj_check_range(L, 2, 1, 1048575);
  return 0;
}

static int lmj_input_pause(lua_State *L) {
  mj_input_pause(&lmj_check_input(L, 1)->in);
  return 0;
}

/* input:close(): no more lines, also from inside on_line; the memory and the
 * descriptor go once no read is in flight. */
static int lmj_input_close(lua_State *L) {
  lmj_input_t *li = luaL_checkudata(L, 1, LMJ_INPUT);
  if (li->line_ref == LUA_NOREF) return 0;
  lmj_unref(L, &li->line_ref); /* a callback running now keeps its function on the stack */
  lmj_unref(L, &li->end_ref);
  mj_ctx_touch(&li->lctx->ctx);
  mj_input_free(&li->in);      /* may call lmj_input_freed_cb at once */
  return 0;
}

/* core.open(path) -> fd | nil, err, code: a file opened for reading, for core.input. */
static int lmj_open(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  uv_fs_t req;
  int fd = uv_fs_open(NULL, &req, path, O_RDONLY | O_CLOEXEC, 0, NULL);
  uv_fs_req_cleanup(&req);
  if (fd < 0) return lmj_fail(L, fd);
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) { /* opens, but reads fail (libuv aborts on it) */
    close(fd);
    return lmj_fail(L, UV_EISDIR);
  }
  lua_pushinteger(L, fd);
  return 1;
}

/* -------------------------------------------------------------- output --- */

typedef struct {
  mj_output_t *out; /* NULL once released */
} lmj_output_t;

static mj_output_t *lmj_check_output(lua_State *L, int idx) {
  lmj_output_t *lo = luaL_checkudata(L, idx, LMJ_OUTPUT);
  if (lo->out == NULL) luaL_argerror(L, idx, "the output is released");
  return lo->out;
}

/* core.output(fd) -> output: ordered writes that never block the loop. The
 * output outlives its userdata until what was written to it is out. */
static int lmj_output_new(lua_State *L) {
  lmj_ctx_t *c = lmj_ctx(L);
  int fd = (int) lmj_check_range(L, 1, 0, INT_MAX);
  lmj_output_t *lo = lua_newuserdata(L, sizeof *lo);
  lo->out = NULL;
  luaL_getmetatable(L, LMJ_OUTPUT);
  lua_setmetatable(L, -2);
  lo->out = mj_output_new(&c->ctx, fd);
  if (lo->out == NULL) return luaL_error(L, "not enough memory for an output");
  return 1;
}

/* output:write(s, ...) -> true | nil, err, code (the first write error,
 * sticky). The pieces go out together, in one write when nothing is in flight. */
static int lmj_output_write(lua_State *L) {
  mj_output_t *out = lmj_check_output(L, 1);
  int n = lua_gettop(L), rc = 0;
  for (int i = 2; i <= n && rc == 0; i++) {
    size_t len;
    const char *s = luaL_checklstring(L, i, &len);
    rc = mj_output_append(out, s, len);
  }
  if (rc == 0) rc = mj_output_start(out);
  mj_ctx_touch(out->ctx);
  if (rc != 0) return lmj_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* output:pending() -> bytes not yet written */
static int lmj_output_pending(lua_State *L) {
  mj_output_t *o = lmj_check_output(L, 1);
  if (o->error) return lmj_fail(L, o->error);
  lua_pushnumber(L, (lua_Number) (o->pending_len + o->inflight_len - o->inflight_off));
  return 1;
}

static int lmj_output_gc(lua_State *L) {
  lmj_output_t *lo = luaL_checkudata(L, 1, LMJ_OUTPUT);
  if (lo->out) mj_output_release(lo->out);
  lo->out = NULL;
  return 0;
}

/* --------------------------------------------------------------- redis --- */

/* A connection's memory outlives its userdata's reach: it is freed once
 * hiredis and libuv let go of it (on_freed), after conn:close() or when the
 * context closes. The userdata holds a pointer to it, NULL once freed. */
typedef struct {
  mj_redis_t r;
  lmj_ctx_t *lctx;
  int event_ref;
  int self_ref;
} lmj_redis_t;

/* The connection behind the userdata, or NULL once closed (or closing). */
static lmj_redis_t *lmj_open_redis(lua_State *L, int idx) {
  lmj_redis_t **slot = luaL_checkudata(L, idx, LMJ_REDIS);
  if (*slot == NULL || (*slot)->r.closed || (*slot)->r.close_pending) return NULL;
  return *slot;
}

static lmj_redis_t *lmj_check_redis(lua_State *L, int idx) {
  lmj_redis_t *lr = lmj_open_redis(L, idx);
  if (lr == NULL) luaL_argerror(L, idx, "the connection is closed");
  return lr;
}

/* A reply as Lua values: strings and statuses as strings, integers as
 * numbers, nil as nil (false inside an array), arrays as tables with n, an
 * error inside an array as { err = message }. hiredis bounds the depth. */
static void lmj_push_reply(lua_State *L, const redisReply *reply, int nested) {
  switch (reply->type) {
  case REDIS_REPLY_STRING:
  case REDIS_REPLY_STATUS:
    lua_pushlstring(L, reply->str, reply->len);
    break;
  case REDIS_REPLY_INTEGER:
    lua_pushnumber(L, (lua_Number) reply->integer);
    break;
  case REDIS_REPLY_ARRAY:
    luaL_checkstack(L, 4, "redis reply");
    lua_createtable(L, reply->elements > INT_MAX ? 0 : (int) reply->elements, 1);
    for (size_t i = 0; i < reply->elements; i++) {
      lmj_push_reply(L, reply->element[i], 1);
      lua_rawseti(L, -2, (int) i + 1);
    }
    lua_pushnumber(L, (lua_Number) reply->elements);
    lua_setfield(L, -2, "n");
    break;
  case REDIS_REPLY_ERROR:
    lua_createtable(L, 0, 1);
    lua_pushlstring(L, reply->str, reply->len);
    lua_setfield(L, -2, "err");
    break;
  default:
    if (nested) lua_pushboolean(L, 0);
    else lua_pushnil(L);
  }
}

/* cb(value) for a reply; cb(nil, message, "reply") for an error reply;
 * cb(nil, why, "connection") when the connection ended first. */
static void lmj_redis_reply_cb(mj_redis_t *r, intptr_t tag, int persistent,
                               const redisReply *reply, const char *error) {
  lmj_redis_t *lr = r->data;
  lua_State *L = lr->lctx->L;
  if (lr->lctx->finalizing) return;
  int ref = (int) tag;
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  if (!persistent || reply == NULL) luaL_unref(L, LUA_REGISTRYINDEX, ref);
  if (reply == NULL) {
    lua_pushnil(L);
    lua_pushstring(L, error);
    lua_pushliteral(L, "connection");
    lmj_call(L, 3);
  } else if (reply->type == REDIS_REPLY_ERROR) {
    lua_pushnil(L);
    lua_pushlstring(L, reply->str, reply->len);
    lua_pushliteral(L, "reply");
    lmj_call(L, 3);
  } else {
    lmj_push_reply(L, reply, 0);
    lmj_call(L, 1);
  }
}

/* on_event("up") once connected; on_event("down", why) once down for good. */
static void lmj_redis_state_cb(mj_redis_t *r, int up, const char *why) {
  lmj_redis_t *lr = r->data;
  lua_State *L = lr->lctx->L;
  if (lr->lctx->finalizing || lr->event_ref == LUA_NOREF) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, lr->event_ref);
  lua_pushstring(L, up ? "up" : "down");
  if (why) lua_pushstring(L, why);
  else lua_pushnil(L);
  lmj_call(L, 2);
}

static void lmj_redis_freed_cb(mj_redis_t *r) {
  lmj_redis_t *lr = r->data;
  if (!lr->lctx->finalizing) {
    lua_State *L = lr->lctx->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, lr->self_ref);
    lmj_redis_t **slot = lua_touserdata(L, -1);
    if (slot != NULL) *slot = NULL;
    lua_pop(L, 1);
    lmj_unref(L, &lr->self_ref);
    lmj_unref(L, &lr->event_ref);
  }
  free(lr);
}

/* core.redis(host, port, timeout_ms, max_reply, on_event) -> conn | nil, err */
static int lmj_redis_new(lua_State *L) {
  lmj_ctx_t *c = lmj_ctx(L);
  const char *host = luaL_checkstring(L, 1);
  int port = (int) lmj_check_range(L, 2, 1, 65535);
  double timeout_ms = lmj_check_range(L, 3, 1, 1e12);
  double max_reply = lmj_check_range(L, 4, 1024, 1e15);
  luaL_checktype(L, 5, LUA_TFUNCTION);
  lmj_redis_t **slot = lua_newuserdata(L, sizeof *slot);
  *slot = NULL;
  luaL_getmetatable(L, LMJ_REDIS);
  lua_setmetatable(L, -2);
  lmj_redis_t *lr = calloc(1, sizeof *lr);
  if (lr == NULL) return lmj_fail(L, UV_ENOMEM);
  lr->lctx = c;
  lr->r.data = lr;
  lr->r.on_reply = lmj_redis_reply_cb;
  lr->r.on_state = lmj_redis_state_cb;
  lr->r.on_freed = lmj_redis_freed_cb;
  int rc = mj_redis_open(&c->ctx, &lr->r, host, port, (uint64_t) timeout_ms, (size_t) max_reply);
  mj_ctx_touch(&c->ctx);
  if (rc != 0) {
    free(lr);
    return lmj_fail(L, rc);
  }
  *slot = lr;
  lr->event_ref = lmj_ref_function(L, 5);
  lua_pushvalue(L, -1);
  lr->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

/* Sends args (a table of strings or numbers) with cb for its reply(ies). */
static int lmj_redis_send(lua_State *L, int persistent) {
  enum { ON_STACK = 16 };
  lmj_redis_t *lr = lmj_check_redis(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  int argc = (int) lua_objlen(L, 2);
  if (argc < 1) luaL_argerror(L, 2, "a command needs at least its name");
  const char *argv_stack[ON_STACK];
  size_t lens_stack[ON_STACK];
  const char **argv = argv_stack;
  size_t *lens = lens_stack;
  if (argc > ON_STACK) {
    argv = malloc(argc * sizeof *argv);
    lens = malloc(argc * sizeof *lens);
    if (argv == NULL || lens == NULL) {
      free(argv);
      free(lens);
      return lmj_fail(L, UV_ENOMEM);
    }
  }
  int bad = 0;
  for (int i = 0; i < argc && !bad; i++) {
    lua_rawgeti(L, 2, i + 1);
    int t = lua_type(L, -1);
    if (t == LUA_TSTRING || t == LUA_TNUMBER) {
      if (t == LUA_TNUMBER) { /* the string made from it must outlive this loop: */
        lua_tolstring(L, -1, NULL);
        lua_pushvalue(L, -1);
        lua_rawseti(L, 2, i + 1); /* the table keeps it (the caller's table is changed) */
      }
      argv[i] = lua_tolstring(L, -1, &lens[i]); /* a string the table holds */
    } else {
      bad = i + 1;
    }
    lua_pop(L, 1);
  }
  int rc = UV_EINVAL;
  if (!bad) {
    int ref = lmj_ref_function(L, 3);
    rc = mj_redis_command(&lr->r, argc, argv, lens, ref, persistent);
    mj_ctx_touch(&lr->lctx->ctx);
    if (rc != 0) luaL_unref(L, LUA_REGISTRYINDEX, ref);
  }
  if (argv != argv_stack) {
    free(argv);
    free(lens);
  }
  if (bad) return luaL_argerror(L, 2, lua_pushfstring(L, "argument %d is not a string or a number", bad));
  if (rc != 0) return lmj_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* conn:command(args, cb) -> true | nil, err: cb gets the reply (see above). */
static int lmj_redis_command(lua_State *L) {
  return lmj_redis_send(L, 0);
}

/* conn:subscribe({ "SUBSCRIBE", channel }, cb): cb gets every message. */
static int lmj_redis_subscribe(lua_State *L) {
  return lmj_redis_send(L, 1);
}

/* conn:close(): commands in flight get (nil, "closed", "connection") now. */
static int lmj_redis_close(lua_State *L) {
  lmj_redis_t *lr = lmj_open_redis(L, 1);
  if (lr != NULL) {
    mj_ctx_t *ctx = &lr->lctx->ctx; /* lr may be freed by the close */
    mj_redis_close(&lr->r);
    mj_ctx_touch(ctx);
  }
  return 0;
}

static int lmj_redis_pending(lua_State *L) {
  lua_pushnumber(L, lmj_check_redis(L, 1)->r.pending);
  return 1;
}

/* ---------------------------------------------------------------- open --- */

static void lmj_new_class(lua_State *L, const char *name, const luaL_Reg *methods,
                          lua_CFunction tostring, lua_CFunction gc) {
  luaL_newmetatable(L, name);
  lua_newtable(L);
  for (; methods->name; methods++) {
    lua_pushvalue(L, -3); /* ctx as upvalue 1 */
    lua_pushcclosure(L, methods->func, 1);
    lua_setfield(L, -2, methods->name);
  }
  lua_setfield(L, -2, "__index");
  if (tostring) {
    lua_pushcfunction(L, tostring);
    lua_setfield(L, -2, "__tostring");
  }
  if (gc) {
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
}

static int lmj_generic_tostring(lua_State *L) {
  lua_getmetatable(L, 1);
  lua_pushliteral(L, "__name");
  lua_rawget(L, -2);
  lua_pushfstring(L, "<%s %p>", lua_tostring(L, -1), lua_topointer(L, 1));
  return 1;
}

static void lmj_set_name(lua_State *L, const char *name) {
  luaL_getmetatable(L, name);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
}

static void lmj_push_frame_types(lua_State *L) {
  lua_newtable(L);
#define LMJ_SET_TYPE(name)              \
  lua_pushinteger(L, MJ_FRAME_##name); \
  lua_setfield(L, -2, #name);
  MJ_FRAME_TYPES(LMJ_SET_TYPE)
#undef LMJ_SET_TYPE
  lua_pushinteger(L, MJ_MAX_INFLIGHT); /* JOB frames one child may hold at once */
  lua_setfield(L, -2, "MAX_INFLIGHT");
  lua_pushinteger(L, MJ_BATCH_AREA); /* a batch's kept results, at most */
  lua_setfield(L, -2, "BATCH_AREA");
}

static void lmj_ignore_sigpipe(void) {
  struct sigaction current;
  if (sigaction(SIGPIPE, NULL, &current) == 0 && current.sa_handler == SIG_DFL)
    signal(SIGPIPE, SIG_IGN);
}

/* The state is closing (or the context was dropped): every child is killed
 * and reaped, every handle closed, the loop closed. When requests are still in
 * libuv's thread pool (a read blocked on a terminal), the context is left
 * allocated: they point into it. */
static int lmj_ctx_gc(lua_State *L) {
  lmj_ctx_t **slot = lua_touserdata(L, 1);
  lmj_ctx_t *c = *slot;
  if (c == NULL) return 0;
  *slot = NULL;
  c->finalizing = 1;
  if (mj_ctx_close(&c->ctx) == 0) free(c);
  return 0;
}

/* Pushes a new loop context: a userdata holding a pointer to it. */
static void lmj_new_ctx(lua_State *L) {
  lmj_ctx_t **slot = lua_newuserdata(L, sizeof *slot);
  *slot = NULL;
  luaL_newmetatable(L, LMJ_CTX);
  lua_pushcfunction(L, lmj_ctx_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lmj_ctx_t *c = calloc(1, sizeof *c);
  if (c == NULL) luaL_error(L, "not enough memory for the event loop");
  int rc = mj_ctx_init(&c->ctx);
  if (rc != 0) {
    free(c);
    luaL_error(L, "cannot create the event loop: %s", uv_strerror(rc));
  }
  /* Callbacks outside core.run (input:resume delivering lines, say) run on
   * a thread of the context's own, anchored in the registry: the thread that
   * first required the module may be a coroutine long collected. */
  c->L = lua_newthread(L);
  lua_setfield(L, LUA_REGISTRYINDEX, LMJ_THREAD);
  *slot = c;
}

/* Keeps this module (and libuv with it) loaded until the process ends: a
 * signal handler or a thread pool thread of libuv must never outlive its
 * code, whatever order the Lua state closes in. */
static void lmj_pin_module(void) {
  Dl_info info;
  if (dladdr((void *) luaopen_moonjob_core, &info) != 0 && info.dli_fname != NULL)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NODELETE);
}

int luaopen_moonjob_core(lua_State *L) {
  static const luaL_Reg functions[] = {
    {"run", lmj_run}, {"step", lmj_step}, {"backend_fd", lmj_backend_fd},
    {"backend_timeout", lmj_backend_timeout}, {"catch_sigint", lmj_catch_sigint}, {"hold_stop_signals", lmj_hold_stop_signals}, {"running", lmj_running}, {"hrtime", lmj_hrtime}, {"cpu_count", lmj_cpu_count},
    {"getpid", lmj_getpid}, {"isatty", lmj_isatty}, {"child_path", lmj_child_path}, {"realpath", lmj_realpath},
    {"spawn", lmj_spawn},
    {"timer", lmj_timer_new}, {"input", lmj_input_new}, {"open", lmj_open}, {"output", lmj_output_new},
    {"redis", lmj_redis_new},
    {NULL, NULL}};
  static const luaL_Reg process_methods[] = {
    {"send", lmj_process_send}, {"kill", lmj_process_kill},
    {"end_input", lmj_process_end_input}, {"set_max_frame", lmj_process_set_max_frame},
    {"started", lmj_process_started}, {"recall", lmj_process_recall},
    {"batch", lmj_process_batch}, {"batch_started", lmj_process_batch_started},
    {"batch_cut", lmj_process_batch_cut}, {NULL, NULL}};
  static const luaL_Reg timer_methods[] = {
    {"start", lmj_timer_start}, {"stop", lmj_timer_stop}, {"unref", lmj_timer_unref},
    {"close", lmj_timer_close}, {NULL, NULL}};
  static const luaL_Reg input_methods[] = {
    {"resume", lmj_input_resume}, {"pause", lmj_input_pause}, {"batch", lmj_input_batch}, {"close", lmj_input_close},
    {NULL, NULL}};
  static const luaL_Reg redis_methods[] = {
    {"command", lmj_redis_command}, {"subscribe", lmj_redis_subscribe},
    {"close", lmj_redis_close}, {"pending", lmj_redis_pending}, {NULL, NULL}};
  static const luaL_Reg output_methods[] = {
    {"write", lmj_output_write}, {"pending", lmj_output_pending}, {NULL, NULL}};

  lmj_ignore_sigpipe();
  lmj_pin_module();
  /* One loop per Lua state, created on first require, kept in the registry. */
  lua_getfield(L, LUA_REGISTRYINDEX, LMJ_CTX);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lmj_new_ctx(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, LMJ_CTX);
  }
  lmj_new_class(L, LMJ_PROCESS, process_methods, lmj_process_tostring, NULL);
  lmj_new_class(L, LMJ_TIMER, timer_methods, lmj_generic_tostring, NULL);
  lmj_new_class(L, LMJ_INPUT, input_methods, lmj_generic_tostring, NULL);
  lmj_new_class(L, LMJ_OUTPUT, output_methods, lmj_generic_tostring, lmj_output_gc);
  lmj_set_name(L, LMJ_TIMER);
  lmj_set_name(L, LMJ_INPUT);
  lmj_set_name(L, LMJ_OUTPUT);
  lmj_new_class(L, LMJ_REDIS, redis_methods, lmj_generic_tostring, NULL);
  lmj_set_name(L, LMJ_REDIS);

  lua_newtable(L);
  for (const luaL_Reg *f = functions; f->name; f++) {
    lua_pushvalue(L, -2);
    lua_pushcclosure(L, f->func, 1);
    lua_setfield(L, -2, f->name);
  }
  lmj_push_frame_types(L);
  lua_setfield(L, -2, "frame");
  return 1;
}
