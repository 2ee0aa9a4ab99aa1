--[[ fail: the function raised an exception declared terminal; record it. Fenced by the token.

DISPATCHED -> FAILED (kept for the retention): every later claim replies FAILED with the recorded
exception, which the caller raises again without running the function.

KEYS[1] the record   KEYS[2] the open index
ARGV[1] token   ARGV[2] error (one line, for operators)   ARGV[3] the recorded exception (JSON)
ARGV[4] retention, ms   ARGV[5] notification channel
ARGV[6] "s": the channel is sharded (SPUBLISH, Redis Cluster)

Reply: 1 done (or already failed under this token); 0 lost: the token no longer holds it.
]]
local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 't', 'w')
if r['err'] then return 0 end -- completed (a packed string): nothing to change
local s = r[1]
if not s or r[2] ~= ARGV[1] then return 0 end
if s == 'f' then return 1 end
if s ~= 'd' then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('HSET', rec, 's', 'f', 'e', ARGV[2], 'z', ARGV[3], 'x', 0, 'm', now)
redis.call('HDEL', rec, 'o', 'w')
redis.call('PEXPIRE', rec, ARGV[4])
redis.call('ZREM', KEYS[2], rec)
if r[3] then
  if ARGV[6] == 's' then redis.call('SPUBLISH', ARGV[5], rec) else redis.call('PUBLISH', ARGV[5], rec) end
end
return 1
