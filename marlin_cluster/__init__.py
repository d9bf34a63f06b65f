"""Marlin chunk relay (seeds/marlin-data.txt, DESIGN.md section 5): wire formats, crypto,
erasure coding, the producer / cluster member / consumer cores without I/O, the LPF
transport and the `marlin-node` daemons (init, producer, cluster, consumer)."""
