-- wrk's script for the benchmark's closed loop (testing/wrkload.py runs it; Debian's wrk 4.1 with LuaJIT).
--
--   ESUN_WRK_BODIES=FILE ESUN_WRK_OUT=PREFIX ESUN_WRK_UUID_PREFIX=HEX \
--       wrk -t 1 -c CLIENTS -d SECONDS --timeout 5s -s testing/wrk.lua URL
--
-- Settings come from the environment, not `-- args`: wrk calls request() once in its main Lua state, where
-- init() never runs, to check the request it builds.
-- ESUN_WRK_BODIES: one JSON request body per line, with @@ESUN_UUID@@ where the esun_uuid goes. Each request
-- takes the next body under a fresh esun_uuid (ESUN_WRK_UUID_PREFIX, 32 hex from the caller, new for each run so
-- that the service never answers from its cache, then the thread and a counter), so that every answer can be
-- found in the server's log. Each thread writes one line per answer to PREFIX-<thread>.tsv: esun_uuid, sent and
-- answered (wall clock, seconds, from clock_gettime through LuaJIT's ffi: wrk gives a script no per-request
-- time), status, and a 200's body (else "-"), which testing/wrkload.py checks. An answer without a uuid sent (an
-- error body) is matched to the oldest request in flight (see response()). At the end, done()
-- writes the requests never answered to PREFIX-left.tsv and wrk's error counts to PREFIX-errors.tsv.

local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } esun_timespec;
int clock_gettime(int clock_id, esun_timespec *tp);
]]
local ts = ffi.new("esun_timespec")
local function now()
  ffi.C.clock_gettime(0, ts) -- CLOCK_REALTIME, as Python's time.time() and the server's log
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local MARK = "@@ESUN_UUID@@"
local OUT = os.getenv("ESUN_WRK_OUT")
local UUID_PREFIX = os.getenv("ESUN_WRK_UUID_PREFIX") or string.rep("0", 32)
local pre, post = {}, {}
for line in io.lines(os.getenv("ESUN_WRK_BODIES")) do
  local at = line:find(MARK, 1, true)
  if at then
    table.insert(pre, line:sub(1, at - 1))
    table.insert(post, line:sub(at + #MARK))
  end
end
local count = #pre
local headers = { ["Content-Type"] = "application/json" }
local threads = {}
local out = nil
tid = 0 -- set by setup() in each thread's state
sent = {} -- esun_uuid -> when sent, until answered (done() reads what is left)
local n = 0
local prefix = UUID_PREFIX .. "00"

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  prefix = UUID_PREFIX .. string.format("%02x", tid % 256)
  out = io.open(OUT .. "-" .. tid .. ".tsv", "w")
  out:setvbuf("full", 65536)
end

function request()
  n = n + 1
  local id = prefix .. string.format("%030x", n)
  local k = (tid * 7919 + n) % count + 1
  sent[id] = now()
  return wrk.format("POST", wrk.path, headers, pre[k] .. id .. post[k])
end

function response(status, headers, body)
  local t = now()
  local id = body:match('"esun_uuid"%s*:%s*"(%x+)"')
  local t0 = id and sent[id]
  if not t0 then
    -- An answer without a uuid we sent (an error body): wrk does not say which connection it came on, so it is
    -- taken as the answer to the oldest request in flight (the likeliest, on a server that answers in order),
    -- which keeps the counts right: that request is not also reported as never answered.
    for key, when in pairs(sent) do
      if not t0 or when < t0 then
        id, t0 = key, when
      end
    end
  end
  -- A 200's body goes to Python's one answer check (testing.samples.check_answer), on one line: JSON never holds
  -- a raw tab or newline inside a string, and between tokens a space reads the same.
  local text = status == 200 and (body:gsub("[\t\r\n]", " ")) or "-"
  if t0 then
    sent[id] = nil
    out:write(id, "\t", string.format("%.6f\t%.6f", t0, t), "\t", status, "\t", text, "\n")
  else
    out:write("-\t0\t", string.format("%.6f", t), "\t", status, "\t", text, "\n")
  end
end

function done(summary, latency, requests)
  -- The threads' answer files are flushed when wrk exits (stdio); this runs in the main state, before that.
  local left = io.open(OUT .. "-left.tsv", "w")
  for _, thread in ipairs(threads) do
    for id, t0 in pairs(thread:get("sent")) do
      left:write(id, "\t", string.format("%.6f", t0), "\n")
    end
  end
  left:close()
  local e = summary.errors
  local errors = io.open(OUT .. "-errors.tsv", "w")
  errors:write(string.format("connect\t%d\nread\t%d\nwrite\t%d\nstatus\t%d\ntimeout\t%d\nrequests\t%d\n",
    e.connect, e.read, e.write, e.status, e.timeout, summary.requests))
  errors:close()
end
