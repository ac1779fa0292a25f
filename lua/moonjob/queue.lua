-- moonjob.queue -- the jobs waiting for a child, first in, first out.
--
-- push, push_first (a job that never reached its child goes back in front),
-- pop, and remove (a canceled job) are all O(1): removal only marks the job,
-- and pop skips marked entries. `n` counts the jobs really waiting.
local Queue = {}
Queue.__index = Queue

function Queue.new()
  return setmetatable({ items = {}, first = 1, last = 0, n = 0 }, Queue)
end

function Queue:push(job)
  self.last = self.last + 1
  self.items[self.last] = job
  job.queued = true
  self.n = self.n + 1
end

function Queue:push_first(job)
  self.first = self.first - 1
  self.items[self.first] = job
  job.queued = true
  self.n = self.n + 1
end

-- queue:pop() -> the oldest waiting job, or nil
function Queue:pop()
  local items = self.items
  while self.first <= self.last do
    local job = items[self.first]
    items[self.first] = nil
    self.first = self.first + 1
    if job.queued then
      job.queued = false
      self.n = self.n - 1
      return job
    end
  end
  return nil
end

-- queue:remove(job) -> true if the job was waiting here
function Queue:remove(job)
  if not job.queued then return false end
  job.queued = false
  self.n = self.n - 1
  return true
end

return Queue
