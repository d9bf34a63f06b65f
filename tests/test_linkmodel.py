"""The per-destination link model (daemon_runtime/linkmodel.py): spec parsing, datagram and
stream decisions with a fake clock, the transport hook over a real socket on 127.0.0.1, and
the REMP UDP adapter taking its per-destination plan."""
from __future__ import annotations

import asyncio

import pytest

from daemon_runtime import linkmodel
from daemon_runtime.linkmodel import Link, LinkModelError, parse

SPEC = "198.18.1.0/24 delay_ms=10 jitter_ms=2; 198.18.0.0/15 delay_ms=60 loss=0.5 dup=0.2; seed=3"


def test_parse_most_specific_rule_wins_and_round_trips():
    m = parse(SPEC)
    assert m.link_for("198.18.1.7") == Link(delay=0.010, jitter=0.002)
    assert m.link_for("198.19.0.4").delay == pytest.approx(0.060)
    assert m.link_for("127.0.0.1") is None          # no "*": untouched
    assert m.link_for("not-an-address") is None
    again = parse(m.spec())
    assert again.rules == m.rules and again.seed == 3
    star = parse("* delay_ms=5")
    assert star.link_for("10.0.0.1").delay == pytest.approx(0.005)


@pytest.mark.parametrize("bad", ["198.18.1.0/24 delay=3", "nowhere delay_ms=1", "* loss=1.5",
                                 "* delay_ms=x", "speed=3", "* delay_ms=1; * delay_ms=2",
                                 "* delay_ms=-1"])
def test_parse_refuses_bad_specs_by_name(bad):
    with pytest.raises(LinkModelError):
        parse(bad)


def test_datagram_decisions_are_seeded_and_counted():
    a, b = parse(SPEC), parse(SPEC)
    plans = [a.datagram("198.19.0.4") for _ in range(2000)]
    assert plans == [b.datagram("198.19.0.4") for _ in range(2000)]
    lost = sum(1 for p in plans if not p)
    dup = sum(1 for p in plans if len(p) == 2)
    assert 850 < lost < 1150 and a.stats["lost"] == lost
    assert 100 < dup < 300 and a.stats["duplicated"] == dup
    assert all(d == pytest.approx(0.060) for p in plans for d in p)
    near = [a.datagram("198.18.1.9")[0] for _ in range(200)]
    assert all(0.010 <= d <= 0.012 for d in near) and len(set(near)) > 1
    assert a.datagram("127.0.0.1") == [0.0]


def test_stream_release_is_fifo_and_penalises_loss_instead_of_dropping():
    m = parse("* delay_ms=40 jitter_ms=30 loss=0.2; seed=1")
    now, last = 100.0, 0.0
    for i in range(500):
        at = m.stream_release("198.18.2.2", now)
        assert at >= now + 0.040 and at >= last
        last = at
        now += 0.001
    assert m.stats["penalised"] > 50               # none dropped: delayed by the RTO instead
    assert m.stream_release("198.18.2.2", now, key="other") <= now + 0.040 + 0.030 + 0.2


def test_env_spec_and_file(tmp_path):
    assert linkmodel.from_env({}) is None
    f = tmp_path / "links.txt"
    f.write_text("* delay_ms=7\n")
    m = linkmodel.from_env({linkmodel.ENV: f"@{f}"})
    assert m.link_for("198.18.0.1").delay == pytest.approx(0.007)
    with pytest.raises(LinkModelError):
        linkmodel.from_env({linkmodel.ENV: "* loss=2"})


def test_delay_transport_keeps_order_and_bytes_over_a_real_socket():
    async def main():
        got = bytearray()
        done = asyncio.Event()

        async def serve(reader, writer):
            while data := await reader.read(65536):
                got.extend(data)
            done.set()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        model = parse("127.0.0.1 delay_ms=5 jitter_ms=20 loss=0.1; seed=5")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert linkmodel.delay_transport(writer.transport, "127.0.0.1", model)
        assert not linkmodel.delay_transport(writer.transport, "127.0.0.1", model)   # once only
        chunks = [bytes([i % 256]) * (1 + i % 700) for i in range(300)]
        for c in chunks:
            writer.write(c)
        writer.close()                  # deferred until the held-back chunks left
        await asyncio.wait_for(done.wait(), 30)
        server.close()
        return bytes(got), b"".join(chunks), model.stats

    got, sent, stats = asyncio.run(main())
    assert got == sent
    assert stats["sent"] == 300 and stats["delayed"] == 300


def test_remp_udp_adapter_applies_the_per_destination_plan():
    """remp_node.transport.udp calls Faults.plan(addr): a model that drops everything toward one
    address drops those datagrams and nothing else."""
    from remp_node.transport.udp import Faults

    assert Faults().plan(("198.18.0.1", 1)) == [0.0]       # the old interface keeps working
    lm = linkmodel.DatagramFaults(parse("198.18.9.9 loss=1; * delay_ms=3"))
    assert lm.plan(("198.18.9.9", 4000)) == []
    assert lm.plan(("198.18.1.1", 4000)) == [pytest.approx(0.003)]
    assert lm.stats["lost"] == 1
