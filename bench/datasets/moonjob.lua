-- bench/datasets/moonjob.lua -- `moonjob run` as scripts/moonjob runs it, on
-- this checkout's modules, that also writes the parent's own CPU time (user
-- + system, in ms, from getrusage) to the file BENCH_CPU_FILE names: the
-- bench tells the parent's share from its children's.
-- Usage: BENCH_CPU_FILE=F luajit bench/datasets/moonjob.lua run ARGS...
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../../lua/?.lua;" .. here .. "../../lua/?/init.lua;" .. package.path
package.cpath = here .. "../../build/?.so;" .. package.cpath

local ffi = require "ffi"
ffi.cdef [[
struct bench_ds_timeval { long tv_sec; long tv_usec; };
struct bench_ds_rusage { struct bench_ds_timeval utime, stime; long rest[14]; };
int getrusage(int who, struct bench_ds_rusage *usage);
]]

local status = require("moonjob.cli").main(arg)
local u = ffi.new("struct bench_ds_rusage")
ffi.C.getrusage(0, u) -- RUSAGE_SELF
local ms = (tonumber(u.utime.tv_sec) + tonumber(u.stime.tv_sec)) * 1e3
  + (tonumber(u.utime.tv_usec) + tonumber(u.stime.tv_usec)) / 1e3
local f = os.getenv("BENCH_CPU_FILE") and io.open(os.getenv("BENCH_CPU_FILE"), "w")
if f then f:write(ms, "\n"); f:close() end
os.exit(status)
