--[[ release: the function raised an exception that means "not applied". Fenced by the token.

PENDING/DISPATCHED -> RELEASED (kept for the retention; the next call applies the effect).
UNKNOWN held for a reconcile -> stays UNKNOWN, the reconcile lease is given back.

KEYS[1] the record   KEYS[2] the open index
ARGV[1] token   ARGV[2] error (why)   ARGV[3] retention, ms   ARGV[4] notification channel
ARGV[5] "s": the channel is sharded (SPUBLISH, Redis Cluster)
ARGV[6] "n": the function never ran under this grant (a claim given back): a DISPATCHED record's
        attempts go back down by one, so only executions count

Reply: 1 done; 0 lost: the token no longer holds it.
]]
local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 't', 'w', 'a')
if r['err'] then return 0 end -- completed (a packed string): nothing to change
local s = r[1]
if not s or r[2] ~= ARGV[1] then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if s == 'd' or s == 'p' then
  redis.call('HSET', rec, 's', 'r', 'e', ARGV[2], 'm', now)
  if s == 'd' and ARGV[6] == 'n' and (tonumber(r[4]) or 0) > 0 then
    redis.call('HSET', rec, 'a', tonumber(r[4]) - 1)
  end
  redis.call('HDEL', rec, 'x', 'o', 'w')
  redis.call('PEXPIRE', rec, ARGV[3])
  redis.call('ZREM', KEYS[2], rec)
elseif s == 'u' then
  redis.call('HSET', rec, 'x', 0, 'm', now)
  redis.call('HDEL', rec, 'o', 'w')
else
  return 0
end
if r[3] then
  if ARGV[5] == 's' then redis.call('SPUBLISH', ARGV[4], rec) else redis.call('PUBLISH', ARGV[4], rec) end
end
return 1
