"""remp-node's command lines: --help documents every flag, deploy/ files use only real flags
(tests/test_deploy.py runs every unit and compose command through remp_node.daemon.cli.parse_args;
this checks the REMP-specific parts and that a bad line is refused)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from remp_node.daemon.cli import parse_args
from remp_node.daemon.node import build_fullnode_parser, build_validator_parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


@pytest.mark.parametrize("role,build", [("validator", build_validator_parser), ("fullnode", build_fullnode_parser)])
def test_help_documents_every_flag(role, build):
    out = subprocess.run([sys.executable, "-m", "remp_node.daemon.cli", role, "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    for action in build()._actions:
        for flag in action.option_strings:
            assert flag in out.stdout, f"{role} --help lacks {flag}"
        if action.option_strings and action.dest != "help":
            assert action.help, f"{role} {action.option_strings} has no help text"


def test_bad_command_lines_are_refused_precisely(capsys):
    for argv, text in ((["validator", "--key", "k", "--data-dir", "d"], "--network is required"),
                       (["validator", "--network", "n", "--key", "k", "--data-dir", "d", "--faults", "loss=2"],
                        "--faults"),
                       (["fullnode", "--network", "n", "--key", "k", "--data-dir", "d", "--no-such"], "unrecognized"),
                       (["init", "--dir", "x", "--shards", "two"], "invalid int")):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2
        assert text in capsys.readouterr().err


def test_sample_configs_units_and_compose_cover_both_roles(monkeypatch):
    v = parse_args(["validator", "--config", str(DEPLOY / "config" / "remp-validator.toml"),
                    "--key", "/k", "--data-dir", "/d"])
    assert v.network == "/etc/relay-suite/remp-network" and v.listen == "0.0.0.0:7600"
    monkeypatch.setenv("REMP_NODE_REDIS_MAXLEN", "5000")
    f = parse_args(["fullnode", "--config", str(DEPLOY / "config" / "remp-fullnode.toml"),
                    "--key", "/k", "--data-dir", "/d"])
    assert f.redis.startswith("redis://") and f.redis_maxlen == 5000          # env beats the file
    units = {u.name for u in (DEPLOY / "systemd").glob("remp-*.service")}
    assert units == {"remp-validator@.service", "remp-fullnode@.service"}
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    roles = {s["command"][1] for n, s in compose.items() if n.startswith("remp-") and "command" in s
             and s["command"][0] == "remp-node"}
    assert roles == {"init", "validator", "fullnode"}
    for name, svc in compose.items():
        if name.startswith("remp-") and svc.get("image") == "relay-suite":
            parse_args(svc["command"][1:])
