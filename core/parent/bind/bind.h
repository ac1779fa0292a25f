/* bind.h -- what the Lua bindings share: the context, calls into Lua, checks.
 *
 * The bindings are one translation unit: module.c #includes one file per
 * type, as luv does, so everything here and in them is static, and reaches
 * Lua only through module.c's registration tables. Each binding file
 * includes this header too, so that it reads (and an editor parses it) on its
 * own; none is compiled on its own.
 *
 * The loop context is a userdata kept as upvalue 1 of every function (no
 * global Lua state in C): lmj_ctx. C events reach Lua through one
 * protected-call helper with a traceback handler (lmj_call): an error there
 * is printed and the loop carries on. The Lua layer (moonjob/init.lua)
 * protects user callbacks itself, so an error reaching lmj_call is a bug in
 * moonjob. Runtime failures return luv's "fail" triple (lmj_fail); misuse
 * raises (lmj_check_range, the checker of each type, which also rejects an
 * object already closed).
 *
 * Objects with libuv handles (processes, timers, inputs) hold a registry
 * reference to themselves while a handle is open, so the garbage collector
 * never frees memory libuv still points to.
 */
#ifndef MJ_BIND_H
#define MJ_BIND_H

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
 * it, and it must then outlive the state (see lmj_ctx_gc, module.c). */
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
static char lmj_traceback_key; /* its address keys the handler in the registry */

/* Pushes the traceback handler, made once per Lua state: a C function pushed
 * anew is a new object, and lmj_call runs for every frame a child sends. */
static void lmj_push_traceback(lua_State *L) {
  lua_pushlightuserdata(L, &lmj_traceback_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (!lua_isnil(L, -1)) return;
  lua_pop(L, 1);
  lua_pushcfunction(L, lmj_traceback);
  lua_pushlightuserdata(L, &lmj_traceback_key);
  lua_pushvalue(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
}

static void lmj_call(lua_State *L, int nargs) {
  int base = lua_gettop(L) - nargs;
  lmj_push_traceback(L);
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

#endif
