--[[ complete: record an effect as applied, with its result. Fenced by the token.

KEYS[1] the record   KEYS[2] the open index   KEYS[3] the doubt index
ARGV[1] token
ARGV[2] result bytes ("" with a result state other than stored)
ARGV[3] result state: "" stored, "too_large", "unserialisable"
ARGV[4] retention, ms
ARGV[5] notification channel

Reply: 1 recorded (or already recorded by this token); 0 lost: the token no longer holds it.
]]
local rec = KEYS[1]
local r = redis.call('HMGET', rec, 's', 't', 'w')
local s = r[1]
if not s or r[2] ~= ARGV[1] then return 0 end
if s == 'c' then return 1 end
if s ~= 'd' and s ~= 'p' and s ~= 'u' then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if ARGV[3] == '' then
  redis.call('HSET', rec, 's', 'c', 'v', ARGV[2], 'm', now)
  redis.call('HDEL', rec, 'x', 'o', 'e', 'w', 'f')
else
  redis.call('HSET', rec, 's', 'c', 'f', ARGV[3], 'm', now)
  redis.call('HDEL', rec, 'x', 'o', 'e', 'w', 'v')
end
redis.call('PEXPIRE', rec, ARGV[4])
redis.call('ZREM', KEYS[2], rec)
if s == 'u' then redis.call('ZREM', KEYS[3], rec) end
if r[3] then redis.call('PUBLISH', ARGV[5], rec) end
return 1
