import json

import pytest

from marlin_cluster.blocks import BlockError, generated_blocks, load_blocks, verify_block


def test_ethereum_blocks_hash_to_their_manifest(shared_data):
    manifest = {e["file"]: e for e in json.loads((shared_data / "eth" / "manifest.json").read_text())}
    blocks = load_blocks(shared_data / "eth")
    assert {b.name for b in blocks} == set(manifest)
    for b in blocks:
        info = verify_block(b.data)
        assert info["kind"] == "eth"
        assert info["hash"] == manifest[b.name]["hash"] and info["txs"] == manifest[b.name]["txs"]


def test_bitcoin_block_and_its_corrupted_twin(shared_data):
    good = (shared_data / "btc" / "block413567.raw").read_bytes()
    info = verify_block(good)
    assert info == {"kind": "btc", "size": 999887, "txs": 1557,
                    "hash": "0000000000000000025aff8be8a55df8f89c77296db6198f272d6577325d4069"}
    with pytest.raises(BlockError, match="merkle root"):
        verify_block((shared_data / "btc" / "block413567_corrupted_btc2arc.raw").read_bytes())


def test_synthetic_blocks_and_garbage():
    blocks = generated_blocks(4)
    assert blocks == generated_blocks(4)  # deterministic
    for b in blocks:
        assert verify_block(b.data)["kind"] == "synthetic"
    tampered = bytearray(blocks[0].data)
    tampered[-1] ^= 1
    with pytest.raises(BlockError, match="hash mismatch"):
        verify_block(bytes(tampered))
    for junk in (b"", b"\x01\x02", b"\xc5garbage", b"\x00" * 100):
        with pytest.raises(BlockError):
            verify_block(junk)
