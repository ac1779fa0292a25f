/* json_scan.h -- the C half of moonjob.codec.json: the UTF-8 check and the
 * scanner that lets cjson decode JSON text exactly (json_scan.c says how).
 *
 * One source for both sides: the child program #includes json_scan.c in its
 * one translation unit (linked -rdynamic, so the FFI finds these functions in
 * ffi.C), and core.so links it as an object of its own (the codec reaches them
 * through ffi.load of core.so, without running luaopen_moonjob_core).
 *
 * Caveat: the names, the struct and the status numbers are a contract with the
 * ffi.cdef of lua/moonjob/codec/json_c.lua: change both together.
 */
#ifndef MJ_JSON_SCAN_H
#define MJ_JSON_SCAN_H

#include <stddef.h>
#include <stdint.h>

/* What moonjob_json_scan found, in its return value and r->status. */
enum {
  MOONJOB_JSON_PLAIN = 0,      /* nothing cjson would change: decode the text as is */
  MOONJOB_JSON_REWRITTEN = 1,  /* out holds r->written bytes, with r->markers markers */
  MOONJOB_JSON_ROOM = 2,       /* rewriting needs r->written bytes of room: call again */
  MOONJOB_JSON_BAD_UTF8 = 3,   /* not UTF-8 from byte r->at on */
  MOONJOB_JSON_BEYOND_64 = 4,  /* the integer at r->at (r->length bytes) needs more than 64 bits */
  MOONJOB_JSON_OVERFLOW = 5,   /* the number at r->at is beyond a double's range */
  MOONJOB_JSON_UNDERFLOW = 6,  /* the number at r->at is not zero but would read as 0 */
  MOONJOB_JSON_BAD_NUMBER = 7, /* the token at r->at is not a JSON number */
  MOONJOB_JSON_FIXUPS = 8,     /* every marker is a member of the top object: decode the text
                                  as is, then set the r->fixups members (no copy to walk) */
  MOONJOB_JSON_NUL = 9         /* a NUL byte outside strings at r->at */
};

/* The members a text's top object may have fixed up after cjson (more: a copy). */
#define MOONJOB_JSON_MAX_FIXUPS 8
_Static_assert(MOONJOB_JSON_MAX_FIXUPS == 8, "the ffi.cdef of lua/moonjob/codec/json_c.lua says 8");

/* Sizes are doubles (exact up to 2^53): the FFI hands a double to Lua as a
 * number, where a 64-bit integer would come as a cdata box to allocate. */
typedef struct moonjob_json_scan_s {
  int32_t status;
  uint32_t markers;            /* tokens written as markers */
  double at;                   /* 1-based byte position the status is about */
  double length;               /* its length in bytes (a number) */
  double written;              /* bytes of the rewritten text (or the room it needs) */
  /* FIXUPS: member k's key is the text's bytes [key_at[k], +key_length[k]) (no
   * escape in it), its value the token at value_at[k], of kind kind[k] ('i',
   * 'u' or '['); offsets 0-based. */
  uint32_t fixups;
  uint32_t key_at[MOONJOB_JSON_MAX_FIXUPS];
  uint32_t key_length[MOONJOB_JSON_MAX_FIXUPS];
  uint32_t value_at[MOONJOB_JSON_MAX_FIXUPS];
  uint8_t kind[MOONJOB_JSON_MAX_FIXUPS];
} moonjob_json_scan_t;

size_t moonjob_utf8_error_at(const char *text, size_t len);
int moonjob_json_scan(const char *text, size_t len, char *out, size_t room, int max_depth,
                      moonjob_json_scan_t *r);
int64_t moonjob_json_int64(const char *marker);
uint64_t moonjob_json_uint64(const char *marker);
int64_t moonjob_json_int64_at(const char *text, size_t at);
uint64_t moonjob_json_uint64_at(const char *text, size_t at);

#endif
