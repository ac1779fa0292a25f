/* process.c -- moonjob.process: core.spawn, and a child's events as Lua calls.
 *
 * One on_event function gets everything a child does: spawned, frame (a
 * payload, as a string or, for a frame that came in pieces, the list of its
 * pieces), stdout/stderr, oversize, protocol, exit, closed. The methods send
 * frames, signal the child, and read or change the page shared with it (jobs
 * started, recalled, batches).
 *
 * Caveat: a send the kernel did not take at once keeps its strings
 * referenced until libuv is done with them (lmj_keep_sent).
 */
#include "bind.h"

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
