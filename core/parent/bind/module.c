/* module.c -- the Lua face of the C core: luaopen_moonjob_core.
 *
 * The module's functions and one class per userdata type, registered from
 * the binding files this file #includes, one per type (luv's cut): loop.c
 * (the module's functions), process.c, timer.c, stdio.c (inputs and
 * outputs), redis.c, http.c (the HTTP server); bind.h has what they share. Also here: the loop context
 * (one per Lua state, created on first require and kept in the registry),
 * freed when the state closes, the pin that keeps this module loaded, and
 * core.scrub_env (a secret read from the environment, wiped where it lies).
 *
 * Loading the module first makes descriptors 0-2 valid (/dev/null) when the
 * program started with one closed, before libuv opens anything
 * (lmj_fill_closed_stdio; core.closed_at_start tells which were).
 *
 * Caveat: loading the module sets SIGPIPE to "ignore" when it was left at its
 * default. A write to a child that just died must come back as EPIPE, not kill
 * the parent (libuv writes to sockets without MSG_NOSIGNAL). A handler the
 * program installed itself is left alone.
 */
#include "bind.h"

#include "loop.c"
#include "process.c"
#include "timer.c"
#include "stdio.c"
#include "redis.c"
#include "http.c"

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

/* Which of descriptors 0-2 were closed when this module was first loaded. */
static int lmj_stdio_was_closed[3];

/* Descriptors 0-2 closed when the program started (`<&-`, some daemon
 * managers) are opened on /dev/null before libuv opens anything: else the
 * loop's own descriptor lands on one, and a later use of it as stdin or
 * stdout breaks libuv (it asserts). Each is opened the other way round (stdin
 * write-only, stdout and stderr read-only), so that using it fails as using a
 * closed descriptor does. Nothing else in the module opens a descriptor
 * before this runs (the loader's and Lua's own opens are closed again). */
static void lmj_fill_closed_stdio(void) {
  for (int fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int got = open("/dev/null", (fd == 0 ? O_WRONLY : O_RDONLY) | O_NOCTTY);
    if (got < 0) got = open("/", O_RDONLY | O_DIRECTORY); /* no /dev/null (a bare chroot) */
    if (got < 0) continue;
    if (got != fd) {
      dup2(got, fd);
      close(got);
    }
    lmj_stdio_was_closed[fd] = 1;
  }
}

/* core.closed_at_start(fd) -> whether descriptor fd (0, 1 or 2) was closed
 * when the program started (it is /dev/null now, unusable). */
static int lmj_closed_at_start(lua_State *L) {
  int fd = (int) lmj_check_range(L, 1, 0, 2);
  lua_pushboolean(L, lmj_stdio_was_closed[fd]);
  return 1;
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

/* core.scrub_env(name) -> true when the variable was set: its value's bytes
 * are overwritten where they lie, then it is unset. Unsetting alone leaves
 * the bytes in the block /proc/PID/environ shows, so a secret read from the
 * environment (the CLI's MOONJOB_REDIS) would stay readable there. Call it
 * before any thread reads the environment; an entry in read-only memory (a
 * literal given to putenv) cannot be scrubbed, so only the program's own
 * variables should be. */
static int lmj_scrub_env(lua_State *L) {
  extern char **environ;
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  luaL_argcheck(L, len > 0 && strchr(name, '=') == NULL, 1, "not an environment variable's name");
  int found = 0;
  for (char **entry = environ; entry && *entry; entry++)
    if (strncmp(*entry, name, len) == 0 && (*entry)[len] == '=') {
      memset(*entry + len + 1, 0, strlen(*entry + len + 1));
      found = 1;
    }
  unsetenv(name);
  lua_pushboolean(L, found);
  return 1;
}

int luaopen_moonjob_core(lua_State *L) {
  static const luaL_Reg functions[] = {
    {"run", lmj_run}, {"step", lmj_step}, {"backend_fd", lmj_backend_fd},
    {"backend_timeout", lmj_backend_timeout}, {"catch_sigint", lmj_catch_sigint}, {"hold_stop_signals", lmj_hold_stop_signals}, {"running", lmj_running}, {"hrtime", lmj_hrtime}, {"cpu_count", lmj_cpu_count}, {"total_memory", lmj_total_memory},
    {"getpid", lmj_getpid}, {"isatty", lmj_isatty}, {"closed_at_start", lmj_closed_at_start}, {"child_path", lmj_child_path}, {"realpath", lmj_realpath},
    {"spawn", lmj_spawn},
    {"timer", lmj_timer_new}, {"input", lmj_input_new}, {"open", lmj_open}, {"output", lmj_output_new},
    {"redis", lmj_redis_new}, {"http_listen", lmj_http_listen},
    {"scrub_env", lmj_scrub_env},
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
    {"close", lmj_redis_close}, {"pending", lmj_redis_pending},
    {"ping", lmj_redis_ping}, {NULL, NULL}};
  static const luaL_Reg output_methods[] = {
    {"write", lmj_output_write}, {"flush", lmj_output_flush}, {"pending", lmj_output_pending},
    {"record_error", lmj_output_record_error}, {"written", lmj_output_written},
    {"close", lmj_output_close}, {NULL, NULL}};

  lmj_fill_closed_stdio(); /* first: before the loop opens its descriptors */
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
  lmj_http_register(L, lmj_new_class, lmj_generic_tostring);

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
