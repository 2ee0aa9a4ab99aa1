--[[ read: one record as it is stored, for operators. Reads only.

KEYS[1] the record

Reply: {type, payload, pttl}
  type "hash": payload is the flat HGETALL list; "string": the packed completed record
  (see complete.lua); "none": no record; anything else: not a record effectq wrote.
]]
local rec = KEYS[1]
local kind = redis.call('TYPE', rec)['ok']
if kind == 'hash' then
  return {kind, redis.call('HGETALL', rec), redis.call('PTTL', rec)}
end
if kind == 'string' then
  return {kind, redis.call('GET', rec), redis.call('PTTL', rec)}
end
return {kind, false, -2}
