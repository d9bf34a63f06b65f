"""REMP (Everscale's Reliable External Messaging Protocol): protocol cores without I/O
(TL, catchain, reliable message queue, message cache, block consensus, receipts, REMP client)
and, in a later issue, the UDP/HTTP daemons on top of them. Sources: seeds/remp-*, DESIGN.md section 4."""
