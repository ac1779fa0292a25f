-- moonjob.queue -- the jobs waiting for a child: priorities and delays.
--
-- Two binary heaps. `ready` orders jobs by (priority, seq): lower priority
-- first, first in first out within one priority. `delayed` orders jobs that
-- may not run yet by (run_at, seq); pop() moves the due ones over first.
-- push, pop and remove are O(log n); each job remembers its heap and index.
-- `n` counts every waiting job, `ready_n()` those that may run now.
--
-- A job that never reached its child goes back with push: its old seq puts
-- it ahead of everything queued after it at its priority.
local Queue = {}
Queue.__index = Queue

local function ready_before(a, b)
  if a.priority ~= b.priority then return a.priority < b.priority end
  return a.seq < b.seq
end

local function due_before(a, b)
  if a.run_at ~= b.run_at then return a.run_at < b.run_at end
  return a.seq < b.seq
end

local function new_heap(before)
  return { n = 0, before = before }
end

local function place(heap, job, i)
  heap[i] = job
  job.qindex = i
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
  job.qheap = heap
  place(heap, job, heap.n)
  sift_up(heap, heap.n)
end

local function heap_remove(heap, i)
  local job, last = heap[i], heap[heap.n]
  heap[heap.n] = nil
  heap.n = heap.n - 1
  job.qheap, job.qindex = nil, nil
  if i <= heap.n then
    place(heap, last, i)
    sift_down(heap, i)
    sift_up(heap, last.qindex)
  end
  return job
end

function Queue.new(now)
  return setmetatable({ ready = new_heap(ready_before), delayed = new_heap(due_before),
    n = 0, now = now }, Queue)
end

-- queue:push(job): job.priority (default 0) and job.run_at (ms, optional) decide.
function Queue:push(job)
  job.priority = job.priority or 0
  if job.run_at and job.run_at > self.now() then
    heap_push(self.delayed, job)
  else
    heap_push(self.ready, job)
  end
  self.n = self.n + 1
end

-- Moves the delayed jobs that are due to the ready heap.
function Queue:promote()
  local delayed, now = self.delayed, self.now()
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

-- queue:remove(job) -> true if the job was waiting here
function Queue:remove(job)
  local heap = job.qheap
  if heap ~= self.ready and heap ~= self.delayed then return false end
  heap_remove(heap, job.qindex)
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
