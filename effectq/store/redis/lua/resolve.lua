--[[ resolve: an operator settles a record in doubt. Compare-and-set: one resolver wins.

In doubt means UNKNOWN, or DISPATCHED whose lease ran out. FAILED (a recorded terminal exception,
or a key parked after max attempts) is settled by a rule an operator may overrule the same way.
The token is bumped, so a late holder cannot overwrite the settlement; "not_applied" also sets the
attempts back to 0 (the operator's verdict starts the count again). A completed record is never rewritten.
A record settled already exactly as asked (the same outcome, note and result: this resolve's own
first try, resent after its reply was lost, or the same decision again) is reported settled,
unchanged; any other is refused.

KEYS[1] the record   KEYS[2] the open index   KEYS[3] the doubt index
ARGV[1] "applied" or "not_applied"
ARGV[2] result bytes (applied)   ARGV[3] result state ("" stored)
ARGV[4] note (who and why)       ARGV[5] retention, ms   ARGV[6] notification channel
ARGV[7] "s": the channel is sharded (SPUBLISH, Redis Cluster)

Reply: {1, status} settled (now, or so already); {0, status} refused ("" when there is no record;
"d" means in flight with a live lease); {-1, type} the key holds something effectq did not write.
]]
local rec = KEYS[1]
local note = ARGV[4]
if ARGV[1] == 'applied' then note = string.gsub(note, '\n', ' ') end -- a packed record's is one line
local kind = redis.call('TYPE', rec)['ok']
if kind == 'string' then
  local state, was, result = string.match(redis.call('GET', rec),
    '^c1\n[^\n]*\n[^\n]*\n([^\n]*)\n[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n([^\n]*)\n(.*)$')
  if ARGV[1] == 'applied' and state == ARGV[3] and was == note and result == ARGV[2] then
    return {1, 'c'} -- settled so already
  end
  return {0, 'c'}
end
if kind == 'none' then return {0, ''} end
if kind ~= 'hash' then return {-1, kind} end
local r = redis.call('HMGET', rec, 's', 't', 'x', 'w', 'a', 'n', 'u', 'k', 'i', 'h', 'e')
if r[10] then -- the identity field (see claim.lua); the old layout's fields otherwise
  local name, run, key, ihash = string.match(r[10], '^([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)$')
  if name then r[6], r[7], r[8], r[9] = name, run, key, ihash end
end
local s = r[1]
if not s then return {-1, 'hash without status'} end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local doubt = s == 'u' or s == 'f' or (s == 'd' and (tonumber(r[3]) or 0) <= now)
if not doubt then
  if s == 'r' and ARGV[1] ~= 'applied' and r[11] == note then return {1, 'r'} end -- settled so already
  return {0, s}
end
local tok = (tonumber(r[2]) or 0) + 1
if ARGV[1] == 'applied' then
  -- packed like complete.lua; the key is kept whole (a resolved record is looked up by it)
  local packed = table.concat({'c1', tok, r[5] or '0', ARGV[3], now, r[6] or '', r[7] or '', r[8] or '',
    r[9] or '', note, ARGV[2]}, '\n')
  redis.call('SET', rec, packed, 'PX', ARGV[5])
else
  redis.call('HSET', rec, 's', 'r', 't', tok, 'a', 0, 'e', note, 'm', now)
  redis.call('HDEL', rec, 'x', 'o', 'w', 'z', 'g')
  redis.call('PEXPIRE', rec, ARGV[5])
end
redis.call('ZREM', KEYS[2], rec)
redis.call('ZREM', KEYS[3], rec)
if r[4] then
  if ARGV[7] == 's' then redis.call('SPUBLISH', ARGV[6], rec) else redis.call('PUBLISH', ARGV[6], rec) end
end
local out = 'c'
if ARGV[1] ~= 'applied' then out = 'r' end
return {1, out}
