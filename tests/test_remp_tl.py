"""REMP TL constructor ids: computed from the ever-tl scheme lines, checked against the
table in DESIGN.md section 4, and the normalization rule checked against TON tl-parser's
behaviour (ids of well-known lines)."""
import pytest

from remp_node.wire import tl
from remp_node.wire.keys import PUB_ED25519
from remp_node.wire.tl import REMP_TL_LINES, normalize_tl_line, tl_constructor_id

# DESIGN.md section 4 (the ids the reference node uses on the wire).
DESIGN_TABLE = {
    "tonNode.rempReceipt": 0x3122B7A2,
    "tonNode.rempSentToValidators": 0x2FF6C87B,
    "tonNode.rempNew": 0x5BFABD30,
    "tonNode.rempRejected": 0xB4E1EE77,
    "tonNode.rempAccepted": 0x30225E0E,
    "tonNode.rempIgnored": 0x43BEBB8B,
    "tonNode.rempDuplicate": 0x9ECD4334,
    "tonNode.rempTimeout": 0xB71796AF,
    "tonNode.rempFullnode": 0xD7145A5A,
    "tonNode.rempQueue": 0xEBABF815,
    "tonNode.rempCollator": 0x44F07DE7,
    "tonNode.rempShardchain": 0x237E2B37,
    "tonNode.rempMasterchain": 0xBCC0EAA3,
    "tonNode.rempSignedReceipt": 0xB361C8DD,
    # ever-tl generated Rust (ton_api ton_node.rs) for the two lines DESIGN.md does not list
    "tonNode.rempReceived": 0x32E5A18A,
}


@pytest.mark.parametrize("name,expected", sorted(DESIGN_TABLE.items()))
def test_constructor_id_from_scheme_line(name, expected):
    assert tl_constructor_id(REMP_TL_LINES[name]) == expected


def test_module_constants_match_lines():
    pairs = {
        "REMP_RECEIPT": "tonNode.rempReceipt", "REMP_SIGNED_RECEIPT": "tonNode.rempSignedReceipt",
        "REMP_NEW": "tonNode.rempNew", "REMP_REJECTED": "tonNode.rempRejected",
        "REMP_ACCEPTED": "tonNode.rempAccepted", "REMP_IGNORED": "tonNode.rempIgnored",
        "REMP_DUPLICATE": "tonNode.rempDuplicate", "REMP_TIMEOUT": "tonNode.rempTimeout",
        "REMP_SENT_TO_VALIDATORS": "tonNode.rempSentToValidators",
        "REMP_FULLNODE": "tonNode.rempFullnode", "REMP_QUEUE": "tonNode.rempQueue",
        "REMP_COLLATOR": "tonNode.rempCollator", "REMP_SHARDCHAIN": "tonNode.rempShardchain",
        "REMP_MASTERCHAIN": "tonNode.rempMasterchain", "REMP_MESSAGE": "tonNode.rempMessage",
    }
    for const, name in pairs.items():
        assert getattr(tl, const) == tl_constructor_id(REMP_TL_LINES[name]), const


def test_pub_ed25519_and_block_id_ext():
    assert PUB_ED25519 == 0x4813B4C6
    # tonNode.blockIdExt is 0x6752eb78 in TON's generated ton_api (tl/generate/scheme).
    assert tl.BLOCK_ID_EXT == 0x6752EB78


def test_normalization_rules():
    # trailing ';' dropped, white space folded, comments and explicit '#id' removed
    a = normalize_tl_line("tonNode.rempReceipt   message_id:int256\n status:tonNode.RempMessageStatus "
                          "timestamp:long source_id:int256 = tonNode.RempReceipt; // c")
    assert a == ("tonNode.rempReceipt message_id:int256 status:tonNode.RempMessageStatus "
                 "timestamp:long source_id:int256 = tonNode.RempReceipt")
    assert normalize_tl_line("db.block.info#4ac6e727 id:int = db.block.Info;") == "db.block.info id:int = db.block.Info"
    # a one-character change gives a different id
    assert tl_constructor_id("tonNode.rempNew = tonNode.RempMessageStatus") != tl_constructor_id(
        "tonNode.rempNew = tonNode.RempMessageStatu")


def test_zero_block_id_packs_to_80_bytes():
    assert len(tl.ZERO_BLOCK_ID.pack()) == 4 + 8 + 4 + 32 + 32
    assert tl.ZERO_BLOCK_ID.pack() == bytes(80)


def test_vector_parentheses_are_dropped_like_tons_tl_compiler():
    from remp_node.wire.tl import tl_constructor_id
    assert tl_constructor_id("catchain.getDifference rt:(vector int) = catchain.Difference") == 0xd06cced8


def test_reader_refuses_truncated_and_badly_padded_bytes_at_every_cut():
    """TLReader reads with Struct.unpack_from and slices (no memoryview copies): every prefix
    of a valid object is refused with TLError, never another exception or a short value."""
    from remp_node.wire.tl import TLError, TLReader, pack_bytes, pack_int, pack_long
    blob = pack_int(-7) + pack_long(1 << 40) + pack_bytes(b"x" * 5) + pack_bytes(b"y" * 300) + b"\x01" * 32
    r = TLReader(blob)
    assert (r.int(), r.long(), r.bytes(), r.bytes(), r.int256()) == (-7, 1 << 40, b"x" * 5, b"y" * 300, b"\x01" * 32)
    r.finish()
    for cut in range(len(blob)):
        r = TLReader(blob[:cut])
        with pytest.raises(TLError):
            r.int(), r.long(), r.bytes(), r.bytes(), r.int256()
            r.finish()
    bad = bytearray(pack_bytes(b"x" * 5))
    bad[-1] = 1                                    # non-zero padding
    with pytest.raises(TLError):
        TLReader(bytes(bad)).bytes()
    with pytest.raises(TLError):
        TLReader(b"\xff\x00\x00\x00").bytes()      # 0xff length prefix
    assert TLReader(bytearray(pack_int(3))).int() == 3     # any bytes-like input
