"""Runtime shared by every relay-suite daemon: the JSON event log and its catalogue,
typed configuration (file + env + flags), daemon lifecycle (signals, graceful shutdown,
/health and /metrics), and the embedded Redis server used by tests and the launcher.

Protocol logic never lives here; it stays in its protocol's package (DESIGN.md section 1).
"""
