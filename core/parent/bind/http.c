/* http.c -- moonjob.http_server: core.http_listen, the core's HTTP server
 * (core/parent/http.c) as Lua objects.
 *
 * The low-level API the dashboard and the worker's metrics are built on:
 * no routes, no pages. core.http_listen(host, port, on_request [, opts])
 * calls on_request(req) for each whole request; req (a moonjob.http_request)
 * has the request's fields (method, url, path, query, headers, body, peer,
 * peer_port) and is answered with req:respond, or streamed with req:start,
 * req:write and req:finish; req:on_close(fn) hears a client that left first.
 *
 * Handlers are asynchronous by design: the loop cannot run inside its own
 * callbacks (loop.wait_until refuses there), so a handler that needs Redis
 * sends its command and answers from the reply's callback, on a later turn.
 * A handler that raises gets its request answered 500 (or, once streaming,
 * its connection closed) and the error reported: to opts.on_error(message,
 * what) when given, else on stderr, as the pool reports a listener's error.
 *
 * Lifetimes: a server holds a reference to itself until server:close() (or
 * the Lua state closes). A request holds one to itself from its delivery
 * until it is answered or its connection ends, whichever comes first: one
 * never answered is freed with its connection.
 */
#include "bind.h"

#define LMJ_HTTP "moonjob.http_server"
#define LMJ_HTTP_REQ "moonjob.http_request"

typedef struct {
  mj_http_server_t s;
  lmj_ctx_t *lctx;
  int handler_ref, error_ref, self_ref;
} lmj_http_server_t;

typedef struct {
  mj_http_conn_t *conn;              /* NULL once answered or gone */
  lmj_http_server_t *ls;
  int self_ref, close_ref;
  unsigned started : 1, finished : 1, gone : 1;
  char why[128];                     /* why the connection ended */
} lmj_http_req_t;

/* ------------------------------------------------------------- errors --- */

/* Calls the function below its nargs arguments, protected; an error goes to
 * opts.on_error(message, what) or to stderr. Returns 0, or -1 when it raised. */
static int lmj_http_pcall(lmj_http_server_t *ls, lua_State *L, int nargs, const char *what) {
  int base = lua_gettop(L) - nargs;
  lmj_push_traceback(L);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, 0, base);
  lua_remove(L, base);
  if (rc == 0) return 0;
  if (ls->error_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, ls->error_ref);
    lua_insert(L, -2);
    lua_pushstring(L, what);
    lmj_call(L, 2);
  } else {
    fprintf(stderr, "moonjob: error in an HTTP %s: %s\n", what, lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  return -1;
}

/* ----------------------------------------------------------- requests --- */

/* The request lets go of its connection (answered, or gone). */
static void lmj_http_release(lua_State *L, lmj_http_req_t *req) {
  if (req->conn != NULL) req->conn->data = NULL;
  req->conn = NULL;
  lmj_unref(L, &req->close_ref);
  lmj_unref(L, &req->self_ref); /* last: it may be all that keeps req alive */
}

static void lmj_http_gone_cb(mj_http_conn_t *c, const char *why) {
  lmj_http_req_t *req = c->data;
  if (req == NULL) return;
  snprintf(req->why, sizeof req->why, "%s", why);
  req->gone = 1;
  req->conn = NULL;
  c->data = NULL;
  if (req->ls->lctx->finalizing) return;
  lua_State *L = req->ls->lctx->L;
  int close_ref = req->close_ref;
  req->close_ref = LUA_NOREF;
  lmj_http_server_t *ls = req->ls;
  if (close_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, close_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, close_ref);
    lua_pushstring(L, why);
    lmj_unref(L, &req->self_ref);
    lmj_http_pcall(ls, L, 1, "on_close callback");
  } else {
    lmj_unref(L, &req->self_ref);
  }
}

/* The request's fields, in the table its userdata keeps as environment. */
static void lmj_http_push_fields(lua_State *L, mj_http_conn_t *c) {
  lua_createtable(L, 0, 10);
  lua_pushstring(L, http_method_str((enum http_method) c->parser.method));
  lua_setfield(L, -2, "method");
  lua_pushlstring(L, c->head, c->url_len);
  lua_setfield(L, -2, "url");
  struct http_parser_url u;
  http_parser_url_init(&u);
  int parsed = c->url_len <= UINT16_MAX /* its offsets are 16 bits (max_header's bound) */
               && http_parser_parse_url(c->head, c->url_len, c->parser.method == HTTP_CONNECT, &u) == 0;
  if (parsed && (u.field_set & (1 << UF_PATH)))
    lua_pushlstring(L, c->head + u.field_data[UF_PATH].off, u.field_data[UF_PATH].len);
  else lua_pushlstring(L, c->head, parsed ? 0 : c->url_len);
  lua_setfield(L, -2, "path");
  if (parsed && (u.field_set & (1 << UF_QUERY))) {
    lua_pushlstring(L, c->head + u.field_data[UF_QUERY].off, u.field_data[UF_QUERY].len);
    lua_setfield(L, -2, "query");
  }
  lua_createtable(L, 0, (int) c->nfields);
  for (size_t i = 0; i < c->nfields; i++) {
    const mj_http_field_t *f = &c->fields[i];
    lua_pushlstring(L, c->head + f->name_off, f->name_len);
    lua_pushvalue(L, -1);
    lua_rawget(L, -3);
    if (lua_isnil(L, -1)) { /* first of its name */
      lua_pop(L, 1);
      lua_pushlstring(L, c->head + f->value_off, f->value_len);
    } else { /* repeated: joined with ", " */
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, c->head + f->value_off, f->value_len);
      lua_concat(L, 3);
    }
    lua_rawset(L, -3);
  }
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, c->body ? c->body : "", c->body_len);
  lua_setfield(L, -2, "body");
  lua_pushstring(L, c->peer);
  lua_setfield(L, -2, "peer");
  lua_pushinteger(L, c->peer_port);
  lua_setfield(L, -2, "peer_port");
}

static void lmj_http_request_cb(mj_http_conn_t *c) {
  lmj_http_server_t *ls = c->server->data;
  lua_State *L = ls->lctx->L;
  if (ls->lctx->finalizing) return;
  luaL_checkstack(L, 8, "http request");
  lmj_http_req_t *req = lua_newuserdata(L, sizeof *req);
  memset(req, 0, sizeof *req);
  req->ls = ls;
  req->close_ref = LUA_NOREF;
  luaL_getmetatable(L, LMJ_HTTP_REQ);
  lua_setmetatable(L, -2);
  lmj_http_push_fields(L, c);
  lua_setfenv(L, -2);
  req->conn = c;
  c->data = req;
  lua_pushvalue(L, -1);
  req->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ls->handler_ref);
  lua_pushvalue(L, -2);
  int raised = lmj_http_pcall(ls, L, 1, "request handler") != 0;
  if (raised && req->conn != NULL) {
    static const char type[] = "Content-Type: text/plain; charset=utf-8\r\n";
    static const char body[] = "500 Internal Server Error\n";
    if (!req->started) mj_http_respond(req->conn, 500, type, sizeof type - 1, body, sizeof body - 1, 0);
    else mj__http_drop(req->conn, "the request handler raised an error");
    if (req->conn != NULL) lmj_http_release(L, req);
    req->started = req->finished = 1;
  }
  lua_pop(L, 1);
}

/* --------------------------------------------------- request methods --- */

static lmj_http_req_t *lmj_check_req(lua_State *L) {
  return luaL_checkudata(L, 1, LMJ_HTTP_REQ);
}

/* req.field: the request's fields first, then the methods. */
static int lmj_http_req_index(lua_State *L) {
  lua_getfenv(L, 1);
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  if (!lua_isnil(L, -1)) return 1;
  lua_pushvalue(L, 2);
  lua_gettable(L, lua_upvalueindex(1));
  return 1;
}

/* The header lines of table idx, checked: "Name: value\r\n" each, pushed as
 * one string. Content-Length and Transfer-Encoding are the core's; a
 * Connection: close sets *close_after. */
static void lmj_http_push_headers(lua_State *L, int idx, int *close_after) {
  *close_after = 0;
  if (lua_isnoneornil(L, idx)) {
    lua_pushliteral(L, "");
    return;
  }
  luaL_checktype(L, idx, LUA_TTABLE);
  luaL_Buffer b;
  lua_newtable(L); /* the lines, joined at the end: luaL_Buffer cannot live across lua_next */
  int lines = lua_gettop(L), n = 0;
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    size_t nlen, vlen;
    const char *name = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &nlen) : NULL;
    int t = lua_type(L, -1);
    const char *value = t == LUA_TSTRING || t == LUA_TNUMBER ? lua_tolstring(L, -1, &vlen) : NULL;
    if (name == NULL || nlen == 0 || nlen != strspn(name, "!#$%&'*+-.^_`|~0123456789"
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
      luaL_error(L, "bad header name %s: names are HTTP tokens (letters, digits, -)",
                 name ? lua_pushfstring(L, "'%s'", name) : luaL_typename(L, -2));
    if (value == NULL || strcspn(value, "\r\n") != vlen || memchr(value, 0, vlen))
      luaL_error(L, "bad value for header '%s': a string or number without CR, LF or NUL", name);
    if (strcasecmp(name, "content-length") == 0 || strcasecmp(name, "transfer-encoding") == 0)
      luaL_error(L, "header '%s' is set by the core: leave it out", name);
    if (strcasecmp(name, "connection") == 0) {
      if (strcasecmp(value, "close") == 0) *close_after = 1;
      else if (strcasecmp(value, "keep-alive") != 0)
        luaL_error(L, "header 'connection' may only be 'close' or 'keep-alive'");
    } else {
      luaL_buffinit(L, &b);
      luaL_addlstring(&b, name, nlen);
      luaL_addlstring(&b, ": ", 2);
      luaL_addlstring(&b, value, vlen);
      luaL_addlstring(&b, "\r\n", 2);
      luaL_pushresult(&b);
      lua_rawseti(L, lines, ++n);
    }
    lua_pop(L, 1);
  }
  luaL_buffinit(L, &b);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, lines, i);
    luaL_addvalue(&b);
  }
  luaL_pushresult(&b);
  lua_remove(L, lines);
}

static int lmj_http_check_status(lua_State *L, int idx) {
  double v = luaL_checknumber(L, idx);
  if (!(v >= 200 && v <= 599 && v == (int) v))
    luaL_argerror(L, idx, "an HTTP status is a whole number from 200 to 599");
  return (int) v;
}

/* false, why: the client left (or the answer could not be queued). */
static int lmj_http_not_sent(lua_State *L, lmj_http_req_t *req, int rc) {
  lua_pushboolean(L, 0);
  if (req->gone) lua_pushstring(L, req->why);
  else lua_pushstring(L, uv_strerror(rc));
  return 2;
}

/* req:respond(status [, headers [, body]]) -> true | false, why */
static int lmj_http_req_respond(lua_State *L) {
  lmj_http_req_t *req = lmj_check_req(L);
  if (req->started) luaL_error(L, "req:respond(): the request was answered already");
  int status = lmj_http_check_status(L, 2);
  size_t len;
  const char *body = luaL_optlstring(L, 4, "", &len);
  int close_after;
  lmj_http_push_headers(L, 3, &close_after);
  if (req->conn == NULL) return lmj_http_not_sent(L, req, UV_ENOTCONN);
  req->started = req->finished = 1;
  size_t hlen;
  const char *headers = lua_tolstring(L, -1, &hlen);
  int rc = mj_http_respond(req->conn, status, headers, hlen, body, len, close_after);
  mj_ctx_touch(&req->ls->lctx->ctx);
  if (rc != 0) return lmj_http_not_sent(L, req, rc);
  lmj_http_release(L, req);
  lua_pushboolean(L, 1);
  return 1;
}

/* req:start(status [, headers]) -> true | false, why: a streamed answer. */
static int lmj_http_req_start(lua_State *L) {
  lmj_http_req_t *req = lmj_check_req(L);
  if (req->started) luaL_error(L, "req:start(): the request was answered already");
  int status = lmj_http_check_status(L, 2);
  int close_after;
  lmj_http_push_headers(L, 3, &close_after);
  if (req->conn == NULL) return lmj_http_not_sent(L, req, UV_ENOTCONN);
  req->started = 1;
  size_t hlen;
  const char *headers = lua_tolstring(L, -1, &hlen);
  int rc = mj_http_start(req->conn, status, headers, hlen, close_after);
  mj_ctx_touch(&req->ls->lctx->ctx);
  if (rc != 0) return lmj_http_not_sent(L, req, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* req:write(chunk) -> true | false, why (the client left, or does not read). */
static int lmj_http_req_write(lua_State *L) {
  lmj_http_req_t *req = lmj_check_req(L);
  size_t len;
  const char *data = luaL_checklstring(L, 2, &len);
  if (!req->started || req->finished) luaL_error(L, "req:write(): call req:start() first, and not after req:finish()");
  if (req->conn == NULL) return lmj_http_not_sent(L, req, UV_ENOTCONN);
  int rc = mj_http_write(req->conn, data, len);
  mj_ctx_touch(&req->ls->lctx->ctx);
  if (rc != 0) return lmj_http_not_sent(L, req, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* req:finish() -> true | false, why: the end of a streamed answer. */
static int lmj_http_req_finish(lua_State *L) {
  lmj_http_req_t *req = lmj_check_req(L);
  if (!req->started || req->finished) luaL_error(L, "req:finish(): call req:start() first, and only once");
  req->finished = 1;
  if (req->conn == NULL) return lmj_http_not_sent(L, req, UV_ENOTCONN);
  int rc = mj_http_finish(req->conn);
  mj_ctx_touch(&req->ls->lctx->ctx);
  if (rc != 0) return lmj_http_not_sent(L, req, rc);
  lmj_http_release(L, req);
  lua_pushboolean(L, 1);
  return 1;
}

/* req:on_close(fn): fn(why) when the client leaves before the answer is
 * finished (at once when it has left already). One per request. */
static int lmj_http_req_on_close(lua_State *L) {
  lmj_http_req_t *req = lmj_check_req(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (req->gone) {
    lua_pushvalue(L, 2);
    lua_pushstring(L, req->why);
    lua_call(L, 1, 0);
  } else if (req->conn != NULL) {
    lmj_unref(L, &req->close_ref);
    req->close_ref = lmj_ref_function(L, 2);
  }
  return 0;
}

/* req:closed() -> nil while the client is there, else why it left. */
static int lmj_http_req_closed(lua_State *L) {
  lmj_http_req_t *req = lmj_check_req(L);
  if (req->gone) lua_pushstring(L, req->why);
  else lua_pushnil(L);
  return 1;
}

/* ------------------------------------------------------------ servers --- */

static lmj_http_server_t *lmj_check_http(lua_State *L, int idx) {
  lmj_http_server_t **slot = luaL_checkudata(L, idx, LMJ_HTTP);
  if (*slot == NULL || (*slot)->s.closed) luaL_argerror(L, idx, "the server is closed");
  return *slot;
}

static void lmj_http_freed_cb(mj_http_server_t *s) {
  lmj_http_server_t *ls = s->data;
  if (!ls->lctx->finalizing) {
    lua_State *L = ls->lctx->L;
    if (ls->self_ref != LUA_NOREF) {
      lua_rawgeti(L, LUA_REGISTRYINDEX, ls->self_ref);
      lmj_http_server_t **slot = lua_touserdata(L, -1);
      if (slot != NULL) *slot = NULL;
      lua_pop(L, 1);
    }
    lmj_unref(L, &ls->self_ref);
    lmj_unref(L, &ls->handler_ref);
    lmj_unref(L, &ls->error_ref);
  }
  free(ls);
}

/* An option of table idx: a number in [min, max], or 0 when absent. */
static double lmj_http_option(lua_State *L, int idx, const char *name, double min, double max) {
  lua_getfield(L, idx, name);
  double v = 0;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER || !(lua_tonumber(L, -1) >= min && lua_tonumber(L, -1) <= max))
      luaL_error(L, "core.http_listen: option %s must be a number from %f to %f", name, min, max);
    v = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

/* core.http_listen(host, port, on_request [, opts]) -> server | nil, err, code */
static int lmj_http_listen(lua_State *L) {
  lmj_ctx_t *c = lmj_ctx(L);
  const char *host = luaL_checkstring(L, 1);
  int port = (int) lmj_check_range(L, 2, 0, 65535);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  mj_http_limits_t limits = {0};
  int on_error = 0;
  if (!lua_isnoneornil(L, 4)) {
    luaL_checktype(L, 4, LUA_TTABLE);
    limits.max_header = (size_t) lmj_http_option(L, 4, "max_header", 256, UINT16_MAX); /* URL offsets: 16 bits */
    limits.max_body = (size_t) lmj_http_option(L, 4, "max_body", 1, 1e12);
    limits.max_connections = (unsigned) lmj_http_option(L, 4, "max_connections", 1, 1e6);
    limits.idle_timeout_ms = (uint64_t) lmj_http_option(L, 4, "idle_timeout_ms", 1, 1e12);
    limits.max_unsent = (size_t) lmj_http_option(L, 4, "max_unsent", 1, 1e12);
    lua_getfield(L, 4, "on_error");
    on_error = lua_gettop(L);
    if (lua_isnil(L, -1)) on_error = 0;
    else luaL_argcheck(L, lua_isfunction(L, -1), 4, "on_error must be a function");
  }
  lmj_http_server_t *ls = calloc(1, sizeof *ls);
  if (ls == NULL) return lmj_fail(L, UV_ENOMEM);
  ls->lctx = c;
  ls->self_ref = ls->handler_ref = ls->error_ref = LUA_NOREF;
  ls->s.data = ls;
  ls->s.on_request = lmj_http_request_cb;
  ls->s.on_gone = lmj_http_gone_cb;
  ls->s.on_freed = lmj_http_freed_cb;
  char why[256];
  int rc = mj_http_listen(&c->ctx, &ls->s, host, port, &limits, why, sizeof why);
  mj_ctx_touch(&c->ctx);
  if (rc != 0) { /* freed once its handle closed (lmj_http_freed_cb), unless never opened */
    if (rc == UV_EINVAL && ls->s.ctx == NULL) free(ls);
    lua_pushnil(L);
    lua_pushstring(L, why);
    lua_pushstring(L, uv_err_name(rc));
    return 3;
  }
  lmj_http_server_t **slot = lua_newuserdata(L, sizeof *slot);
  *slot = ls;
  luaL_getmetatable(L, LMJ_HTTP);
  lua_setmetatable(L, -2);
  ls->handler_ref = lmj_ref_function(L, 3);
  if (on_error) ls->error_ref = lmj_ref_function(L, on_error);
  lua_pushvalue(L, -1);
  ls->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

/* server:port() -> the port listened on (the one picked for port 0). */
static int lmj_http_port(lua_State *L) {
  lua_pushinteger(L, mj_http_port(&lmj_check_http(L, 1)->s));
  return 1;
}

/* server:connections() -> how many connections are open. */
static int lmj_http_connections(lua_State *L) {
  lua_pushinteger(L, lmj_check_http(L, 1)->s.nconns);
  return 1;
}

/* server:close(): stops listening and closes every connection now; requests
 * not answered hear on_close("the server closed"). */
static int lmj_http_close(lua_State *L) {
  lmj_http_server_t **slot = luaL_checkudata(L, 1, LMJ_HTTP);
  if (*slot == NULL || (*slot)->s.closed) return 0;
  mj_ctx_t *ctx = &(*slot)->lctx->ctx;
  mj_http_close(&(*slot)->s);
  mj_ctx_touch(ctx);
  return 0;
}

/* Registers both classes; the request's __index looks at its fields first. */
static void lmj_http_register(lua_State *L, void (*new_class)(lua_State *, const char *,
                              const luaL_Reg *, lua_CFunction, lua_CFunction),
                              lua_CFunction tostring) {
  static const luaL_Reg server_methods[] = {
    {"port", lmj_http_port}, {"connections", lmj_http_connections}, {"close", lmj_http_close},
    {NULL, NULL}};
  static const luaL_Reg request_methods[] = {
    {"respond", lmj_http_req_respond}, {"start", lmj_http_req_start},
    {"write", lmj_http_req_write}, {"finish", lmj_http_req_finish},
    {"on_close", lmj_http_req_on_close}, {"closed", lmj_http_req_closed}, {NULL, NULL}};
  new_class(L, LMJ_HTTP, server_methods, tostring, NULL);
  new_class(L, LMJ_HTTP_REQ, request_methods, tostring, NULL);
  luaL_getmetatable(L, LMJ_HTTP_REQ);
  lua_getfield(L, -1, "__index");
  lua_pushcclosure(L, lmj_http_req_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushliteral(L, LMJ_HTTP_REQ);
  lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
  luaL_getmetatable(L, LMJ_HTTP);
  lua_pushliteral(L, LMJ_HTTP);
  lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
}
