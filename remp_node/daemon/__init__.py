"""The `remp-node` daemons: console script, validator and full node roles, durable store,
the network directory format and the offline receipt verifier."""
