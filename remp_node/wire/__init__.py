"""REMP wire codecs: TL (ton_api.tl boxed objects), node keys and key ids, the client <->
validator datagrams, receipts and their delivery batches, the catchain's, the RMQ's and
block consensus's TL objects, the validator node's channel prefix and block payloads,
external-message BOC parsing, the model wallet's message body, and shard idents. Every byte
REMP writes to the wire or a journal is laid out here. Pure: no I/O, no clock; imports
nothing else from remp_node but remp_node.errors."""
