"""Redis memory per completed record (MEMORY USAGE), with a small result.

effectq's completed record is one packed string; a run's index adds 16 bytes
per record. Compared with the result stored alone under a key of the same
length (the floor) and with Powertools' record of the same call.

    python bench/memory.py [-n 200] [--redis-url URL]
"""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import redis

import effectq

try:
    from common import main_sized, table
    from latency import powertools_effect
except ImportError:  # imported as bench.memory
    from .common import main_sized, table
    from .latency import powertools_effect

RESULT = {"id": "msg_01HX3K9Q2Z", "status": "sent"}


def measure(url: str, n: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    namespace = "shop"  # a realistic namespace: key names count too (the bench's own Redis is empty)
    store = effectq.RedisStore(client, namespace=namespace)

    @effectq.effect(name="email.send")
    def send(to: str) -> dict[str, str]:
        return RESULT

    run_id = str(uuid.uuid4())  # a Celery task id
    records = []
    with effectq.run(run_id, store=store):
        for i in range(n):
            key = send.key(f"user{i}@example.com")
            send(f"user{i}@example.com")
            records.append(store.record_key(key))
    result_bytes = len(store.get(key).result or b"")  # type: ignore[union-attr]
    per_record = sum(client.memory_usage(k) or 0 for k in records) / n
    index = next(client.scan_iter(match=f"effectq:{{{namespace}*:run:*"))
    index_share = (client.memory_usage(index) or 0) / n
    floor = []
    for i, record in enumerate(records):
        name = f"floor:{namespace}:{i}".ljust(len(record), "x")
        client.set(name, b'{"id":"msg_01HX3K9Q2Z","status":"sent"}')
        floor.append(client.memory_usage(name) or 0)
    powertools = None
    noop = powertools_effect(client)
    if noop is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            before = set(client.scan_iter(count=1000))
            for i in range(n):
                noop(payload={"to": f"user{i}@example.com", **RESULT})
            made = [k for k in client.scan_iter(count=1000) if k not in before]
        powertools = sum(client.memory_usage(k) or 0 for k in made) / max(1, len(made))
        client.delete(*made)
    for pattern in (f"effectq:{{{namespace}*", f"floor:{namespace}:*"):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)
    return {
        "n": n,
        "result": result_bytes,
        "record": per_record,
        "index": index_share,
        "floor": sum(floor) / n,
        "powertools": powertools,
    }


def report(r: dict[str, Any]) -> str:
    rows = [
        ("effectq completed record", r["record"], r["record"] - r["result"]),
        ("  + its share of the run index", r["record"] + r["index"], r["record"] + r["index"] - r["result"]),
        ("floor: the result alone, same key length", r["floor"], r["floor"] - r["result"]),
    ]
    if r["powertools"] is not None:
        rows.append(("Powertools record", r["powertools"], r["powertools"] - r["result"]))
    return "\n".join(
        [
            f"### Redis memory per completed record ({r['n']} records, {r['result']}-byte result; bytes)",
            "",
            table(["record", "MEMORY USAGE", "beyond the result"], rows),
        ]
    )


def main() -> None:
    main_sized(__doc__, measure, report, default_n=200)


if __name__ == "__main__":
    main()
