/* child.c -- the child program: embeds LuaJIT and runs one processor's jobs.
 *
 * The parent starts this program with the channel socket on fd 3 and the
 * child's stdout/stderr on pipes of their own. Mechanism lives here: the
 * process set-up, and a tiny `moonjob.channel` module (recv/send of frames on
 * fd 3, blocking). Policy lives in Lua: main() requires `moonjob.runner`, which
 * reads the INIT frame, loads the processor file and runs jobs one at a time
 * until the channel reaches end-of-file.
 *
 * Caveats: the child dies with its parent (PR_SET_PDEATHSIG) and on end of
 * file on the channel, so it never outlives a crashed parent for long. Writes
 * to a closed channel raise a Lua error (SIGPIPE is ignored) and the runner
 * exits.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "frame.h"

#define CHANNEL_FD 3
#define EXIT_INTERNAL 70 /* EX_SOFTWARE: the runner itself failed */

/* ---------------------------------------------------------------- I/O --- */

/* Reads exactly n bytes. Returns 1 when done, 0 on end-of-file before the
 * first byte, -1 on error or end-of-file in the middle (errno set). */
static int read_exact(int fd, void *buf, size_t n) {
  char *p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, p + got, n - got);
    if (r > 0) {
      got += (size_t) r;
    } else if (r == 0) {
      if (got == 0) return 0;
      errno = EPIPE;
      return -1;
    } else if (errno != EINTR) {
      return -1;
    }
  }
  return 1;
}

/* Writes every byte of iov[0..n). Returns 0, or -1 with errno set. */
static int write_all(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    ssize_t w = writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    while (n > 0 && (size_t) w >= iov->iov_len) {
      w -= (ssize_t) iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *) iov->iov_base + w;
      iov->iov_len -= (size_t) w;
    }
  }
  return 0;
}

/* True when bytes written to stdout or stderr are not yet read by the parent.
 * Both are socketpairs made by libuv; SIOCOUTQ counts what the peer has not
 * consumed. Anything else (a terminal, a file) counts as pending: safe. */
static int output_pending(void) {
  for (int fd = 1; fd <= 2; fd++) {
    int unread = 0;
    if (ioctl(fd, SIOCOUTQ, &unread) != 0 || unread > 0) return 1;
  }
  return 0;
}

/* ----------------------------------------------- moonjob.channel module --- */

/* channel.recv() -> type, job, payload | nil at end-of-file.
 * Raises on a read error or a frame cut short. */
static int channel_recv(lua_State *L) {
  mj_frame_header_t h;
  int r = read_exact(CHANNEL_FD, &h, sizeof h);
  if (r == 0) return 0;
  if (r < 0) return luaL_error(L, "channel read failed: %s", strerror(errno));
  char *payload = malloc(h.len ? h.len : 1);
  if (payload == NULL) return luaL_error(L, "not enough memory for a %u-byte frame", h.len);
  r = h.len ? read_exact(CHANNEL_FD, payload, h.len) : 1;
  if (r <= 0) {
    free(payload);
    return luaL_error(L, "channel read failed: %s", r == 0 ? "end of file" : strerror(errno));
  }
  lua_pushinteger(L, (lua_Integer) h.type);
  lua_pushnumber(L, (lua_Number) h.job);
  lua_pushlstring(L, payload, h.len);
  free(payload);
  return 3;
}

/* channel.send(type, job, part...) sends one frame whose payload is the
 * concatenation of the string parts, without concatenating them in memory.
 * A frame that ends a job carries MJ_FRAME_FLAG_OUTPUT when output is still
 * unread (the caller flushed stdio first). Raises when the channel is closed. */
static int channel_send(lua_State *L) {
  enum { MAX_PARTS = 4 };
  mj_frame_header_t h;
  struct iovec iov[1 + MAX_PARTS];
  int nparts = lua_gettop(L) - 2;
  size_t total = 0;
  luaL_argcheck(L, nparts <= MAX_PARTS, 2 + MAX_PARTS + 1, "too many payload parts");
  h.type = (uint32_t) luaL_checkinteger(L, 1);
  h.job = (uint64_t) luaL_checknumber(L, 2);
  if (MJ_FRAME_ENDS_JOB(h.type) && output_pending()) h.type |= MJ_FRAME_FLAG_OUTPUT;
  for (int i = 0; i < nparts; i++) {
    size_t n;
    const char *s = luaL_checklstring(L, 3 + i, &n);
    iov[1 + i].iov_base = (void *) s;
    iov[1 + i].iov_len = n;
    total += n;
  }
  if (total > UINT32_MAX) return luaL_error(L, "frame too large (%f bytes)", (double) total);
  h.len = (uint32_t) total;
  iov[0].iov_base = &h;
  iov[0].iov_len = sizeof h;
  if (write_all(CHANNEL_FD, iov, 1 + nparts) < 0)
    return luaL_error(L, "channel write failed: %s", strerror(errno));
  return 0;
}

static int open_channel(lua_State *L) {
  static const luaL_Reg funcs[] = {
    {"recv", channel_recv}, {"send", channel_send}, {NULL, NULL}};
  lua_newtable(L);
  luaL_register(L, NULL, funcs);
#define MJ_SET_TYPE(name)               \
  lua_pushinteger(L, MJ_FRAME_##name); \
  lua_setfield(L, -2, #name);
  MJ_FRAME_TYPES(MJ_SET_TYPE)
#undef MJ_SET_TYPE
  return 1;
}

/* -------------------------------------------------------------- main --- */

/* The child must not outlive its parent, must survive writes to a closed
 * channel as errors, and must see a blocking channel whatever libuv did. */
static void set_up_process(void) {
  pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(EXIT_INTERNAL); /* parent already gone */
  signal(SIGPIPE, SIG_IGN);
  int flags = fcntl(CHANNEL_FD, F_GETFL);
  if (flags < 0) {
    fprintf(stderr, "moonjob-child: no channel on fd %d; this program is started by moonjob\n",
            CHANNEL_FD);
    exit(2);
  }
  fcntl(CHANNEL_FD, F_SETFL, flags & ~O_NONBLOCK);
  fcntl(CHANNEL_FD, F_SETFD, FD_CLOEXEC); /* a processor's os.execute must not hold it */
  setvbuf(stdout, NULL, _IOLBF, 0);       /* print() reaches the parent line by line */
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
  return 1;
}

/* Runs require("moonjob.runner").main(). Returns the process exit status. */
static int run_runner(lua_State *L) {
  lua_pushcfunction(L, traceback);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "moonjob.runner");
  if (lua_pcall(L, 1, 1, 1) != 0) goto error;
  lua_getfield(L, -1, "main");
  if (lua_pcall(L, 0, 1, 1) != 0) goto error;
  return (int) luaL_optinteger(L, -1, 0);
error:
  fprintf(stderr, "moonjob-child: %s\n", lua_tostring(L, -1));
  return EXIT_INTERNAL;
}

int main(int argc, char **argv) {
  (void) argc;
  (void) argv;
  set_up_process();
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "moonjob-child: cannot create a Lua state\n");
    return EXIT_INTERNAL;
  }
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, open_channel);
  lua_setfield(L, -2, "moonjob.channel");
  lua_pop(L, 2);
  int status = run_runner(L);
  fflush(stdout);
  _exit(status); /* skip lua_close: the OS frees everything at once */
}
