--[[ renew: the holder is alive; extend its lease. Fenced by the token.

KEYS[1] the record   KEYS[2] the open index
ARGV[1] token   ARGV[2] lease, ms

Reply: 1 renewed; 0 lost (taken over, settled, or the lease was given up).
]]
local rec = KEYS[1]
local r = redis.pcall('HMGET', rec, 's', 't', 'x')
if r['err'] then return 0 end -- completed (a packed string): nothing to change
local s = r[1]
if not s or r[2] ~= ARGV[1] or (tonumber(r[3]) or 0) == 0 then return 0 end
if s ~= 'd' and s ~= 'p' and s ~= 'u' then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease_end = now + tonumber(ARGV[2])
redis.call('HSET', rec, 'x', lease_end)
if s ~= 'u' then redis.call('ZADD', KEYS[2], lease_end, rec) end
return 1
