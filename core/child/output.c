/* output.c -- what the child writes to stdout and stderr: counted, and in a
 * batch of lines tagged with the line that wrote it.
 *
 * Bytes: a frame that ends a job carries how far each stream went
 * (output_written), so that the parent gives the job its output and no more
 * (output attribution, in core/parent/channel.c).
 *
 * Tags: stdout and stderr are stdio streams over fopencookie (counted_stream)
 * that write to fds 1 and 2. While a line of a batch runs (moonjob run:
 * output_lines, then one output_line_starts per line, from
 * moonjob_batch_next in exports.c), each output line is written as
 * "[line N] text\n", N the line running, so that the parent passes a batch's
 * output through as it is and printing never ends a batch. A line's output
 * that does not end in a newline is ended with one when the line ends (its
 * partial line stays its own, as a job's does). In a batch the tagged bytes
 * are held here (OUTPUT_HELD bytes per stream) and written when the buffer
 * is full, at a line start once the oldest held byte is OUTPUT_HOLD_NS old,
 * when the batch ends (before its DONE frame counts the bytes) and at exit:
 * one write for many lines, not one per line, which is what makes a
 * processor that prints on every line as fast as one that does not.
 *
 * Caveats: what bypasses stdio (a command run by os.execute, a write(2)
 * through the FFI) is neither tagged nor held: the parent tags those lines
 * with the line the batch had reached when it read them (moonjob.cli.output),
 * which may be a later one (as it did before the child tagged). What is held
 * is written before os.execute and io.popen run a command (output_flush), so
 * that the command's output comes after it, and so that a command that kills
 * the child loses none of it. A child killed otherwise (SIGKILL, a hard
 * timeout, a crash in C) loses what it held: at most OUTPUT_HOLD_NS of
 * lines before the line running, and what that line printed.
 */
#include "child.h"

#define OUTPUT_HELD (32 * 1024)
#define OUTPUT_HOLD_NS (10 * 1000000ull)

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

/* One stream's tagged output, held while a batch runs. */
typedef struct {
  char bytes[OUTPUT_HELD];
  size_t len;
  int open_line; /* the line running wrote a partial line here: its tag is out */
} held_output_t;

static held_output_t held[2];    /* stdout, stderr */
static uint64_t held_since;      /* when the oldest held byte was written (ns), 0: none */
static uint64_t next_output_line; /* the number the batch's next line has (0: no batch) */
static char line_tag[32];        /* "[line N] " of the line running */
static size_t line_tag_len;      /* 0: no line of a batch runs, output is not tagged */

static void write_fully(int fd, const char *buf, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, buf + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t) n;
  }
}

static void output_flush_held(void) {
  for (int i = 0; i < 2; i++) {
    if (held[i].len > 0) write_fully(1 + i, held[i].bytes, held[i].len);
    held[i].len = 0;
  }
  held_since = 0;
}

static void hold(held_output_t *h, const char *buf, size_t size) {
  if (held_since == 0) held_since = monotonic_ns();
  while (size > 0) {
    if (h->len == OUTPUT_HELD) output_flush_held();
    size_t n = OUTPUT_HELD - h->len < size ? OUTPUT_HELD - h->len : size;
    memcpy(h->bytes + h->len, buf, n);
    h->len += n, buf += n, size -= n;
  }
}

/* Holds buf's bytes, each output line tagged with the line running. */
static void hold_tagged(held_output_t *h, const char *buf, size_t size) {
  while (size > 0) {
    if (!h->open_line) hold(h, line_tag, line_tag_len);
    const char *nl = memchr(buf, '\n', size);
    size_t n = nl ? (size_t) (nl - buf) + 1 : size;
    hold(h, buf, n);
    h->open_line = nl == NULL;
    buf += n, size -= n;
  }
}

static ssize_t counted_write(void *cookie, const char *buf, size_t size) {
  int fd = (int) (intptr_t) cookie;
  if (line_tag_len > 0) {
    hold_tagged(&held[fd - 1], buf, size);
    return (ssize_t) size;
  }
  write_fully(fd, buf, size);
  return (ssize_t) size;
}

/* The line running ends: what stdio holds is tagged with it, and a partial
 * line it left is ended. */
static void output_line_ends(void) {
  if (line_tag_len == 0) return;
  if (__fpending(stdout) > 0) fflush(stdout);
  if (__fpending(stderr) > 0) fflush(stderr);
  for (int i = 0; i < 2; i++)
    if (held[i].open_line) {
      hold(&held[i], "\n", 1);
      held[i].open_line = 0;
    }
  line_tag_len = 0;
}

/* A line of the batch starts at `now` (ns): its output is tagged with its
 * number. Started < 0: no line starts (the batch is over). */
static void output_line_starts(uint64_t now, int started) {
  if (next_output_line == 0) return; /* not a batch of moonjob run's */
  output_line_ends();
  if (held_since != 0 && now - held_since >= OUTPUT_HOLD_NS) output_flush_held();
  if (!started) return;
  int n = snprintf(line_tag, sizeof line_tag, "[line %llu] ", (unsigned long long) next_output_line++);
  line_tag_len = n > 0 && (size_t) n < sizeof line_tag ? (size_t) n : 0;
}

/* What stdio and this file hold is written now, the tags of the line
 * running kept: before a command the line runs writes to the same fds
 * (os.execute, io.popen: moonjob.child.runner), so that its output comes
 * after what the line printed before it. */
static void output_flush(void) {
  if (__fpending(stdout) > 0) fflush(stdout);
  if (__fpending(stderr) > 0) fflush(stderr);
  output_flush_held();
}

/* A batch whose first line is `first` begins; 0: the batch ended, its output
 * is written (before its ending frame counts the bytes). */
static void output_lines(uint64_t first) {
  output_line_ends();
  output_flush_held();
  next_output_line = first;
}

/* At exit (os.exit in a line), before stdio flushes its streams: what they
 * and this file hold is written, tagged. */
static void output_at_exit(void) {
  output_line_ends();
  output_flush_held();
}

/* stdout and stderr are replaced, before Lua opens its io library, by these
 * streams (sandbox.c). */
static FILE *counted_stream(int fd, int mode) {
  static int flush_at_exit = 0;
  if (!flush_at_exit) flush_at_exit = atexit(output_at_exit) == 0;
  cookie_io_functions_t io = {.write = counted_write};
  FILE *f = fopencookie((void *) (intptr_t) fd, "w", io);
  if (f == NULL || setvbuf(f, NULL, mode, BUFSIZ) != 0) return NULL;
  return f;
}
