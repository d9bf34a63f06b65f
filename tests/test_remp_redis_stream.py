"""StatusHub's Redis stream writer (remp_node/api/server.py, XADD_SCRIPT): a batch of statuses is
one EVAL that XADDs each, in order, with the same fields as one XADD per status; what Redis
refuses is counted as not appended (exactly, from the refused entry on) and logged once,
and appending resumes when Redis accepts again."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import redis
from prometheus_client import CollectorRegistry

from remp_node.api.server import StatusHub


def _hub(url: str, stream: str) -> tuple[StatusHub, list[str]]:
    errors: list[str] = []
    daemon = SimpleNamespace(registry=CollectorRegistry(), log_error=errors.append,
                             args=SimpleNamespace(grace=2.0), _bug=lambda where, exc: errors.append(repr(exc)))
    return StatusHub(daemon, redis_url=url, stream=stream, maxlen=1000), errors


def _status(hub: StatusHub, i: int) -> None:
    d = {"kind": "PutIntoQueue", "n": i}
    hub.status(bytes([i % 256]) * 32, d, json.dumps(d, separators=(",", ":")))


async def _until(cond, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def test_statuses_appended_in_order_and_refusals_counted(redis_url):
    r = redis.Redis.from_url(redis_url)

    async def main():
        hub, errors = _hub(redis_url, "st")
        await hub.start()
        try:
            for i in range(700):                    # more than one batch (512)
                _status(hub, i)
            await _until(lambda: hub.m_appended._value.get() == 700)
            rows = r.xrange("st")
            assert [json.loads(f[b"value"])["n"] for _, f in rows] == list(range(700))
            assert all(f[b"key"].decode() == (bytes([i % 256]) * 32).hex() for i, (_, f) in enumerate(rows))
            assert hub.redis_state()["connected"] is True and errors == []
            # the stream key holds a string: every XADD is refused (WRONGTYPE)
            r.delete("st")
            r.set("st", "not a stream")
            for i in range(5):
                _status(hub, i)
            await _until(lambda: hub.m_not_appended._value.get() == 5)
            assert hub.m_appended._value.get() == 700 and hub.redis_state()["connected"] is False
            assert len(errors) == 1 and "WRONGTYPE" in errors[0] and redis_url in errors[0]
            r.delete("st")
            for i in range(3):
                _status(hub, i)
            await _until(lambda: hub.m_appended._value.get() == 703, timeout=15.0)
            assert r.xlen("st") == 3 and hub.redis_state()["connected"] is True
        finally:
            await hub.close()

    asyncio.run(main())
    r.close()
