"""rmb_peer: the RMB wire library, the rmb-peer core and daemon, and the app library.

The RMB wire library (pure parsing/signing/crypto plus the registry client; no daemon code,
imported by rmb_relay and rmb_peer alike; tests/test_peer_edges.py checks its imports):
  errors     RmbRemoteError (ValueError: bad input from outside) / RmbLocalError (misuse)
  envelope   Envelope protobuf, parse_envelope (size-bounded), relay_error, expiry
  challenge  envelope signature challenge, sign_envelope / verify_envelope
  token      the relay authentication JWT (bounded size and depth)
  e2e        end-to-end AES-GCM over the secp256k1 shared key
  identity   account keys (sr25519/ed25519) and typed signatures, E2EKey
  twins      Twin records and TwinDirectory (registry client: TTL, stale-if-error)
The peer: core (PeerCore, no I/O, no clock), daemon (its asyncio adapter), twinstore
(SQLite twin table in --data-dir), redisq (Redis queue reader/writer), events (the RMB
event catalogue). Apps: client (RmbClient, RmbService).
"""
