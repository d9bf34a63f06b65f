"""`remp-node`: the REMP console script, one role per process.

    remp-node init --dir D [--shards 2] [--validators-per-shard 7] [--masterchain-validators N] [--group-draw dealt]
                   [--fullnodes 1] [--mc-catchain-lifetime S] [--block-interval S] [--base-port P]
    remp-node validator --network D --key D/keys/v1.key --data-dir DATA [...]
    remp-node fullnode  --network D --key D/keys/fullnode1.key --data-dir DATA [...]

`init` writes a local network directory (remp_node/daemon/netfiles.py: network.json with the
zerostate config of DESIGN.md section 4, one key file per node with mode 0600, 127.0.0.1
addresses, the demo's wallets). The daemon roles live in remp_node/daemon/node.py.

Sources: DESIGN.md sections 2, 4, 6 and 7.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .netfiles import NetFilesError, init_network

__all__ = ["main", "build_init_parser", "build_parser", "parse_args"]

DEFAULT_EXT_MESSAGES = "../shared/data/ton/ext_messages.jsonl"


def build_init_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="remp-node init")
    p.add_argument("--dir", required=True, metavar="D", help="network directory to write (created if absent)")
    p.add_argument("--shards", type=int, default=2, help="shards of workchain 0, a power of two (default 2)")
    p.add_argument("--validators-per-shard", type=int, default=7,
                   help="validators per shard group; the network has shards x this many validators (default 7)")
    p.add_argument("--masterchain-validators", type=int, default=None, metavar="N",
                   help="the first N validators also validate the masterchain (default: all)")
    p.add_argument("--fullnodes", type=int, default=1, help="full nodes (REMP clients) to write keys for (default 1)")
    p.add_argument("--mc-catchain-lifetime", type=float, default=30.0, metavar="S",
                   help="seconds per master catchain session (production: 250; default 30)")
    p.add_argument("--block-interval", type=float, default=0.5, metavar="S",
                   help="seconds between shard blocks (default 0.5)")
    p.add_argument("--master-block-interval", type=float, default=None, metavar="S",
                   help="seconds between master blocks (default: the block interval)")
    p.add_argument("--base-port", type=int, default=0, metavar="P",
                   help="validator i gets UDP P+i-1 and HTTP P+1000+i-1, full node j UDP P+500+j-1 and "
                        "HTTP P+1500+j-1; 0 (default) picks free ports now")
    p.add_argument("--genesis-delay", type=float, default=5.0, metavar="S",
                   help="master session 0 starts S seconds after init (default 5)")
    p.add_argument("--genesis-time", type=float, default=None, metavar="UNIX",
                   help="start of master session 0 as Unix seconds (overrides --genesis-delay)")
    p.add_argument("--group-draw", choices=["dealt", "independent"], default="dealt",
                   help="shard groups of a session: dealt (disjoint while shards x validators-per-shard "
                        "<= validators; default) or independent (each shard's group drawn on its own: "
                        "a validator may serve several shards)")
    p.add_argument("--wallets", type=int, default=8, help="demo wallets of workchain 0 (default 8)")
    p.add_argument("--masterchain-wallets", type=int, default=2, help="demo wallets of workchain -1 (default 2)")
    p.add_argument("--wallet-balance", type=int, default=10**12, help="balance of each demo wallet (nano units)")
    p.add_argument("--ext-messages", default=DEFAULT_EXT_MESSAGES, metavar="FILE",
                   help="ext_messages.jsonl whose destinations become open accounts (skipped when absent; "
                        f"default {DEFAULT_EXT_MESSAGES})")
    return p


def _init(argv: list[str]) -> int:
    args = build_init_parser().parse_args(argv)
    try:
        net = init_network(
            args.dir, shards=args.shards, validators_per_shard=args.validators_per_shard,
            masterchain_validators=args.masterchain_validators, fullnodes=args.fullnodes,
            mc_catchain_lifetime=args.mc_catchain_lifetime, block_interval=args.block_interval,
            base_port=args.base_port, genesis_time=args.genesis_time, genesis_delay=args.genesis_delay,
            wallets=args.wallets, masterchain_wallets=args.masterchain_wallets, group_draw=args.group_draw,
            wallet_balance=args.wallet_balance, ext_messages=args.ext_messages,
            timing={"master_block_interval": args.master_block_interval})
    except (NetFilesError, ValueError, OSError) as exc:
        print(f"remp-node init: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"network": str(Path(args.dir) / "network.json"),
                      "validators": len(net.validators()), "fullnodes": len(net.fullnodes()),
                      "shards": len(net.config.shards), "open_accounts": len(net.state.get("open_accounts", []))}))
    return 0


ROLES = {"init": "write a local network directory",
         "verify": "check receipt JSON signatures offline (remp_node/daemon/verify.py)",
         "validator": "run a validator (shard and masterchain) daemon",
         "fullnode": "run a full node (REMP client + API) daemon"}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (roles as subcommands); each role's own flags: `remp-node ROLE --help`."""
    p = argparse.ArgumentParser(prog="remp-node", description="REMP nodes: " + "; ".join(
        f"{k}: {v}" for k, v in ROLES.items()))
    p.add_argument("role", choices=sorted(ROLES), help="what this process is")
    return p


def parse_args(argv: list[str]):
    """The Namespace a `remp-node ROLE ...` command line gives (SystemExit(2) when refused):
    for tests/test_deploy.py and tools that check deploy/ files against the real parsers."""
    if not argv or argv[0] not in ROLES:
        build_parser().parse_args(argv[:1] or ["--help"])
    if argv[0] == "init":
        return build_init_parser().parse_args(argv[1:])
    if argv[0] == "verify":
        from .verify import build_parser as verify_parser
        return verify_parser().parse_args(argv[1:])
    from .node import parse_role_args
    return parse_role_args(argv[0], argv[1:])[1]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in ROLES:
        build_parser().parse_args(argv or ["--help"])
        return 2
    role, rest = argv[0], argv[1:]
    if role == "init":
        return _init(rest)
    if role == "verify":
        from .verify import main as verify_main
        return verify_main(rest)
    from .node import run_role
    return run_role(role, rest)


if __name__ == "__main__":
    raise SystemExit(main())
