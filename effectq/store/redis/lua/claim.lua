--[[ claim: read an effect record and, when it is free, claim it. One round trip.

A record in flight, released, unknown or failed is a hash; fields: s status (p pending,
d dispatched, r released, u unknown, f failed), t fencing token, a attempts (how many times the
function was dispatched; absent reads 0), x lease end (ms, Redis clock; 0 none), o owner,
h identity: effect name \n run id \n effect key \n input hash (written whole by every grant that
runs the function: the attempt that executes owns the record), g the identity of the holder of a
reconcile lease on an unknown (h stays the recorded attempt's, the one the reconcile asks about,
until dispatch makes g the identity), e error, c created, m modified (absent until the record
first changes: read c), w "a waiter is listening" flag, z a failed record's recorded exception
(JSON, written by fail.lua; absent when the key was parked after max attempts). Every field is a
hash entry Redis writes and reads one by one, so the identity, which only a grant (or a dispatch)
writes, is one. Records written before h keep n, u, k and i as fields of their own; every script
reads both, and a grant rewrites such a record in the new layout.
A completed record is one packed string (see complete.lua).

KEYS[1] the record
KEYS[2] the open index (zset: pending/dispatched records, score = lease end)
KEYS[3] the doubt index (zset: unknown records, score = when they became unknown: the
        mark_unknown, or the end of the lease a dead holder left)
KEYS[4] (default keys only) the run's index of completed records (see complete.lua)
ARGV[1] lease, ms
ARGV[2] owner: unique per call; a retried claim with the same owner gets its grant back
ARGV[3] flags: "r" may reconcile an unknown, "s" replay safe, "f" reconcile before a first run,
        "i" on a completed record, also return the run's index and the records it lists when
        it lists any record but this one (a redelivery prefetches the rest; a run of one effect
        has none to prefetch)
ARGV[4] the identity, as a grant writes it to h: effect name \n run id \n effect key \n input hash
        (or "")
ARGV[5] retention of a pending or parked record, ms
ARGV[6] max attempts: a dispatch that would start execution number max + 1 parks the record
        instead (status f, kept for the retention, its last error kept); 0 or absent: no cap

Reply: a completed record is the packed string itself, as a bulk string (the caller reads it:
a replay costs the server one GET); with the "i" flag and an index of more than this record,
   PREFETCHED   {packed, run index, record 1, record 2, ...}  record i is the value of the
                index's i-th entry: a packed record, or nil (this record; one gone, or no longer
                completed). They are the first PREFETCH_RECORDS entries at most, and stop before
                the one that would take them past PREFETCH_BYTES: the caller reads the entries
                after the last one given with one MGET (same slot). Hints only: the caller uses
                a packed record as a completed claim's, and claims any other key.
Else, by the first element:
   1 CLAIMED    {1, token, attempt, status, error}  the caller holds a dispatched claim: execute
                (error: why an unknown is being re-run, when replay_safe re-dispatched it)
   3 IN_FLIGHT  {3, token, attempt, status, remaining lease ms, holder}
   4 UNKNOWN    {4, token, attempt, error, last holder, input hash}  maybe applied
   5 RECONCILE  {5, token, attempt, status, error[, input hash]}  the caller holds a lease to ask
                the remote system (status p: nothing ran yet; u: the outcome is unknown, and the
                input hash is the recorded attempt's, the one the reconcile asks about)
   6 FAILED     {6, token, attempt, error, recorded exception or ""}  a terminal failure (fail.lua)
                is replayed; without a recorded exception, the key is parked: attempts exhausted
  -1 CORRUPT    {-1, what was found}

A retried claim of the same owner gets its grant back with a lease from now, as long as nobody
else wrote the record since (its first try's lease may have run out while the reply was lost).
It writes (and so do a retried complete or dispatch of the same token): a WAIT that follows the
retry then covers the first try's write as well.
]]
local keys, argv = KEYS, ARGV -- globals: each read of one is a lookup by name, of a local none
local rec = keys[1]
-- GET first: a completed record answers at once, and a free key needs no second look. Only a
-- record in flight, released or unknown (a hash) pays for the failed GET and an HMGET.
-- The two common outcomes (a replay, a first run) come first, before any closure is made.
local packed = redis.pcall('GET', rec)
if type(packed) == 'string' then
  if keys[4] and string.find(argv[3], 'i', 1, true) then
    local index = redis.call('GET', keys[4]) -- 16 bytes a record
    if index and #index > 16 then
      -- A redelivery: the records the index lists are in this bucket (this slot), read here
      -- 16 at a time, so that what the reply cannot carry is not read whole either. A record's
      -- key is the tag and its digest in hex, formatted as three numbers of 6, 6 and 4 bytes
      -- (a format of one number a byte costs Redis twice as much). The tag holds no "%": the
      -- prefix and the namespace are checked.
      local PREFETCH_RECORDS, PREFETCH_BYTES = 64, 262144
      local reply, n, left = {packed, index}, 2, PREFETCH_BYTES
      local key = string.sub(keys[4], 1, -37) .. '%012x%012x%08x' -- "<tag>:" of "<tag>:run:<d>"
      local count = math.min(math.floor(#index / 16), PREFETCH_RECORDS)
      for first = 1, count, 16 do
        local names, m = {}, 0
        for i = first, math.min(first + 15, count) do
          local a, b, c, d, e, f, g, h, i2, j, k, l, w, x, y, z = string.byte(index, i * 16 - 15, i * 16)
          m = m + 1
          names[m] = string.format(key, ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f,
            ((((g * 256 + h) * 256 + i2) * 256 + j) * 256 + k) * 256 + l, ((w * 256 + x) * 256 + y) * 256 + z)
        end
        local values = redis.call('MGET', unpack(names))
        for i = 1, m do
          local value = values[i]
          if value then
            if names[i] == rec then
              value = false -- the caller has it already
            else
              left = left - #value
              if left < 0 then return reply end
            end
          end
          n = n + 1
          reply[n] = value
        end
      end
      return reply
    end
  end
  return packed
end
if not packed then
  -- a free key (a first run): the same grant as fresh_claim(now, 0, true) below, whose m
  -- would only repeat c. Its numbers go to Redis as strings, each made once: Redis formats
  -- every number a script passes it with a printf of its own.
  -- (Arithmetic's own coercion and string.format's %d cost half what tonumber and tostring do.)
  local clock = redis.call('TIME')
  local stamp = clock[1] .. string.sub('00000' .. clock[2], -6, -4) -- ms: seconds, then ms digits
  local now = stamp + 0
  local lease_end = string.format('%d', now + argv[1])
  local status, att, attempts = 'd', 1, '1'
  if argv[3] ~= '' and string.find(argv[3], 'f', 1, true) then status, att, attempts = 'p', 0, '0' end
  redis.call('HSET', rec, 's', status, 't', stamp, 'a', attempts, 'x', lease_end, 'o', argv[2],
    'h', argv[4], 'c', stamp)
  if status == 'p' then redis.call('PEXPIRE', rec, argv[5]) end
  redis.call('ZADD', keys[2], lease_end, rec)
  if status == 'p' then return {5, now, att, status, ''} end
  return {1, now, att, status, ''}
end
-- Not a string: a hash (in flight, released, unknown, failed), or another type.
local r = redis.pcall('HMGET', rec, 's', 't', 'a', 'x', 'o', 'i', 'e', 'h', 'z')
if r['err'] then return {-1, redis.call('TYPE', rec)['ok']} end

local open, doubt = keys[2], keys[3]
local lease, owner, flags = tonumber(argv[1]), argv[2], argv[3]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local s = r[1]
local tok, att, x = tonumber(r[2]) or 0, tonumber(r[3]) or 0, tonumber(r[4]) or 0
local own, ihash, err = r[5] or '', r[6] or '', r[7] or ''
if r[8] then ihash = string.match(r[8], '^[^\n]*\n[^\n]*\n[^\n]*\n([^\n]*)$') or ihash end

local function grant(status, newtok, newatt, fresh)
  local fields = {'s', status, 't', newtok, 'a', newatt, 'x', now + lease, 'o', owner,
    'h', argv[4], 'm', now}
  if fresh then
    fields[#fields + 1] = 'c'
    fields[#fields + 1] = now
  else
    redis.call('HDEL', rec, 'e', 'g', 'n', 'u', 'k', 'i') -- the last grant's e and g; the old layout
  end
  redis.call('HSET', rec, unpack(fields))
  if status == 'p' then
    redis.call('PEXPIRE', rec, argv[5])
  elseif not fresh then
    redis.call('PERSIST', rec)
  end
  redis.call('ZADD', open, now + lease, rec)
  if not fresh then redis.call('ZREM', doubt, rec) end
  if status == 'p' then return {5, newtok, newatt, status, ''} end
  return {1, newtok, newatt, status, ''}
end

local cap = tonumber(argv[6]) or 0

-- Attempts exhausted: the execution a grant would start does not; the key is parked, taken over
-- (the token bumped, as a re-run would) and kept for the retention with its last error.
local function park()
  redis.call('HSET', rec, 's', 'f', 't', tok + 1, 'x', 0, 'm', now)
  redis.call('HDEL', rec, 'o', 'w', 'z', 'g')
  redis.call('PEXPIRE', rec, argv[5])
  redis.call('ZREM', open, rec)
  redis.call('ZREM', doubt, rec)
  return {6, tok + 1, att, err, ''}
end

local function in_flight()
  redis.call('HSET', rec, 'w', 1)
  return {3, tok, att, s, x - now, own}
end

local function fresh_claim(newtok, newatt, fresh)
  if string.find(flags, 'f', 1, true) then return grant('p', newtok, newatt, fresh) end
  if cap > 0 and newatt >= cap then return park() end
  return grant('d', newtok, newatt + 1, fresh)
end

if not s then
  return fresh_claim(now, 0, true)
end
if s == 'r' then
  return fresh_claim(tok + 1, att, false)
end
if s == 'f' then
  return {6, tok, att, err, r[9] or ''}
end
if s ~= 'p' and s ~= 'd' and s ~= 'u' then
  return {-1, 'status ' .. s}
end
if x > 0 and own == owner then
  -- A retried claim of our own, and nobody else has written since (any other grant, or the lease
  -- running out while dispatched, rewrites o or x): the same grant again, with a lease from now.
  -- The first try's may have run out while its reply was lost, and nothing ran under it yet.
  redis.call('HSET', rec, 'x', now + lease, 'm', now)
  if s ~= 'u' then redis.call('ZADD', open, now + lease, rec) end
  if s == 'd' then return {1, tok, att, s, err} end
  return {5, tok, att, s, err, ihash}
end
if s == 'p' then
  if x > now then return in_flight() end
  return fresh_claim(tok + 1, att, false) -- the reconciler died before dispatch: nothing ran
end
if s == 'd' then
  if x > now then return in_flight() end
  err = 'lease expired while dispatched (holder ' .. own .. ')'
  redis.call('HSET', rec, 's', 'u', 'e', err, 'x', 0, 'm', now)
  redis.call('ZREM', open, rec)
  redis.call('ZADD', doubt, x, rec) -- unknown since the lease ran out, not since it was noticed
  s, x = 'u', 0
end
-- unknown
if x > now then return in_flight() end
if string.find(flags, 'r', 1, true) then
  redis.call('HSET', rec, 't', tok + 1, 'x', now + lease, 'o', owner, 'g', argv[4], 'm', now)
  return {5, tok + 1, att, s, err, ihash}
end
if string.find(flags, 's', 1, true) then
  if cap > 0 and att >= cap then return park() end
  redis.call('HSET', rec, 's', 'd', 't', tok + 1, 'a', att + 1, 'x', now + lease, 'o', owner,
    'h', argv[4], 'm', now) -- the re-run's identity: it is what executes
  redis.call('ZREM', doubt, rec)
  redis.call('ZADD', open, now + lease, rec)
  return {1, tok + 1, att + 1, 'd', err}
end
return {4, tok, att, err, own, ihash}
