--[[ complete: record an effect as applied, with its result. Fenced by the token.

A completed record is packed into one string (it is kept for the retention, so it is the bulk of
what Redis holds; a hash with a result over 64 bytes would lose its compact encoding):

  "c1" \n token \n attempt \n result state \n completed ms \n effect name \n run id \n
  key form \n input hash \n note \n result

key form: ":" + the first 16 hex of the input hash when the key is "run id:name:<sha256 hex>"
(the default key, which the caller can recompute), else the whole key.

KEYS[1] the record   KEYS[2] the open index   KEYS[3] the doubt index
KEYS[4] (default keys only) the run's index of completed records: a string of 16-byte digests;
        given only for a key whose last segment (after its last colon) is 64 lower-case hex digits
ARGV[1] token
ARGV[2] result bytes ("" with a result state other than stored)
ARGV[3] result state: "" stored, "too_large", "unserialisable"
ARGV[4] retention, ms
ARGV[5] notification channel
ARGV[6] the record's 16-byte digest, appended to the run's index
ARGV[7] "s": the channel is sharded (SPUBLISH, Redis Cluster)

Reply: 1 recorded (or already recorded by this token); 0 lost: the token no longer holds it.
]]
local keys, argv = KEYS, ARGV -- globals: each read of one is a lookup by name, of a local none
local rec = keys[1]
local r = redis.pcall('HMGET', rec, 's', 't', 'w', 'a', 'h')
if r['err'] then
  -- Not a hash: completed already (a packed string), by this token or not.
  local packed = redis.pcall('GET', rec)
  if type(packed) ~= 'string' or string.match(packed, '^c1\n(%d+)\n') ~= argv[1] then return 0 end
  redis.call('SET', rec, packed, 'KEEPTTL') -- a retry: written, so a WAIT after it covers the first try
  return 1
end
local s = r[1]
if not s or r[2] ~= argv[1] then return 0 end
if s ~= 'd' and s ~= 'p' and s ~= 'u' then return 0 end
local clock = redis.call('TIME')
-- h is name \n run \n key \n input hash, which the packed record repeats but for the key: a
-- default key (run id:name:<sha256 hex>) goes as its form. Plain finds, and a sub only where a
-- string is needed: a pattern over h, or a character class over the key, costs Redis several
-- times what the rest of this does, and so does every string a script makes.
local find, sub = string.find, string.sub
local h = r[5]
local p1 = h and find(h, '\n', 1, true)
local p2 = p1 and find(h, '\n', p1 + 1, true)
local p3 = p2 and find(h, '\n', p2 + 1, true)
if not p3 or find(h, '\n', p3 + 1, true) then -- the identity as fields of their own (records written before h)
  local old = redis.call('HMGET', rec, 'n', 'u', 'k', 'i')
  h = (old[1] or '') .. '\n'
  p1 = #h
  h = h .. (old[2] or '') .. '\n'
  p2 = #h
  h = h .. (old[3] or '')
  p3 = #h + 1
  h = h .. '\n' .. (old[4] or '')
end
-- h's newlines are at p1, p2, p3: the key runs from p2 + 1 to p3 - 1, and "run id:name:" is as
-- long as "name \n run \n", p2.
local form, colon, hex16, tail = h, '', '', '' -- the key's form and what follows it in the record
if p3 - p2 - 1 == p2 + 64 then
  -- 64 hex digits at its end: so KEYS[4] says (see above), else a look (a class costs Redis)
  local hex = keys[4] ~= nil
  if not hex then
    local _, e = find(h, '^[0-9a-f]*\n', p2 + p2 + 1)
    hex = e == p3
  end
  if hex then
    local prefix = sub(h, p1 + 1, p2 - 1) .. ':' .. sub(h, 1, p1 - 1) .. ':'
    if find(h, prefix, p2 + 1, true) == p2 + 1 then
      form, colon, hex16, tail = sub(h, 1, p2), ':', sub(h, p2 + p2 + 1, p2 + p2 + 16), sub(h, p3)
    end
  end
end
-- The completed ms as digits (no number to format): the seconds, then the first three of the
-- microseconds' six (fewer only in the first tenth of a second). One concatenation makes the
-- record: every string a script makes costs Redis a hash of each of its bytes.
local usec = clock[2]
local ms = #usec == 6 and sub(usec, 1, 3) or sub('00000' .. usec, -6, -4)
local packed = 'c1\n' .. r[2] .. '\n' .. (r[4] or '0') .. '\n' .. argv[3] .. '\n' .. clock[1] .. ms .. '\n'
  .. form .. colon .. hex16 .. tail .. '\n\n' .. argv[2]
redis.call('SET', rec, packed, 'PX', argv[4])
if keys[4] and redis.call('APPEND', keys[4], argv[6]) == #argv[6] then
  redis.call('PEXPIRE', keys[4], argv[4]) -- set once, when the run's first completion makes it
end
redis.call('ZREM', keys[2], rec)
if s == 'u' then redis.call('ZREM', keys[3], rec) end
if r[3] then
  if argv[7] == 's' then redis.call('SPUBLISH', argv[5], rec) else redis.call('PUBLISH', argv[5], rec) end
end
return 1
