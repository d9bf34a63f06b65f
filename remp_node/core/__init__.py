"""REMP protocol cores (sans-I/O, `now` passed in): catchain, reliable message queue, message
cache, block consensus, validator, receipt delivery, REMP client, chain follower, shard
state, session schedule, and the core-event -> log-record map. Import the wire codecs only."""
