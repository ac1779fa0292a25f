/* failing.c -- makes one set-up call of the child program fail, for the specs.
 *
 * Preloaded (LD_PRELOAD) into moonjob-child by spec/sandbox_spec.lua through a
 * wrapper given as the pool's `child` program. MOONJOB_FAIL names the call and
 * its first interesting argument, "name:number": "prctl:38" fails
 * prctl(PR_SET_NO_NEW_PRIVS, ...), "setrlimit:4" fails setrlimit(RLIMIT_CORE,
 * ...), "fcntl:2" fails fcntl(fd, F_SETFD, ...), "close_range:5" fails
 * close_range(5, ...). The call fails with EPERM; every other call goes
 * through. The headers are left out on purpose: their prototypes vary
 * (enums, fortify redirections), the ABI does not.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* True when MOONJOB_FAIL is "name:value". */
static int should_fail(const char *name, long value) {
  const char *spec = getenv("MOONJOB_FAIL");
  size_t n = strlen(name);
  if (spec == NULL || strncmp(spec, name, n) != 0 || spec[n] != ':') return 0;
  return strtol(spec + n + 1, NULL, 10) == value;
}

static void *next(const char *name) {
  return dlsym(RTLD_NEXT, name);
}

int setrlimit(int resource, const void *limits) {
  if (should_fail("setrlimit", resource)) return errno = EPERM, -1;
  return ((int (*)(int, const void *)) next("setrlimit"))(resource, limits);
}

int prctl(int option, unsigned long a2, unsigned long a3, unsigned long a4, unsigned long a5) {
  if (should_fail("prctl", option)) return errno = EPERM, -1;
  return ((int (*)(int, unsigned long, unsigned long, unsigned long, unsigned long)) next("prctl"))(
      option, a2, a3, a4, a5);
}

int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void *arg = va_arg(ap, void *); /* every fcntl argument fits a pointer-sized slot */
  va_end(ap);
  if (should_fail("fcntl", cmd)) return errno = EPERM, -1;
  return ((int (*)(int, int, void *)) next("fcntl"))(fd, cmd, arg);
}

int close_range(unsigned int first, unsigned int last, int flags) {
  if (should_fail("close_range", (long) first)) return errno = EPERM, -1;
  return ((int (*)(unsigned int, unsigned int, int)) next("close_range"))(first, last, flags);
}
