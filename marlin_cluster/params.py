"""Marlin protocol constants: the seed's "TBD" constants as documented config with defaults
(seed: marlin-data.txt "Constants", "NUM_CHUNKS", "MIN_CHUNKS"; DESIGN.md section 5).

Per channel id (= message type; seed "NUM_CHUNKS: mapping(MESSAGE_TYPE => uint32)"):
    ChannelParams(num_chunks, min_chunks, max_block)
Network-wide (Params):
    no_of_cluster_options  NO_OF_CLUSTER_OPTIONS: clusters offered per chunk (default 2)
    tolerable_latency      TOLERABLE_LATENCY, seconds: a chunk whose attestation timestamp is
                           older is dropped (default 30 s)
    max_clock_skew         seconds a chunk timestamp may lie in the future (default 5 s)
    stake_per_byte         STAKE_PER_BYTE: stake units per byte of chunk + attestation (default 1)
    stake_budget           a producer's stake units per refresh interval; offsets are uint32 so
                           at most 2**32 (default 2**32)
    refresh_interval       seconds; stake offsets restart at 0 each interval (epoch =
                           attestation timestamp // refresh_interval); an offset reused within
                           one epoch is slashing evidence (default 60 s)
    chunk_expiry           seconds a consumer waits after a message's first chunk for MIN_CHUNKS
                           before it raises a dispute (default 10 s)
    ack_timeout            seconds a producer waits for an acknowledgement before it re-sends the
                           chunk to the next candidate member / cluster option (default 2 s)
    max_send_attempts      sends per chunk (first + re-sends) before it is reported as missing
                           an acknowledgement for good (default 3)
    ack_retention          seconds a producer keeps a finished message's acks (default 300 s)
    finished_retention     seconds a consumer remembers a finished (rebuilt, disputed, expired)
                           message id, so a chunk delayed past TOLERABLE_LATENCY (a partition)
                           is a duplicate of it, not a block never seen (default 300 s)
    max_messages           bound on messages a core tracks at once (producer in flight,
                           consumer pending) (default 256)
    max_cached_chunks      bound on a cluster member's chunk cache entries (default 65,536)
    max_pending_bytes      bound on chunk bytes a consumer holds for unfinished messages
                           (default 256 MiB)
    max_evidence           slashing evidence records kept (default 1,024)
The seed's CHUNKS_PER_PEER and CHUNK_REPORT_LIMIT are not used by this protocol version.

Channels (default map): 0 = raw bytes (no block validation), 1 = Bitcoin blocks, 2 = Ethereum
blocks; each 12 chunks of which any 8 rebuild (1.5x bytes on the wire), blocks up to 4 MiB.
pyeclib's isa_l_rs_cauchy allows at most 32 fragments (num_chunks <= 32).

Errors: MarlinConfigError (a MarlinLocalError) for inconsistent values or an unknown channel.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Mapping

from .wire import ATTESTATION_LEN, WITNESS_LEN, MarlinLocalError

__all__ = ["ChannelParams", "Params", "MarlinConfigError", "CHANNEL_RAW", "CHANNEL_BTC", "CHANNEL_ETH",
           "CHANNEL_NAMES", "FRAGMENT_OVERHEAD", "MAX_FRAGMENTS"]

CHANNEL_RAW = 0
CHANNEL_BTC = 1
CHANNEL_ETH = 2
CHANNEL_NAMES = {CHANNEL_RAW: "raw", CHANNEL_BTC: "btc", CHANNEL_ETH: "eth"}

#: pyeclib fragment header (80 bytes) plus alignment padding allowance, per chunk.
FRAGMENT_OVERHEAD = 80 + 64
#: liberasurecode / ISA-L limit on k + m.
MAX_FRAGMENTS = 32


class MarlinConfigError(MarlinLocalError):
    """Inconsistent Marlin parameters, or a channel the parameters do not define."""


@dataclass(frozen=True)
class ChannelParams:
    """Coding parameters of one channel (message type).

    num_chunks: NUM_CHUNKS, fragments per block (k + m), <= 32
    min_chunks: MIN_CHUNKS, fragments any subset of which rebuilds the block (k), >= 1
    max_block:  largest block in bytes a producer sends / a consumer accepts
    """

    num_chunks: int = 12
    min_chunks: int = 8
    max_block: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        if not 1 <= self.min_chunks < self.num_chunks <= MAX_FRAGMENTS:
            raise MarlinConfigError(f"need 1 <= MIN_CHUNKS < NUM_CHUNKS <= {MAX_FRAGMENTS}, got "
                                    f"{self.min_chunks} of {self.num_chunks}")
        if self.max_block < 1:
            raise MarlinConfigError("max_block must be positive")

    @property
    def max_chunk(self) -> int:
        """Largest chunk (bytes) a block of max_block can produce."""
        return -(-self.max_block // self.min_chunks) + FRAGMENT_OVERHEAD


def _default_channels() -> dict[int, ChannelParams]:
    return {CHANNEL_RAW: ChannelParams(), CHANNEL_BTC: ChannelParams(), CHANNEL_ETH: ChannelParams()}


@dataclass(frozen=True)
class Params:
    """Network-wide Marlin parameters (see the module docstring for each field and unit)."""

    channels: Mapping[int, ChannelParams] = field(default_factory=_default_channels)
    no_of_cluster_options: int = 2
    tolerable_latency: float = 30.0
    max_clock_skew: float = 5.0
    stake_per_byte: int = 1
    stake_budget: int = 1 << 32
    refresh_interval: float = 60.0
    chunk_expiry: float = 10.0
    ack_timeout: float = 2.0
    max_send_attempts: int = 3
    ack_retention: float = 300.0
    finished_retention: float = 300.0
    max_messages: int = 256
    max_cached_chunks: int = 65536
    max_pending_bytes: int = 256 * 1024 * 1024
    max_evidence: int = 1024

    def __post_init__(self) -> None:
        if not self.channels:
            raise MarlinConfigError("at least one channel is needed")
        for ch, cp in self.channels.items():
            if not isinstance(ch, int) or not 0 <= ch < 65536:
                raise MarlinConfigError(f"channel id {ch!r} is not a uint16")
            if not isinstance(cp, ChannelParams):
                raise MarlinConfigError(f"channel {ch}: not a ChannelParams")
        if self.no_of_cluster_options < 1:
            raise MarlinConfigError("NO_OF_CLUSTER_OPTIONS must be >= 1")
        if self.stake_per_byte < 0 or not 0 < self.stake_budget <= (1 << 32):
            raise MarlinConfigError("need STAKE_PER_BYTE >= 0 and 0 < stake_budget <= 2**32")
        for name in ("tolerable_latency", "refresh_interval", "chunk_expiry", "ack_timeout", "ack_retention",
                     "finished_retention"):
            if getattr(self, name) <= 0:
                raise MarlinConfigError(f"{name} must be positive seconds")
        if self.max_clock_skew < 0:
            raise MarlinConfigError("max_clock_skew must be >= 0")
        for name in ("max_send_attempts", "max_messages", "max_cached_chunks", "max_pending_bytes", "max_evidence"):
            if getattr(self, name) < 1:
                raise MarlinConfigError(f"{name} must be >= 1")

    def channel(self, channel: int) -> ChannelParams:
        """The ChannelParams of `channel`. Raises MarlinConfigError when undefined."""
        try:
            return self.channels[channel]
        except KeyError:
            raise MarlinConfigError(f"channel {channel} is not configured") from None

    @property
    def max_chunk(self) -> int:
        """Largest chunk (bytes) any channel allows."""
        return max(cp.max_chunk for cp in self.channels.values())

    @property
    def max_frame(self) -> int:
        """Largest frame (bytes) a node accepts: kind + attestation + witness + max_chunk."""
        return 1 + ATTESTATION_LEN + WITNESS_LEN + self.max_chunk

    def replace(self, **changes) -> "Params":
        """A copy with some fields changed (validated)."""
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Mapping) -> "Params":
        """From a config mapping: the field names above; "channels" maps channel id (int or
        decimal string) -> {"num_chunks", "min_chunks", "max_block"}. Unknown keys raise
        MarlinConfigError."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise MarlinConfigError(f"unknown Marlin parameters: {sorted(unknown)}")
        kw = dict(data)
        if "channels" in kw:
            chans = {}
            for ch, cp in kw["channels"].items():
                try:
                    chans[int(ch)] = cp if isinstance(cp, ChannelParams) else ChannelParams(**cp)
                except TypeError as exc:
                    raise MarlinConfigError(f"channel {ch}: {exc}") from None
            kw["channels"] = chans
        return cls(**kw)

    def to_dict(self) -> dict:
        """The inverse of from_dict (JSON/TOML friendly: channel ids as strings)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "channels"}
        out["channels"] = {str(ch): {"num_chunks": cp.num_chunks, "min_chunks": cp.min_chunks,
                                     "max_block": cp.max_block} for ch, cp in self.channels.items()}
        return out
