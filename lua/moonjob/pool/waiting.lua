-- moonjob.pool.waiting -- the jobs waiting for a child: priorities and delays.
--
-- Jobs that may run now are ordered by (priority, id): lower priority first,
-- first in first out within one priority. They wait in one of two places:
--
--   * `run`, a queue of jobs already in that order: a job joins it when it
--     goes after its last job (the common case: jobs of one priority added
--     one after the other, or of rising priorities). Push and pop are O(1),
--     with no comparison along a heap's levels.
--   * `ready`, a binary heap, for the others (a better priority arriving
--     after worse ones, a job given back with its old id, a delayed job
--     becoming due): O(log n).
--
-- pop() takes the better of the two firsts, so the order is the same as one
-- heap's. `delayed` is a heap of jobs that may not run yet, by (run_at, id);
-- pop() moves the due ones over first. Each job remembers its place in
-- job.qindex: 1..RUN_BASE-1 in `ready`, negative in `delayed`, RUN_BASE + i
-- at place i of `run`, false when out. A job removed from `run` (a cancel)
-- leaves a hole (false) that pop skips; `run` moves its jobs down to place 1
-- once its holes and taken places outnumber them. `n` counts every waiting
-- job, `ready_n()` those that may run now.
--
-- A job that never reached its child goes back with push: its old id puts
-- it ahead of everything queued after it at its priority.
--
-- The pool does not call this module directly: it reaches it as its local job
-- source, under the interface of moonjob.pool.source. Calls: nothing.
--
-- Jobs are moonjob.job objects: their id, qindex and priority are read and
-- written in the job's own slots (Job.SLOT), not through its metatable, which
-- the heaps would otherwise call a few times per level at every push and pop.
local Job = require "moonjob.job"

local Waiting = {}
Waiting.__index = Waiting

local ID, QINDEX, PRIORITY = Job.SLOT.id, Job.SLOT.qindex, Job.SLOT.priority
local RUN_BASE = 2 ^ 40 -- qindex of place i of `run`: RUN_BASE + i (a heap never gets that big)
local COMPACT_FROM = 64 -- `run` moves its jobs down once this many places at its start are free

local function ready_before(a, b)
  local pa, pb = a[PRIORITY] or 0, b[PRIORITY] or 0
  if pa ~= pb then return pa < pb end
  return a[ID] < b[ID]
end

local function due_before(a, b)
  if a.run_at ~= b.run_at then return a.run_at < b.run_at end
  return a[ID] < b[ID]
end

local function new_heap(before, sign)
  return { n = 0, before = before, sign = sign }
end

local function place(heap, job, i)
  heap[i] = job
  job[QINDEX] = heap.sign * i
end

local function sift_up(heap, i)
  local before, job = heap.before, heap[i]
  while i > 1 do
    local parent = math.floor(i / 2)
    if not before(job, heap[parent]) then break end
    place(heap, heap[parent], i)
    i = parent
  end
  place(heap, job, i)
end

local function sift_down(heap, i)
  local before, job, n = heap.before, heap[i], heap.n
  while true do
    local child = 2 * i
    if child > n then break end
    if child < n and before(heap[child + 1], heap[child]) then child = child + 1 end
    if not before(heap[child], job) then break end
    place(heap, heap[child], i)
    i = child
  end
  place(heap, job, i)
end

local function heap_push(heap, job)
  heap.n = heap.n + 1
  place(heap, job, heap.n)
  sift_up(heap, heap.n)
end

local function heap_remove(heap, i)
  local job, last = heap[i], heap[heap.n]
  heap[heap.n] = nil
  heap.n = heap.n - 1
  job[QINDEX] = false
  if i <= heap.n then
    place(heap, last, i)
    sift_down(heap, i)
    sift_up(heap, last[QINDEX] * heap.sign)
  end
  return job
end

----------------------------------------------------------- the run ---

-- `run`: jobs at places first..last (holes: false), live of them waiting.
local function new_run()
  return { first = 1, last = 0, live = 0 }
end

-- Whether job may join `run`: it goes after its last job.
local function run_takes(run, job)
  return run.live == 0 or ready_before(run[run.last], job)
end

-- Moves the jobs of `run` down to places 1.. (their qindex with them), so
-- that the table's array part does not grow past what waits.
local function run_compact(run)
  local to = 0
  for i = run.first, run.last do
    local job = run[i]
    run[i] = nil
    if job then
      to = to + 1
      run[to] = job
      job[QINDEX] = RUN_BASE + to
    end
  end
  run.first, run.last = 1, to
end

local function run_push(run, job)
  if run.live == 0 then
    for i = run.first, run.last do run[i] = nil end -- holes only
    run.first, run.last = 1, 0
  elseif run.first > COMPACT_FROM and run.first > 2 * run.live then
    run_compact(run)
  end
  local last = run.last + 1
  run[last], run.last, run.live = job, last, run.live + 1
  job[QINDEX] = RUN_BASE + last
end

-- The first job of `run` (holes skipped and dropped), or nil.
local function run_head(run)
  if run.live == 0 then return nil end
  local first = run.first
  local job = run[first]
  while not job do
    run[first] = nil
    first = first + 1
    job = run[first]
  end
  run.first = first
  return job
end

-- Takes out the job at place i: the first or the last place is given up
-- (the last one's holes before it too: the last place holds a job while
-- any waits), any other is left a hole.
local function run_remove(run, i)
  local job = run[i]
  job[QINDEX] = false
  run.live = run.live - 1
  if i == run.first then
    run[i] = nil
    run.first = i + 1
  elseif i == run.last then
    run[i] = nil
    local last = i - 1
    while run[last] == false do
      run[last] = nil
      last = last - 1
    end
    run.last = last
  else
    run[i] = false
  end
  return job
end

-------------------------------------------------------------- the queue ---

function Waiting.new(now)
  return setmetatable({ ready = new_heap(ready_before, 1), delayed = new_heap(due_before, -1),
    run = new_run(), n = 0, now = now }, Waiting)
end

-- A job that may run now joins `run` or the `ready` heap.
local function push_ready(self, job)
  local run = self.run
  if run_takes(run, job) then return run_push(run, job) end
  heap_push(self.ready, job)
end

-- queue:push(job): job.priority (lower first, default 0) and job.run_at (ms,
-- optional) decide.
function Waiting:push(job)
  local run_at = rawget(job, "run_at") -- not through the job's metatable: a call per job
  if run_at and run_at > self.now() then
    heap_push(self.delayed, job)
  else
    push_ready(self, job)
  end
  self.n = self.n + 1
end

-- Moves the delayed jobs that are due to the run queue or the ready heap.
function Waiting:promote()
  local delayed = self.delayed
  if delayed.n == 0 then return end
  local now = self.now()
  while delayed.n > 0 and delayed[1].run_at <= now do
    push_ready(self, heap_remove(delayed, 1))
  end
end

-- The next job that may run, and whether it is `run`'s (else the heap's);
-- nil when none.
local function next_ready(self)
  local head, top = run_head(self.run), self.ready[1]
  if top and (not head or ready_before(top, head)) then return top, false end
  return head, true
end

-- The next ready job taken out (the run queue's or the heap's), or nil.
local function take_ready(self)
  local job, in_run = next_ready(self)
  if not job then return nil end
  self.n = self.n - 1
  if in_run then return run_remove(self.run, self.run.first) end
  return heap_remove(self.ready, 1)
end

-- queue:pop() -> the next job that may run now, or nil
function Waiting:pop()
  self:promote()
  return take_ready(self)
end

-- queue:peek() -> the job pop() would return, left in place, or nil
function Waiting:peek()
  self:promote()
  return (next_ready(self))
end

-- queue:remove(job) -> true if the job was waiting here
function Waiting:remove(job)
  local q = job[QINDEX]
  if not q then return false end
  if q >= RUN_BASE then
    local run, i = self.run, q - RUN_BASE
    if run[i] ~= job then return false end
    run_remove(run, i)
  else
    local heap = q > 0 and self.ready or self.delayed
    if heap[q * heap.sign] ~= job then return false end
    heap_remove(heap, q * heap.sign)
  end
  self.n = self.n - 1
  return true
end

-- queue:pop_any() -> a waiting job, due or not (to empty the queue), or nil
function Waiting:pop_any()
  local job = take_ready(self)
  if job then return job end
  if self.delayed.n == 0 then return nil end
  self.n = self.n - 1
  return heap_remove(self.delayed, 1)
end

function Waiting:ready_n()
  self:promote()
  return self.ready.n + self.run.live
end

-- queue:next_due() -> the run_at of the earliest delayed job, or nil
function Waiting:next_due()
  local delayed = self.delayed
  return delayed.n > 0 and delayed[1].run_at or nil
end

return Waiting
