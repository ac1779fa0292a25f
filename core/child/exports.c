/* exports.c -- the functions the runner calls through the FFI, in one place.
 *
 * The batch functions and the clock below are also exported for the
 * runner's FFI (moonjob_*: the program is linked with -rdynamic), so that the
 * per-line loop of a batch stays compiled; the channel.* versions are the
 * same for a build without the export. The JSON codec's C half,
 * ../json_scan.c (moonjob_utf8_error_at, moonjob_json_*), is the other export.
 *
 * Caveat: the names and signatures are a contract with the ffi.cdef of
 * lua/moonjob/child/batch.lua (lua/moonjob/codec/json_c.lua's for json_scan.c's
 * functions); the batch's state is the shared page's batch
 * word and area (frame.h), which the parent reads (core/parent/shared.c).
 */
#include "child.h"

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* When the line before ended, read by channel.keep_completed as it wrote
 * its result (result.c), or 0: the next line starts then rather than at a
 * clock reading of its own (a reading costs about as much as a tenth of a
 * tiny line here; the two differ by the loop's few steps). Only for a line
 * that follows at once: a batch's first line, and one after a line the Lua
 * path wrote, read the clock. */
static uint64_t line_end_stamp;

/* Starts the next line of the batch in hand. Returns when it started (ms on
 * the monotonic clock, also left in the shared page for the parent, should
 * the child die in it), or -1 when the parent took it back. What the child
 * prints from here on is tagged with this line (output.c). */
double moonjob_batch_next(void) {
  uint64_t now = line_end_stamp != 0 ? line_end_stamp : monotonic_ns();
  line_end_stamp = 0;
  if (shared == NULL) {
    output_line_starts(now, 1);
    line_began(now);
    return (double) now / 1e6;
  }
  uint64_t b = __atomic_load_n(&shared->batch, __ATOMIC_ACQUIRE), next;
  do {
    uint32_t started = MJ_BATCH_STARTED(b);
    if (MJ_BATCH_SEQ(b) != job_seq || started >= MJ_BATCH_LIMIT(b)) {
      output_line_starts(now, 0);
      return -1;
    }
    next = MJ_BATCH(job_seq, started + 1, MJ_BATCH_LIMIT(b));
  } while (!__atomic_compare_exchange_n(&shared->batch, &b, next, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE));
  __atomic_store_n(&shared->batch_line_started, now, __ATOMIC_RELAXED);
  output_line_starts(now, 1);
  line_began(now); /* its own deadline (interrupt.c) */
  return (double) now / 1e6;
}

static int channel_batch_next(lua_State *L) {
  lua_pushnumber(L, moonjob_batch_next());
  return 1;
}

/* channel.batch_keep(text) -> true when the result text of the line just
 * finished went into the batch area (the parent reads it there should the
 * child die before the job's DONE frame, which carries channel.KEPT); false
 * when it does not fit (nothing kept: the runner ends the batch and sends the
 * text itself). */
int moonjob_batch_keep(const void *text, size_t len) {
  if (shared == NULL) return 0;
  uint64_t k = __atomic_load_n(&shared->batch_kept, __ATOMIC_RELAXED);
  size_t used = MJ_KEPT_BYTES(k);
  if (len > MJ_BATCH_AREA - used) return 0;
  /* A blank line keeps no bytes, and its text may then be NULL (an empty
   * string.buffer that never held any: one that only C-written lines used,
   * channel.keep_completed); memcpy from NULL is undefined even for 0 bytes
   * (UBSan aborts the child in make sanitize). It still counts as a line. */
  if (len > 0) memcpy((char *) shared + MJ_SHARED_SIZE + used, text, len);
  __atomic_store_n(&shared->batch_kept, MJ_KEPT(MJ_KEPT_LINES(k) + 1, used + len), __ATOMIC_RELEASE);
  return 1;
}

static int channel_batch_keep(lua_State *L) {
  size_t len;
  const char *text = luaL_checklstring(L, 1, &len);
  lua_pushboolean(L, moonjob_batch_keep(text, len));
  return 1;
}

/* Where the line that starts at text[from] (0-based) ends: the offset of its
 * newline, or len. */
size_t moonjob_line_end(const char *text, size_t from, size_t len) {
  const char *nl = from < len ? memchr(text + from, '\n', len - from) : NULL;
  return nl ? (size_t) (nl - text) : len;
}

/* moonjob_output_lines(first): a batch whose first line is `first` begins,
 * and what each of its lines prints is tagged with the line's number (each
 * moonjob_batch_next starts the next); 0: the batch is over, what it printed
 * is written, before the frame that ends it. */
void moonjob_output_lines(double first) {
  line_end_stamp = 0; /* (a batch begins or ends: its first line reads the clock) */
  output_lines(first > 0 ? (uint64_t) first : 0);
}

static int channel_output_lines(lua_State *L) {
  moonjob_output_lines(luaL_checknumber(L, 1));
  return 0;
}

/* channel.output_flush(): what the child holds of its output is written
 * now (output.c: before a command runs). */
static int channel_output_flush(lua_State *L) {
  (void) L;
  output_flush();
  return 0;
}

/* channel.now() -> milliseconds on the monotonic clock (a batch times its
 * lines with it). */
double moonjob_now_ms(void) {
  return (double) monotonic_ns() / 1e6;
}

static int channel_now(lua_State *L) {
  lua_pushnumber(L, moonjob_now_ms());
  return 1;
}
