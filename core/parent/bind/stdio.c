/* stdio.c -- moonjob.input and moonjob.output: the CLI's lines in, results out.
 *
 * core.input reads lines (or blocks of lines) from a descriptor, core.open
 * opens the file it reads, core.output writes in order without blocking the
 * loop and records what was written (the mechanism is the core's stdio.c and
 * output.c). An input is closed with input:close(); an output with
 * output:close() (what it still holds is dropped) or by the garbage
 * collector (it finishes writing what it holds first, while the loop runs).
 */
#include "bind.h"

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

/* core.output(fd [, record_fd]) -> output: ordered writes that never block
 * the loop. With record_fd (a joblog), each whole line fd took is copied
 * there right after (a duplicate of record_fd is kept: the caller still owns
 * its own). The output outlives its userdata until what was written to it is
 * out. */
static int lmj_output_new(lua_State *L) {
  lmj_ctx_t *c = lmj_ctx(L);
  int fd = (int) lmj_check_range(L, 1, 0, INT_MAX);
  int record_fd = -1;
  if (!lua_isnoneornil(L, 2)) {
    record_fd = fcntl((int) lmj_check_range(L, 2, 0, INT_MAX), F_DUPFD_CLOEXEC, 3);
    if (record_fd < 0) return lmj_fail(L, -errno);
  }
  lmj_output_t *lo = lua_newuserdata(L, sizeof *lo);
  lo->out = NULL;
  luaL_getmetatable(L, LMJ_OUTPUT);
  lua_setmetatable(L, -2);
  lo->out = mj_output_new(&c->ctx, fd, record_fd);
  if (lo->out == NULL) {
    if (record_fd >= 0) close(record_fd);
    return luaL_error(L, "not enough memory for an output");
  }
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

/* output:flush() -> true | nil, err, code: what is pending is written now
 * when the descriptor takes it (a pipe, terminal or socket), not at the
 * start of the loop's next turn. */
static int lmj_output_flush(lua_State *L) {
  mj_output_t *out = lmj_check_output(L, 1);
  int rc = mj_output_flush(out);
  if (rc != 0) return lmj_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* output:pending() -> bytes not yet written | nil, err, code (a write error) */
static int lmj_output_pending(lua_State *L) {
  mj_output_t *o = lmj_check_output(L, 1);
  if (o->error) return lmj_fail(L, o->error);
  lua_pushnumber(L, (lua_Number) mj_output_pending(o));
  return 1;
}

/* output:record_error() -> nil | err, code: why the record could not be
 * written (nothing more is written then). */
static int lmj_output_record_error(lua_State *L) {
  mj_output_t *o = lmj_check_output(L, 1);
  if (o->record_error == 0) return 0;
  lua_pushfstring(L, "%s: %s", uv_err_name(o->record_error), uv_strerror(o->record_error));
  lua_pushstring(L, uv_err_name(o->record_error));
  return 2;
}

/* output:written() -> the bytes the descriptor took, in all */
static int lmj_output_written(lua_State *L) {
  lua_pushnumber(L, (lua_Number) lmj_check_output(L, 1)->written);
  return 1;
}

/* output:close(): nothing more is written; what is pending is dropped (not
 * recorded either). Closing again does nothing. */
static int lmj_output_close(lua_State *L) {
  lmj_output_t *lo = luaL_checkudata(L, 1, LMJ_OUTPUT);
  if (lo->out) mj_output_close(lo->out);
  lo->out = NULL;
  return 0;
}

static int lmj_output_gc(lua_State *L) {
  lmj_output_t *lo = luaL_checkudata(L, 1, LMJ_OUTPUT);
  if (lo->out) mj_output_release(lo->out);
  lo->out = NULL;
  return 0;
}
