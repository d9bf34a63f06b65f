"""MessageCache: replay protection by id and by body hash (uid), status table, GC at N+2."""
from __future__ import annotations

import hashlib

import pytest

from remp_node.core.cache import (AddResult, CacheStatus, CacheTransitionError, MessageCache)


def h(tag: str) -> bytes:
    return hashlib.sha256(tag.encode()).digest()


def test_new_known_duplicate_by_body():
    c = MessageCache()
    a = c.add(h("m1"), h("body1"), 5)
    assert a.result is AddResult.NEW and a.entry.status is CacheStatus.PENDING
    again = c.add(h("m1"), h("body1"), 6)
    assert again.result is AddResult.KNOWN and again.entry is a.entry
    assert again.entry.master_seqno == 5          # lifetime counts from the first sighting
    dup = c.add(h("m1-new-header"), h("body1"), 5)
    assert dup.result is AddResult.DUPLICATE
    assert dup.original.message_id == h("m1")
    assert dup.entry.duplicate_of == h("m1")
    # a later copy of the duplicate id is just KNOWN
    assert c.add(h("m1-new-header"), h("body1"), 5).result is AddResult.KNOWN
    assert c.add(h("m2"), h("body2"), 5).result is AddResult.NEW
    assert len(c) == 3


def test_collator_refuses_accepted_and_finalized_by_id_and_uid():
    c = MessageCache()
    c.add(h("m1"), h("b1"), 1)
    assert c.collation_refusal(h("m1"), h("b1")) is None
    c.set_status(h("m1"), CacheStatus.COLLATED, block_id="cand")
    assert c.collation_refusal(h("m1"), h("b1")) is None    # a candidate is not acceptance
    c.set_status(h("m1"), CacheStatus.ACCEPTED, block_id="blk1")
    assert "already in accepted block" in c.collation_refusal(h("m1"), h("b1"))
    # same body under a new id: refused although the id was never seen
    assert "already in accepted block" in c.collation_refusal(h("m1b"), h("b1"))
    c.set_status(h("m1"), CacheStatus.FINALIZED, master_block_id="mc1")
    assert c.get(h("m1")).block_id == "blk1" and c.get(h("m1")).master_block_id == "mc1"
    assert c.collation_refusal(h("m1"), h("b1")) is not None
    # the duplicate entry itself is refused too
    c.add(h("m1c"), h("b1"), 1)
    assert c.collation_refusal(h("m1c"), h("b1")) is not None


def test_block_refusal():
    c = MessageCache()
    c.add(h("a"), h("ba"), 1)
    c.add(h("b"), h("bb"), 1)
    assert c.block_refusal([(h("a"), h("ba")), (h("b"), h("bb"))]) is None
    assert "twice" in c.block_refusal([(h("a"), h("ba")), (h("a2"), h("ba"))])
    c.set_status(h("a"), CacheStatus.ACCEPTED, block_id="x")
    assert c.block_refusal([(h("b"), h("bb")), (h("a"), h("ba"))]) is not None
    assert c.block_refusal([(h("zz"), h("ba"))]) is not None     # replay by body
    assert c.block_refusal([(h("b"), h("bb"))]) is None


def test_transition_table():
    c = MessageCache()
    c.add(h("a"), h("ba"), 1)
    c.set_status(h("a"), CacheStatus.REJECTED)
    # another validator's collator may still include it
    c.set_status(h("a"), CacheStatus.ACCEPTED, block_id="b")
    # orphaned by the masterchain: back to the queue
    c.set_status(h("a"), CacheStatus.PENDING)
    assert c.get(h("a")).block_id is None
    c.set_status(h("a"), CacheStatus.ACCEPTED, block_id="b2")
    c.set_status(h("a"), CacheStatus.FINALIZED)
    with pytest.raises(CacheTransitionError) as ei:
        c.set_status(h("a"), CacheStatus.PENDING)
    assert "FINALIZED -> PENDING" in str(ei.value)
    dup = c.add(h("d"), h("ba"), 1).entry
    with pytest.raises(CacheTransitionError):
        c.set_status(dup.message_id, CacheStatus.COLLATED)
    with pytest.raises(KeyError):
        c.set_status(h("unknown"), CacheStatus.ACCEPTED)
    with pytest.raises(ValueError):
        c.add(b"short", h("x"), 1)


def test_gc_drops_at_n_plus_2_only():
    c = MessageCache()
    c.add(h("s3"), h("b3"), 3)
    c.add(h("s4"), h("b4"), 4)
    c.add(h("s4dup"), h("b3"), 4)   # duplicate of s3 seen in session 4
    assert c.gc(4) == []
    assert c.obsolete(3, 5) and not c.obsolete(4, 5)
    dropped = c.gc(5)
    assert [e.message_id for e in dropped] == [h("s3")]
    assert h("s3") not in c and c.by_uid(h("b3")) is None
    assert h("s4") in c and h("s4dup") in c
    assert {e.message_id for e in c.gc(6)} == {h("s4"), h("s4dup")}
    assert len(c) == 0
    # after GC the id is new again (replay protection only lasts the lifetime; seeds)
    assert c.add(h("s3"), h("b3"), 7).result is AddResult.NEW
