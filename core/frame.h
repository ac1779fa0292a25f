/* frame.h -- the wire format between the parent and its children.
 *
 * Parent and child talk over a dedicated socketpair (fd 3 in the child) with
 * length-prefixed frames: a fixed 16-byte header followed by `len` payload
 * bytes. The header is written in the host's byte order: both ends always run
 * on the same machine, from the same build.
 *
 * The payload is opaque to C. Values inside it are encoded by the Lua side with
 * LuaJIT's string.buffer serializer (or carried as JSON text in "json" codec
 * mode); C only moves the bytes.
 *
 * Job tokens: the `job` field of a JOB frame is a random 64-bit token the
 * parent draws for that dispatch (core/parent/send.c); every frame the child
 * sends about that job carries it back, and INTERRUPT carries it too. The
 * child learns a token only by reading its JOB frame, so a processor that
 * writes to the channel cannot forge frames for jobs it has not been given.
 * The parent checks every header against the child's state (frame_violation
 * in core/parent/channel.c): READY/LOADERR only while starting, job frames
 * only with the head job's token.
 *
 * Pipelining: the parent may send a child up to MJ_MAX_INFLIGHT JOB frames
 * before the first is answered. The child reads ahead and runs them one at a
 * time, in the order sent; frames about a job always concern the oldest one
 * not yet ended (the head), so the parent checks them against the head's
 * token. JOB frames are numbered 1, 2, 3... per child in the order sent,
 * modulo 2^21 (the sequence number: both ends count the same frames; at most
 * MJ_MAX_INFLIGHT are in flight, so numbers compare within a window).
 *
 * Shared page: the parent also maps one page with the child (a memfd on the
 * child's fd 4, MJ_SHARED_FD). Its `gate` says which jobs the child started
 * and which the parent took back (recalled), in one 64-bit word that both
 * change only by compare-and-swap, so a job is either started by the child or
 * recalled by the parent, never both. It holds three sequence numbers:
 * `started`, the last job the child started, and a range [from, to] of jobs
 * recalled, which counts only while it lies ahead of `started` (from after
 * started). The child drops a recalled job unread; to start job s it swaps in
 * started = s, keeping the range if it still lies ahead of s. To recall the
 * jobs from x on (x not started), the parent swaps in the range [x, last
 * sent], joined with a range still pending (the jobs between are recalled
 * too). The parent reads `started` to know, without any frame, whether the
 * child took the head job (acknowledgement) and, when the child dies, which
 * job it was running. `interrupts` counts the INTERRUPT frames wholly written: a child
 * that sees it change looks in its channel before it starts a job.
 */
#ifndef MJ_FRAME_H
#define MJ_FRAME_H

#include <stdint.h>

typedef struct {
  uint32_t len;   /* payload bytes that follow the header */
  uint32_t type;  /* one of mj_frame_type */
  uint64_t job;   /* job number, 0 when the frame is about no job */
} mj_frame_header_t;

#define MJ_FRAME_HEADER_SIZE ((uint32_t) sizeof(mj_frame_header_t))

typedef enum {
  /* parent -> child */
  MJ_FRAME_INIT = 1,      /* options for the child, before anything else */
  MJ_FRAME_JOB = 2,       /* run one job */
  MJ_FRAME_INTERRUPT = 3, /* stop the running job: payload {code, reason}; SIGUSR1 follows */
  /* child -> parent */
  MJ_FRAME_READY = 16,    /* processor loaded, waiting for jobs */
  MJ_FRAME_LOADERR = 17,  /* processor failed to load; the child exits next */
  MJ_FRAME_DONE = 18,     /* job completed; payload is the result */
  MJ_FRAME_FAIL = 19,     /* job failed; payload is the error */
  MJ_FRAME_PROGRESS = 20, /* job:progress(value) */
  MJ_FRAME_LOG = 21       /* job:log(text) */
} mj_frame_type;

#define MJ_FRAME_TYPE_MASK 0xffu

/* X-macro over every frame type, for tables of names (the Lua constants of
 * both programs come from here). */
#define MJ_FRAME_TYPES(X) \
  X(INIT) X(JOB) X(INTERRUPT) X(READY) X(LOADERR) X(DONE) X(FAIL) X(PROGRESS) X(LOG)

/* True for the frames that end a job, and for the two that end the start-up
 * (READY, LOADERR). Their payload starts with an mj_job_usage_t block
 * (counted in `len`), whose `output` counts let the parent attribute what the
 * child printed to the right job, or, up to the end of the start-up, to none. */
#define MJ_FRAME_ENDS_JOB(t) ((t) == MJ_FRAME_DONE || (t) == MJ_FRAME_FAIL || \
                              (t) == MJ_FRAME_LOADERR || (t) == MJ_FRAME_READY)

/* What the job cost the child, measured by the child itself, and where its
 * output ends. */
typedef struct {
  double cpu_ms;      /* user + system CPU time since the job started */
  double max_rss_kb;  /* the child's peak resident set size so far */
  double wall_ms;     /* the job's run time on the child's monotonic clock, from
                         when it took the job to when it ended */
  uint64_t output[2]; /* bytes the child had written to stdout and stderr when the
                         job ended (MJ_OUTPUT_UNKNOWN: not known): the parent
                         gives the bytes before that point to this job, the
                         rest to the jobs after it */
} mj_job_usage_t;

#define MJ_OUTPUT_UNKNOWN UINT64_MAX

/* The page shared by the parent and one child. */
typedef struct {
  uint64_t gate;        /* started and recalled sequence numbers (see above; atomic) */
  uint32_t input_ended; /* 1 once the parent ends the channel on purpose (atomic): an
                           end of file without it means the parent died */
  uint32_t interrupts;  /* INTERRUPT frames the parent wrote whole so far (atomic) */
  uint32_t output_seq;  /* odd while the parent reads stdout or stderr (atomic) */
  uint64_t output_read[2]; /* bytes the parent read from stdout, stderr (atomic): with
                              what the socket still holds (SIOCOUTQ), the child knows
                              how many it wrote, read with output_seq as a seqlock */
  uint64_t batch;       /* the batch of lines in hand: MJ_BATCH(seq, started, limit) (atomic) */
  uint64_t batch_kept;  /* its results kept in the batch area: MJ_KEPT(lines, bytes) (atomic) */
  uint64_t batch_line_started; /* when its last line started, CLOCK_MONOTONIC ns (atomic) */
} mj_shared_t;

/* Batches of lines (the command line's jobs, see child/batch.lua): one JOB frame
 * carries many lines, and the child runs the processor once per line. The
 * word `batch` says, for the job with sequence number `seq`, how many of its
 * lines the child started and how many it may start (`limit`): the child
 * starts a line only by swapping in started + 1 while started < limit, and
 * the parent takes back the lines not started by swapping in limit =
 * started, so a line is either started or taken back, never both. The child
 * writes each finished line's result into the batch area (the MJ_BATCH_AREA
 * bytes after the page) and then publishes how many lines and bytes it holds
 * in `batch_kept`: the area is shared memory, so when the child dies in the
 * middle of a batch, the parent still reads what the lines before finished
 * with. The job's DONE frame carries the area's bytes, so the area only
 * matters until then. */
#define MJ_BATCH_AREA (1024 * 1024)
#define MJ_BATCH_LINE_BITS 21
#define MJ_BATCH_LINES_MAX ((1u << MJ_BATCH_LINE_BITS) - 1)
#define MJ_BATCH(seq, started, limit) \
  ((uint64_t) (seq) | ((uint64_t) (started) << MJ_SEQ_BITS) | \
   ((uint64_t) (limit) << (MJ_SEQ_BITS + MJ_BATCH_LINE_BITS)))
#define MJ_BATCH_SEQ(b) ((uint32_t) (b) & MJ_SEQ_MASK)
#define MJ_BATCH_STARTED(b) ((uint32_t) ((b) >> MJ_SEQ_BITS) & MJ_BATCH_LINES_MAX)
#define MJ_BATCH_LIMIT(b) ((uint32_t) ((b) >> (MJ_SEQ_BITS + MJ_BATCH_LINE_BITS)) & MJ_BATCH_LINES_MAX)
#define MJ_KEPT(lines, bytes) (((uint64_t) (lines) << 32) | (uint32_t) (bytes))
#define MJ_KEPT_LINES(k) ((uint32_t) ((k) >> 32))
#define MJ_KEPT_BYTES(k) ((uint32_t) (k))

/* JOB frames a child may hold at once: the one it runs and those queued behind. */
#define MJ_MAX_INFLIGHT 16

#define MJ_SEQ_BITS 21
#define MJ_SEQ_MASK ((1u << MJ_SEQ_BITS) - 1)

/* The sequence number after s. */
static inline uint32_t mj_seq_next(uint32_t s) {
  return (s + 1) & MJ_SEQ_MASK;
}

/* True when sequence number a comes after b (within half the range). */
static inline int mj_seq_after(uint32_t a, uint32_t b) {
  uint32_t d = (a - b) & MJ_SEQ_MASK;
  return d != 0 && d < (1u << (MJ_SEQ_BITS - 1));
}

#define MJ_GATE(started, from, to) \
  ((uint64_t) (started) | ((uint64_t) (from) << MJ_SEQ_BITS) | ((uint64_t) (to) << (2 * MJ_SEQ_BITS)))
#define MJ_GATE_STARTED(g) ((uint32_t) (g) & MJ_SEQ_MASK)
#define MJ_GATE_FROM(g) ((uint32_t) ((g) >> MJ_SEQ_BITS) & MJ_SEQ_MASK)
#define MJ_GATE_TO(g) ((uint32_t) ((g) >> (2 * MJ_SEQ_BITS)) & MJ_SEQ_MASK)

/* True while gate g holds a recalled range the child has not passed yet. */
static inline int mj_gate_pending(uint64_t g) {
  return mj_seq_after(MJ_GATE_FROM(g), MJ_GATE_STARTED(g));
}

/* True when job `seq` is recalled in gate g: from <= seq <= to, pending. */
static inline int mj_gate_recalled(uint64_t g, uint32_t seq) {
  return mj_gate_pending(g) && !mj_seq_after(MJ_GATE_FROM(g), seq) && !mj_seq_after(seq, MJ_GATE_TO(g));
}

/* True when job `seq` was started in gate g (it, or a later job, was). */
static inline int mj_gate_started(uint64_t g, uint32_t seq) {
  return !mj_seq_after(seq, MJ_GATE_STARTED(g));
}

/* The gate once the child starts job seq: a pending range ahead of it stays. */
static inline uint64_t mj_gate_start(uint64_t g, uint32_t seq) {
  if (mj_gate_pending(g) && mj_seq_after(MJ_GATE_FROM(g), seq))
    return MJ_GATE(seq, MJ_GATE_FROM(g), MJ_GATE_TO(g));
  return MJ_GATE(seq, seq, seq);
}

#define MJ_SHARED_FD 4
#define MJ_SHARED_SIZE 4096
#define MJ_SHARED_MAP_SIZE (MJ_SHARED_SIZE + MJ_BATCH_AREA) /* the page, then the batch area */

/* The signal that interrupts a running job once its INTERRUPT frame is sent. */
#define MJ_INTERRUPT_SIGNAL SIGUSR1

#endif
