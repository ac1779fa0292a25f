/* output.c -- counting what the child writes to stdout and stderr.
 *
 * Two counts, for two uses. Writes: stdout and stderr are stdio streams that
 * count their writes (counted_stream), so that a batch of lines can tell a
 * line that printed (moonjob_output_mark, exports.c). Bytes: a frame that
 * ends a job carries how far each stream went (output_written), so that the
 * parent gives the job its output and no more (output attribution, in
 * core/parent/channel.c).
 */
#include "child.h"

/* How many bytes the child has written to stdout and stderr so far: what the
 * parent has read (it publishes the count in the shared page) plus what the
 * pipe still holds (FIONREAD, which a pipe answers on its writing end too).
 * The parent's count and the pipe change together while it reads, so both
 * are taken between two equal, even readings of output_seq (a seqlock).
 * Without the shared page, or when a stream is not a pipe (a terminal, a
 * file), the counts are MJ_OUTPUT_UNKNOWN: the parent then reads all there
 * is. */
static void output_written(uint64_t written[2]) {
  static int pipes = -1; /* are fds 1 and 2 pipes? (asked once) */
  written[0] = written[1] = MJ_OUTPUT_UNKNOWN;
  if (pipes < 0) {
    struct stat st[2];
    pipes = fstat(1, &st[0]) == 0 && fstat(2, &st[1]) == 0 && S_ISFIFO(st[0].st_mode) &&
            S_ISFIFO(st[1].st_mode);
  }
  if (shared == NULL || !pipes) return;
  for (int tries = 0; tries < 100000; tries++) {
    uint32_t before = __atomic_load_n(&shared->output_seq, __ATOMIC_ACQUIRE);
    if (before & 1) { /* the parent is reading */
      sched_yield();
      continue;
    }
    uint64_t read[2] = {__atomic_load_n(&shared->output_read[0], __ATOMIC_ACQUIRE),
                        __atomic_load_n(&shared->output_read[1], __ATOMIC_ACQUIRE)};
    int unread[2] = {0, 0};
    for (int i = 0; i < 2; i++)
      if (ioctl(1 + i, FIONREAD, &unread[i]) != 0) return;
    if (__atomic_load_n(&shared->output_seq, __ATOMIC_ACQUIRE) != before) continue;
    for (int i = 0; i < 2; i++) written[i] = read[i] + (uint64_t) unread[i];
    return;
  }
}

/* stdout and stderr are replaced, before Lua opens its io library, by stdio
 * streams that write to fds 1 and 2 and count their writes, so that a batch
 * of lines can end after a line that wrote output and the parent can tag
 * that output with the line (moonjob_output_mark, child/batch.lua). Caveat: what
 * bypasses stdio (a command run by os.execute, a write(2) through the FFI)
 * is not counted. */
static uint32_t output_writes;

static ssize_t counted_write(void *cookie, const char *buf, size_t size) {
  int fd = (int) (intptr_t) cookie;
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, buf + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t) n;
  }
  output_writes++;
  return done > 0 || size == 0 ? (ssize_t) done : -1;
}

static FILE *counted_stream(int fd, int mode) {
  cookie_io_functions_t io = {.write = counted_write};
  FILE *f = fopencookie((void *) (intptr_t) fd, "w", io);
  if (f == NULL || setvbuf(f, NULL, mode, BUFSIZ) != 0) return NULL;
  return f;
}
