/* json_scan.c -- the C half of moonjob.codec.json: one pass over a JSON text
 * that checks its UTF-8 and finds what cjson would change, so that cjson,
 * fast, can decode every text exactly.
 *
 * cjson reads every number as a double and an empty array as an empty table:
 * it would round an integer beyond ±2^53, turn 1e400 into inf and 1e-400 into
 * 0, and lose `[]` from `{}`. moonjob_json_scan looks at the tokens outside
 * strings (strings are skipped 16 bytes at a time with SSE2, else 8) and
 * finds:
 *   - integers written without fraction or exponent beyond ±2^53: each is
 *     written, in a copy of the text, as a marker, a JSON string holding byte
 *     0xFF, a kind ('i' for int64_t, 'u' for uint64_t above 2^63-1) and its
 *     digits; past 64 bits, an error;
 *   - empty arrays (`[`, blanks, `]`): written as the marker "\xFF[";
 *   - numbers with a fraction or an exponent beyond a double's range, or not
 *     zero but too small for one: an error (their decimal exponent decides;
 *     strtod in the C locale decides the few near the edges);
 *   - number tokens outside JSON's grammar (cjson takes `1.`): an error;
 *   - a NUL byte outside strings: an error (cjson stops reading at one, and
 *     would take `{"a":1}\0junk` for `{"a":1}`; in a string cjson refuses it).
 * When nothing is found (most texts) cjson decodes the text itself. When
 * every marker is the value of a member of the top object whose key has no
 * escape (records with big ids), the scan says FIXUPS and lists those members
 * (key and token, at most MOONJOB_JSON_MAX_FIXUPS): cjson decodes the text
 * itself and the codec sets them by key, with no copy to decode and walk. A
 * key met again after a fixup for it, or a key with an escape after one, may
 * take the member's place (cjson keeps a repeated key's last value): the copy
 * then. Else cjson decodes the copy, and the codec turns each marker back into
 * its value (a 64-bit integer cdata, an empty table marked as an array).
 * Valid UTF-8 never holds byte 0xFF and cjson writes every \u escape as
 * UTF-8, so no string of the text can be taken for a marker.
 *
 * What the scanner does not judge (syntax, escapes, nesting past max_depth) is
 * left to cjson. Past max_depth it stops rewriting and says "plain": cjson then
 * reads the text itself and says why it is wrong, at the right position. A
 * marker where the text had a number or `[]` as an object's key makes the copy
 * valid where the text is not: the codec finds it (a marker left over) and
 * asks cjson about the text itself.
 *
 * Errors come in this order: invalid UTF-8 anywhere, then the first number
 * error or NUL byte, then cjson's own. The status numbers are in json_scan.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtod_l, newlocale */
#endif
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "json_scan.h"

/* ------------------------------------------------------------ UTF-8 --- */

/* The bytes of the UTF-8 character starting at s[i] (s[i] >= 0x80), or 0
 * when it is not one (RFC 3629: no overlong forms, no surrogates, nothing
 * past U+10FFFF; cut short by the end). */
static size_t mj_utf8_char(const unsigned char *s, size_t i, size_t len) {
  unsigned c = s[i];
  size_t n;
  unsigned low = 0x80, high = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 1;
  else if (c == 0xE0) n = 2, low = 0xA0;
  else if (c == 0xED) n = 2, high = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) n = 2;
  else if (c == 0xF0) n = 3, low = 0x90;
  else if (c == 0xF4) n = 3, high = 0x8F;
  else if (c >= 0xF1 && c <= 0xF3) n = 3;
  else return 0;
  if (i + n >= len) return 0;
  if (s[i + 1] < low || s[i + 1] > high) return 0;
  for (size_t k = 2; k <= n; k++)
    if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
  return n + 1;
}

#define MJ_ONES 0x0101010101010101ull
#define MJ_HIGH 0x8080808080808080ull
/* The high bit of each byte of v that is zero (none: 0). */
#define MJ_ZERO_BYTES(v) (((v) - MJ_ONES) & ~(v) & MJ_HIGH)

/* Where text[0, len) stops being UTF-8, as a 1-based byte position, or 0 when
 * it is UTF-8. The codec checks every string it writes with it; runs of ASCII
 * are skipped eight bytes at a time. */
size_t moonjob_utf8_error_at(const char *text, size_t len) {
  const unsigned char *s = (const unsigned char *) text;
  size_t i = 0;
  while (i < len) {
    if (i + 8 <= len) {
      uint64_t word;
      memcpy(&word, s + i, 8);
      if ((word & MJ_HIGH) == 0) {
        i += 8;
        continue;
      }
    }
    if (s[i] < 0x80) {
      i++;
      continue;
    }
    size_t n = mj_utf8_char(s, i, len);
    if (n == 0) return i + 1;
    i += n;
  }
  return 0;
}

/* ---------------------------------------------------------- numbers --- */

#define MJ_IS_DIGIT(c) ((c) >= '0' && (c) <= '9')

/* A number token's parts: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)? */
typedef struct {
  int negative;
  const unsigned char *int_start, *int_end, *frac_start, *frac_end;
  int has_exponent;
  int64_t exponent; /* held within ±1e9: farther is as far as far goes */
} mj_number_t;

/* Splits token p[0, n) into its parts. Returns 0, or -1 when it is not a JSON
 * number (a leading zero, `1.`, `-`, `1e`). */
static int mj_number_parts(const unsigned char *p, size_t n, mj_number_t *num) {
  const unsigned char *end = p + n;
  memset(num, 0, sizeof *num);
  if (*p == '-') num->negative = 1, p++;
  num->int_start = p;
  if (p == end || !MJ_IS_DIGIT(*p)) return -1;
  if (*p == '0') p++;
  else
    while (p < end && MJ_IS_DIGIT(*p)) p++;
  num->int_end = p;
  if (p < end && *p == '.') {
    num->frac_start = ++p;
    while (p < end && MJ_IS_DIGIT(*p)) p++;
    num->frac_end = p;
    if (num->frac_end == num->frac_start) return -1;
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    int negative = 0;
    p++;
    if (p < end && (*p == '+' || *p == '-')) negative = *p++ == '-';
    if (p == end || !MJ_IS_DIGIT(*p)) return -1;
    for (; p < end && MJ_IS_DIGIT(*p); p++)
      if (num->exponent < 1000000000) num->exponent = num->exponent * 10 + (*p - '0');
    if (negative) num->exponent = -num->exponent;
    num->has_exponent = 1;
  }
  return p == end ? 0 : -1;
}

/* An integer token beyond ±2^53: its marker kind ('i' or 'u'), or
 * MOONJOB_JSON_BEYOND_64. 0 for an integer within ±2^53 (a double holds it). */
static int mj_integer_kind(const mj_number_t *num) {
  size_t digits = (size_t) (num->int_end - num->int_start);
  if (digits < 16 || (digits == 16 && memcmp(num->int_start, "9007199254740992", 16) <= 0))
    return 0;
  if (digits > 20) return MOONJOB_JSON_BEYOND_64;
  uint64_t v = 0;
  for (const unsigned char *p = num->int_start; p < num->int_end; p++) {
    unsigned d = *p - '0';
    if (v > (UINT64_MAX - d) / 10) return MOONJOB_JSON_BEYOND_64;
    v = v * 10 + d;
  }
  if (num->negative) return v > (uint64_t) 1 << 63 ? MOONJOB_JSON_BEYOND_64 : 'i';
  return v > (uint64_t) INT64_MAX ? 'u' : 'i';
}

/* strtod of token p[0, n), in the C locale whatever the program's. */
static double mj_strtod(const unsigned char *p, size_t n) {
  static locale_t c_locale;
  char small[128];
  char *copy = n < sizeof small ? small : malloc(n + 1);
  if (copy == NULL) return 1; /* no memory to tell: let it pass, as cjson would */
  memcpy(copy, p, n);
  copy[n] = '\0';
  if (c_locale == (locale_t) 0) c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t) 0);
  double v = c_locale != (locale_t) 0 ? strtod_l(copy, NULL, c_locale) : strtod(copy, NULL);
  if (copy != small) free(copy);
  return v;
}

/* A number with a fraction or an exponent: 0 when a double holds it, else
 * MOONJOB_JSON_OVERFLOW or MOONJOB_JSON_UNDERFLOW. Its first digit that is
 * not zero gives its decimal exponent; only near the edges does strtod run. */
static int mj_double_range(const mj_number_t *num, const unsigned char *token, size_t n) {
  int64_t power;
  const unsigned char *p = num->int_start;
  while (p < num->int_end && *p == '0') p++;
  if (p < num->int_end) {
    power = num->int_end - p - 1;
  } else {
    p = num->frac_start;
    while (p != NULL && p < num->frac_end && *p == '0') p++;
    if (p == NULL || p == num->frac_end) return 0; /* zero: any exponent */
    power = -(p - num->frac_start) - 1;
  }
  power += num->exponent;
  if (power >= -307 && power <= 307) return 0;
  if (power >= 309) return MOONJOB_JSON_OVERFLOW;
  if (power <= -325) return MOONJOB_JSON_UNDERFLOW;
  double v = mj_strtod(token, n);
  if (v == HUGE_VAL || v == -HUGE_VAL) return MOONJOB_JSON_OVERFLOW;
  return v == 0 ? MOONJOB_JSON_UNDERFLOW : 0;
}

/* ---------------------------------------------------------- scanner --- */

typedef struct {
  const unsigned char *s;
  size_t len;
  char *out;
  size_t room;
  size_t written;   /* bytes of the copy so far (written, or counted past room) */
  size_t copied;    /* the text before this offset is in the copy */
  uint32_t markers;
  moonjob_json_scan_t *r;
  int top_object;   /* the text is an object: its members' markers may be fixups */
  int fixable;      /* every marker so far is a fixup */
} mj_scan_t;

static void mj_put(mj_scan_t *st, const void *bytes, size_t n) {
  if (n == 0) return;
  if (st->written + n <= st->room) memcpy(st->out + st->written, bytes, n);
  st->written += n;
}

/* The key of the top object's member whose value starts at text[start]:
 * its body's offset and length, found backwards (blanks, ':', blanks, a
 * string without a backslash); 0 when the text is not so (then the copy). */
static int mj_key_before(const mj_scan_t *st, size_t start, size_t *at, size_t *n) {
  const unsigned char *s = st->s;
  size_t i = start;
  while (i > 0 && (s[i - 1] == ' ' || s[i - 1] == '\t' || s[i - 1] == '\n' || s[i - 1] == '\r')) i--;
  if (i == 0 || s[--i] != ':') return 0;
  while (i > 0 && (s[i - 1] == ' ' || s[i - 1] == '\t' || s[i - 1] == '\n' || s[i - 1] == '\r')) i--;
  if (i == 0 || s[--i] != '"') return 0;
  size_t end = i;
  while (i > 0 && s[i - 1] != '"') {
    if (s[i - 1] == '\\') return 0;
    i--;
  }
  if (i < 2 || s[i - 2] == '\\') return 0; /* (that quote was escaped: the key is longer) */
  *at = i;
  *n = end - i;
  return 1;
}

/* A marker at text[start], `depth` containers deep, of kind `kind`: a fixup
 * when it is the value of a member of the top object, under a key without
 * escapes, and there is room for one more; else the codec needs the copy. */
static void mj_note_marker(mj_scan_t *st, size_t start, long depth, char kind) {
  moonjob_json_scan_t *r = st->r;
  size_t key_at = 0, key_length = 0;
  if (!st->fixable) return;
  if (depth != 1 || !st->top_object || r->fixups == MOONJOB_JSON_MAX_FIXUPS || start > UINT32_MAX ||
      !mj_key_before(st, start, &key_at, &key_length)) {
    st->fixable = 0;
    return;
  }
  uint32_t k = r->fixups++;
  r->key_at[k] = (uint32_t) key_at;
  r->key_length[k] = (uint32_t) key_length;
  r->value_at[k] = (uint32_t) start;
  r->kind[k] = (uint8_t) kind;
}

/* A key of the top object, text[at, at + n) (its quotes excluded), after a
 * fixup. cjson keeps a repeated key's last value: a key met again after a
 * fixup for it, or any key written with an escape (it may be the same key),
 * leaves the text to the copy. */
static void mj_later_key(mj_scan_t *st, size_t at, size_t n) {
  moonjob_json_scan_t *r = st->r;
  const unsigned char *key = st->s + at;
  if (memchr(key, '\\', n) != NULL) st->fixable = 0;
  for (uint32_t k = 0; st->fixable && k < r->fixups; k++)
    if (r->key_length[k] == n && memcmp(st->s + r->key_at[k], key, n) == 0) st->fixable = 0;
}

/* Writes text[start, end) into the copy as a marker: kind, then `digits`. */
static void mj_marker(mj_scan_t *st, size_t start, size_t end, char kind,
                      const unsigned char *digits, size_t ndigits) {
  char head[3] = {'"', (char) 0xFF, kind};
  mj_put(st, st->s + st->copied, start - st->copied);
  mj_put(st, head, 3);
  mj_put(st, digits, ndigits);
  mj_put(st, "\"", 1);
  st->copied = end;
  st->markers++;
}

/* The first quote, backslash or byte past 0x7F from s[i] on, or len: 16
 * bytes at a time with SSE2, then 8 (the lowest flagged byte of a word is
 * the first: little-endian). */
static size_t mj_next_special(const unsigned char *s, size_t i, size_t len) {
#ifdef __SSE2__
  const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
  for (; i + 16 <= len; i += 16) {
    __m128i v = _mm_loadu_si128((const __m128i *) (s + i));
    v = _mm_or_si128(v, _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
    unsigned found = (unsigned) _mm_movemask_epi8(v);
    if (found != 0) return i + (size_t) __builtin_ctz(found);
  }
#endif
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    uint64_t found = (w | MJ_ZERO_BYTES(w ^ (MJ_ONES * '"')) | MJ_ZERO_BYTES(w ^ (MJ_ONES * '\\'))) & MJ_HIGH;
    if (found != 0) return i + (size_t) __builtin_ctzll(found) / 8;
  }
#endif
  while (i < len && s[i] != '"' && s[i] != '\\' && s[i] < 0x80) i++;
  return i;
}

/* The end of the string whose body starts at s[i] (after its closing quote,
 * or the end of the text), or 0 when a byte in it is not UTF-8 (at *bad). */
static size_t mj_skip_string(const unsigned char *s, size_t i, size_t len, size_t *bad) {
  for (;;) {
    i = mj_next_special(s, i, len);
    if (i >= len) return len;
    unsigned c = s[i];
    if (c == '"') return i + 1;
    if (c == '\\') {
      i += i + 1 < len && s[i + 1] < 0x80 ? 2 : 1; /* (a byte past 0x7F is checked as UTF-8) */
    } else {
      size_t n = mj_utf8_char(s, i, len);
      if (n == 0) {
        *bad = i;
        return 0;
      }
      i += n;
    }
  }
}

static int mj_finish(moonjob_json_scan_t *r, int status) {
  r->status = status;
  return status;
}

/* The scan stopped at s[i] (a number error, or too deep): the rest is only
 * checked for UTF-8, which comes first. */
static int mj_stop(const mj_scan_t *st, size_t i, int status, moonjob_json_scan_t *r) {
  size_t bad = moonjob_utf8_error_at((const char *) st->s + i, st->len - i);
  if (bad != 0) {
    r->at = (double) (i + bad);
    r->length = 0;
    return mj_finish(r, MOONJOB_JSON_BAD_UTF8);
  }
  return mj_finish(r, status);
}

/* The number token at s[i]: its end, after writing a marker for it when it
 * needs one, or 0 when it is an error (in r). */
static size_t mj_scan_number(mj_scan_t *st, size_t i, long depth, moonjob_json_scan_t *r) {
  size_t end = i;
  while (end < st->len && (MJ_IS_DIGIT(st->s[end]) || st->s[end] == '-' || st->s[end] == '+' ||
                           st->s[end] == '.' || st->s[end] == 'e' || st->s[end] == 'E'))
    end++;
  const unsigned char *token = st->s + i;
  size_t n = end - i;
  mj_number_t num;
  int kind;
  if (mj_number_parts(token, n, &num) != 0) kind = MOONJOB_JSON_BAD_NUMBER;
  else if (num.frac_start == NULL && !num.has_exponent) kind = mj_integer_kind(&num);
  else kind = mj_double_range(&num, token, n);
  if (kind == 'i' || kind == 'u') {
    mj_note_marker(st, i, depth, (char) kind);
    mj_marker(st, i, end, (char) kind, token, n);
  } else if (kind != 0) {
    r->at = (double) (i + 1);
    r->length = (double) n;
    r->status = kind;
    return 0;
  }
  return end;
}

static size_t mj_skip_blanks(const unsigned char *s, size_t i, size_t len) {
  while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
  return i;
}

/* Scans text[0, len) (see the top of the file): PLAIN, REWRITTEN (out holds
 * r->written bytes), ROOM (out, `room` bytes, was too small: r->written is
 * the room it needs), or an error at r->at. Arrays and objects deeper than
 * max_depth stop the rewriting: cjson says so. */
int moonjob_json_scan(const char *text, size_t len, char *out, size_t room, int max_depth,
                      moonjob_json_scan_t *r) {
  mj_scan_t st = {(const unsigned char *) text, len, out, room, 0, 0, 0, r, 0, 1};
  const unsigned char *s = st.s;
  long depth = 0;
  size_t i = mj_skip_blanks(s, 0, len);
  r->status = 0, r->markers = 0, r->fixups = 0;
  r->at = r->length = r->written = 0;
  st.top_object = i < len && s[i] == '{';
  while (i < len) {
    unsigned c = s[i];
    if (c == '"') {
      size_t bad = 0, body = i + 1;
      i = mj_skip_string(s, body, len, &bad);
      if (i == 0) {
        r->at = (double) (bad + 1);
        return mj_finish(r, MOONJOB_JSON_BAD_UTF8);
      }
      if (r->fixups > 0 && depth == 1 && st.fixable) { /* (a key of the top object?) */
        size_t colon = mj_skip_blanks(s, i, len);
        if (colon < len && s[colon] == ':') mj_later_key(&st, body, i - 1 - body);
      }
    } else if (c == '-' || MJ_IS_DIGIT(c)) {
      size_t end = mj_scan_number(&st, i, depth, r);
      if (end == 0) return mj_stop(&st, i, r->status, r);
      i = end;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return mj_stop(&st, i, MOONJOB_JSON_PLAIN, r);
      size_t close = c == '[' ? mj_skip_blanks(s, i + 1, len) : len;
      if (close < len && s[close] == ']') {
        mj_note_marker(&st, i, depth - 1, '[');
        mj_marker(&st, i, close + 1, '[', NULL, 0);
        depth--;
        i = close + 1;
      } else {
        i++;
      }
    } else if (c == ']' || c == '}') {
      depth--;
      i++;
    } else if (c >= 0x80) {
      size_t n = mj_utf8_char(s, i, len);
      if (n == 0) {
        r->at = (double) (i + 1);
        return mj_finish(r, MOONJOB_JSON_BAD_UTF8);
      }
      i += n;
    } else if (c == 0) { /* cjson would stop here and take the text before for the whole */
      r->at = (double) (i + 1);
      return mj_stop(&st, i, MOONJOB_JSON_NUL, r);
    } else {
      i++;
    }
  }
  if (st.markers == 0) return mj_finish(r, MOONJOB_JSON_PLAIN);
  r->markers = st.markers;
  if (st.fixable) return mj_finish(r, MOONJOB_JSON_FIXUPS);
  r->fixups = 0;
  mj_put(&st, s + st.copied, len - st.copied);
  r->written = (double) st.written;
  return mj_finish(r, st.written <= room ? MOONJOB_JSON_REWRITTEN : MOONJOB_JSON_ROOM);
}

/* The value of a run of digits (a sign is the caller's). The FFI hands the
 * functions below back as int64_t or uint64_t cdata. */
static uint64_t mj_digits_value(const char *digits) {
  uint64_t v = 0;
  for (; MJ_IS_DIGIT(*digits); digits++) v = v * 10 + (uint64_t) (*digits - '0');
  return v;
}

/* The integer token at text[at] (an optional '-', then digits that the scan
 * found to fit): a fixup's value. */
uint64_t moonjob_json_uint64_at(const char *text, size_t at) {
  return mj_digits_value(text + at);
}

int64_t moonjob_json_int64_at(const char *text, size_t at) {
  if (text[at] != '-') return (int64_t) mj_digits_value(text + at);
  uint64_t v = mj_digits_value(text + at + 1);
  return v == (uint64_t) 1 << 63 ? INT64_MIN : -(int64_t) v;
}

/* A marker's value: its token after the two bytes "\xFFi" or "\xFFu". */
uint64_t moonjob_json_uint64(const char *marker) {
  return moonjob_json_uint64_at(marker, 2);
}

int64_t moonjob_json_int64(const char *marker) {
  return moonjob_json_int64_at(marker, 2);
}
