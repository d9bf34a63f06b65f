import argparse
import os
import subprocess
import sys
import textwrap

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from daemon_runtime.config import add_common_args, load_args
from daemon_runtime.lifecycle import Ready, parse_hostport, start_status_server


def make_parser():
    p = argparse.ArgumentParser(prog="demo")
    p.add_argument("--domain", action="append", default=None)
    p.add_argument("--relay", action="extend", nargs="+", default=None)
    p.add_argument("--limit", nargs=2, type=int, metavar=("COUNT", "SIZE"))
    p.add_argument("--ranker-period", type=float, default=3600.0)
    p.add_argument("--no-update", action="store_true")
    p.add_argument("--key-type", choices=["sr25519", "ed25519"], default="sr25519")
    add_common_args(p)
    return p


def test_precedence_file_env_flags(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text(textwrap.dedent("""
        ranker-period = 1800
        domain = ["a.example", "b.example"]
        limit = [10, 1000]
        key_type = "ed25519"
        relay = ["ws://a", "ws://b"]
    """))
    args = load_args(make_parser(), ["--config", str(cfg)], "DEMO_")
    assert args.ranker_period == 1800.0 and args.domain == ["a.example", "b.example"]
    assert args.limit == [10, 1000] and args.key_type == "ed25519" and args.no_update is False
    assert args.relay == ["ws://a", "ws://b"]
    assert load_args(make_parser(), ["--config", str(cfg), "--relay", "ws://c"], "DEMO_").relay == ["ws://c"]
    monkeypatch.setenv("DEMO_RANKER_PERIOD", "60")
    monkeypatch.setenv("DEMO_NO_UPDATE", "true")
    args = load_args(make_parser(), ["--config", str(cfg)], "DEMO_")
    assert args.ranker_period == 60.0 and args.no_update is True
    args = load_args(make_parser(), ["--config", str(cfg), "--ranker-period", "5", "--domain", "c"], "DEMO_")
    assert args.ranker_period == 5.0
    assert args.domain == ["c"]  # a repeatable flag replaces the file's list, not extends it


def test_bad_config_is_refused_with_the_key_named(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('colour = "red"\n')
    with pytest.raises(SystemExit) as exc:
        load_args(make_parser(), ["--config", str(cfg)], "DEMO_")
    assert exc.value.code == 2 and "unknown option 'colour'" in capsys.readouterr().err
    cfg.write_text('key-type = "rsa"\n')
    with pytest.raises(SystemExit):
        load_args(make_parser(), ["--config", str(cfg)], "DEMO_")
    assert "'rsa' is not one of" in capsys.readouterr().err


def test_parse_hostport():
    assert parse_hostport("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_hostport(":8080") == ("127.0.0.1", 8080)
    assert parse_hostport("[::1]:9") == ("::1", 9)
    with pytest.raises(ValueError):
        parse_hostport("host:http")


async def test_status_server_serves_metrics_and_health():
    reg = CollectorRegistry()
    Counter("demo_things", "things", registry=reg).inc(3)
    state = {"ok": True}
    runner, port = await start_status_server("127.0.0.1", 0, reg, lambda: dict(state))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                assert r.status == 200 and "demo_things_total 3.0" in await r.text()
            async with s.get(f"http://127.0.0.1:{port}/health") as r:
                assert r.status == 200 and (await r.json())["ok"] is True
            state["ok"] = False
            async with s.get(f"http://127.0.0.1:{port}/health") as r:
                assert r.status == 503
    finally:
        await runner.cleanup()


def test_run_daemon_stops_gracefully_on_sigterm(tmp_path):
    script = tmp_path / "d.py"
    script.write_text(textwrap.dedent("""
        import asyncio, sys
        from daemon_runtime.lifecycle import Ready, run_daemon
        async def main(stop):
            Ready(port=1).announce()
            await stop.wait()
            await asyncio.sleep(0.05)   # drain
            print("drained", flush=True)
        sys.exit(run_daemon(main))
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd())
    assert Ready.parse(proc.stdout.readline()) == {"port": 1}
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "drained" in out
