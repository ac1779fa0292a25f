/* channel.c -- the channel to the parent, and the moonjob.channel module.
 *
 * The child's side of the wire format (frame.h): recv/send of frames on fd 3,
 * blocking, for the runner (lua/moonjob/child/runner.lua). The parent may
 * send several JOB frames ahead (pipelining): the child reads the channel
 * ahead and queues them, and starts each through the shared gate, which also
 * tells it which ones the parent took back. INTERRUPT frames are kept aside
 * for the job they name (interrupt.c acts on them). The module's functions
 * are registered here; some are defined in the parts they belong to
 * (channel.run, channel.protect and the per-line deadlines in interrupt.c,
 * channel.strict in alloc.c, the batch functions and the clock in exports.c).
 *
 * Caveats: writes to a closed channel raise a Lua error (SIGPIPE is ignored)
 * and the runner exits. An end of file the parent did not announce in the
 * shared page means that it died: the child then takes its process group
 * along (channel_ended).
 */
#include "child.h"

static const char kept_marker;                 /* channel.KEPT: the batch area's results */
static double job_number;                      /* what Lua sees for it: 1, 2, 3... */
static double job_start_cpu_ms;                /* the child's CPU time when the job started */
static uint64_t job_start_ns;                  /* and when, on the monotonic clock */
static double last_cpu_ms;                     /* the child's CPU time when the last job ended */
static int last_cpu_valid;
static int child_cpu_ms(double *cpu_ms, double *max_rss_kb);

/* The channel ended (end of file, or a write found it closed). The parent
 * marks the shared page before it ends the channel on purpose; otherwise it
 * died, maybe an instant before its death signal reaches the child: the child
 * must not exit quietly and leave its group behind. */
static void channel_ended(void) {
  if (shared != NULL && !__atomic_load_n(&shared->input_ended, __ATOMIC_ACQUIRE)) parent_gone();
}

/* Writes every byte of iov[0..n). Returns 0, or -1 with errno set. */
static int write_all(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    ssize_t w = writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    while (n > 0 && (size_t) w >= iov->iov_len) {
      w -= (ssize_t) iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *) iov->iov_base + w;
      iov->iov_len -= (size_t) w;
    }
  }
  return 0;
}

/* ------------------------------------------------------ reading ahead --- */

/* The child reads its channel ahead, in as large pieces as the kernel gives,
 * into `in`, and cuts it into frames there. INIT and JOB frames wait in
 * `queued` (their payload stays in the buffer) until channel.recv hands them
 * to Lua one at a time; INTERRUPT frames are kept aside in `interrupts`
 * while their job is queued or running, so that a job interrupted while it
 * waited is found before it starts, and a running one when the signal comes.
 * A frame whose payload cannot be held (malloc refused) is skipped and
 * handed over without its payload. */
typedef struct {
  uint32_t type, seq;
  uint64_t token;
  size_t off;   /* payload offset in in.buf */
  uint32_t len;
  int dropped;  /* the payload could not be held */
} queued_t;

#define MAX_INTERRUPTS (MJ_MAX_INFLIGHT + 2)
#define READ_CHUNK (64 * 1024)
#define KEEP_BUFFER (1024 * 1024) /* free a larger buffer once it is empty */

static struct {
  char *buf;
  size_t len, cap, parsed; /* bytes held; cut into frames up to `parsed` */
  size_t discard;          /* bytes still to drop of a frame that could not be held */
} in;

/* The queued frames: an array that grows (jobs the parent took back still
 * arrive after as many new ones, so no fixed bound holds), used from
 * first_queued on. Every whole frame held is cut at once, so an INTERRUPT
 * behind any number of JOB frames is always seen. */
static queued_t *queued;
static unsigned nqueued, first_queued, queued_cap;
static uint32_t jobs_received;   /* JOB frames read: the sequence number (frame.h) */
static uint32_t interrupts_seen; /* shared->interrupts when the channel was last read */

static struct {
  uint64_t token;
  char *payload;
  size_t len;
} interrupts[MAX_INTERRUPTS];
static unsigned ninterrupts;

static queued_t *queued_at(unsigned i) {
  return &queued[first_queued + i];
}

/* A new slot at the end of the queue, or NULL when memory is refused. */
static queued_t *queue_slot(void) {
  if (first_queued + nqueued == queued_cap) {
    if (first_queued > 0) {
      memmove(queued, queued + first_queued, nqueued * sizeof *queued);
      first_queued = 0;
    } else {
      unsigned cap = queued_cap ? queued_cap * 2 : 64;
      queued_t *grown = realloc(queued, cap * sizeof *queued);
      if (grown == NULL) return NULL;
      queued = grown;
      queued_cap = cap;
    }
  }
  return &queued[first_queued + nqueued++];
}

static int is_queued_job(uint64_t token) {
  for (unsigned i = 0; i < nqueued; i++)
    if (queued_at(i)->type == MJ_FRAME_JOB && queued_at(i)->token == token) return 1;
  return 0;
}

static int find_interrupt(uint64_t token) {
  for (unsigned i = 0; i < ninterrupts; i++)
    if (interrupts[i].token == token) return (int) i;
  return -1;
}

static void forget_interrupt(uint64_t token) {
  int i = find_interrupt(token);
  if (i < 0) return;
  free(interrupts[i].payload);
  interrupts[i] = interrupts[--ninterrupts];
}

/* An INTERRUPT frame: kept while its job is queued or running (the parent
 * sends at most one per job); one about a job already over is dropped. */
static void keep_interrupt(uint64_t token, const char *payload, size_t len) {
  if (token == 0 || find_interrupt(token) >= 0 || ninterrupts == MAX_INTERRUPTS) return;
  if (token != job_token && !is_queued_job(token)) return;
  char *copy = malloc(len ? len : 1);
  if (copy == NULL) len = 0; /* the job still stops, with the default reason */
  else memcpy(copy, payload, len);
  interrupts[ninterrupts].token = token;
  interrupts[ninterrupts].payload = copy;
  interrupts[ninterrupts++].len = len;
}

static void pass_recalled(uint32_t seq);

/* True when the parent took job `seq` back (the shared gate, frame.h). */
static int recalled(uint32_t seq) {
  return shared != NULL && mj_gate_recalled(__atomic_load_n(&shared->gate, __ATOMIC_ACQUIRE), seq);
}

/* Cuts the bytes held into frames, as far as whole frames go. A JOB frame
 * the parent took back already is dropped here; one it takes back later is
 * dropped when its turn comes (channel.recv). */
static void cut_frames(void) {
  while (in.discard == 0 && in.len - in.parsed >= sizeof(mj_frame_header_t)) {
    mj_frame_header_t h;
    memcpy(&h, in.buf + in.parsed, sizeof h);
    size_t off = in.parsed + sizeof h;
    if (in.len - off < h.len) return;
    uint32_t seq = h.type == MJ_FRAME_JOB ? mj_seq_next(jobs_received) : 0;
    if (h.type == MJ_FRAME_INTERRUPT) {
      keep_interrupt(h.job, in.buf + off, h.len);
    } else if (h.type == MJ_FRAME_JOB && recalled(seq)) {
      jobs_received = seq;
      /* between jobs with nothing queued, every job before it is passed: the gate
         moves on, so a run of recalls never drifts out of the sequence window */
      if (nqueued == 0 && job_token == 0) pass_recalled(seq);
    } else {
      queued_t *q = queue_slot();
      if (q == NULL) return; /* cut later, once frames went */
      q->type = h.type;
      q->token = h.job;
      q->off = off;
      q->len = h.len;
      q->dropped = 0;
      q->seq = seq;
      if (h.type == MJ_FRAME_JOB) jobs_received = seq;
    }
    in.parsed = off + h.len;
  }
}

/* Moves what is still needed (the queued frames and the bytes not cut yet)
 * to the start of the buffer; frees a large buffer once nothing is held. */
static void compact(void) {
  size_t from = nqueued && !queued_at(0)->dropped ? queued_at(0)->off - sizeof(mj_frame_header_t)
                                                  : in.parsed;
  for (unsigned i = 0; i < nqueued; i++)
    if (!queued_at(i)->dropped && queued_at(i)->off - sizeof(mj_frame_header_t) < from)
      from = queued_at(i)->off - sizeof(mj_frame_header_t);
  if (from == 0) return;
  memmove(in.buf, in.buf + from, in.len - from);
  in.len -= from;
  in.parsed -= from;
  for (unsigned i = 0; i < nqueued; i++)
    if (!queued_at(i)->dropped) queued_at(i)->off -= from;
  if (in.len == 0 && in.cap > KEEP_BUFFER) {
    free(in.buf);
    in.buf = NULL;
    in.cap = 0;
  }
}

/* Room to read into: a chunk, or the rest of the frame being cut. When a
 * frame cannot be held, it is queued without its payload and its bytes are
 * dropped as they come. Returns 0, or -1 when even a chunk cannot be had. */
static int make_room(void) {
  size_t need = in.len + READ_CHUNK;
  if (in.discard == 0 && in.len - in.parsed >= sizeof(mj_frame_header_t)) {
    mj_frame_header_t h;
    memcpy(&h, in.buf + in.parsed, sizeof h);
    size_t whole = in.parsed + sizeof h + h.len;
    if (whole > need) need = whole;
  }
  if (need <= in.cap) return 0;
  size_t cap = in.cap ? in.cap : READ_CHUNK;
  while (cap < need) cap *= 2;
  char *grown = realloc(in.buf, cap);
  if (grown != NULL) {
    in.buf = grown;
    in.cap = cap;
    return 0;
  }
  if (in.len - in.parsed < sizeof(mj_frame_header_t)) return -1;
  mj_frame_header_t h; /* a frame too large to hold: queued without payload */
  memcpy(&h, in.buf + in.parsed, sizeof h);
  if (sizeof h + (size_t) h.len <= in.len - in.parsed) return -1; /* whole, only not cut yet */
  queued_t *q = queue_slot();
  if (q == NULL) return -1;
  q->type = h.type;
  q->token = h.job;
  q->off = 0;
  q->len = 0;
  q->dropped = 1;
  q->seq = h.type == MJ_FRAME_JOB ? (jobs_received = mj_seq_next(jobs_received)) : 0;
  /* (a recalled one is dropped when its turn comes: its payload is not here) */
  size_t held = in.len - in.parsed - sizeof h;
  in.discard = h.len - held;
  in.len = in.parsed; /* its header and payload bytes so far are dropped */
  return in.len + READ_CHUNK <= in.cap ? 0 : -1;
}

/* Reads what the channel holds (waiting for at least a byte when `wait`),
 * and cuts it into frames. Returns 1 when bytes came, 0 at end of file, -1
 * when nothing came (EAGAIN) or on error (errno set). */
static int pull(int wait) {
  compact();
  if (make_room() != 0) {
    errno = ENOMEM;
    return -1;
  }
  ssize_t r;
  do {
    r = recv(CHANNEL_FD, in.buf + in.len, in.cap - in.len, wait ? 0 : MSG_DONTWAIT);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return r == 0 ? 0 : -1;
  size_t got = (size_t) r;
  if (in.discard > 0) { /* the rest of a frame that could not be held */
    size_t drop = got < in.discard ? got : in.discard;
    memmove(in.buf + in.len, in.buf + in.len + drop, got - drop);
    in.discard -= drop;
    got -= drop;
  }
  in.len += got;
  cut_frames();
  return 1;
}

/* Reads, without waiting, what the channel holds when the parent wrote an
 * INTERRUPT since the last look (the shared page counts them): it is then
 * in the channel, since it is counted once written whole. */
static void look_for_interrupts(void) {
  uint32_t written = shared ? __atomic_load_n(&shared->interrupts, __ATOMIC_ACQUIRE) : 0;
  if (shared != NULL && written == interrupts_seen) return;
  interrupts_seen = written;
  while (pull(0) > 0) {}
}

/* ----------------------------------------------- moonjob.channel module --- */

/* Marks job `seq` started in the shared gate, unless the parent recalled it
 * (frame.h). Returns 1 when it may run, 0 when it was recalled. */
static int start_job(uint32_t seq) {
  if (shared == NULL) return 1;
  uint64_t g = __atomic_load_n(&shared->gate, __ATOMIC_ACQUIRE);
  if (mj_gate_started(g, seq)) return 1; /* again (start_arriving_job): its batch word stays */
  do {
    if (mj_gate_recalled(g, seq)) return 0;
    /* its lines, should it be a batch, before the parent can see it started;
     * the batch word changes before this job writes the area (the gate's
     * compare-and-swap below orders them), so that a parent copying the last
     * batch's kept results can tell (mj_process_batch_same) */
    __atomic_store_n(&shared->batch, MJ_BATCH(seq, 0, MJ_BATCH_LINES_MAX), __ATOMIC_RELEASE);
    __atomic_store_n(&shared->batch_kept, MJ_KEPT(0, 0), __ATOMIC_RELEASE);
  } while (!__atomic_compare_exchange_n(&shared->gate, &g, mj_gate_start(g, seq), 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
  return 1;
}

/* Job `seq`, recalled, is dropped now that its turn came: the gate says the
 * child got this far, so the recalled range stops being pending once passed
 * (a later recall then need not be joined to it, frame.h). */
static void pass_recalled(uint32_t seq) {
  if (shared == NULL) return;
  uint64_t g = __atomic_load_n(&shared->gate, __ATOMIC_ACQUIRE), next;
  do {
    if (!mj_gate_recalled(g, seq)) return;
    next = seq == MJ_GATE_TO(g) ? MJ_GATE(seq, seq, seq) : MJ_GATE(seq, mj_seq_next(seq), MJ_GATE_TO(g));
  } while (!__atomic_compare_exchange_n(&shared->gate, &g, next, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE));
}

typedef struct {
  const char *bytes;
  size_t len;
} payload_t;

/* Under lua_cpcall: the payload as a Lua string, left in the registry. */
static int store_payload(lua_State *L) {
  payload_t *p = lua_touserdata(L, 1);
  lua_pushlstring(L, p->bytes, p->len);
  lua_setfield(L, LUA_REGISTRYINDEX, "moonjob.payload");
  return 0;
}

/* Pushes the payload as a string; false when the Lua heap cannot hold it
 * (memory_limit): the caller reports that instead of raising. */
static int push_payload(lua_State *L, const char *bytes, size_t len) {
  payload_t p = {bytes, len};
  if (lua_cpcall(L, store_payload, &p) != 0) {
    lua_pop(L, 1);
    lua_gc(L, LUA_GCCOLLECT, 0);
    return 0;
  }
  lua_getfield(L, LUA_REGISTRYINDEX, "moonjob.payload");
  lua_pushnil(L);
  lua_setfield(L, LUA_REGISTRYINDEX, "moonjob.payload");
  return 1;
}

/* The job the child runs next starts as soon as its header is in, while a
 * large payload still arrives: a job whose data takes longer to receive than
 * the parent's ack_timeout must not read as left untaken. Starting the same
 * job again once it is whole changes nothing (start_job is idempotent). */
static void start_arriving_job(void) {
  mj_frame_header_t h;
  if (in.discard > 0 || in.len - in.parsed < sizeof h) return;
  memcpy(&h, in.buf + in.parsed, sizeof h);
  if (h.type == MJ_FRAME_JOB) start_job(mj_seq_next(jobs_received));
}

/* The next INIT or JOB frame, reading (and waiting) as needed; NULL at end
 * of file. Raises on a read error. */
static queued_t *next_frame(lua_State *L) {
  while (nqueued == 0) {
    start_arriving_job();
    int r = pull(1);
    if (r == 0 || (r < 0 && errno != ENOMEM)) channel_ended();
    if (r == 0) return NULL;
    if (r < 0) luaL_error(L, "channel read failed: %s", strerror(errno));
  }
  return queued_at(0);
}

static void drop_first_frame(void) {
  first_queued++;
  if (--nqueued == 0) first_queued = 0;
}

/* channel.recv() -> type, job, payload | type, job, false (the payload did
 * not fit in memory) | nil at end-of-file. A JOB frame is the job the child
 * starts now: the shared gate says so (a job the parent recalled is dropped
 * unread, and the next one read), its token becomes the current one, and
 * Lua sees a local number instead of it. Raises on a read error. */
static int channel_recv(lua_State *L) {
  queued_t *q;
  for (;;) {
    q = next_frame(L);
    if (q == NULL) return 0;
    if (q->type != MJ_FRAME_JOB) break;
    if (start_job(q->seq)) {
      job_token = q->token;
      job_seq = q->seq;
      job_number += 1;
      /* CPU time counts from the end of the last job: a wait for this one
         blocked, so it added next to nothing (measured anew before any job ended) */
      if (!last_cpu_valid) child_cpu_ms(&job_start_cpu_ms, NULL);
      else job_start_cpu_ms = last_cpu_ms;
      job_start_ns = monotonic_ns(); /* its run time too: the parent's clock would count its own idle time */
      break;
    }
    pass_recalled(q->seq);
    forget_interrupt(q->token);
    drop_first_frame();
  }
  lua_pushinteger(L, (lua_Integer) q->type);
  lua_pushnumber(L, q->type == MJ_FRAME_JOB ? job_number : 0);
  if (q->dropped || !push_payload(L, in.buf + q->off, q->len)) lua_pushboolean(L, 0);
  drop_first_frame();
  return 3;
}

static double ms_of(struct timeval tv) {
  return tv.tv_sec * 1e3 + tv.tv_usec / 1e3;
}

/* The child's CPU time (ms) and peak RSS (KB). getrusage(RUSAGE_SELF) sums
 * every thread under each one's run-queue lock, about twice the cost of
 * RUSAGE_THREAD (the main thread alone, with the same peak RSS) on a
 * per-job path: so the main thread's is read, and the other threads' CPU
 * (the parent watcher, which only blocks; the output flusher; threads a C
 * library started through the FFI) is taken from RUSAGE_SELF every
 * USAGE_SELF_EVERY readings. Once it is seen to grow, or once the flusher
 * runs (batches, output.c), every reading is RUSAGE_SELF: a child whose
 * other threads work gets all its threads' CPU from then on, at worst
 * USAGE_SELF_EVERY job endings late (what they spent before that is left
 * out, given to no job). Returns -1 when getrusage fails. */
#define USAGE_SELF_EVERY 16
static int child_cpu_ms(double *cpu_ms, double *max_rss_kb) {
  static unsigned readings;
  static int others_work;      /* other threads' CPU was seen to grow */
  static double others_ms = -1; /* their CPU at the last RUSAGE_SELF reading */
  static double unseen_ms;      /* what they spent while only the main thread was read */
  struct rusage self, thread;
  if (others_work || output_flusher_started()) {
    if (getrusage(RUSAGE_SELF, &self) != 0) return -1;
    *cpu_ms = ms_of(self.ru_utime) + ms_of(self.ru_stime) - unseen_ms;
    if (max_rss_kb) *max_rss_kb = (double) self.ru_maxrss;
    return 0;
  }
  if (getrusage(RUSAGE_THREAD, &thread) != 0) return -1;
  double mine = ms_of(thread.ru_utime) + ms_of(thread.ru_stime);
  if (readings++ % USAGE_SELF_EVERY == 0 && getrusage(RUSAGE_SELF, &self) == 0) {
    double others = ms_of(self.ru_utime) + ms_of(self.ru_stime) - mine;
    /* (1 ms of slack: the two readings are not taken at one instant) */
    if (others_ms >= 0 && others > others_ms + 1) {
      others_work = 1; /* from now on; what they spent since the last look is no job's */
      unseen_ms = others - others_ms;
    }
    if (others > others_ms) others_ms = others; /* (never back: a job's CPU stays >= 0) */
  }
  if (others_work) others_ms -= unseen_ms; /* (this reading is then SELF's less unseen_ms) */
  *cpu_ms = mine + (others_ms > 0 ? others_ms : 0);
  if (max_rss_kb) *max_rss_kb = (double) thread.ru_maxrss;
  return 0;
}

/* The job's run time and CPU time since it started, and the peak RSS so
 * far. The reading is kept as the next job's start. */
static mj_job_usage_t job_usage(void) {
  mj_job_usage_t u = {0, 0, 0, {0, 0}};
  if (job_start_ns != 0) u.wall_ms = (double) (monotonic_ns() - job_start_ns) / 1e6;
  last_cpu_valid = child_cpu_ms(&last_cpu_ms, &u.max_rss_kb) == 0;
  if (last_cpu_valid && last_cpu_ms > job_start_cpu_ms) u.cpu_ms = last_cpu_ms - job_start_cpu_ms;
  return u;
}

/* channel.send(type, job, part...) sends one frame whose payload is the
 * concatenation of the string parts, without concatenating them in memory.
 * Frames about a job carry the current job's token (`job` is ignored: only
 * the job in hand can be answered). A frame that ends a job carries its usage
 * and how far its output goes (the caller flushed stdio first), and the job
 * is then over: no INTERRUPT can concern it any more.
 * Raises when the channel is closed. */
static int channel_send(lua_State *L) {
  enum { MAX_PARTS = 4 };
  mj_frame_header_t h;
  mj_job_usage_t usage;
  struct iovec iov[2 + MAX_PARTS];
  int nparts = lua_gettop(L) - 2, n = 1;
  size_t total = 0;
  luaL_argcheck(L, nparts <= MAX_PARTS, 2 + MAX_PARTS + 1, "too many payload parts");
  h.type = (uint32_t) luaL_checkinteger(L, 1);
  luaL_checknumber(L, 2);
  h.job = (h.type == MJ_FRAME_READY || h.type == MJ_FRAME_LOADERR) ? 0 : job_token;
  if (MJ_FRAME_ENDS_JOB(h.type)) {
    usage = job_usage();
    iov[n].iov_base = &usage;
    iov[n++].iov_len = sizeof usage;
    total += sizeof usage;
    output_written(usage.output);
  }
  for (int i = 0; i < nparts; i++, n++) {
    size_t len;
    const char *s;
    if (lua_touserdata(L, 3 + i) == &kept_marker) { /* channel.KEPT */
      s = shared ? (const char *) shared + MJ_SHARED_SIZE : "";
      len = shared ? MJ_KEPT_BYTES(__atomic_load_n(&shared->batch_kept, __ATOMIC_RELAXED)) : 0;
    } else {
      s = luaL_checklstring(L, 3 + i, &len);
    }
    iov[n].iov_base = (void *) s;
    iov[n].iov_len = len;
    total += len;
  }
  if (total > UINT32_MAX) return luaL_error(L, "frame too large (%f bytes)", (double) total);
  h.len = (uint32_t) total;
  iov[0].iov_base = &h;
  iov[0].iov_len = sizeof h;
  if (write_all(CHANNEL_FD, iov, n) < 0) {
    int saved_errno = errno;
    if (saved_errno == EPIPE || saved_errno == ECONNRESET) channel_ended();
    return luaL_error(L, "channel write failed: %s", strerror(saved_errno));
  }
  if (h.type == MJ_FRAME_READY) {
    ready_sent = 1;
    heap.strict = 0;
  }
  if (MJ_FRAME_ENDS_JOB(h.type) && h.job != 0) {
    forget_interrupt(job_token);
    job_token = 0;
  }
  return 0;
}

/* channel.interrupt() -> the payload of the INTERRUPT frame about the job in
 * hand (the parent's {code, message, reason}), or nil. */
static int channel_interrupt(lua_State *L) {
  int i = job_token != 0 ? find_interrupt(job_token) : -1;
  if (i < 0) return 0;
  lua_pushlstring(L, interrupts[i].payload ? interrupts[i].payload : "", interrupts[i].len);
  return 1;
}

static int open_channel(lua_State *L) {
  static const luaL_Reg funcs[] = {
    {"recv", channel_recv}, {"send", channel_send}, {"run", channel_run},
    {"interrupt_traceback", channel_interrupt_traceback}, {"strict", channel_strict},
    {"interrupt", channel_interrupt}, {"batch_next", channel_batch_next},
    {"batch_keep", channel_batch_keep}, {"now", channel_now}, {"output_lines", channel_output_lines},
    {"output_flush", channel_output_flush}, {"line_timeout", channel_line_timeout},
    {"protect", channel_protect}, {"batch_line_done", channel_batch_line_done},
    {"keep_completed", channel_keep_completed}, {NULL, NULL}};
  lua_newtable(L);
  luaL_register(L, NULL, funcs);
#define MJ_SET_TYPE(name)               \
  lua_pushinteger(L, MJ_FRAME_##name); \
  lua_setfield(L, -2, #name);
  MJ_FRAME_TYPES(MJ_SET_TYPE)
#undef MJ_SET_TYPE
  lua_pushlightuserdata(L, (void *) &kept_marker);
  lua_setfield(L, -2, "KEPT");
  return 1;
}
