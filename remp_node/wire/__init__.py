"""REMP wire codecs: TL (ton_api.tl boxed objects), node keys and key ids, the client <->
validator datagrams, receipts, external-message BOC parsing and shard idents. Pure: no I/O,
no clock; imports nothing else from remp_node but remp_node.errors."""
