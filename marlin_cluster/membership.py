"""Who is who in a Marlin network (seed: "isValidProducer", "isValidClusterMember",
"getClusterList"; the seed leaves populating these lists TODO, here they come from the
network file).

Membership is a pure frozen dataclass:
    producers:  {address (20 bytes): public key (65 bytes uncompressed)}
    members:    {address: public key} of every cluster member
    clusters:   {cluster id (uint16): [member addresses]}
    consumers:  {address: public key}
Every address must equal keccak256(public key[1:])[12:]; every cluster member must be in
`members`. Errors: MembershipError (a MarlinLocalError).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .crypto import address_of, keccak256
from .wire import MarlinLocalError, MarlinWireError

__all__ = ["Membership", "MembershipError", "cluster_options"]


class MembershipError(MarlinLocalError):
    """An inconsistent membership (address / key mismatch, unknown member, bad cluster id)."""


def cluster_options(message_id: int, chunk_id: int, cluster_ids: Sequence[int], n: int) -> list[int]:
    """The `n` cluster ids closest to keccak256(messageId 4 || chunkNo 2) (seed "Get cluster
    options for a chunk"), closest first; ties go to the lower id.

    Cluster ids are uint16, so the hash is placed in the same space by its top 16 bits and
    the distance is |point - id| (the seed's sorted-list walk outwards from the insertion
    index). `cluster_ids` must be sorted ascending."""
    digest = keccak256(message_id.to_bytes(4, "big"), chunk_id.to_bytes(2, "big"))
    point = int.from_bytes(digest[:2], "big")
    ids = cluster_ids
    g = bisect.bisect_left(ids, point)
    l = g - 1
    out: list[int] = []
    while len(out) < n and (l >= 0 or g < len(ids)):
        if l < 0:
            out.append(ids[g]); g += 1
        elif g >= len(ids):
            out.append(ids[l]); l -= 1
        elif point - ids[l] <= ids[g] - point:
            out.append(ids[l]); l -= 1
        else:
            out.append(ids[g]); g += 1
    return out


@dataclass(frozen=True)
class Membership:
    """See the module docstring. Derived lookups are computed once in __post_init__."""

    producers: Mapping[bytes, bytes]
    clusters: Mapping[int, Sequence[bytes]]
    members: Mapping[bytes, bytes]
    consumers: Mapping[bytes, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for role in ("producers", "members", "consumers"):
            for addr, pub in getattr(self, role).items():
                try:
                    derived = address_of(pub)
                except MarlinWireError as exc:
                    raise MembershipError(f"{role}: {exc}") from None
                if derived != addr:
                    raise MembershipError(f"{role}: address 0x{addr.hex()} does not match its public key")
        member_clusters: dict[bytes, set[int]] = {}
        for cid, addrs in self.clusters.items():
            if not isinstance(cid, int) or not 0 <= cid < 65536:
                raise MembershipError(f"cluster id {cid!r} is not a uint16")
            if not addrs:
                raise MembershipError(f"cluster {cid} has no members")
            for a in addrs:
                if a not in self.members:
                    raise MembershipError(f"cluster {cid}: member 0x{a.hex()} has no public key")
                member_clusters.setdefault(a, set()).add(cid)
        object.__setattr__(self, "_member_clusters", {a: frozenset(s) for a, s in member_clusters.items()})
        object.__setattr__(self, "_cluster_ids", sorted(self.clusters))

    @property
    def cluster_ids(self) -> list[int]:
        """All cluster ids, ascending."""
        return self._cluster_ids  # type: ignore[attr-defined]

    def clusters_of(self, address: bytes) -> frozenset[int]:
        """Cluster ids `address` is a member of (empty when none)."""
        return self._member_clusters.get(address, frozenset())  # type: ignore[attr-defined]

    def is_producer(self, address: bytes) -> bool:
        return address in self.producers

    def is_member(self, address: bytes, cluster_id: int | None = None) -> bool:
        """True when `address` is a member of `cluster_id` (of any cluster when None)."""
        cs = self.clusters_of(address)
        return bool(cs) if cluster_id is None else cluster_id in cs

    def is_consumer(self, address: bytes) -> bool:
        return address in self.consumers

    def public_key(self, address: bytes) -> bytes | None:
        """The 65-byte public key of any known node, or None."""
        return self.producers.get(address) or self.members.get(address) or self.consumers.get(address)

    def options(self, message_id: int, chunk_id: int, n: int) -> list[int]:
        """cluster_options over this membership's clusters."""
        return cluster_options(message_id, chunk_id, self.cluster_ids, n)

    def to_dict(self) -> dict:
        """JSON-friendly form: hex strings ("0x..."), cluster ids as decimal strings."""
        h = lambda b: "0x" + b.hex()  # noqa: E731
        return {"producers": {h(a): h(p) for a, p in self.producers.items()},
                "members": {h(a): h(p) for a, p in self.members.items()},
                "clusters": {str(c): [h(a) for a in ms] for c, ms in self.clusters.items()},
                "consumers": {h(a): h(p) for a, p in self.consumers.items()}}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Membership":
        """Inverse of to_dict. Raises MembershipError for malformed hex or inconsistencies."""
        def b(s) -> bytes:
            try:
                return bytes.fromhex(s[2:] if s.startswith("0x") else s)
            except (ValueError, AttributeError, TypeError):
                raise MembershipError(f"not a hex string: {s!r}") from None
        try:
            return cls(producers={b(a): b(p) for a, p in data.get("producers", {}).items()},
                       members={b(a): b(p) for a, p in data.get("members", {}).items()},
                       clusters={int(c): [b(a) for a in ms] for c, ms in data.get("clusters", {}).items()},
                       consumers={b(a): b(p) for a, p in data.get("consumers", {}).items()})
        except (ValueError, TypeError, AttributeError) as exc:
            raise MembershipError(f"malformed membership: {exc}") from None
