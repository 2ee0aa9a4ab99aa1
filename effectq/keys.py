"""Effect keys, idempotency keys and effect markers.

An effect key names one application of one effect. The default key is::

    <run id>:<effect name>:<sha256 of the canonical JSON of the bound arguments>

Effect names may not contain ``:``, so the key parses unambiguously from the
right even when a run id contains colons. A key function may return any other
non-empty string instead. The store prefixes every key with its namespace.

The canonical JSON follows a key scheme (:class:`KeyScheme`): RFC 8785 by default,
or ``legacy``, effectq's bytes before it, for a fleet that upgrades in two steps
(``EFFECTQ_KEY_SCHEME=legacy``, or :func:`set_key_scheme`). The schemes give the same
key for nearly every input; where they differ, a call first looks for a record under
the other scheme's key and joins it (:func:`bridge_key`), so an effect claimed or
applied before the upgrade is not applied again by a redelivery after it.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import inspect
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol
from urllib.parse import unquote

from .errors import ConfigurationError, InvalidKeyError

__all__ = [
    "MAX_KEY_LENGTH",
    "KeyScheme",
    "bridge_hash",
    "bridge_key",
    "check_key",
    "check_name",
    "check_namespace",
    "check_run_id",
    "default_key",
    "default_name",
    "effect_marker",
    "find_markers",
    "has_marker",
    "idempotency_key",
    "key_params",
    "key_scheme",
    "legacy_keys",
    "set_key_scheme",
]

MAX_KEY_LENGTH = 1024
"""Longest effect key (and run id) accepted, in characters."""

_NAME = re.compile(r"[A-Za-z0-9_.<>/\-\[\]@+]{1,200}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.\-/@+]{1,64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
"""Control characters a run id or key may not hold; ``str.isprintable()`` is True only for a text
with none of them (they are not printable), so a printable text, nearly every one, skips the search."""
_IDEMPOTENCY_NS = uuid.UUID("6f0f3d4c-9f6e-5b8e-9a51-0c5e1f3b7d2a")


def check_name(name: object) -> str:
    """Validate an effect name: letters, digits and ``_ . - < > / [ ] @ +``, no ``:``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"effect name {name!r} is not valid: use 1-200 letters, digits or _.-<>/[]@+ "
            f"(no ':' or spaces), e.g. name='github.comment'"
        )
    return name


def default_name(fn: Callable[..., Any]) -> str:
    """An effect's name when none is given: ``module.qualname``, made valid."""
    module = getattr(fn, "__module__", None) or "<unknown>"
    return f"{module}.{fn.__qualname__}".replace("<locals>", "[locals]").replace(":", ".")


_SKIPPED_PARAMS = ("self", "cls")


def key_params(
    signature: inspect.Signature, key_args: tuple[str, ...] | None, name: str, fn: Callable[..., Any]
) -> frozenset[str]:
    """The parameters that form an effect's default key: ``key_args``, else all but ``self``/``cls``."""
    if key_args is not None:
        missing = [n for n in key_args if n not in signature.parameters]
        if missing:
            raise ConfigurationError(
                f"effect {name}: key_args names {missing} that {fn.__qualname__} does not take"
            )
        return frozenset(key_args)
    names = list(signature.parameters)
    return frozenset(n for i, n in enumerate(names) if not (i == 0 and n in _SKIPPED_PARAMS))


def check_namespace(namespace: object) -> str:
    """Validate a namespace: 1-64 letters, digits or ``_ . - / @ +`` (no braces, no ``:``)."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ConfigurationError(f"namespace {namespace!r} is not valid: use 1-64 letters, digits or _.-/@+")
    return namespace


def check_run_id(run_id: object) -> str:
    """Validate a run id: a non-empty string without control characters."""
    if not isinstance(run_id, str) or not run_id:
        raise ConfigurationError(f"run id must be a non-empty string, not {run_id!r}")
    if len(run_id) > MAX_KEY_LENGTH or (not run_id.isprintable() and _CONTROL.search(run_id)):
        raise ConfigurationError(
            f"run id {run_id[:80]!r} is not valid: at most {MAX_KEY_LENGTH} characters, no control characters"
        )
    return run_id


def check_key(key: object, *, name: str) -> str:
    """Validate what a key function returned."""
    if not isinstance(key, str):
        raise InvalidKeyError(
            f"the key function of effect {name} returned {type(key).__qualname__}, not str; nothing was run"
        )
    if not key.strip():
        raise InvalidKeyError(f"the key function of effect {name} returned an empty key; nothing was run")
    if len(key) > MAX_KEY_LENGTH or (not key.isprintable() and _CONTROL.search(key)):
        raise InvalidKeyError(
            f"the key function of effect {name} returned a key over {MAX_KEY_LENGTH} characters "
            f"or with control characters; nothing was run"
        )
    return key


def default_key(run_id: str, name: str, input_hash: str) -> str:
    """The default effect key: ``run id:effect name:input hash``."""
    return f"{run_id}:{name}:{input_hash}"


class KeyScheme(enum.StrEnum):
    """How the canonical JSON of an effect's input is written, before it is hashed into a key."""

    RFC8785 = "rfc8785"
    """Scheme 2, the default: RFC 8785 (JCS), the bytes a service in another language computes."""
    LEGACY = "legacy"
    """Scheme 1: effectq's bytes before RFC 8785 (Python's float text, names by code point)."""


KEY_SCHEME_VARIABLE = "EFFECTQ_KEY_SCHEME"
_legacy: bool | None = None


def _scheme(value: object) -> KeyScheme:
    try:
        return KeyScheme(str(value).strip().lower())
    except ValueError:
        raise ConfigurationError(
            f"key scheme {value!r} is not known: use 'rfc8785' (the default) or 'legacy'"
        ) from None


def key_scheme() -> KeyScheme:
    """This process's key scheme: :func:`set_key_scheme`'s, else ``$EFFECTQ_KEY_SCHEME``, else RFC 8785."""
    return KeyScheme.LEGACY if legacy_keys() else KeyScheme.RFC8785


def legacy_keys() -> bool:
    """Whether this process writes keys under the legacy scheme (read once, then kept)."""
    global _legacy
    legacy = _legacy
    if legacy is None:
        chosen = _scheme(os.environ.get(KEY_SCHEME_VARIABLE) or KeyScheme.RFC8785)
        legacy = _legacy = chosen is KeyScheme.LEGACY
    return legacy


def set_key_scheme(scheme: KeyScheme | str | None) -> KeyScheme:
    """Choose the key scheme for this process (``None``: back to ``$EFFECTQ_KEY_SCHEME``); returns it.

    Call it before the first effect call, in every process of the fleet alike (a
    Celery worker's ``worker_process_init``, say): keys are computed per call.
    """
    global _legacy
    _legacy = None if scheme is None else _scheme(scheme) is KeyScheme.LEGACY
    return key_scheme()


class _Reads(Protocol):
    def get(self, key: str) -> Any: ...


def bridge_key(store: _Reads, key: str, other: str) -> str:
    """``other`` (the key under the other key scheme) if the store holds a record under it, else ``key``.

    Called only for an input the schemes write differently. A record under the other
    key was made by a process on the other scheme (a worker not yet upgraded, or a
    redelivery of a call it began), so the call joins it: its result replays, its
    claim holds, an unknown outcome stays unknown.
    """
    return other if store.get(other) is not None else key


def bridge_hash(store: _Reads, key: str, input_hash: str, other: str) -> str:
    """The input hash to claim a key function's ``key`` with: ``other`` if its record was made with it.

    A key function's key does not change with the scheme, but the input hash kept to
    tell two inputs of one key apart does; this keeps a redelivery across the upgrade
    from being taken for a different input.
    """
    record = store.get(key)
    return other if record is not None and record.input_hash == other else input_hash


def idempotency_key(namespace: str, key: str) -> str:
    """A stable idempotency key for the effect, to hand to a remote API.

    It is a UUID (version 5 layout) derived from the namespace and the effect key,
    so it fits APIs that cap the length or want a UUID, and the same effect gets
    the same idempotency key in every attempt, process and redelivery.
    """
    return str(uuid.uuid5(_IDEMPOTENCY_NS, f"{namespace}\x00{key}"))


_DEFAULT_KEY = re.compile(r"(.+):([A-Za-z0-9_.<>/\-\[\]@+]{1,200}):([0-9a-f]{64})", re.S)


_NAME_PART = re.compile(r"[A-Za-z0-9_.<>/\-\[\]@+]{1,200}")


class _Digest(Protocol):
    def digest(self) -> bytes: ...
    def hexdigest(self) -> str: ...


def _builtin_sha256() -> Callable[[bytes], _Digest]:
    """CPython's own SHA-256 where there is one, else hashlib's (OpenSSL's).

    The digests are the same; what differs is the code between the call and the
    digest. OpenSSL's goes through its EVP dispatch, which on every effect call
    (twice: the input hash and the record's digest) runs with cold caches right
    after a round trip: about 1.5 µs more per hash there, against a few hundred
    nanoseconds in a tight loop.
    """
    if sys.implementation.name == "cpython":
        for module in ("_sha2", "_sha256"):  # 3.12+, 3.11
            try:
                return importlib.import_module(module).sha256  # type: ignore[no-any-return]
            except (ImportError, AttributeError):
                continue
    return hashlib.sha256


sha256 = _builtin_sha256()
"""SHA-256 for keys and record digests: ``sha256(data).hexdigest()`` as hashlib's."""


def split_default_key(key: str) -> tuple[str, str, str] | None:
    """(run id, effect name, input hash) of a key shaped like a default key, else None.

    The same answer as ``_DEFAULT_KEY.fullmatch`` (the name holds no colon and the
    hash none, so both are the last segments), without its backtracking.
    """
    head, _, input_hash = key.rpartition(":")
    if len(input_hash) != 64:
        return None
    try:  # 64 lowercase hex digits: what bytes.fromhex reads and .hex() writes back unchanged
        # (in half a regex match's instructions; spaces or capitals come back changed)
        if bytes.fromhex(input_hash).hex() != input_hash:
            return None
    except ValueError:  # not hex
        return None
    run_id, colon, name = head.rpartition(":")
    if not colon or not run_id:
        return None
    named = _names.get(name)
    if named is None:  # a process's effects have few names: each is checked once, not once a run
        if len(_names) >= 1024:
            _names.clear()
        named = _names[name] = _NAME_PART.fullmatch(name) is not None
    return (run_id, name, input_hash) if named else None


_names: dict[str, bool] = {}
"""Effect names already checked against :data:`_NAME_PART` (False: no default key's name)."""


def key_digest(namespace: str, key: str) -> str:
    """The hex digest that locates a key's record (sha256 of namespace and key)."""
    return sha256(f"{namespace}\x00{key}".encode()).hexdigest()


# Markers ---------------------------------------------------------------------------------

_MARKER_PREFIX = "<!-- effectq:effect="
_MARKER = re.compile(r"<!-- effectq:effect=([^\s>]+) -->")
_UNSAFE = re.compile(r"[\s%<>]|-(?=-)")


def _escape(key: str) -> str:
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), key)


def _unescape(text: str) -> str:
    return unquote(text)


def effect_marker(key: str) -> str:
    """A hidden HTML comment naming the effect key: ``<!-- effectq:effect=KEY -->``.

    Embed it in what the effect creates (a comment body, a pull request description,
    an email header) so a ``reconcile`` hook can find it again with
    :func:`has_marker` or :func:`find_markers`. Whitespace, ``%``, ``<``, ``>`` and
    the second dash of ``--`` are percent-encoded, so the comment stays valid HTML.
    """
    return f"{_MARKER_PREFIX}{_escape(key)} -->"


def find_markers(text: str) -> Iterator[str]:
    """Yield the effect keys of every effect marker in ``text``, in order."""
    for match in _MARKER.finditer(text):
        yield _unescape(match.group(1))


def has_marker(text: str, key: str) -> bool:
    """Whether ``text`` holds the effect marker of ``key``."""
    return effect_marker(key) in text
