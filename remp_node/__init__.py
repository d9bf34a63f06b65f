"""REMP (Everscale's Reliable External Messaging Protocol): protocol cores without I/O
(TL, catchain, reliable message queue, message cache, block consensus, receipts, REMP client,
transport, receipt delivery) and the `remp-node` daemons on top of them (validator, full node
with its HTTP / WebSocket / GraphQL / Redis-stream API, init, verify).
Sources: seeds/remp-*, DESIGN.md section 4."""
