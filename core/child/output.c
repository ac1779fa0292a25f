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
 * is full, by a thread once the oldest held byte is OUTPUT_HOLD_NS old (the
 * flusher; at line starts when it could not start), when the batch ends
 * (before its DONE frame counts the bytes) and at exit: one write for many
 * lines, not one per line, which is what makes a processor that prints on
 * every line as fast as one that does not.
 *
 * Caveats: what bypasses stdio (a command run by os.execute, a write(2)
 * through the FFI) is neither tagged nor held: the parent tags those lines
 * with the line the batch had reached when it read them (moonjob.cli.output),
 * which may be a later one (as it did before the child tagged). What is held
 * is written before os.execute and io.popen run a command (output_flush), so
 * that the command's output comes after it, and so that a command that kills
 * the child loses none of it. A child killed otherwise (SIGKILL, a hard
 * timeout, a crash in C) loses what it held: what it printed in the last
 * OUTPUT_HOLD_NS. The flusher counts against RLIMIT_NPROC (max_procs) as
 * a process would, from the first batch on.
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

/* held and held_since are the main thread's and the flusher's (below): both
 * take held_lock. The tag and the line's state are the main thread's. */
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_started = PTHREAD_COND_INITIALIZER; /* held_since went from 0 */
static int flusher = 0; /* 1: the flusher runs; -1: it could not start */

/* True once the flusher runs: the child's CPU time is then read over all
 * its threads (channel.c, child_cpu_ms). */
static int output_flusher_started(void) {
  return flusher > 0;
}

static void write_fully(int fd, const char *buf, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, buf + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t) n;
  }
}

/* Writes what is held (held_lock taken). */
static void flush_held_locked(void) {
  for (int i = 0; i < 2; i++) {
    if (held[i].len > 0) write_fully(1 + i, held[i].bytes, held[i].len);
    held[i].len = 0;
  }
  held_since = 0;
}

static void output_flush_held(void) {
  pthread_mutex_lock(&held_lock);
  flush_held_locked();
  pthread_mutex_unlock(&held_lock);
}

/* (held_lock taken) */
static void hold(held_output_t *h, const char *buf, size_t size) {
  if (held_since == 0) {
    held_since = monotonic_ns();
    if (flusher > 0) pthread_cond_signal(&held_started);
  }
  while (size > 0) {
    if (h->len == OUTPUT_HELD) flush_held_locked();
    size_t n = OUTPUT_HELD - h->len < size ? OUTPUT_HELD - h->len : size;
    memcpy(h->bytes + h->len, buf, n);
    h->len += n, buf += n, size -= n;
  }
}

/* Holds buf's bytes, each output line tagged with the line running. */
static void hold_tagged(held_output_t *h, const char *buf, size_t size) {
  pthread_mutex_lock(&held_lock);
  while (size > 0) {
    if (!h->open_line) hold(h, line_tag, line_tag_len);
    const char *nl = memchr(buf, '\n', size);
    size_t n = nl ? (size_t) (nl - buf) + 1 : size;
    hold(h, buf, n);
    h->open_line = nl == NULL;
    buf += n, size -= n;
  }
  pthread_mutex_unlock(&held_lock);
}

/* The flusher: a thread that writes what is held once its oldest byte is
 * OUTPUT_HOLD_NS old, so that what a line printed reaches the parent even
 * while the line runs on (and is not lost if the child is killed in it). It
 * sleeps while nothing is held. */
static void *held_flusher(void *arg) {
  (void) arg;
  pthread_mutex_lock(&held_lock);
  for (;;) {
    while (held_since == 0) pthread_cond_wait(&held_started, &held_lock);
    uint64_t due = held_since + OUTPUT_HOLD_NS, now = monotonic_ns();
    if (now >= due) {
      flush_held_locked();
      continue;
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    uint64_t ns = (uint64_t) until.tv_nsec + (due - now);
    until.tv_sec += (time_t) (ns / 1000000000u);
    until.tv_nsec = (long) (ns % 1000000000u);
    pthread_cond_timedwait(&held_started, &held_lock, &until);
  }
  return NULL;
}

/* Starts the flusher, with every signal blocked in it (handlers run in the
 * main thread), once, at the first batch. It counts against RLIMIT_NPROC:
 * if it cannot start, what is held is written at line starts instead. */
static void start_flusher(void) {
  pthread_condattr_t cattr; /* the wait's clock is the monotonic one (not yet waited on: no thread) */
  if (pthread_condattr_init(&cattr) != 0) goto failed;
  int rc = pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
  if (rc == 0) rc = pthread_cond_init(&held_started, &cattr);
  pthread_condattr_destroy(&cattr);
  if (rc != 0) goto failed;
  sigset_t all, old;
  sigfillset(&all);
  pthread_attr_t attr;
  pthread_t thread;
  rc = pthread_attr_init(&attr);
  if (rc == 0) rc = pthread_attr_setstacksize(&attr, 64 * 1024);
  if (rc == 0) rc = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (rc == 0) rc = pthread_sigmask(SIG_SETMASK, &all, &old);
  if (rc == 0) {
    rc = pthread_create(&thread, &attr, held_flusher, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
  }
  pthread_attr_destroy(&attr);
  if (rc == 0) {
    flusher = 1;
    return;
  }
failed:
  flusher = -1;
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
  if (held[0].open_line) hold_tagged(&held[0], "\n", 1);
  if (held[1].open_line) hold_tagged(&held[1], "\n", 1);
  line_tag_len = 0;
}

/* A line of the batch starts at `now` (ns): its output is tagged with its
 * number. Started 0: no line starts (the batch is over). Without the
 * flusher, what is held is written here once it is OUTPUT_HOLD_NS old. */
static void output_line_starts(uint64_t now, int started) {
  if (next_output_line == 0) return; /* not a batch of moonjob run's */
  output_line_ends();
  if (flusher < 0) {
    uint64_t since = __atomic_load_n(&held_since, __ATOMIC_RELAXED);
    if (since != 0 && now - since >= OUTPUT_HOLD_NS) output_flush_held();
  }
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
  if (first > 0 && flusher == 0) start_flusher();
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
