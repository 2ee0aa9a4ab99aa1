--[[ resolve: an operator settles a record in doubt. Compare-and-set: one resolver wins.

In doubt means UNKNOWN, or DISPATCHED whose lease ran out. The token is bumped, so a
late holder cannot overwrite the settlement. A completed record is never rewritten.

KEYS[1] the record   KEYS[2] the open index   KEYS[3] the doubt index
ARGV[1] "applied" or "not_applied"
ARGV[2] result bytes (applied)   ARGV[3] result state ("" stored)
ARGV[4] note (who and why)       ARGV[5] retention, ms   ARGV[6] notification channel

Reply: {1, status} settled; {0, status} refused ("" when there is no record;
"d" means in flight with a live lease).
]]
local rec = KEYS[1]
local r = redis.call('HMGET', rec, 's', 't', 'x', 'w')
local s = r[1]
if not s then return {0, ''} end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local doubt = s == 'u' or (s == 'd' and (tonumber(r[3]) or 0) <= now)
if not doubt then return {0, s} end
local tok = (tonumber(r[2]) or 0) + 1
if ARGV[1] == 'applied' then
  redis.call('HSET', rec, 's', 'c', 't', tok, 'e', ARGV[4], 'm', now)
  if ARGV[3] == '' then
    redis.call('HSET', rec, 'v', ARGV[2])
    redis.call('HDEL', rec, 'f')
  else
    redis.call('HSET', rec, 'f', ARGV[3])
    redis.call('HDEL', rec, 'v')
  end
else
  redis.call('HSET', rec, 's', 'r', 't', tok, 'e', ARGV[4], 'm', now)
end
redis.call('HDEL', rec, 'x', 'o', 'w')
redis.call('PEXPIRE', rec, ARGV[5])
redis.call('ZREM', KEYS[2], rec)
redis.call('ZREM', KEYS[3], rec)
if r[4] then redis.call('PUBLISH', ARGV[6], rec) end
local out = 'c'
if ARGV[1] ~= 'applied' then out = 'r' end
return {1, out}
