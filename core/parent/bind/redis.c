/* redis.c -- moonjob.redis: core.redis, one connection, replies as Lua values.
 *
 * Mechanism only, as the core's redis.c: commands are sent as argument
 * vectors and each reply goes to the callback given with its command;
 * reconnecting and what the commands mean are lua/moonjob/redis/client.lua's.
 * A table of TLS options makes the connection speak TLS (redis_tls.c).
 */
#include "bind.h"

#include <hiredis/hiredis.h>

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
  if (*slot == NULL || (*slot)->r.closed) return NULL;
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

/* The TLS options at idx (a table: ca, cert, key, servername, each a string
 * or nil; nothing else), into o. Raises on misuse. */
static void lmj_check_tls(lua_State *L, int idx, mj_redis_tls_options_t *o) {
  static const char *const names[] = {"ca", "cert", "key", "servername"};
  const char **fields[] = {&o->ca, &o->cert, &o->key, &o->servername};
  luaL_checktype(L, idx, LUA_TTABLE);
  memset(o, 0, sizeof *o);
  for (lua_pushnil(L); lua_next(L, idx) != 0; lua_pop(L, 1)) {
    size_t i = 0;
    const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "";
    while (i < 4 && strcmp(key, names[i]) != 0) i++;
    if (i == 4) luaL_argerror(L, idx, "TLS options are ca, cert, key and servername");
    if (lua_type(L, -1) != LUA_TSTRING || lua_objlen(L, -1) == 0 || strlen(lua_tostring(L, -1)) != lua_objlen(L, -1))
      luaL_argerror(L, idx, lua_pushfstring(L, "TLS option %s must be a non-empty string", key));
    *fields[i] = lua_tostring(L, -1); /* the table holds it */
  }
}

/* core.redis(host, port, timeout_ms, max_reply, on_event [, tls]) -> conn | nil, err */
static int lmj_redis_new(lua_State *L) {
  lmj_ctx_t *c = lmj_ctx(L);
  const char *host = luaL_checkstring(L, 1);
  int port = (int) lmj_check_range(L, 2, 1, 65535);
  double timeout_ms = lmj_check_range(L, 3, 1, 1e12);
  double max_reply = lmj_check_range(L, 4, 1024, 1e15);
  luaL_checktype(L, 5, LUA_TFUNCTION);
  mj_redis_tls_options_t tls;
  int with_tls = !lua_isnoneornil(L, 6);
  if (with_tls) lmj_check_tls(L, 6, &tls);
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
  char why[300] = "";
  int rc = mj_redis_open(&c->ctx, &lr->r, host, port, (uint64_t) timeout_ms, (size_t) max_reply,
                         with_tls ? &tls : NULL, why, sizeof why);
  mj_ctx_touch(&c->ctx);
  if (rc != 0) {
    free(lr);
    if (rc != MJ_ETLS) return lmj_fail(L, rc);
    lua_pushnil(L);
    lua_pushstring(L, why);
    return 2;
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
  if (rc == UV_EINVAL)
    return luaL_argerror(L, 2, persistent ? "conn:subscribe takes SUBSCRIBE or SSUBSCRIBE and channels"
                                          : "SUBSCRIBE and SSUBSCRIBE go through conn:subscribe; other commands"
                                            " of subscriptions (and MONITOR) are not supported");
  if (rc == UV_ENOBUFS) {
    lua_pushnil(L);
    lua_pushfstring(L, "ENOBUFS: this command would take the bytes waiting to be written to the server past %f"
                    " (16 times the largest reply taken): the server reads too slowly, or not at all, or the"
                    " command is too large", (double) lr->r.max_out);
    lua_pushliteral(L, "ENOBUFS");
    return 3;
  }
  if (rc != 0) return lmj_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* conn:command(args, cb) -> true | nil, err, code: cb gets the reply (see
 * above); code "ENOBUFS": too many bytes would wait to be written. */
static int lmj_redis_command(lua_State *L) {
  return lmj_redis_send(L, 0);
}

/* conn:subscribe({ "SUBSCRIBE" or "SSUBSCRIBE", channel... }, cb): cb gets
 * each confirmation and every message of the channels; an error reply
 * (refused) or the connection's end is its last call. */
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

/* conn:ping() -> true | nil, err: a PING on a subscribed connection; no
 * byte back within the timeout drops it (on_event("down", why)). */
static int lmj_redis_ping(lua_State *L) {
  lmj_redis_t *lr = lmj_check_redis(L, 1);
  int rc = mj_redis_ping(&lr->r);
  mj_ctx_touch(&lr->lctx->ctx);
  if (rc != 0) return lmj_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int lmj_redis_pending(lua_State *L) {
  lua_pushnumber(L, lmj_check_redis(L, 1)->r.pending);
  return 1;
}
