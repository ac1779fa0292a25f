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
 * parent draws for that dispatch (process.c); every frame the child sends
 * about that job carries it back, and INTERRUPT carries it too. The child
 * learns a token only by reading its JOB frame, so a processor that writes to
 * the channel cannot forge frames for jobs it has not been given. The parent
 * checks every header against the child's state (frames_ok in process.c):
 * READY/LOADERR only while starting, job frames only with the current token.
 *
 * Shared page: the parent also maps one page with the child (a memfd on the
 * child's fd 4, MJ_SHARED_FD). When the child has read a JOB frame it stores
 * the token in `taken` there; the parent reads it to know, without any frame,
 * whether the child took its job (acknowledgement) and, when the child dies,
 * whether it ever started the job.
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

/* Set by the child on a frame that ends a job when bytes it wrote to stdout or
 * stderr were still unread at that moment: the parent then reads those pipes
 * before handling the frame. Without the flag the parent skips that read. */
#define MJ_FRAME_FLAG_OUTPUT 0x100u
#define MJ_FRAME_TYPE_MASK 0xffu

/* X-macro over every frame type, for tables of names (the Lua constants of
 * both programs come from here). */
#define MJ_FRAME_TYPES(X) \
  X(INIT) X(JOB) X(INTERRUPT) X(READY) X(LOADERR) X(DONE) X(FAIL) X(PROGRESS) X(LOG)

/* True for the frames that end a job: with MJ_FRAME_FLAG_OUTPUT the parent
 * reads whatever the child printed before it, so output lands on the right job.
 * Their payload starts with an mj_job_usage_t block (counted in `len`). */
#define MJ_FRAME_ENDS_JOB(t) ((t) == MJ_FRAME_DONE || (t) == MJ_FRAME_FAIL || \
                              (t) == MJ_FRAME_LOADERR)

/* What the job cost the child, measured by the child itself. */
typedef struct {
  double cpu_ms;     /* user + system CPU time since the job was received */
  double max_rss_kb; /* the child's peak resident set size so far */
} mj_job_usage_t;

/* The page shared by the parent and one child. */
typedef struct {
  uint64_t taken;       /* token of the last JOB frame the child read (atomic) */
  uint32_t input_ended; /* 1 once the parent ends the channel on purpose (atomic): an
                           end of file without it means the parent died */
} mj_shared_t;

#define MJ_SHARED_FD 4
#define MJ_SHARED_SIZE 4096

/* The signal that interrupts a running job once its INTERRUPT frame is sent. */
#define MJ_INTERRUPT_SIGNAL SIGUSR1

#endif
