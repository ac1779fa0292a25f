/* floor.c -- the floor for the pool benchmark: the same exchange, minimal.
 *
 * Usage: floor CHILDREN JOBS [INFLIGHT]
 * Forks CHILDREN processes, each connected by a socketpair (the kind of channel
 * moonjob uses); the parent keeps INFLIGHT frames (default 1) in flight per
 * child with epoll, each child echoes a frame back for each frame it reads
 * (16-byte header, as in core/frame.h, plus a small payload). The parent
 * reads what a child sent in one read and answers each frame with a new one
 * in one write. Prints "jobs_per_second N".
 * Nothing here is moonjob code: it is what the machine allows.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  uint32_t len, type;
  uint64_t job;
} header_t;

#define PAYLOAD 8

static int read_exact(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *) buf + got, n - got);
    if (r <= 0) return -1;
    got += (size_t) r;
  }
  return 0;
}

#define FRAME (sizeof(header_t) + PAYLOAD)
#define MAX_INFLIGHT 64

static void child_loop(int fd) {
  char frame[FRAME];
  while (read_exact(fd, frame, sizeof frame) == 0) {
    if (write(fd, frame, sizeof frame) != (ssize_t) sizeof frame) break;
  }
  _exit(0);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  int children = argc > 1 ? atoi(argv[1]) : 1;
  long jobs = argc > 2 ? atol(argv[2]) : 100000;
  int inflight = argc > 3 ? atoi(argv[3]) : 1;
  int fds[64];
  int ep = epoll_create1(0);
  char frame[sizeof(header_t) + PAYLOAD] = {0};
  ((header_t *) frame)->len = PAYLOAD;
  if (children < 1 || children > 64 || inflight < 1 || inflight > MAX_INFLIGHT) return 2;
  for (int i = 0; i < children; i++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
    if (fork() == 0) {
      close(sv[0]);
      child_loop(sv[1]);
    }
    close(sv[1]);
    fds[i] = sv[0];
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t) i};
    epoll_ctl(ep, EPOLL_CTL_ADD, sv[0], &ev);
  }
  double t0 = now();
  long sent = 0, done = 0;
  static char out[FRAME * MAX_INFLIGHT], back[FRAME * MAX_INFLIGHT];
  for (int k = 0; k < MAX_INFLIGHT; k++) memcpy(out + k * FRAME, frame, FRAME);
  for (int i = 0; i < children; i++)
    for (int k = 0; k < inflight && sent < jobs; k++, sent++)
      if (write(fds[i], frame, sizeof frame) < 0) return 1;
  while (done < jobs) {
    struct epoll_event evs[64];
    int n = epoll_wait(ep, evs, 64, -1);
    for (int k = 0; k < n; k++) {
      int fd = fds[evs[k].data.u32];
      ssize_t got = read(fd, back, sizeof back); /* whole frames: each is written whole */
      if (got <= 0) return 1;
      long frames = got / (ssize_t) FRAME;
      if (got % (ssize_t) FRAME != 0 && read_exact(fd, back, FRAME - got % FRAME) != 0) return 1;
      if (got % (ssize_t) FRAME != 0) frames++;
      done += frames;
      long more = jobs - sent < frames ? jobs - sent : frames;
      if (more > 0 && write(fd, out, (size_t) more * FRAME) < 0) return 1;
      sent += more;
    }
  }
  double elapsed = now() - t0;
  for (int i = 0; i < children; i++) close(fds[i]);
  while (wait(NULL) > 0) {}
  printf("jobs_per_second %.0f\n", jobs / elapsed);
  return 0;
}
