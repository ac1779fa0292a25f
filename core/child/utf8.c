/* utf8.c -- moonjob_utf8_error_at: the UTF-8 check of moonjob.codec.json.
 *
 * Exported for the FFI (the program is linked with -rdynamic), like the
 * functions of exports.c; the Lua module checks text with Lua patterns where
 * the function is not there (the parent, a program of its own).
 */
#include "child.h"

/* Where text[0, len) stops being UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), as a 1-based byte position, or 0 when
 * it is UTF-8. moonjob.codec.json checks every line and string with it in the
 * child, through the FFI (Lua's pattern matching took 12% of a batch line);
 * runs of ASCII are skipped eight bytes at a time. */
size_t moonjob_utf8_error_at(const char *text, size_t len) {
  const unsigned char *s = (const unsigned char *) text;
  size_t i = 0;
  while (i < len) {
    if (i + 8 <= len) {
      uint64_t word;
      memcpy(&word, s + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t n;
    unsigned low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 1;
    else if (c == 0xE0) n = 2, low = 0xA0;
    else if (c == 0xED) n = 2, high = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) n = 2;
    else if (c == 0xF0) n = 3, low = 0x90;
    else if (c == 0xF4) n = 3, high = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) n = 3;
    else return i + 1;
    if (i + n >= len) return i + 1; /* cut short by the end */
    if (s[i + 1] < low || s[i + 1] > high) return i + 1;
    for (size_t k = 2; k <= n; k++)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i + 1;
    i += n + 1;
  }
  return 0;
}
