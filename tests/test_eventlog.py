import io
import json
import re

import pytest

from daemon_runtime.eventlog import Catalogue, EventLog, EventLogError, EventSpec, attr_types

CAT = Catalogue("demo", [
    EventSpec("demo.node.sent", "a message left", {"size": "long", "peer": "string"}),
    EventSpec("demo.node.failed", "it failed", {"reason": "string"}),
])


def test_lines_follow_the_contract():
    buf = io.StringIO()
    log = EventLog("demo-svc", "n1", [CAT], sink=buf)
    log.emit("demo.node.sent", "t-1", size=1024, peer="n2")
    log.emit("demo.node.failed", None, level="error", reason="boom")
    log.emit("demo.node.sent", "t-2", level="debug", size=1)  # below min level: dropped
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert len(lines) == 2
    assert list(lines[0]) == ["ts", "level", "service", "node", "event", "trace_id", "attrs"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", lines[0]["ts"])
    assert lines[0] == {**lines[0], "level": "info", "service": "demo-svc", "node": "n1",
                        "event": "demo.node.sent", "trace_id": "t-1",
                        "attrs": {"size": 1024, "peer": "n2"}}
    assert lines[1]["level"] == "error" and lines[1]["trace_id"] is None


def test_undeclared_events_and_attrs_are_refused():
    log = EventLog("demo-svc", "n1", [CAT], sink=io.StringIO())
    with pytest.raises(EventLogError, match="not in this daemon"):
        log.emit("demo.node.nope")
    with pytest.raises(EventLogError, match="not declared"):
        log.emit("demo.node.sent", size=1, colour="red")
    with pytest.raises(EventLogError, match="must be long"):
        log.emit("demo.node.sent", size="big")
    with pytest.raises(EventLogError, match="must be long"):
        log.emit("demo.node.sent", size=True)


def test_conflicting_attr_types_across_catalogues_are_refused():
    other = Catalogue("x", [EventSpec("x.y.z", "", {"size": "string"})])
    with pytest.raises(EventLogError, match="size"):
        attr_types([CAT, other])
    assert attr_types([CAT]) == {"size": "long", "peer": "string", "reason": "string"}


def test_file_sink_rotates(tmp_path):
    path = tmp_path / "ev.jsonl"
    log = EventLog("demo-svc", "n1", [CAT], sink=str(path), max_bytes=2000, backups=2)
    for i in range(100):
        log.emit("demo.node.sent", f"t-{i}", size=i)
    log.close()
    assert path.exists() and (tmp_path / "ev.jsonl.1").exists()
    for line in path.read_text().splitlines():
        json.loads(line)


def test_catalogue_doc_is_in_sync_with_code():
    from pathlib import Path

    from deploy.catalogues import render_markdown
    doc = Path(__file__).resolve().parent.parent / "docs" / "event-catalogue.md"
    assert doc.read_text() == render_markdown(), \
        "regenerate: python -m deploy.catalogues > docs/event-catalogue.md"


def test_idle_lines_reach_the_file_without_close(tmp_path):
    import time
    path = tmp_path / "idle.jsonl"
    log = EventLog("demo-svc", "n1", [CAT], sink=str(path))
    log.emit("demo.node.sent", "t-1", size=1)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not path.read_text():
        time.sleep(0.02)
    assert json.loads(path.read_text())["trace_id"] == "t-1"  # flushed by the background flusher
    log.close()
    log.emit("demo.node.sent", "t-2", size=2)  # after close: dropped, not an error
    assert len(path.read_text().splitlines()) == 1


def test_segment_mode_moves_whole_files_and_loses_no_line(tmp_path):
    """Segment mode: closed segments appear in segments/ whole (one rename), every line is
    in exactly one file, and close() seals the last segment."""
    import json as _json
    import time as _time
    from daemon_runtime.eventlog import Catalogue, EventLog, EventSpec, seal_dir
    cat = Catalogue("t", [EventSpec("t.x.y", "test", {"n": "long"})])
    path = tmp_path / "d.jsonl"
    log = EventLog("svc", "n1", [cat], sink=str(path), segment_s=0.05)
    seen_whole = True
    for i in range(400):
        log.emit("t.x.y", trace_id=str(i), n=i)
        if i % 50 == 0:
            _time.sleep(0.2)   # the flusher closes the segment when it is due
            for seg in (tmp_path / "segments").glob("*.jsonl"):
                seen_whole &= seg.read_bytes().endswith(b"\n")
    log.emit("t.x.y", trace_id="idle", n=400)
    limit = _time.monotonic() + 30      # idle: the flusher seals it without another line
    while not any(b'"idle"' in p.read_bytes() for p in (tmp_path / "segments").glob("*.jsonl")):
        assert _time.monotonic() < limit, "an idle writer's last segment was not sealed"
        _time.sleep(0.05)
    mid = len(list((tmp_path / "segments").glob("*.jsonl")))
    log.close()
    assert mid >= 2 and seen_whole
    assert not path.exists()
    ns = [_json.loads(line)["attrs"]["n"] for seg in sorted((tmp_path / "segments").glob("*.jsonl"))
          for line in seg.read_text().splitlines()]
    assert ns == list(range(401))
    (tmp_path / "left.jsonl").write_text('{"a": 1}\n')
    assert len(seal_dir(str(tmp_path))) == 1 and not (tmp_path / "left.jsonl").exists()
