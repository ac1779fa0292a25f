/* result.c -- a batch line's result line written in C, straight into the
 * batch area: channel.keep_completed.
 *
 * For each line of a batch that completed, the runner (child/batch.lua)
 * used to encode the processor's result with moonjob.codec.json's encoder,
 * format the result line (moonjob.codec.resultline) and copy it into the
 * shared area: in Lua, the most of a light line's cost, and code whose
 * recursion and key loops kept the per-line loop from compiling. Here the
 * same bytes are written by one C call: the result as exact JSON (object
 * keys sorted by their bytes; integers up to 2^53 in full; other numbers as
 * the shortest of %.15g/%.16g/%.17g that reads back equal; strings checked
 * as UTF-8 and escaped as the codec escapes them), inside
 *   {"line":N,"status":"completed","result":...,"attempts":A,"ms":M}\n
 * and the area's count published, as moonjob_batch_keep does.
 *
 * It writes only what it is sure to write as the Lua encoder would, and
 * declines the rest (returns nil, nothing written): a table with a
 * metatable, an object with a key that is not a string, a table that is
 * neither an object nor an array 1..n, nesting deeper than
 * MJ_RESULT_MAX_DEPTH, a value of another type (cdata, functions, a
 * light userdata other than cjson.null), a string that is not UTF-8, a
 * number that is not finite, or whose form would be decided by a rounding
 * tie (LuaJIT's string.format rounds a tie away from zero, the C library to
 * even), a result longer than max_payload, a line that does not
 * fit in the area's room. The runner then does it in Lua, as before, and
 * errors keep their words. So the bytes are the same either way
 * (spec/child/result_line_spec.lua compares them on generated values).
 *
 * It runs no metamethod and makes nothing in the Lua heap: what it reads
 * stays on the Lua stack while it writes (the stack may grow; past its
 * bound it declines). An object of more than 32 keys has its list of keys
 * malloc'd (a memory error raised while the stack grows would leak that
 * list: once, at a full heap).
 */
#include "child.h"

#include <locale.h>
#include <math.h>

#include "../json_scan.h"

#define MJ_RESULT_MAX_DEPTH 100

/* Where the line is written: p moves on, never past end (full: no room). */
typedef struct {
  char *p, *end;
  int full;
} mj_out_t;

static locale_t result_locale; /* the C locale, for %g and strtod whatever the processor set */

static void out_bytes(mj_out_t *o, const void *s, size_t n) {
  if (o->full || (size_t) (o->end - o->p) < n) {
    o->full = 1;
    return;
  }
  memcpy(o->p, s, n);
  o->p += n;
}

#define OUT_LITERAL(o, s) out_bytes((o), (s), sizeof(s) - 1)

static void out_uint(mj_out_t *o, uint64_t v) {
  char digits[24];
  int i = sizeof digits;
  do {
    digits[--i] = (char) ('0' + v % 10);
    v /= 10;
  } while (v != 0);
  out_bytes(o, digits + i, sizeof digits - (size_t) i);
}

/* The position (1-based) of the last significant digit that is not 0 in
 * n's exact decimal expansion, as far as its first `digits` + 1 (rounded
 * there: with 780 the expansion is whole, a double's has at most 767
 * significant digits), and that digit in *last. */
static int last_digit(double n, int digits, char *last) {
  char text[800];
  snprintf(text, sizeof text, "%.*e", digits, n);
  int seen = 0, at = 0;
  for (const char *d = text; *d != 'e' && *d != '\0'; d++) {
    if (*d < '0' || *d > '9') continue;
    seen++;
    if (*d != '0') at = seen, *last = *d;
  }
  return at;
}

/* The precision p (15, 16 or 17) at which %.{p}g of n rounds a tie (its
 * exact value has p + 1 significant digits, the last a 5), or 0. There
 * LuaJIT's string.format rounds away from zero and the C library to even;
 * elsewhere both write the digits correctly rounded, the same. */
static int tie_precision(double n) {
  char last = 0;
  int at = last_digit(n, 24, &last); /* (rules out nearly all, cheaply) */
  if (at < 16 || at > 18 || last != '5') return 0;
  return last_digit(n, 780, &last) == at ? at - 1 : 0;
}

static const double powers_of_ten[] = {1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12};

/* The common case without the C library's formatting: n (not whole) is
 * the double nearest m / 10^k for a whole m of at most 15 digits, and
 * 1e-4 <= |n| < 1e15. Then its %.15g is m's digits with the point k from
 * the right, trailing zeros dropped (the double nearest a decimal of 15
 * digits rounds back to it there, and %g writes no exponent in that range),
 * and it reads back equal: json.number_text's choice. Returns whether it
 * wrote n so. (m / 10^k, both exact, rounds as strtod of the decimal does.) */
static int out_short_decimal(mj_out_t *o, double n) {
  double a = fabs(n);
  if (!(a >= 1e-4 && a < 1e15)) return 0;
  for (int k = 1; k < (int) (sizeof powers_of_ten / sizeof powers_of_ten[0]); k++) {
    double m = nearbyint(a * powers_of_ten[k]);
    if (m >= 1e15) return 0;
    if (m / powers_of_ten[k] != a) continue;
    char digits[40];
    int len = 0;
    uint64_t v = (uint64_t) m;
    while (k > 0 && v % 10 == 0) v /= 10, k--; /* (trailing zeros) */
    for (int i = 0; v != 0 || i <= k; i++) {
      if (i == k && i > 0) digits[len++] = '.';
      digits[len++] = (char) ('0' + v % 10);
      v /= 10;
    }
    if (n < 0) digits[len++] = '-';
    for (int i = 0; i < len / 2; i++) {
      char c = digits[i];
      digits[i] = digits[len - 1 - i];
      digits[len - 1 - i] = c;
    }
    out_bytes(o, digits, (size_t) len);
    return 1;
  }
  return 0;
}

/* A number the short form does not fit: the first of %.15g, %.16g, %.17g
 * that reads back equal, in the C locale (a processor may have set another:
 * LuaJIT's own formatting ignores it). Returns 0, or -1 to decline. */
static int out_long_number(mj_out_t *o, double n) {
  int tie = tie_precision(n);
  char text[64];
  for (int precision = 15; precision <= 17; precision++) {
    if (precision == tie) return -1; /* (the Lua encoder writes it as LuaJIT rounds) */
    int len = snprintf(text, sizeof text, "%.*g", precision, n);
    if (precision == 17 || strtod_l(text, NULL, result_locale) == n) {
      out_bytes(o, text, (size_t) len);
      return 0;
    }
  }
  return -1;
}

/* A number as json.number_text writes it. Returns 0, or -1 to decline. */
static int out_number(mj_out_t *o, double n) {
  if (!isfinite(n)) return -1;
  if (n == floor(n) && fabs(n) <= 9007199254740992.0) {
    if (signbit(n)) OUT_LITERAL(o, "-");
    out_uint(o, (uint64_t) fabs(n));
    return 0;
  }
  if (out_short_decimal(o, n)) return 0;
  locale_t outer = uselocale(result_locale);
  int status = out_long_number(o, n);
  uselocale(outer);
  return status;
}

static const char hex_digits[] = "0123456789abcdef";

/* A string as the codec writes it: UTF-8 only, `"` `\` and control bytes
 * escaped (\b \f \n \r \t, else \u00XX, and DEL as \u007f). */
static int out_string(mj_out_t *o, const char *s, size_t len) {
  if (moonjob_utf8_error_at(s, len) != 0) return -1;
  OUT_LITERAL(o, "\"");
  size_t from = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char) s[i];
    if (c >= 32 && c != '"' && c != '\\' && c != 127) continue;
    out_bytes(o, s + from, i - from);
    from = i + 1;
    switch (c) {
    case '"': OUT_LITERAL(o, "\\\""); break;
    case '\\': OUT_LITERAL(o, "\\\\"); break;
    case '\b': OUT_LITERAL(o, "\\b"); break;
    case '\f': OUT_LITERAL(o, "\\f"); break;
    case '\n': OUT_LITERAL(o, "\\n"); break;
    case '\r': OUT_LITERAL(o, "\\r"); break;
    case '\t': OUT_LITERAL(o, "\\t"); break;
    default: {
      char u[6] = {'\\', 'u', '0', '0', hex_digits[c >> 4], hex_digits[c & 15]};
      out_bytes(o, u, sizeof u);
    }
    }
  }
  out_bytes(o, s + from, len - from);
  OUT_LITERAL(o, "\"");
  return 0;
}

static int out_value(lua_State *L, mj_out_t *o, int index, int depth);

/* An object key: its bytes and the stack slot of its value. */
typedef struct {
  const char *s;
  size_t len;
  int value;
} mj_key_t;

/* Lua's string order: bytes unsigned, a prefix first. */
static int key_less(const mj_key_t *a, const mj_key_t *b) {
  int c = memcmp(a->s, b->s, a->len < b->len ? a->len : b->len);
  return c < 0 || (c == 0 && a->len < b->len);
}

static int key_compare(const void *a, const void *b) {
  return key_less(a, b) ? -1 : key_less(b, a) ? 1 : 0;
}

/* The members of the table at `t`, whose first key is on the stack's top
 * (a string, above `base`): every key and value pushed in turn, the keys
 * sorted, written. Declines a key that is not a string. */
static int out_object(lua_State *L, mj_out_t *o, int t, int base, int depth) {
  mj_key_t small[32], *keys = small;
  size_t n = 0, room = sizeof small / sizeof small[0];
  int status = 0;
  lua_pushnil(L); /* (the first key again: lua_next from the start) */
  lua_remove(L, -2);
  while (lua_next(L, t) != 0) {
    if (lua_type(L, -2) != LUA_TSTRING || !lua_checkstack(L, 3)) {
      status = -1;
      lua_pop(L, 2);
      break;
    }
    if (n == room) {
      mj_key_t *more = malloc(2 * room * sizeof *more);
      if (more == NULL) {
        status = -1;
        lua_pop(L, 2);
        break;
      }
      memcpy(more, keys, n * sizeof *keys);
      if (keys != small) free(keys);
      keys = more, room *= 2;
    }
    keys[n].s = lua_tolstring(L, -2, &keys[n].len);
    keys[n].value = lua_gettop(L);
    n++;
    lua_pushvalue(L, -2); /* the key again, for lua_next: the pair stays */
  }
  if (status == 0) {
    if (n <= 12) {
      for (size_t i = 1; i < n; i++) {
        mj_key_t k = keys[i];
        size_t j = i;
        for (; j > 0 && key_less(&k, &keys[j - 1]); j--) keys[j] = keys[j - 1];
        keys[j] = k;
      }
    } else {
      qsort(keys, n, sizeof *keys, key_compare);
    }
    OUT_LITERAL(o, "{");
    for (size_t i = 0; i < n && status == 0; i++) {
      if (i > 0) OUT_LITERAL(o, ",");
      status = out_string(o, keys[i].s, keys[i].len);
      OUT_LITERAL(o, ":");
      if (status == 0) status = out_value(L, o, keys[i].value, depth + 1);
    }
    OUT_LITERAL(o, "}");
  }
  if (keys != small) free(keys);
  lua_settop(L, base);
  return status;
}

/* The table at `t` (no metatable): an array when its keys are exactly 1..n,
 * an object when they are all strings, `{}` when empty. */
static int out_table(lua_State *L, mj_out_t *o, int t, int depth) {
  int base = lua_gettop(L);
  if (depth >= MJ_RESULT_MAX_DEPTH || !lua_checkstack(L, 4)) return -1;
  if (lua_getmetatable(L, t)) {
    lua_settop(L, base);
    return -1;
  }
  lua_pushnil(L);
  if (lua_next(L, t) == 0) {
    OUT_LITERAL(o, "{}");
    return 0;
  }
  if (lua_type(L, -2) == LUA_TSTRING) {
    lua_pop(L, 1);
    return out_object(L, o, t, base, depth);
  }
  /* an array: every key a whole number >= 1, as many as the greatest */
  double count = 0, max = 0;
  do {
    lua_pop(L, 1); /* (the value: the key stays for lua_next) */
    double k = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : 0;
    if (!(k >= 1 && k == floor(k) && k <= 4294967295.0)) {
      lua_settop(L, base);
      return -1;
    }
    count++;
    if (k > max) max = k;
  } while (lua_next(L, t) != 0);
  if (count != max) return -1;
  OUT_LITERAL(o, "[");
  for (int i = 1; i <= (int) count; i++) {
    if (i > 1) OUT_LITERAL(o, ",");
    lua_rawgeti(L, t, i);
    int status = out_value(L, o, lua_gettop(L), depth + 1);
    lua_pop(L, 1);
    if (status != 0) return -1;
  }
  OUT_LITERAL(o, "]");
  return 0;
}

static int out_value(lua_State *L, mj_out_t *o, int index, int depth) {
  switch (lua_type(L, index)) {
  case LUA_TSTRING: {
    size_t len;
    const char *s = lua_tolstring(L, index, &len);
    return out_string(o, s, len);
  }
  case LUA_TNUMBER: return out_number(o, lua_tonumber(L, index));
  case LUA_TBOOLEAN:
    if (lua_toboolean(L, index)) OUT_LITERAL(o, "true");
    else OUT_LITERAL(o, "false");
    return 0;
  case LUA_TTABLE: return out_table(L, o, index, depth);
  case LUA_TNIL: OUT_LITERAL(o, "null"); return 0;
  case LUA_TLIGHTUSERDATA: /* cjson.null */
    if (lua_touserdata(L, index) != NULL) return -1;
    OUT_LITERAL(o, "null");
    return 0;
  default: return -1;
  }
}

/* The milliseconds as moonjob.codec.resultline's put_ms writes them: to the
 * microsecond, no trailing zeros. */
static void out_ms(mj_out_t *o, double ms) {
  double us = floor(ms * 1000 + 0.5);
  if (!(us >= 0 && us < 1e15)) {
    o->full = 1; /* (never in practice: the Lua side writes it) */
    return;
  }
  uint64_t u = (uint64_t) us, whole = u / 1000;
  unsigned frac = (unsigned) (u - whole * 1000);
  out_uint(o, whole);
  if (frac == 0) return;
  char digits[4] = {'.', (char) ('0' + frac / 100), (char) ('0' + frac / 10 % 10), (char) ('0' + frac % 10)};
  size_t n = 4;
  while (digits[n - 1] == '0') n--;
  out_bytes(o, digits, n);
}

/* channel.keep_completed(result, line, attempt, t0, max_payload) -> true
 * when the result line of a line that completed with `result` (started at
 * t0, channel.now's milliseconds) went into the batch area; nil when this
 * code declines it (nothing written: the runner writes it in Lua). */
static int channel_keep_completed(lua_State *L) {
  double line = luaL_checknumber(L, 2), attempt = luaL_checknumber(L, 3);
  double t0 = luaL_checknumber(L, 4), max_payload = luaL_checknumber(L, 5);
  lua_settop(L, 5);
  if (shared == NULL || !(line >= 0 && attempt >= 0)) return 0;
  if (result_locale == (locale_t) 0) {
    result_locale = newlocale(LC_ALL_MASK, "C", (locale_t) 0);
    if (result_locale == (locale_t) 0) return 0;
  }
  uint64_t k = __atomic_load_n(&shared->batch_kept, __ATOMIC_RELAXED);
  size_t used = MJ_KEPT_BYTES(k);
  char *area = (char *) shared + MJ_SHARED_SIZE;
  mj_out_t o = {area + used, area + MJ_BATCH_AREA, 0};
  OUT_LITERAL(&o, "{\"line\":");
  out_uint(&o, (uint64_t) line);
  OUT_LITERAL(&o, ",\"status\":\"completed\",\"result\":");
  char *result_at = o.p;
  int status = out_value(L, &o, 1, 0);
  lua_settop(L, 5);
  if (status != 0 || o.full || (double) (o.p - result_at) > max_payload) return 0;
  OUT_LITERAL(&o, ",\"attempts\":");
  out_uint(&o, (uint64_t) attempt);
  OUT_LITERAL(&o, ",\"ms\":");
  uint64_t now = monotonic_ns();
  out_ms(&o, (double) now / 1e6 - t0);
  OUT_LITERAL(&o, "}\n");
  if (o.full) return 0;
  line_end_stamp = now; /* (the next line's start: moonjob_batch_next) */
  size_t len = (size_t) (o.p - (area + used));
  __atomic_store_n(&shared->batch_kept, MJ_KEPT(MJ_KEPT_LINES(k) + 1, used + len), __ATOMIC_RELEASE);
  lua_pushboolean(L, 1);
  return 1;
}
