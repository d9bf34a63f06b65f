"""Datagrams per external message for new-message propagation through the REMP RMQ.

Seed (remp-overview.md, "Proposals for speeding up"): the full node sends to validators and
a validator puts a message into the catchain only if it has not seen it there yet, so a new
message costs 2N..3N datagrams instead of the naive N^2 (every validator re-sending to
every other one).

Method: a whole in-memory network (remp_node.testnet.sim.Simulation, fake clock, no loss) with one
shard whose group is all N validators, and one full node (client.py's RempClient: one
validator first, one more every 2 s until more than 1/3 answered). Messages are submitted
one at a time, 1 s apart. Per message we count
  client: rempMessage datagrams full node -> validators;
  rmq:    REMP catchain datagrams whose bytes carry the message id (block updates, and
          blocks re-sent by getDifference/getBlock answers), plus RMQ body queries/answers;
and, separately, every RMQ-channel datagram in the window divided by the messages
("rmq all", includes the catchain's periodic getDifference sync that runs regardless).
Also per message: "receipts", the signed receipt datagrams validators send to the full node
(one per status per validator; the reference batches them, see remp_node/core/validator.py).

Run: .venv/bin/python bench/bench_remp_propagation.py [--messages 10] [--n 4 7 16]
"""
from __future__ import annotations

import argparse
import hashlib
import time

from pytoniq_core import Cell
from remp_node.wire.keys import NodeKey
from remp_node.testnet.sim import SimConfig, Simulation
from remp_node.core.state import make_wallet_message, wallet_address
from remp_node.wire.tl import REMP_MESSAGE, pack_id
from remp_node.core.validator import CH_CLIENT, CH_RMQ

REMP_MESSAGE_ID = pack_id(REMP_MESSAGE)


def measure(n: int, messages: int, seed: int = 7) -> dict:
    keys = [NodeKey.from_seed(hashlib.sha256(f"bench-w:{i}".encode()).digest()) for i in range(messages)]
    sim = Simulation(SimConfig(validators=n, shard_count=1, group_size=n, seed=seed,
                               mc_catchain_lifetime=3600.0, jitter=0.002),
                     wallets=[(k.public, 1000) for k in keys])
    tracked: dict[bytes, dict] = {}
    window = {"rmq_all": 0}

    def classify(data: bytes) -> str:
        kind = data[0] if data else 0
        if kind == CH_RMQ:
            window["rmq_all"] += 1
        for mid, c in tracked.items():
            if mid in data:
                if kind == CH_CLIENT and data[33:37] == REMP_MESSAGE_ID:   # not a receipt
                    c["client"] += 1
                elif kind == CH_CLIENT:
                    c["receipts"] += 1
                elif kind == CH_RMQ:
                    c["rmq"] += 1
        return str(kind)

    sim.net.classify = classify
    sim.run(1.0)
    window["rmq_all"] = 0
    t0 = int(sim.now)
    mids = []
    for i, k in enumerate(keys):
        a = wallet_address(k.public)
        boc = make_wallet_message(k, a, a, 1, t0 + 3600, nonce=i)
        tracked[Cell.one_from_boc(boc).hash] = {"client": 0, "rmq": 0, "receipts": 0}
        mids.append(sim.submit(boc))
        sim.run(1.0)
    sim.run_until(lambda: all(sim.finals.get(m) for m in mids), 20.0)
    rmq_all = window["rmq_all"]
    sim.run(0.5)                      # the last Finalized receipts in flight
    finalized = sum(1 for m in mids if sim.finals.get(m) and sim.finals[m][0].outcome == "finalized")
    per = lambda key: sum(c[key] for c in tracked.values()) / len(tracked)
    return {"n": n, "client": per("client"), "rmq": per("rmq"), "total": per("client") + per("rmq"),
            "rmq_all": rmq_all / len(tracked), "receipts": per("receipts"),
            "finalized": finalized, "messages": len(mids)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=10, help="messages per N (default 10)")
    ap.add_argument("--n", type=int, nargs="+", default=[4, 7, 16], help="validators per group")
    args = ap.parse_args()
    print(f"{'N':>3} {'client':>7} {'rmq':>7} {'total':>7} {'target 2N..3N':>14} {'naive N^2':>10} "
          f"{'rmq all':>8} {'receipts':>9} {'finalized':>10} {'wall s':>7}")
    figures, baseline = {}, {}
    for n in args.n:
        t = time.time()
        r = measure(n, args.messages)
        figures.update({f"client_per_message@N={n}": r["client"], f"rmq_per_message@N={n}": r["rmq"],
                        f"total_per_message@N={n}": r["total"], f"rmq_all_per_message@N={n}": r["rmq_all"],
                        f"receipts_per_message@N={n}": r["receipts"], f"finalized@N={n}": r["finalized"]})
        baseline.update({f"target_max@N={n}": 3 * n, f"naive@N={n}": n * n})
        print(f"{n:>3} {r['client']:>7.1f} {r['rmq']:>7.1f} {r['total']:>7.1f} {f'{2*n}..{3*n}':>14} "
              f"{n*n:>10} {r['rmq_all']:>8.1f} {r['receipts']:>9.1f} {r['finalized']:>4}/{r['messages']:<5} "
              f"{time.time()-t:>7.1f}")
    from result_file import write_result
    write_result("remp_propagation", figures, baseline)


if __name__ == "__main__":
    main()
