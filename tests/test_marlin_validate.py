"""Block validation with each chain's own rules (validate.py): Bitcoin proof of work and
merkle root (python-bitcoinlib CheckBlock), Ethereum header hash and transactions / ommers /
withdrawals roots (trie.HexaryTrie). Real blocks from ../shared/data (skips without them)."""
from __future__ import annotations

import json

import pytest
import rlp

from marlin_cluster.params import CHANNEL_BTC, CHANNEL_ETH, CHANNEL_RAW
from marlin_cluster.validate import (BlockInvalid, block_hash, check_message_id, message_id_of,
                                     validate_block)

BTC_HASH = "0000000000000000025aff8be8a55df8f89c77296db6198f272d6577325d4069"


def test_bitcoin_block_valid_and_message_id(shared_data):
    data = (shared_data / "btc" / "block413567.raw").read_bytes()
    info = validate_block(CHANNEL_BTC, data)
    assert info.hash[::-1].hex() == BTC_HASH and info.txs == 1557 and info.size == len(data)
    assert block_hash(CHANNEL_BTC, data) == info.hash
    assert message_id_of(CHANNEL_BTC, data) == int.from_bytes(info.hash[:4], "big") != 0
    check_message_id(message_id_of(CHANNEL_BTC, data), info)
    with pytest.raises(BlockInvalid) as e:
        check_message_id(0, info)
    assert e.value.reason == "message_id_mismatch"


def test_corrupted_bitcoin_block_fails_on_the_merkle_root(shared_data):
    data = (shared_data / "btc" / "block413567_corrupted_btc2arc.raw").read_bytes()
    good = (shared_data / "btc" / "block413567.raw").read_bytes()
    assert block_hash(CHANNEL_BTC, data) == block_hash(CHANNEL_BTC, good)      # header unchanged
    with pytest.raises(BlockInvalid, match="(?i)merkle"):
        validate_block(CHANNEL_BTC, data)


def test_bitcoin_proof_of_work_is_checked(shared_data):
    data = bytearray((shared_data / "btc" / "block413567.raw").read_bytes())
    data[76:80] = (int.from_bytes(data[76:80], "little") + 1).to_bytes(4, "little")   # nonce
    with pytest.raises(BlockInvalid, match="(?i)proof|pow|hash"):
        validate_block(CHANNEL_BTC, bytes(data))


def test_ethereum_blocks_hash_and_roots(shared_data):
    manifest = json.loads((shared_data / "eth" / "manifest.json").read_text())
    entries = manifest if isinstance(manifest, list) else manifest.get("blocks", manifest)
    files = sorted((shared_data / "eth").glob("*.rlp"))
    assert files
    hashes = json.dumps(entries)
    for path in files:
        data = path.read_bytes()
        info = validate_block(CHANNEL_ETH, data)
        assert "0x" + info.hash.hex() in hashes, path.name           # keccak256(header) = manifest hash
        assert block_hash(CHANNEL_ETH, data) == info.hash


def test_ethereum_altered_transaction_fails_on_the_transactions_root(shared_data):
    path = next(p for p in sorted((shared_data / "eth").glob("*.rlp"))
                if len(rlp.decode(p.read_bytes())[1]) > 1)
    items = rlp.decode(path.read_bytes())
    items[1] = items[1][::-1]                                       # same txs, other order
    with pytest.raises(BlockInvalid, match="transactions root"):
        validate_block(CHANNEL_ETH, rlp.encode(items))
    items = rlp.decode(path.read_bytes())
    items[2] = [items[0]]                                           # a fake uncle
    with pytest.raises(BlockInvalid, match="ommers"):
        validate_block(CHANNEL_ETH, rlp.encode(items))


def test_garbage_is_invalid_not_a_crash():
    for ch in (CHANNEL_BTC, CHANNEL_ETH):
        for data in (b"", b"\x01" * 10, b"\xc0", b"\xf8\x01\x00", b"\x00" * 200):
            with pytest.raises(BlockInvalid):
                validate_block(ch, data)
    assert validate_block(CHANNEL_RAW, b"anything").txs == 0
