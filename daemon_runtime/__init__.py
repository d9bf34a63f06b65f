"""Runtime shared by every relay-suite daemon: the JSON event log and its LogRecord
(eventlog), typed configuration (config), daemon lifecycle (lifecycle: signals, graceful
shutdown, /health and /metrics), the log rate limiter (ratelimit), daemon subprocesses for
the local networks and the launcher (daemons), the one loop around a sans-I/O core and its clock rule (runner), the in-memory datagram network and fake
clock the core tests run on (memnet), and the embedded Redis server used by tests and the
launcher (redis_server).

Protocol logic never lives here; it stays in its protocol's package (DESIGN.md section 1),
and nothing here imports a protocol package (pyproject.toml [tool.importlinter]).
"""
