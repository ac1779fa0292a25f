/* loop.c -- the module's functions: running the loop, and facts of the process.
 *
 * core.run and core.step (the loop, driven by core.run or by a host loop
 * through core.backend_fd and core.backend_timeout), the stop signals
 * (core.catch_sigint, core.hold_stop_signals), and small facts a program asks
 * for: the clock, the CPU count, a pid, a terminal, a real path, and where
 * the child program is installed (beside this module).
 */
#include "bind.h"

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

/* core.total_memory() -> the machine's memory in bytes, and the limit a
 * control group sets on this process's (libuv's reading; 0 when none is
 * known). moonjob.pool.options makes the default memory_limit of them. */
static int lmj_total_memory(lua_State *L) {
  lua_pushnumber(L, (lua_Number) uv_get_total_memory());
  lua_pushnumber(L, (lua_Number) uv_get_constrained_memory());
  return 2;
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
