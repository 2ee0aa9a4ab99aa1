"""The bytes the wire writes, and the command packer redis-py's connections get: no I/O here.

A script call is framed once (``EVALSHA sha numkeys keys... args...``) and the
same bytes serve the sync and the asyncio wire. hiredis frames in C when it is
installed; it is handed text and bytes alone, since it turns an int or a float
into text by calling back into Python (``repr``), which runs pending signal
handlers and does not check the exception one may raise (a worker's time
limit): the process would die of a segmentation fault. The rest is converted
here, in Python, where such an exception is raised as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SignalSafePacker", "command", "frame", "frame_python", "hiredis_packs"]

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:  # hiredis frames a command in C: about half the time of the Python below
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is optional; so is pack_command (hiredis >= 2.1)
    _pack_command = None

_TEXT = frozenset({str, bytes})
"""What hiredis is handed as it is (see the module's notes)."""
_heads: dict[tuple[bytes, int, int], bytes] = {}
"""The head of an ``EVALSHA`` frame (command, sha, key count) per (sha, keys, args) shape."""


def frame(sha: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
    """The ``EVALSHA`` command's bytes, framed by hiredis when it is installed."""
    pack = _pack_command
    if pack is None:
        return frame_python(sha, keys, args)
    parts: list[str | bytes] = ["EVALSHA", sha, str(len(keys))]
    values: Sequence[Any] = args
    if _TEXT.issuperset(map(type, keys)):  # a store's keys are text: taken as they are, no loop
        parts += keys
    else:
        values = (*keys, *args)
    for value in values:
        kind = type(value)
        if kind is int:
            value = str(value)
        elif kind is not str and kind is not bytes:
            value = _data(value)
        parts.append(value)
    return pack(tuple(parts))


def frame_python(sha: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
    """:func:`frame` in Python alone: the same bytes."""
    nkeys, nargs = len(keys), len(args)
    head_key = (sha.encode(), nkeys, nargs)
    head = _heads.get(head_key)
    if head is None:
        head = _heads[head_key] = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%b\r\n%b" % (
            3 + nkeys + nargs,
            head_key[0],
            _bulk(nkeys),
        )
    return head + b"".join([_bulk(v) for v in keys] + [_bulk(v) for v in args])


def command(*parts: str | bytes) -> bytes:
    """Any command's bytes (``SCRIPT LOAD``, ``WAIT``), framed in Python."""
    return b"*%d\r\n" % len(parts) + b"".join(_bulk(p) for p in parts)


def _bulk(value: Any) -> bytes:
    kind = type(value)
    if kind is str:
        data = value.encode()
    elif kind is bytes:
        data = value
    elif kind is int:
        data = b"%d" % value
    else:
        data = _data(value)
    return b"$%d\r\n%b\r\n" % (len(data), data)


def _data(value: Any) -> bytes:
    """A script argument's bytes, as redis-py and hiredis send it."""
    kind = type(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return str.encode(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    if kind is float:
        return repr(value).encode()
    raise TypeError(f"a script argument must be str, bytes, int or float, not {kind.__name__}")


class SignalSafePacker:
    """redis-py's command packer for its connections when hiredis is installed, without the crash.

    redis-py hands every command to ``hiredis.pack_command`` as it is; hiredis
    turns an int or a float into text by calling back into Python (``repr``),
    which runs pending signal handlers, and uses the result unchecked when a
    handler raised (a worker's time limit): the process dies of a segmentation
    fault. Every connection's handshake sends one (``HELLO 3``, ``SELECT db``).
    This packer turns them into text first, in Python, where such an exception is
    raised as usual, and hands hiredis the rest as redis-py does: the same bytes.
    """

    __slots__ = ()

    def pack(self, *args: Any) -> list[bytes]:
        assert _pack_command is not None
        first = args[0]
        if isinstance(first, str):  # a command name with literal arguments in it ("CONFIG GET")
            args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        parts: list[Any] = []
        for arg in args:
            kind = type(arg)
            if kind is int:
                arg = str(arg)
            elif isinstance(arg, float):
                arg = repr(arg)  # as hiredis writes it, a subclass's own repr included
            elif isinstance(arg, bytearray | memoryview):
                arg = bytes(arg)
            parts.append(arg)  # hiredis takes str and bytes as they are, and refuses the rest
        try:
            return [_pack_command(tuple(parts))]
        except TypeError as exc:
            from redis.exceptions import DataError

            raise DataError(str(exc)) from exc


_PACKER = SignalSafePacker()


def hiredis_packs(connection_class: Any) -> bool:
    """Whether redis-py packs the commands of ``connection_class``'s connections with hiredis,
    and lets them be given a packer of their own (``command_packer``)."""
    if _pack_command is None:
        return False
    try:
        import redis.connection
    except ImportError:  # pragma: no cover - the pool is redis-py's
        return False
    base = getattr(redis.connection, "AbstractConnection", None)
    packs = getattr(redis.connection, "HIREDIS_PACK_AVAILABLE", None)  # redis-py 5's name
    if packs is None:
        packs = getattr(redis.connection, "HIREDIS_AVAILABLE", False)
    if not packs or base is None:
        return False  # redis-py packs in Python: no call back into it from C
    return isinstance(connection_class, type) and issubclass(connection_class, base)
