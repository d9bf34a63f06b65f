"""marlin_cluster."""
