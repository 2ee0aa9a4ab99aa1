--[[ mark_unknown: the function raised an exception that means "maybe applied". Fenced.

DISPATCHED -> UNKNOWN, which never expires and is never replayed silently.

KEYS[1] the record   KEYS[2] the open index   KEYS[3] the doubt index
ARGV[1] token   ARGV[2] error (why)   ARGV[3] notification channel
ARGV[4] "s": the channel is sharded (SPUBLISH, Redis Cluster)
ARGV[5] "n": the function never ran under this grant (a re-dispatch given back): the attempts go
        back down by one, so only executions count

Reply: 1 done (or already unknown under this token); 0 lost.
]]
local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 't', 'w', 'a')
if r['err'] then return 0 end -- completed (a packed string): nothing to change
local s = r[1]
if not s or r[2] ~= ARGV[1] then return 0 end
if s == 'u' then return 1 end
if s ~= 'd' then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('HSET', rec, 's', 'u', 'e', ARGV[2], 'x', 0, 'm', now)
if ARGV[5] == 'n' and (tonumber(r[4]) or 0) > 0 then redis.call('HSET', rec, 'a', tonumber(r[4]) - 1) end
redis.call('HDEL', rec, 'w')
redis.call('PERSIST', rec)
redis.call('ZREM', KEYS[2], rec)
redis.call('ZADD', KEYS[3], now, rec)
if r[3] then
  if ARGV[4] == 's' then redis.call('SPUBLISH', ARGV[3], rec) else redis.call('PUBLISH', ARGV[3], rec) end
end
return 1
