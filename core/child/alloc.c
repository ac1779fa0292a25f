/* alloc.c -- the counting Lua allocator behind --memory-limit.
 *
 * With a memory limit, the Lua state is created with limited_alloc, which
 * counts the heap's bytes (`heap`, child.h) and refuses growth past the
 * limit: the allocation fails with "not enough memory" inside the job. It
 * holds strictly during set-up, loading and a job (channel.run, in
 * interrupt.c, and channel.strict); otherwise the runner has HEAP_RESERVE
 * bytes more, to report a job that filled the heap.
 *
 * The count wraps LuaJIT's own allocator (the one luaL_newstate gives, much
 * faster than the C library's realloc for a heap of small strings): the
 * state is made as without a limit, and its allocator replaced by the
 * counting one with the bytes it holds already.
 *
 * Caveat: only the Lua heap is counted. Memory that bypasses the allocator
 * (malloc in C code a processor calls) is bounded by RLIMIT_DATA alone
 * (sandbox.c), and not at all in the sanitized build.
 */
#include "child.h"

/* A Lua allocator that counts bytes and refuses growth past the limit: the
 * allocation fails with "not enough memory" inside the job. Shrinking is never
 * refused (LuaJIT raises on a refused shrink too). */
static void *limited_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  heap_t *heap = ud;
  if (ptr == NULL) osize = 0;
  if (nsize == 0) {
    heap->used -= osize;
    return heap->inner(heap->inner_ud, ptr, osize, 0);
  }
  size_t cap = heap->limit + (heap->strict ? 0 : HEAP_RESERVE);
  if (nsize > osize && heap->used + (nsize - osize) > cap) {
    heap->refused = 1;
    return NULL;
  }
  void *p = heap->inner(heap->inner_ud, ptr, osize, nsize);
  if (p != NULL) heap->used = heap->used - osize + nsize;
  return p;
}

static lua_State *new_state(const child_options_t *o) {
  lua_State *L = luaL_newstate();
  if (L == NULL || o->memory_limit == 0) return L;
  heap.limit = o->memory_limit;
  heap.strict = 1; /* until READY: set-up and loading count in full */
  heap.inner = lua_getallocf(L, &heap.inner_ud);
  /* what the new state holds already: its frees are counted out later */
  heap.used = (size_t) lua_gc(L, LUA_GCCOUNT, 0) * 1024 + (size_t) lua_gc(L, LUA_GCCOUNTB, 0);
  lua_setallocf(L, limited_alloc, &heap);
  return L;
}

/* channel.strict(on): while on, the Lua heap may not pass memory_limit at all
 * (the runner loads the processor so); off, the runner has a small reserve. */
static int channel_strict(lua_State *L) {
  heap.strict = lua_toboolean(L, 1);
  return 0;
}
