"""The full node's user API: HTTP / WebSocket / Redis-stream server, GraphQL route, and a
client that spreads messages over several full nodes."""
