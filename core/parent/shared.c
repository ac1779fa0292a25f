/* shared.c -- the page a parent shares with its child: gate, recall, batches.
 *
 * One page per child (a memfd on its fd 4, frame.h), the batch area after
 * it. Its gate tells which job the child started (mj_process_started) and
 * lets the parent take back the jobs it has not started (mj_process_recall),
 * both sides changing it by compare-and-swap only; the batch word and area
 * tell where a batch of lines stands (mj_process_batch) and let the parent
 * take back the lines not started (mj_process_batch_cut). The page also
 * carries what the other parts count: INTERRUPT frames written and the input
 * ended on purpose (send.c), output read (channel.c).
 *
 * Caveat: the page stays mapped until the process is closed, so what a dead
 * child left there (a batch's kept results) can still be read after its exit.
 */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "moonjob.h"

/* One page shared with the child (its fd 4). Returns 0 or a UV_E... code. */
int mj__shared_map(mj_process_t *p) {
  int fd = memfd_create("moonjob-shared", MFD_CLOEXEC);
  if (fd < 0) return -errno;
  if (fd <= MJ_SHARED_FD) { /* placing it on fd 4 in the child must never land on itself */
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, MJ_SHARED_FD + 1);
    int rc = -errno;
    close(fd);
    if (moved < 0) return rc;
    fd = moved;
  }
  void *page = MAP_FAILED;
  if (ftruncate(fd, MJ_SHARED_MAP_SIZE) == 0)
    page = mmap(NULL, MJ_SHARED_MAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED) {
    int rc = -errno;
    close(fd);
    return rc;
  }
  p->shared = page;
  p->shared_fd = fd;
  return 0;
}

void mj__shared_release(mj_process_t *p) {
  if (p->shared_fd >= 0) close(p->shared_fd);
  p->shared_fd = -1;
  if (p->shared != NULL) munmap(p->shared, MJ_SHARED_MAP_SIZE);
  p->shared = NULL;
}

/* 1 when the child started job `job` (it swapped the job's sequence number
 * into the shared page's gate, frame.h), 0 when not yet, -1 when the job is
 * not in flight (ended, recalled, or never sent here). */
int mj_process_started(mj_process_t *p, uint64_t job) {
  const mj_inflight_t *f = mj__inflight_find(p, job);
  if (f == NULL) return -1;
  if (p->shared == NULL) return 0;
  return mj_gate_started(__atomic_load_n(&p->shared->gate, __ATOMIC_ACQUIRE), f->seq);
}

/* Takes back the jobs in flight that the child has not started, from job
 * `from` on (0: from the first it has not started; nothing when `from` was
 * started): one compare-and-swap on the shared gate marks them recalled, so
 * the child drops them unread and never starts them (frame.h), even if it is
 * about to. A range recalled before and not yet passed by the child is
 * joined, and the jobs sent between the two are taken back too. They leave
 * the jobs in flight; their numbers go to jobs[0..n), n returned (the caller
 * passes room for MJ_MAX_INFLIGHT). A dead child's gate still answers: what
 * it never started is recalled. */
unsigned mj_process_recall(mj_process_t *p, uint64_t from, uint64_t *jobs, unsigned max) {
  unsigned first = 0;
  while (from != 0 && first < p->nin && mj__inflight_at(p, first)->job != from) first++;
  if (p->shared == NULL || first >= p->nin) return 0;
  uint64_t g = __atomic_load_n(&p->shared->gate, __ATOMIC_ACQUIRE);
  uint32_t lo;
  for (;;) {
    unsigned i = first;
    if (from == 0)
      while (i < p->nin && mj_gate_started(g, mj__inflight_at(p, i)->seq)) i++;
    if (i == p->nin || mj_gate_started(g, mj__inflight_at(p, i)->seq)) return 0;
    uint32_t hi = p->seq;
    lo = mj__inflight_at(p, i)->seq;
    if (mj_gate_pending(g)) {
      if (mj_seq_after(lo, MJ_GATE_FROM(g))) lo = MJ_GATE_FROM(g);
      if (mj_seq_after(MJ_GATE_TO(g), hi)) hi = MJ_GATE_TO(g);
    }
    uint64_t recalled = MJ_GATE(MJ_GATE_STARTED(g), lo, hi);
    if (__atomic_compare_exchange_n(&p->shared->gate, &g, recalled, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      break; /* else g now holds what the child swapped in: look again */
  }
  unsigned keep = 0, n = 0;
  while (keep < p->nin && mj_seq_after(lo, mj__inflight_at(p, keep)->seq)) keep++;
  for (unsigned i = keep; i < p->nin && n < max; i++) jobs[n++] = mj__inflight_at(p, i)->job;
  p->nin = keep;
  return n;
}

/* The shared `batch` word of job `job`, when it is in flight and the child
 * started it as a batch of lines (frame.h); 0 otherwise. */
static uint64_t batch_word(mj_process_t *p, uint64_t job) {
  const mj_inflight_t *f = mj__inflight_find(p, job);
  if (f == NULL || p->shared == NULL) return 0;
  if (!mj_gate_started(__atomic_load_n(&p->shared->gate, __ATOMIC_ACQUIRE), f->seq)) return 0;
  uint64_t b = __atomic_load_n(&p->shared->batch, __ATOMIC_ACQUIRE);
  return MJ_BATCH_SEQ(b) == f->seq ? b : 0;
}

/* Where batch job `job` stands in the child (frame.h): the lines it started,
 * and the lines and bytes of results it kept in the batch area (*kept points
 * at them; they stay readable after the child's death, until the process is
 * freed). Returns 0, or -1 when `job` is not a batch the child started.
 * While the child lives it may move on to its next job, which reuses the
 * area: copy the kept bytes, then ask mj_process_batch_same. */
int mj_process_batch(mj_process_t *p, uint64_t job, mj_batch_state_t *state) {
  uint64_t b = batch_word(p, job);
  if (b == 0) return -1;
  state->word = b;
  uint64_t k = __atomic_load_n(&p->shared->batch_kept, __ATOMIC_ACQUIRE);
  state->started = MJ_BATCH_STARTED(b);
  state->kept_lines = MJ_KEPT_LINES(k);
  state->kept_bytes = MJ_KEPT_BYTES(k) <= MJ_BATCH_AREA ? MJ_KEPT_BYTES(k) : 0;
  state->kept = (const char *) p->shared + MJ_SHARED_SIZE;
  state->line_started_ns = __atomic_load_n(&p->shared->batch_line_started, __ATOMIC_RELAXED);
  return 0;
}

/* After a copy of what mj_process_batch pointed at: 1 when the child was
 * still on that batch all along (the copy is whole), 0 when it may have moved
 * on to another job and reused the area (seqlock reader, frame.h; the child
 * changes the batch word before its next job writes the area). */
int mj_process_batch_same(mj_process_t *p, const mj_batch_state_t *state) {
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  uint64_t b = __atomic_load_n(&p->shared->batch, __ATOMIC_RELAXED);
  return MJ_BATCH_SEQ(b) == MJ_BATCH_SEQ(state->word);
}

/* Takes back the lines of batch job `job` that the child has not started,
 * except its first line: one compare-and-swap lowers its limit to the lines
 * started (at least 1), so the child starts no more of them and ends the job
 * with what ran. The first line stays with the child even when it has not
 * reached it yet, so that every batch makes progress (a child slow to reach
 * its batches would otherwise have them all taken back). Returns the new
 * limit (the lines after it are the caller's again), or -1 when `job` is not
 * a batch the child started. */
int mj_process_batch_cut(mj_process_t *p, uint64_t job) {
  uint64_t b = batch_word(p, job);
  if (b == 0) return -1;
  for (;;) {
    uint32_t keep = MJ_BATCH_STARTED(b) > 0 ? MJ_BATCH_STARTED(b) : 1;
    if (keep > MJ_BATCH_LIMIT(b)) keep = MJ_BATCH_LIMIT(b);
    uint64_t cut = MJ_BATCH(MJ_BATCH_SEQ(b), MJ_BATCH_STARTED(b), keep);
    if (__atomic_compare_exchange_n(&p->shared->batch, &b, cut, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      return (int) keep;
    if (MJ_BATCH_SEQ(b) != MJ_BATCH_SEQ(cut)) return -1; /* the child moved on to another job */
  }
}
