"""REMP datagram transport: the sans-I/O authenticated, fragmenting transport core, its
asyncio UDP adapter and the endpoint the daemons open."""
