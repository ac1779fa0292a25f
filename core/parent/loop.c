/* loop.c -- the one libuv loop of a Lua state, and running it safely.
 *
 * Every pool of a program shares this loop. mj_ctx_run refuses to re-enter
 * the loop from one of its own callbacks (libuv's uv_run is not reentrant).
 * A blocking wait can be made interruptible by Ctrl-C (mj_ctx_catch_sigint):
 * meanwhile SIGINT only sets a flag and wakes the loop, which stops; the
 * previous SIGINT disposition (for example the LuaJIT REPL's own handler) is
 * restored afterwards. The handler is installed once per wait, not per run.
 * A program can instead hold SIGINT, SIGTERM and SIGHUP for the context's
 * whole life (mj_ctx_hold_stop_signals: the command line, which then ends its
 * children and exits with 128 + the signal).
 *
 * A host loop (luv, cqueues, ...) can drive the loop instead: it watches
 * libuv's backend descriptor (mj_ctx_fd), runs what is ready when it is
 * readable (mj_ctx_step, never waiting) and also when mj_ctx_timeout's
 * milliseconds have passed (libuv's timers make no descriptor readable).
 * libuv registers a descriptor to watch, and takes a new timer into account,
 * only at its next run; so once a host watches, any change made outside the
 * loop's callbacks makes the descriptor readable (mj_ctx_touch, through the
 * wake-up handle), and the host's next step brings the kernel's set up to date.
 *
 * Caveat: a signal handler has no argument to carry a context, so the context
 * being run interruptibly is kept in one static pointer; nested interruptible
 * runs cannot happen because runs do not nest.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "moonjob.h"

static mj_ctx_t *volatile signal_target; /* the context catching stop signals, if any */

/* The signals that stop a wait: SIGINT alone for a library's blocking calls,
 * all three for a program that holds them (the command line). */
static const int stop_signals[MJ_NSTOP_SIGNALS] = {SIGINT, SIGTERM, SIGHUP};

static void mj_stop_signal_handler(int signum) {
  int saved_errno = errno;            /* the interrupted code may be reading errno */
  mj_ctx_t *ctx = signal_target;
  if (ctx != NULL) {
    ctx->interrupted = signum;
    uv_async_send(&ctx->wakeup);      /* async-signal-safe */
  }
  errno = saved_errno;
}

static void mj_wakeup_cb(uv_async_t *handle) {
  mj_ctx_t *ctx = handle->data;
  if (ctx->interrupted) uv_stop(&ctx->loop);
}

static int run_ready(mj_ctx_t *ctx);

/* Frames staged during the loop's callbacks (send.c) are written before
 * the loop waits for events, and as soon as it has handled them. Redis
 * commands (redis.c) only before it waits: those of a whole turn, its
 * timers' and its events', go out in one write. */
static void mj_flush_before_cb(uv_prepare_t *h) {
  mj__process_flush_all(h->data);
  mj__redis_flush_all(h->data);
}

static void mj_flush_after_cb(uv_check_t *h) {
  mj__process_flush_all(h->data);
}

/* Initialises the context's lists (empty), the loop and its wake-up handle.
 * Returns 0 or a UV_E... code. */
int mj_ctx_init(mj_ctx_t *ctx) {
  memset(ctx, 0, sizeof *ctx);
  mj_list_t *lists[] = {&ctx->live, &ctx->open, &ctx->inputs, &ctx->outputs, &ctx->redis, &ctx->redis_staged,
                        &ctx->tls, &ctx->http};
  for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) mj__list_init(lists[i]);
  int rc = uv_loop_init(&ctx->loop);
  if (rc != 0) return rc;
  rc = uv_async_init(&ctx->loop, &ctx->wakeup, mj_wakeup_cb);
  if (rc != 0) {
    uv_loop_close(&ctx->loop);
    return rc;
  }
  ctx->wakeup.data = ctx;
  uv_unref((uv_handle_t *) &ctx->wakeup); /* never keeps the loop alive by itself */
  uv_prepare_init(&ctx->loop, &ctx->flush_before);
  uv_check_init(&ctx->loop, &ctx->flush_after);
  ctx->flush_before.data = ctx->flush_after.data = ctx;
  uv_prepare_start(&ctx->flush_before, mj_flush_before_cb);
  uv_check_start(&ctx->flush_after, mj_flush_after_cb);
  uv_unref((uv_handle_t *) &ctx->flush_before);
  uv_unref((uv_handle_t *) &ctx->flush_after);
  run_ready(ctx); /* registers the wake-up's descriptor: a host's poll set sees it from now on */
  return 0;
}

/* Catches the first n stop signals for ctx, keeping the handlers that were
 * there to put back. With keep_ignored, a signal ignored now stays ignored
 * (it is never caught, not even for an instant). */
static void catch_stop_signals(mj_ctx_t *ctx, int n, int keep_ignored) {
  struct sigaction ours;
  memset(&ours, 0, sizeof ours);
  ours.sa_handler = mj_stop_signal_handler;
  sigemptyset(&ours.sa_mask);
  ctx->interrupted = 0;
  signal_target = ctx;
  for (int i = 0; i < n; i++) {
    sigaction(stop_signals[i], NULL, &ctx->previous[i]);
    if (!(keep_ignored && ctx->previous[i].sa_handler == SIG_IGN)) sigaction(stop_signals[i], &ours, NULL);
  }
  ctx->ncaught = n;
}

/* The context holds all stop signals for good (mj_ctx_hold_stop_signals). */
static int holding_stop_signals(const mj_ctx_t *ctx) {
  return ctx->ncaught == MJ_NSTOP_SIGNALS;
}

static void release_stop_signals(mj_ctx_t *ctx) {
  for (int i = 0; i < ctx->ncaught; i++) sigaction(stop_signals[i], &ctx->previous[i], NULL);
  ctx->ncaught = 0;
  signal_target = NULL;
}

/* While `on`, SIGINT only sets ctx->interrupted and wakes the loop, which
 * stops; turning it off restores the handler that was there before. Calls
 * must pair up (on, then off). Once the context holds the stop signals
 * (mj_ctx_hold_stop_signals), this does nothing. */
void mj_ctx_catch_sigint(mj_ctx_t *ctx, int on) {
  if (holding_stop_signals(ctx)) return;
  if (on && signal_target == NULL) catch_stop_signals(ctx, 1, 0);
  else if (!on && signal_target == ctx) release_stop_signals(ctx);
}

/* For a program that stops on SIGINT, SIGTERM and SIGHUP (the command line):
 * from now until the context closes, each of them only stops the loop, at
 * once or at its next run, and mj_ctx_run returns MJ_EINTERRUPTED with the
 * signal in ctx->stop_signal. A signal the program was started with ignored
 * stays ignored, as Unix programs do (nohup ignores SIGHUP). Returns 0, or -1
 * when another context (another Lua state) catches them. */
int mj_ctx_hold_stop_signals(mj_ctx_t *ctx) {
  if (holding_stop_signals(ctx)) return 0;
  if (signal_target == ctx) release_stop_signals(ctx);
  if (signal_target != NULL) return -1;
  catch_stop_signals(ctx, MJ_NSTOP_SIGNALS, 1); /* nohup, a shell's `&`: ignored stays ignored */
  return 0;
}

/* Runs the loop in `mode`. Returns uv_run's result (non-zero while handles
 * remain active), MJ_EINTERRUPTED when a stop signal stopped it (or came
 * before it started; ctx->stop_signal says which), or MJ_EREENTERED when
 * called from inside a callback of this loop. */
int mj_ctx_run(mj_ctx_t *ctx, uv_run_mode mode) {
  if (ctx->running) return MJ_EREENTERED;
  if (!ctx->interrupted) {
    ctx->running = 1;
    uv_run(&ctx->loop, mode);
    ctx->running = 0;
    mj__process_flush_all(ctx); /* a timer run last (UV_RUN_ONCE) may have staged frames */
    /* Redis commands wait for the next run's prepare (a turn's in one write)
     * unless a host loop steps it: it may not step again soon */
    if (mode == UV_RUN_NOWAIT) mj__redis_flush_all(ctx);
  }
  if (ctx->interrupted) {
    ctx->stop_signal = ctx->interrupted;
    ctx->interrupted = 0;
    return MJ_EINTERRUPTED;
  }
  return uv_loop_alive(&ctx->loop);
}

/* ------------------------------------------------ driven by a host loop --- */

/* Runs what is ready, without waiting, with the wake-up handle counted as
 * alive: a wake-up or a signal may be all that made the descriptor readable,
 * and uv_run does nothing at all on a loop with nothing alive. */
static int run_ready(mj_ctx_t *ctx) {
  uv_ref((uv_handle_t *) &ctx->wakeup);
  int rc = mj_ctx_run(ctx, UV_RUN_NOWAIT);
  uv_unref((uv_handle_t *) &ctx->wakeup);
  return rc;
}

/* The descriptor a host loop watches for reading: libuv's backend (epoll),
 * readable when the loop has events to handle. From now on a change made
 * outside the loop's callbacks makes it readable too (mj_ctx_touch); this
 * first call does so at once, for the changes made so far. */
int mj_ctx_fd(mj_ctx_t *ctx) {
  ctx->embedded = 1;
  mj_ctx_touch(ctx);
  return uv_backend_fd(&ctx->loop);
}

/* Runs what is ready and returns at once. Returns 1 while the loop has
 * something to watch (children, timers, connections), 0 when it has
 * nothing, MJ_EREENTERED inside a callback of the loop, MJ_EINTERRUPTED when
 * a held stop signal came (mj_ctx_run). */
int mj_ctx_step(mj_ctx_t *ctx) {
  if (ctx->running) return MJ_EREENTERED;
  int rc = run_ready(ctx);
  if (rc < 0) return rc;
  return uv_loop_alive(&ctx->loop);
}

/* Milliseconds until the loop must run even if its descriptor stays quiet
 * (its next timer; 0: at once, for example a descriptor not registered yet),
 * or -1 when only the descriptor can bring it work (or it has none). */
int mj_ctx_timeout(mj_ctx_t *ctx) {
  if (!uv_loop_alive(&ctx->loop)) return -1; /* uv_backend_timeout says 0 then */
  uv_update_time(&ctx->loop);                /* timers count from the loop's cached time */
  return uv_backend_timeout(&ctx->loop);
}

/* Something changed outside the loop's callbacks (a timer started, a write
 * queued, a child spawned): a host that watches the descriptor is told to
 * step. A no-op unless a host watches, or while the loop runs. */
void mj_ctx_touch(mj_ctx_t *ctx) {
  if (ctx->embedded && !ctx->running) uv_async_send(&ctx->wakeup);
}

/* ------------------------------------------------------------ closing --- */

/* A part of the core holds something that ends with the context: its closer
 * runs in its turn (mj_close_turn_t) when the context closes. Registering
 * again changes nothing. */
void mj__ctx_on_close(mj_ctx_t *ctx, const mj_closer_t *closer) {
  ctx->closers[closer->turn] = closer;
}

/* Each part registered ends what it holds, or with loop_closed lets go of the
 * loop, in the order of the turns. */
static void close_parts(mj_ctx_t *ctx, int loop_closed) {
  for (int turn = 0; turn < MJ_CLOSE_TURNS; turn++) {
    const mj_closer_t *closer = ctx->closers[turn];
    void (*end)(mj_ctx_t *) = closer == NULL ? NULL : loop_closed ? closer->detach : closer->close;
    if (end != NULL) end(ctx);
  }
}

/* Handles left after the parts ended what they hold (timers, whose memory
 * belongs to their owner, and the context's own) need no close callback. */
static void mj_close_walk_cb(uv_handle_t *h, void *arg) {
  (void) arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* Ends everything the context owns, for good: spawns in flight are waited for,
 * then each part of the core ends in its turn (mj_close_turn_t: every child
 * is SIGKILLed with its process group and reaped first), every handle is
 * closed, and the loop is closed. The owner's callbacks still run meanwhile
 * (for example close callbacks) and must not call back into a program that is
 * going away. Returns 0, or UV_EBUSY when requests in libuv's thread pool (a
 * read blocked on a terminal) did not end within about two seconds: the
 * context's memory must then never be freed. */
int mj_ctx_close(mj_ctx_t *ctx) {
  uint64_t deadline = uv_hrtime() + (uint64_t) MJ_CLOSE_WAIT_MS * 1000000;
  if (signal_target == ctx) release_stop_signals(ctx);
  while (ctx->spawning > 0 && uv_hrtime() < deadline) uv_run(&ctx->loop, UV_RUN_NOWAIT);
  close_parts(ctx, 0);
  uv_walk(&ctx->loop, mj_close_walk_cb, NULL);
  while (uv_run(&ctx->loop, UV_RUN_NOWAIT) != 0 && uv_hrtime() < deadline) {
    const struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
  int rc = uv_loop_close(&ctx->loop);
  if (rc == 0) close_parts(ctx, 1);
  return rc;
}
