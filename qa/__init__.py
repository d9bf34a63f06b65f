"""Saturation search and regression verdicts (docs/testnet.md, "Saturation and regression")."""
