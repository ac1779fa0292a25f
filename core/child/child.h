/* child.h -- what the parts of the child program share (internal).
 *
 * Included once, by main.c, which #includes the parts after it: the program
 * is one translation unit (main.c says why), so what is declared here is
 * static. Each part includes this header too, so that it reads (and an
 * editor parses it) on its own; none is compiled on its own.
 *
 * Below: the constants, the state several parts use (the page shared with
 * the parent, the job in hand, the Lua heap's accounting, the command line's
 * options), and the functions defined in one part and called from another.
 * Each part's own state stays in its file.
 */
#ifndef MJ_CHILD_H
#define MJ_CHILD_H

#define _GNU_SOURCE /* close_range */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "frame.h"

#define CHANNEL_FD 3
#define EXIT_INTERNAL 70 /* EX_SOFTWARE: the runner itself failed */
#define EXIT_SETUP 78    /* EX_CONFIG: the child could not set itself up; its one
                            stderr line says why, and the parent reports it as ELOAD */
#define HEAP_RESERVE (1024 * 1024) /* heap the runner may use past memory_limit to report */
#define MJ_PARENT_DEATH_SIGNAL SIGHUP /* PR_SET_PDEATHSIG; caught: see on_parent_death */

/* ----------------------------------------------------- shared state --- */

static pid_t parent_pid;
static mj_shared_t *shared;                    /* the page shared with the parent, or NULL */
static uint64_t job_token;                     /* token of the job in hand (frame.h) */
static uint32_t job_seq;                       /* and its sequence number */
static int ready_sent;                         /* READY went out: set-up is over */

/* The Lua heap's accounting (memory_limit). Growth past `limit` is refused
 * while `strict` (set-up, loading, a job); otherwise the runner may use
 * HEAP_RESERVE more, so that it can still build and send the error of a job
 * that filled the heap (the job's data may still be referenced). */
typedef struct {
  size_t used, limit;
  int strict;
  int refused;     /* growth was refused since the last job started */
  lua_Alloc inner; /* the allocator the count wraps: LuaJIT's own */
  void *inner_ud;
} heap_t;

static heap_t heap;

/* Options from the command line: the limits must be in place before the
 * Lua state exists. */
typedef struct {
  size_t memory_limit; /* bytes of Lua heap, 0 for none */
  long max_procs;      /* RLIMIT_NPROC, 0 to leave it */
  const char *user;    /* run as this user (the parent must be root), or NULL */
} child_options_t;

/* ------------------------------------------- used across the parts --- */

/* sandbox.c */
static void set_up_process(const child_options_t *o);
static void setup_failed(const char *why);
static void parent_gone(void);

/* alloc.c */
static lua_State *new_state(const child_options_t *o);
static int channel_strict(lua_State *L);

/* output.c */
static FILE *counted_stream(int fd, int mode);
static void output_written(uint64_t written[2]);
static void output_line_starts(uint64_t now, int started);
static void output_lines(uint64_t first);
static void output_flush(void);
static int output_flusher_started(void);

/* channel.c */
static int open_channel(lua_State *L);
static int find_interrupt(uint64_t token);
static void look_for_interrupts(void);

/* interrupt.c */
static void on_interrupt_signal(int signum, siginfo_t *info, void *context);
static int channel_run(lua_State *L);
static int channel_interrupt_traceback(lua_State *L);
static void line_began(uint64_t now);
static int channel_line_timeout(lua_State *L);
static int channel_protect(lua_State *L);
static int channel_batch_line_done(lua_State *L);

/* exports.c */
static uint64_t monotonic_ns(void);
static int channel_batch_next(lua_State *L);
static int channel_batch_keep(lua_State *L);
static int channel_now(lua_State *L);
static int channel_output_lines(lua_State *L);
static int channel_output_flush(lua_State *L);

/* result.c */
static int channel_keep_completed(lua_State *L);

#endif
