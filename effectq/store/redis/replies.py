"""Replies of the Redis scripts, read in one place.

Every reply layout is documented at the top of its Lua script; an unknown
reply code or a record effectq did not write is an error, never a guess.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ...errors import CorruptRecordError, StoreError
from ..base import Claim, ClaimKind, Record, ResultState, Status

__all__ = [
    "STATUS",
    "DispatchReply",
    "Reply",
    "completed_claim",
    "decode_claim",
    "decode_hash",
    "decode_packed",
    "decode_read",
    "packed_claim",
    "text",
    "when",
]


class Reply(enum.IntEnum):
    """claim.lua's reply codes (the first element of a reply that is not a packed record)."""

    CLAIMED = 1
    COMPLETED = 2
    IN_FLIGHT = 3
    UNKNOWN = 4
    RECONCILE = 5
    FAILED = 6
    CORRUPT = -1


class DispatchReply(enum.IntEnum):
    """dispatch.lua's replies that are not an attempt number (>= 1)."""

    LOST = 0
    PARKED = -1


CODES: dict[int, ClaimKind] = {
    Reply.CLAIMED: ClaimKind.CLAIMED,
    Reply.COMPLETED: ClaimKind.COMPLETED,
    Reply.IN_FLIGHT: ClaimKind.IN_FLIGHT,
    Reply.UNKNOWN: ClaimKind.UNKNOWN,
    Reply.RECONCILE: ClaimKind.RECONCILE,
    Reply.FAILED: ClaimKind.FAILED,
}
_GRANTED = (int(Reply.CLAIMED), int(Reply.RECONCILE))  # plain ints: every first run compares
# Read on every claim reply: module globals, since on Python 3.11 an Enum member read off its
# class goes through EnumType's __getattr__ hook (some 1,000 instructions each).
_COMPLETED_KIND, _COMPLETED, _STORED = ClaimKind.COMPLETED, Status.COMPLETED, ResultState.STORED
STATUS = {
    b"p": Status.PENDING,
    b"d": Status.DISPATCHED,
    b"c": Status.COMPLETED,
    b"r": Status.RELEASED,
    b"u": Status.UNKNOWN,
    b"f": Status.FAILED,
}
RESULT_STATES = {state.value.encode(): state for state in ResultState}


def text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _expiry(pttl: int) -> datetime | None:
    if pttl <= 0:
        return None
    return datetime.fromtimestamp(datetime.now(UTC).timestamp() + pttl / 1000, UTC)


def when(ms: Any) -> datetime | None:
    value = _int(ms)
    return datetime.fromtimestamp(value / 1000, UTC) if value else None


def decode_claim(key: str, reply: Any) -> Claim:
    """The one place claim replies are read (their layouts are in claim.lua)."""
    if type(reply) is bytes:  # a completed record: the packed string itself
        return completed_claim(key, reply)
    try:
        code = reply[0]
        if type(code) is bytes:  # PREFETCHED: a completed record, the run's index, the records it lists
            return completed_claim(key, code, reply[1:] if len(reply) > 1 else None)
        code = int(code)
        if code in _GRANTED:  # positional, in Claim's field order: every first run reads one
            return Claim(
                CODES[code],  # kind
                int(reply[1]),  # token
                int(reply[2]),  # attempt
                STATUS[reply[3]],  # status
                0,  # lease_ms
                None,  # result
                _STORED,  # result_state
                "" if code == 1 or len(reply) < 6 else text(reply[5]),  # input_hash: a reconcile's
                "" if reply[4] == b"" else text(reply[4]),  # error: none on nearly every grant
            )
        if code == Reply.IN_FLIGHT:
            return Claim(
                ClaimKind.IN_FLIGHT,
                token=int(reply[1]),
                attempt=int(reply[2]),
                status=STATUS[reply[3]],
                lease_ms=int(reply[4]),
                owner=text(reply[5]),
            )
        if code == Reply.UNKNOWN:
            return Claim(
                ClaimKind.UNKNOWN,
                token=int(reply[1]),
                attempt=int(reply[2]),
                status=Status.UNKNOWN,
                error=text(reply[3]),
                owner=text(reply[4]),
                input_hash=text(reply[5]),
            )
        if code == Reply.FAILED:
            return Claim(
                ClaimKind.FAILED,
                token=int(reply[1]),
                attempt=int(reply[2]),
                status=Status.FAILED,
                error=text(reply[3]),
                failure=text(reply[4]),
            )
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise StoreError(f"effectq claim got an unexpected reply for key {key!r}: {reply!r}") from exc
    what = text(reply[1]) if code == Reply.CORRUPT and len(reply) > 1 else f"reply code {code}"
    if what.startswith("status "):
        raise CorruptRecordError(key, f"status {what[7:]!r}")
    raise CorruptRecordError(key, f"the Redis key holds another type ({what})")


def decode_read(key: str, reply: Any) -> Record | None:
    """A record from read.lua's reply (a hash, a packed string, or nothing)."""
    kind, payload, pttl = reply
    kind = text(kind)
    if kind == "none":
        return None
    if kind == "hash":
        fields = dict(zip(payload[::2], payload[1::2], strict=True))
        return decode_hash(key, fields, int(pttl))
    if kind == "string":
        return decode_packed(key, payload, int(pttl))
    raise CorruptRecordError(key, f"the Redis key holds a {kind}")


def decode_packed(key: str, packed: bytes, pttl: int) -> Record:
    """A completed record from its packed string (complete.lua has the layout)."""
    parts = packed.split(b"\n", 10)
    if len(parts) != 11 or parts[0] != b"c1":
        raise CorruptRecordError(key, "a string that is not a packed completed record")
    _, token, attempt, state, done, name, run_id, form, ihash, note, result = parts
    try:
        result_state = ResultState(text(state))
    except ValueError:
        raise CorruptRecordError(key, f"result state {text(state)!r}") from None
    text_form = text(form)
    if not key:
        key = f"{text(run_id)}:{text(name)}:{text_form[1:]}…" if text_form.startswith(":") else text_form
    return Record(
        key=key,
        status=Status.COMPLETED,
        token=_int(token),
        attempt=_int(attempt),
        name=text(name),
        run_id=text(run_id),
        updated_at=when(done),
        error=text(note),
        result=result if result_state is ResultState.STORED else None,
        result_state=result_state,
        input_hash=text(ihash),
        expires_at=_expiry(pttl),
    )


def decode_hash(key: str, fields: dict[bytes, bytes], pttl: int) -> Record:
    """A pending, dispatched, released or unknown record from its hash."""
    status = STATUS.get(fields.get(b"s", b""))
    if status is None or status is Status.COMPLETED:
        raise CorruptRecordError(key, f"status {text(fields.get(b's'))!r}")
    identity = fields.get(b"h", b"").split(b"\n")  # name, run id, key, input hash (see claim.lua)
    if len(identity) != 4:  # written before the identity was one field
        identity = [
            fields.get(b"n", b""),
            fields.get(b"u", b""),
            fields.get(b"k", b""),
            fields.get(b"i", b""),
        ]
    name, run_id, effect_key, input_hash = identity
    created = fields.get(b"c")
    return Record(
        key=key or text(effect_key),
        status=status,
        token=_int(fields.get(b"t")),
        attempt=_int(fields.get(b"a")),
        name=text(name),
        run_id=text(run_id),
        owner=text(fields.get(b"o")),
        lease_expires_at=when(fields.get(b"x")),
        created_at=when(created),
        updated_at=when(fields.get(b"m", created)),  # no m: unchanged since created
        error=text(fields.get(b"e")),
        input_hash=text(input_hash),
        expires_at=_expiry(pttl),
        failure=text(fields.get(b"z")),
    )


def completed_claim(key: str, packed: bytes, hint: list[Any] | None = None) -> Claim:
    """A COMPLETED claim from a packed record (complete.lua has the layout), or a clear error."""
    try:  # the fields by name at once, not eleven lookups of a list
        version, token, attempt, stored, _, _, _, _, input_hash, _, result = packed.split(b"\n", 10)
    except ValueError:  # not eleven fields
        version = b""
    if version != b"c1" or not token.isdigit() or not attempt.isdigit():
        raise CorruptRecordError(key, "a string that is not a packed completed record")
    state = RESULT_STATES.get(stored)
    if state is None:
        raise CorruptRecordError(key, f"result state {text(stored)!r}")
    return Claim(  # positional, in Claim's field order: every replay reads one
        _COMPLETED_KIND,  # kind
        int(token),  # token
        int(attempt),  # attempt
        _COMPLETED,  # status
        0,  # lease_ms
        result if state is _STORED else None,  # result
        state,  # result_state
        input_hash.decode("utf-8", "replace"),  # input_hash
        "",  # error
        "",  # owner
        hint,  # prefetch_hint
    )


def packed_claim(packed: bytes) -> Claim | None:
    """A COMPLETED claim from a packed record (None if it is not one)."""
    try:
        return completed_claim("", packed)
    except CorruptRecordError:
        return None


class Prefetched:
    """A run's completed records (as :meth:`RedisStore.prefetch` read them), looked up by effect key."""

    __slots__ = ("_found", "_record_key")

    def __init__(self, record_key: Callable[[str], str], found: dict[str, Claim]) -> None:
        self._record_key = record_key
        self._found = found

    def __len__(self) -> int:
        return len(self._found)

    def get(self, key: str) -> Claim | None:
        return self._found.get(self._record_key(key))
