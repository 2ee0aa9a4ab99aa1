--[[ dispatch: after a reconcile found nothing, run the function under the same token.

PENDING/UNKNOWN held by the token (an UNKNOWN only with its reconcile lease: the holder that
left it unknown keeps its token, but may not re-dispatch) -> DISPATCHED, attempt + 1, a fresh lease.
An UNKNOWN takes the reconciler's identity (g, see claim.lua): the attempt that executes owns it.

KEYS[1] the record   KEYS[2] the open index   KEYS[3] the doubt index
ARGV[1] token   ARGV[2] lease, ms
ARGV[3] max attempts (0 or absent: no cap)   ARGV[4] retention of a parked record, ms
ARGV[5] notification channel (for those waiting on the reconcile lease, when parked)
ARGV[6] "s": the channel is sharded (SPUBLISH, Redis Cluster)

A retried dispatch of the same token (its first try landed, the reply was lost) gets the same
attempt back, with a lease from now: the first try's may have run out meanwhile, and nobody took
the record over (that would have changed the token, or made it unknown).

Reply: the attempt number (>= 1); 0 lost: the token no longer holds it; -1 parked: the attempt
would be past max attempts, so the record is failed (status f, as claim.lua parks it) instead.
]]
local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 't', 'a', 'x', 'g', 'w')
if r['err'] then return 0 end -- completed (a packed string): nothing to change
local s = r[1]
if not s or r[2] ~= ARGV[1] then return 0 end
local att = tonumber(r[3]) or 0
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease_end = now + tonumber(ARGV[2])
if s == 'd' then
  -- a retry (written, so a WAIT after it covers the first try): a lease from now
  redis.call('HSET', rec, 'x', lease_end, 'm', now)
  redis.call('ZADD', KEYS[2], lease_end, rec)
  return att
end
if s ~= 'p' and s ~= 'u' then return 0 end
if s == 'u' and (tonumber(r[4]) or 0) == 0 then return 0 end
local cap = tonumber(ARGV[3]) or 0
if cap > 0 and att >= cap then
  redis.call('HSET', rec, 's', 'f', 't', tonumber(r[2]) + 1, 'x', 0, 'm', now)
  redis.call('HDEL', rec, 'o', 'w', 'z', 'g')
  redis.call('PEXPIRE', rec, ARGV[4])
  redis.call('ZREM', KEYS[2], rec)
  redis.call('ZREM', KEYS[3], rec)
  if r[6] and ARGV[5] then
    if ARGV[6] == 's' then redis.call('SPUBLISH', ARGV[5], rec) else redis.call('PUBLISH', ARGV[5], rec) end
  end
  return -1
end
redis.call('HSET', rec, 's', 'd', 'a', att + 1, 'x', lease_end, 'm', now)
if s == 'u' and r[5] then
  redis.call('HSET', rec, 'h', r[5])
  redis.call('HDEL', rec, 'g')
end
redis.call('PERSIST', rec)
redis.call('ZREM', KEYS[3], rec)
redis.call('ZADD', KEYS[2], lease_end, rec)
return att + 1
