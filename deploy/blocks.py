"""Real blockchain blocks as demo traffic: the launcher's and the demo's view of
marlin_cluster.blocks, where block loading and the block checks live (a protocol package
imports nothing from deploy; DESIGN.md section 2, dependencies point down)."""
from marlin_cluster.blocks import (MAX_BLOCK, SYNTHETIC_MAGIC, BlockError, BlockFile, generated_blocks,
                                   load_blocks, load_verified_blocks, verify_block)

__all__ = ["MAX_BLOCK", "SYNTHETIC_MAGIC", "BlockError", "BlockFile", "generated_blocks", "load_blocks",
           "load_verified_blocks", "verify_block"]
