/* main.c -- the child program: embeds LuaJIT and runs one processor's jobs.
 *
 * The parent starts this program with the channel socket on fd 3 and the
 * child's stdout/stderr on pipes of their own. Mechanism lives here: the
 * process set-up, and a tiny `moonjob.channel` module (recv/send of frames on
 * fd 3, blocking). Policy lives in Lua: main() requires
 * `moonjob.child.runner`, which reads the INIT frame, loads the processor
 * file and runs jobs one at a time until the channel reaches end-of-file.
 * This file: the command line, the Lua state and its panic handler, and
 * running the runner.
 *
 * The program is one translation unit: this file #includes its parts (as
 * luv includes its binding files), and child.h declares what they share.
 * One unit keeps every internal function and variable static. The program
 * is linked with -rdynamic, so that the runner's FFI finds the moonjob_*
 * functions; any other non-static symbol would join the dynamic symbol table
 * too, which a processor's code sees, and could take the place of a global
 * of the same name in a library the processor loads.
 *
 * The parts: sandbox.c (the process set-up, before any Lua), alloc.c (the
 * counting allocator behind --memory-limit), output.c (the counted stdout
 * and stderr), channel.c (reading the channel ahead, the shared gate, the
 * moonjob.channel module), interrupt.c (stopping a running job), exports.c
 * and ../json_scan.c (the functions the FFI calls; json_scan.c is core.so's
 * too), result.c (a batch line's result line, written in C).
 */
#include "child.h"

#include "sandbox.c"
#include "alloc.c"
#include "output.c"
#include "channel.c"
#include "interrupt.c"
#include "exports.c"
#include "../json_scan.c"
#include "result.c"

/* A whole number in decimal digits only, at most max. Returns 0 or -1. */
static int parse_whole(const char *text, unsigned long long max, unsigned long long *out) {
  if (*text == '\0' || strspn(text, "0123456789") != strlen(text)) return -1;
  errno = 0;
  unsigned long long v = strtoull(text, NULL, 10);
  if (errno != 0 || v > max) return -1;
  *out = v;
  return 0;
}

static int parse_options(int argc, char **argv, child_options_t *o) {
  memset(o, 0, sizeof *o);
  for (int i = 1; i + 1 < argc; i += 2) {
    unsigned long long v;
    if (strcmp(argv[i], "--user") == 0) {
      o->user = argv[i + 1];
    } else if (strcmp(argv[i], "--memory-limit") == 0) {
      if (parse_whole(argv[i + 1], (unsigned long long) 1 << 46, &v) != 0) return -1;
      o->memory_limit = (size_t) v;
    } else if (strcmp(argv[i], "--max-procs") == 0) {
      if (parse_whole(argv[i + 1], 2147483647ULL, &v) != 0) return -1;
      o->max_procs = (long) v;
    } else {
      return -1;
    }
  }
  return argc % 2 == 1 ? 0 : -1;
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
  return 1;
}

static void setup_out_of_memory(void) {
  char why[160];
  snprintf(why, sizeof why, "memory_limit (%zu bytes) is too small to start the processor",
           heap.limit);
  setup_failed(why);
}

/* An error outside any protected call: never silent. */
static int panic(lua_State *L) {
  if (!ready_sent && heap.refused) setup_out_of_memory();
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "moonjob-child: unprotected Lua error: %s\n", msg ? msg : "(not a string)");
  fflush(stderr);
  _exit(EXIT_INTERNAL);
}

/* The libraries and moonjob.channel, run by lua_cpcall. */
static int set_up_state(lua_State *L) {
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, open_channel);
  lua_setfield(L, -2, "moonjob.channel");
  return 0;
}

/* Runs require("moonjob.child.runner").main(). Returns the process exit status. A
 * memory error before READY is a set-up failure (memory_limit too small). */
static int run_runner(lua_State *L) {
  int rc;
  lua_pushcfunction(L, traceback);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "moonjob.child.runner");
  rc = lua_pcall(L, 1, 1, 1);
  if (rc != 0) goto error;
  lua_getfield(L, -1, "main");
  rc = lua_pcall(L, 0, 1, 1);
  if (rc != 0) goto error;
  return (int) luaL_optinteger(L, -1, 0);
error:
  if (!ready_sent && (rc == LUA_ERRMEM || heap.refused)) setup_out_of_memory();
  fprintf(stderr, "moonjob-child: %s\n", lua_tostring(L, -1));
  return EXIT_INTERNAL;
}

int main(int argc, char **argv) {
  child_options_t options;
  if (parse_options(argc, argv, &options) != 0) {
    fprintf(stderr, "usage: moonjob-child [--memory-limit BYTES] [--max-procs N] [--user NAME]"
            " (whole numbers)\n");
    return 2;
  }
  set_up_process(&options);
  lua_State *L = new_state(&options);
  if (L == NULL) {
    if (options.memory_limit > 0) setup_out_of_memory();
    setup_failed("cannot create a Lua state");
  }
  lua_atpanic(L, panic);
  int rc = lua_cpcall(L, set_up_state, NULL);
  if (rc == LUA_ERRMEM) setup_out_of_memory();
  if (rc != 0) setup_failed(lua_tostring(L, -1) ? lua_tostring(L, -1) : "cannot open the Lua libraries");
  int status = run_runner(L);
  fflush(stdout);
  _exit(status); /* skip lua_close: the OS frees everything at once */
}
