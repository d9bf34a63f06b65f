"""REMP protocol cores (sans-I/O, `now` passed in): catchain, reliable message queue, message
cache, block consensus, validator, receipt delivery, REMP client, chain follower, shard
state, session schedule, and the core-event -> log-record map. They hold no byte layouts:
every codec they use is in remp_node.wire."""
