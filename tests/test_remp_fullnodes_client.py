"""remp_node.api.submit without a network: Retry-After parsing (RFC 9110 section 10.2.3) and
the client's answer to a full node that is not there."""
from __future__ import annotations

import email.utils
import socket

import aiohttp
import pytest

from remp_node.api.submit import Submitter, Unplaced, parse_retry_after


def test_retry_after_seconds_date_and_garbage():
    now = 1_800_000_000.0
    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after(" 0 ", now) == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now) == 30.0
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0   # past: at once
    assert parse_retry_after(None, now) == 1.0
    assert parse_retry_after("soon", now, default=2.0) == 2.0
    assert parse_retry_after("-5", now) == 1.0


def test_no_full_node_urls_is_an_error():
    with pytest.raises(ValueError):
        Submitter([])


async def test_a_message_no_full_node_takes_is_reported_unplaced():
    with socket.socket() as s:           # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with aiohttp.ClientSession() as session:
        sub = Submitter([f"http://127.0.0.1:{port}"], session, max_attempts=3, max_wait=0.5, down_for=0.1)
        res = await sub.submit(b"not a boc")
        assert isinstance(res, Unplaced) and 1 <= res.attempts <= 3
        assert "127.0.0.1" in res.last
        rep = sub.report()
        assert rep["unplaced"] == 1 and sum(rep["nodes"][f"http://127.0.0.1:{port}"]["errors"].values()) == res.attempts
