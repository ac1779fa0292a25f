/* spec/support/host/states.c -- a C program embedding LuaJIT that runs one Lua chunk
 * in many fresh Lua states, one after the other, and checks that closing a
 * state gives back what moonjob took: every descriptor, every child process
 * and (outside sanitizer builds, where glibc's malloc counts) the C heap.
 *
 *   states N CHUNK     runs CHUNK in N states (N >= 2); prints
 *                      "states N fds A B children C heap_growth H" and exits 1
 *                      if descriptors or children were left behind.
 *
 * LUA_PATH and LUA_CPATH come from the environment (luaL_openlibs reads
 * them). Descriptors and the heap are compared between the end of the first
 * state and the end of the last one: libuv and glibc allocate some things once
 * per process, on first use (libuv's signal pipe, for one). Children are
 * counted after each state closes, zombies included. The spec judges the
 * heap's growth; under AddressSanitizer mallinfo2 counts nothing and the
 * sanitizer's leak checker does that job instead. */
#include <dirent.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

/* Processes whose parent is this one, zombies included. */
static int count_children(void) {
  DIR *d = opendir("/proc");
  if (d == NULL) return -1;
  int n = 0;
  pid_t self = getpid();
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char path[300], buf[512];
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    const char *after_name = strrchr(buf, ')');
    int ppid;
    char state;
    if (after_name && sscanf(after_name + 1, " %c %d", &state, &ppid) == 2 && ppid == self) n++;
  }
  closedir(d);
  return n;
}

static size_t heap_in_use(void) {
  return mallinfo2().uordblks;
}

static int run_state(const char *chunk) {
  lua_State *L = luaL_newstate();
  if (L == NULL) return fprintf(stderr, "states: cannot create a Lua state\n"), -1;
  luaL_openlibs(L);
  int rc = luaL_dostring(L, chunk);
  if (rc != 0) fprintf(stderr, "states: %s\n", lua_tostring(L, -1));
  lua_close(L);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: states N CHUNK\n"), 2;
  int n = atoi(argv[1]);
  if (n < 2) return fprintf(stderr, "states: N must be at least 2\n"), 2;
  int fds_first = 0, children = 0;
  size_t heap_first = 0;
  for (int i = 0; i < n; i++) {
    if (run_state(argv[2]) != 0) return 1;
    children += count_children();
    if (i == 0) fds_first = count_fds(), heap_first = heap_in_use();
  }
  int fds_last = count_fds();
  long heap_growth = (long) heap_in_use() - (long) heap_first;
  printf("states %d fds %d %d children %d heap_growth %ld\n", n, fds_first, fds_last, children,
         heap_growth);
  return fds_last == fds_first && children == 0 ? 0 : 1;
}
