"""rmb_peer."""
