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


# ---- the lean CheckBlock (validate._check_block) gives python-bitcoinlib's verdict ----------

def _verdict(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # the verdict is the exception's type and message, or None
        return type(exc).__name__, str(exc)
    return None


@pytest.fixture()
def regtest():
    """python-bitcoinlib's regtest parameters (proof-of-work limit 2^255) so that blocks built
    here can carry a valid proof of work after a few nonces; mainnet again afterwards."""
    import bitcoin
    bitcoin.SelectParams("regtest")
    yield
    bitcoin.SelectParams("mainnet")


def _mined(txs, ntime, merkle=None):
    from bitcoin.core import CBlock, CheckProofOfWork, CheckProofOfWorkError
    root = merkle if merkle is not None else CBlock.build_merkle_tree_from_txs(txs)[-1] if txs else b"\0" * 32
    for nonce in range(10_000):
        header = dict(nVersion=4, hashPrevBlock=b"\x11" * 32, hashMerkleRoot=root, nTime=ntime,
                      nBits=0x207FFFFF, nNonce=nonce)
        try:
            CheckProofOfWork(CBlock(**header).GetHash(), header["nBits"])
        except CheckProofOfWorkError:
            continue
        blk = CBlock(**header)                       # header only: CBlock(vtx=...) checks the root itself
        object.__setattr__(blk, "vtx", tuple(txs))
        object.__setattr__(blk, "vMerkleTree", tuple(CBlock.build_merkle_tree_from_txs(txs)) if txs else ())
        object.__setattr__(blk, "vWitnessMerkleTree", ())
        return CBlock.deserialize(blk.serialize())   # as a consumer gets it: from bytes
    raise AssertionError("no nonce found")


def test_lean_check_block_matches_checkblock_on_real_blocks(shared_data):
    from bitcoin.core import CBlock, CheckBlock
    from marlin_cluster.validate import _check_block
    for name in ("block413567.raw", "block413567_corrupted_btc2arc.raw"):
        raw = (shared_data / "btc" / name).read_bytes()
        b = CBlock.deserialize(raw)
        for t in (b.nTime, b.nTime - 3 * 3600):      # in time; header 3 h in the future
            lib = _verdict(CheckBlock, b, True, True, t)
            assert _verdict(_check_block, b, len(raw), t) == lib, (name, t)
    assert lib is not None and "timestamp" in lib[1]


def test_lean_check_block_matches_checkblock_on_mutated_blocks(shared_data, regtest):
    """Blocks cut from block 413567's transactions and broken one rule at a time (duplicate
    transaction, coinbase misplaced or twice, negative or duplicate-input transaction, wrong
    merkle root, empty): the same verdict, message included, as CheckBlock."""
    from bitcoin.core import CBlock, CheckBlock, CMutableTransaction, CTransaction
    from marlin_cluster.validate import _check_block
    real = CBlock.deserialize((shared_data / "btc" / "block413567.raw").read_bytes())
    cb, txs = real.vtx[0], list(real.vtx[1:40])
    neg = CMutableTransaction.from_tx(txs[3])
    neg.vout[0].nValue = -1
    dup_in = CMutableTransaction.from_tx(txs[4])
    dup_in.vin = [dup_in.vin[0], dup_in.vin[0]]
    t = real.nTime
    cases = {
        "valid": _mined([cb] + txs, t),
        "duplicate_tx": _mined([cb] + txs + [txs[-1]], t),
        "coinbase_not_first": _mined(txs[:1] + [cb] + txs[1:], t),
        "two_coinbases": _mined([cb] + txs + [cb], t),
        "negative_value": _mined([cb, CTransaction.from_tx(neg)] + txs, t),
        "duplicate_inputs": _mined([cb, CTransaction.from_tx(dup_in)] + txs, t),
        "merkle_root": _mined([cb] + txs, t, merkle=b"\x22" * 32),
        "empty": _mined([], t),
    }
    seen = {}
    for name, b in cases.items():
        raw = b.serialize()
        lib = _verdict(CheckBlock, b, True, True, t)
        assert _verdict(_check_block, b, len(raw), t) == lib, name
        seen[name] = lib
    assert seen["valid"] is None
    assert all(v is not None for k, v in seen.items() if k != "valid"), seen
    assert "duplicate transaction" in seen["duplicate_tx"][1]
    assert "hashMerkleRoot" in seen["merkle_root"][1]


# ---- Bitcoin Core's CheckBlock (validate._btc) gives python-bitcoinlib's verdict -------------

def test_core_check_block_matches_python_bitcoinlib_on_real_and_broken_blocks(shared_data):
    """validate_block's Bitcoin path (libbitcoinkernel's CheckBlock plus the header time)
    against python-bitcoinlib's CheckBlock rules (validate._btc_lib), message included, on
    block 413567, its corrupted twin, a changed nonce, a changed output value, trailing and
    missing bytes, and a header 3 h ahead of `now`."""
    from marlin_cluster.validate import _btc_lib
    good = (shared_data / "btc" / "block413567.raw").read_bytes()
    nonce = bytearray(good)
    nonce[76] ^= 1
    value = bytearray(good)
    value[5000] ^= 0x40
    n_time = int.from_bytes(good[68:72], "little")
    cases = [(good, None), ((shared_data / "btc" / "block413567_corrupted_btc2arc.raw").read_bytes(), None),
             (bytes(nonce), None), (bytes(value), None), (good + b"\0", None), (good[:-1], None),
             (good, n_time - 3 * 3600), (good, n_time + 10)]
    verdicts = []
    for data, now in cases:
        ours = _verdict(validate_block, CHANNEL_BTC, data, now)
        assert ours == _verdict(_btc_lib, data, now), (len(data), now)
        verdicts.append(ours)
    assert verdicts[0] is None and verdicts[-1] is None
    assert all(v is not None and v[0] == "BlockInvalid" for v in verdicts[1:-1]), verdicts


def test_validate_does_not_import_deploy():
    """Block checking lives in marlin_cluster (a protocol package imports nothing from
    deploy); the launcher imports marlin_cluster.blocks directly."""
    import subprocess
    import sys
    code = ("import sys, marlin_cluster.validate, marlin_cluster.consumer, marlin_cluster.daemon; "
            "bad = [m for m in sys.modules if m == 'deploy' or m.startswith('deploy.')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
