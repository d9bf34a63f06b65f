"""rmb_relay."""
