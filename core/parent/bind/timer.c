/* timer.c -- moonjob.timer: core.timer, a libuv timer that calls a Lua function.
 *
 * Caveat: a timer holds a reference to itself until timer:close(): one that
 * is dropped without being closed stays alive, and may still fire.
 */
#include "bind.h"

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
