-- moonjob.pool.waiting -- the jobs waiting for a child: priorities and delays.
--
-- Two binary heaps. `ready` orders jobs by (priority, seq): lower priority
-- first, first in first out within one priority. `delayed` orders jobs that
-- may not run yet by (run_at, seq); pop() moves the due ones over first.
-- push, pop and remove are O(log n); each job remembers its place in
-- job.qindex: positive in `ready`, negative in `delayed`, false when out.
-- `n` counts every waiting job, `ready_n()` those that may run now.
--
-- A job that never reached its child goes back with push: its old id puts
-- it ahead of everything queued after it at its priority.
--
-- The pool does not call this module directly: it reaches it as its local job
-- source, under the interface of moonjob.pool.source.
--
-- Jobs are moonjob.job objects: their id, qindex and priority are read and
-- written in the job's own slots (Job.SLOT), not through its metatable, which
-- the heaps would otherwise call a few times per level at every push and pop.
local Job = require "moonjob.job"

local Queue = {}
Queue.__index = Queue

local ID, QINDEX, PRIORITY = Job.SLOT.id, Job.SLOT.qindex, Job.SLOT.priority

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

function Queue.new(now)
  return setmetatable({ ready = new_heap(ready_before, 1), delayed = new_heap(due_before, -1),
    n = 0, now = now }, Queue)
end

-- queue:push(job): job.priority (lower first, default 0) and job.run_at (ms,
-- optional) decide.
function Queue:push(job)
  if job.run_at and job.run_at > self.now() then
    heap_push(self.delayed, job)
  else
    heap_push(self.ready, job)
  end
  self.n = self.n + 1
end

-- Moves the delayed jobs that are due to the ready heap.
function Queue:promote()
  local delayed = self.delayed
  if delayed.n == 0 then return end
  local now = self.now()
  while delayed.n > 0 and delayed[1].run_at <= now do
    heap_push(self.ready, heap_remove(delayed, 1))
  end
end

-- queue:pop() -> the next job that may run now, or nil
function Queue:pop()
  self:promote()
  if self.ready.n == 0 then return nil end
  self.n = self.n - 1
  return heap_remove(self.ready, 1)
end

-- queue:peek() -> the job pop() would return, left in place, or nil
function Queue:peek()
  self:promote()
  return self.ready[1]
end

-- queue:remove(job) -> true if the job was waiting here
function Queue:remove(job)
  local q = job[QINDEX]
  if not q then return false end
  local heap = q > 0 and self.ready or self.delayed
  if heap[q * heap.sign] ~= job then return false end
  heap_remove(heap, q * heap.sign)
  self.n = self.n - 1
  return true
end

-- queue:pop_any() -> a waiting job, due or not (to empty the queue), or nil
function Queue:pop_any()
  local heap = self.ready.n > 0 and self.ready or self.delayed
  if heap.n == 0 then return nil end
  self.n = self.n - 1
  return heap_remove(heap, 1)
end

function Queue:ready_n()
  self:promote()
  return self.ready.n
end

-- queue:next_due() -> the run_at of the earliest delayed job, or nil
function Queue:next_due()
  local delayed = self.delayed
  return delayed.n > 0 and delayed[1].run_at or nil
end

return Queue
