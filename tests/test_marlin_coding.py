"""Erasure coding through pyeclib isa_l_rs_cauchy: any MIN_CHUNKS of
NUM_CHUNKS rebuild the block, tested on random subsets with the real library."""
from __future__ import annotations

import itertools
import random

import pytest

from marlin_cluster.coding import EC_TYPE, Coder, CodingError, coder
from marlin_cluster.wire import MarlinLocalError


@pytest.mark.parametrize("n,k", [(12, 8), (20, 10), (32, 16), (3, 1), (5, 4)])
def test_any_min_chunks_of_num_chunks_rebuild(n, k):
    rng = random.Random(n * 100 + k)
    c = coder(n, k)
    assert c.driver.ec_type.name == EC_TYPE == "isa_l_rs_cauchy" and (c.driver.k, c.driver.m) == (k, n - k)
    for size in (1, 7, k * 64 + 3, 100_003):
        block = rng.randbytes(size)
        chunks = c.encode(block)
        assert len(chunks) == n and len({len(x) for x in chunks}) == 1
        for _ in range(40):
            ids = rng.sample(range(n), k)
            assert c.decode({i: chunks[i] for i in ids}) == block


def test_every_subset_of_a_small_code():
    c = Coder(6, 3)
    block = random.Random(1).randbytes(5000)
    chunks = c.encode(block)
    for ids in itertools.combinations(range(6), 3):
        assert c.decode({i: chunks[i] for i in ids}) == block


def test_too_few_or_broken_chunks_raise_the_remote_error():
    c = coder(12, 8)
    chunks = c.encode(b"block" * 1000)
    with pytest.raises(CodingError):
        c.decode({i: chunks[i] for i in range(7)})
    with pytest.raises(CodingError) as e:
        c.decode({i: b"\0" * len(chunks[0]) for i in range(8)})
    assert isinstance(e.value, ValueError) and e.value.reason == "undecodable"
    with pytest.raises(MarlinLocalError):
        c.encode(b"")
    with pytest.raises(MarlinLocalError):
        Coder(33, 8)
