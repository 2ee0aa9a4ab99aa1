--[[ purge: delete one settled record; never one in doubt or in flight. Operators only.

Settled: completed (a packed string, see complete.lua), released, failed, or pending whose lease
ran out (its holder died before it ran anything). An unknown record, or a dispatched one (live or
with a dead holder), is kept whatever the caller asks. When the record is gone already, its
index entries are dropped.

KEYS[1] the record   KEYS[2] the open index   KEYS[3] the doubt index
ARGV[1] run id the record must belong to ("" for any)
ARGV[2] delete only when unchanged for at least this many ms (0 for any age)

Reply: {code, status}
  1 deleted             status is what it was ("c" completed, "r" released, "f" failed,
                        "p" pending)
  0 kept                status "u", "d" or "p" (in doubt or in flight), or the run or age
                        did not match
  2 no record           its index entries, if any, were dropped; status ""
 -1 not effectq's       status is what the key holds
]]
local rec = KEYS[1]
local kind = redis.call('TYPE', rec)['ok']
if kind == 'none' then
  redis.call('ZREM', KEYS[2], rec)
  redis.call('ZREM', KEYS[3], rec)
  return {2, ''}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local older = tonumber(ARGV[2]) or 0
local s, run, changed
if kind == 'string' then
  local done, packed_run = string.match(redis.call('GET', rec), '^c1\n%d+\n%d+\n[^\n]*\n(%d*)\n[^\n]*\n([^\n]*)\n')
  if not done then return {-1, 'string'} end
  s, run, changed = 'c', packed_run, tonumber(done) or 0
elseif kind == 'hash' then
  local r = redis.call('HMGET', rec, 's', 'x', 'u', 'm', 'h', 'c')
  run = r[3] or ''
  if r[5] then run = string.match(r[5], '^[^\n]*\n([^\n]*)\n') or run end -- the identity field
  s, changed = r[1], tonumber(r[4] or r[6]) or 0 -- unchanged since created: no m yet
  if not s then return {-1, 'hash without status'} end
  local settled = s == 'r' or s == 'f' or (s == 'p' and (tonumber(r[2]) or 0) <= now)
  if not settled then return {0, s} end
else
  return {-1, kind}
end
if ARGV[1] ~= '' and run ~= ARGV[1] then return {0, s} end
if older > 0 and changed > now - older then return {0, s} end
redis.call('DEL', rec)
redis.call('ZREM', KEYS[2], rec)
redis.call('ZREM', KEYS[3], rec)
return {1, s}
