"""How effectq reads an exception it did not raise: its chain, and one bounded line naming it."""

from __future__ import annotations

from collections.abc import Iterator


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then the exceptions it was raised from or while handling, as its traceback shows
    them: the ``__cause__``, else the ``__context__`` (none after ``raise ... from None``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        cause = current.__cause__
        current = cause if cause is not None or current.__suppress_context__ else current.__context__


def describe_exception(exc: BaseException, limit: int = 500) -> str:
    """One line naming an exception and those it was raised from or while handling, bounded,
    for records and logs: the link that made it "maybe applied" may be any of them."""
    parts: list[str] = []
    previous: BaseException | None = None
    for link in exception_chain(exc):
        named = f"{type(link).__module__}.{type(link).__qualname__}: {link}"
        if previous is None:
            parts.append(named)
        else:
            how = "raised from" if previous.__cause__ is link else "while handling"
            parts.append(f" ({how} {named})")
        previous = link
    text = " ".join("".join(parts).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
