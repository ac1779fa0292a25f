/* loop.c -- the one libuv loop of a Lua state, and running it safely.
 *
 * Every pool of a program shares this loop. mj_ctx_run refuses to re-enter
 * the loop from one of its own callbacks (libuv's uv_run is not reentrant).
 * A blocking wait can be made interruptible by Ctrl-C (mj_ctx_catch_sigint):
 * meanwhile SIGINT only sets a flag and wakes the loop, which stops; the
 * previous SIGINT disposition (for example the LuaJIT REPL's own handler) is
 * restored afterwards. The handler is installed once per wait, not per run.
 *
 * Caveat: a signal handler has no argument to carry a context, so the context
 * being run interruptibly is kept in one static pointer; nested interruptible
 * runs cannot happen because runs do not nest.
 */
#include <string.h>

#include "moonjob.h"

static mj_ctx_t *volatile sigint_target; /* the context catching SIGINT, if any */

static void mj_sigint_handler(int signum) {
  (void) signum;
  mj_ctx_t *ctx = sigint_target;
  if (ctx == NULL) return;
  ctx->interrupted = 1;
  uv_async_send(&ctx->wakeup);        /* async-signal-safe */
}

static void mj_wakeup_cb(uv_async_t *handle) {
  mj_ctx_t *ctx = handle->data;
  if (ctx->interrupted) uv_stop(&ctx->loop);
}

/* Initialises the loop and its wake-up handle. Returns 0 or a UV_E... code. */
int mj_ctx_init(mj_ctx_t *ctx) {
  memset(ctx, 0, sizeof *ctx);
  int rc = uv_loop_init(&ctx->loop);
  if (rc != 0) return rc;
  rc = uv_async_init(&ctx->loop, &ctx->wakeup, mj_wakeup_cb);
  if (rc != 0) {
    uv_loop_close(&ctx->loop);
    return rc;
  }
  ctx->wakeup.data = ctx;
  uv_unref((uv_handle_t *) &ctx->wakeup); /* never keeps the loop alive by itself */
  return 0;
}

/* While `on`, SIGINT only sets ctx->interrupted and wakes the loop, which
 * stops; turning it off restores the handler that was there before. Calls
 * must pair up (on, then off). */
void mj_ctx_catch_sigint(mj_ctx_t *ctx, int on) {
  if (on && sigint_target == NULL) {
    struct sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_handler = mj_sigint_handler;
    sigemptyset(&ours.sa_mask);
    ctx->interrupted = 0;
    sigint_target = ctx;
    sigaction(SIGINT, &ours, &ctx->previous_sigint);
  } else if (!on && sigint_target == ctx) {
    sigaction(SIGINT, &ctx->previous_sigint, NULL);
    sigint_target = NULL;
  }
}

/* Runs the loop in `mode`. Returns uv_run's result (non-zero while handles
 * remain active), MJ_EINTERRUPTED when Ctrl-C stopped it (or came before it
 * started), or MJ_EREENTERED when called from inside a callback of this loop. */
int mj_ctx_run(mj_ctx_t *ctx, uv_run_mode mode) {
  if (ctx->running) return MJ_EREENTERED;
  if (!ctx->interrupted) {
    ctx->running = 1;
    uv_run(&ctx->loop, mode);
    ctx->running = 0;
  }
  if (ctx->interrupted) {
    ctx->interrupted = 0;
    return MJ_EINTERRUPTED;
  }
  return uv_loop_alive(&ctx->loop);
}
