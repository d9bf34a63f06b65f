"""The Marlin event catalogue (DESIGN.md section 6). trace_id = "message_id:producer"
(message id as 8 hex digits, producer address as 0x-hex). Sizes in bytes, durations ms.
The Marlin daemons come in a later issue; the catalogue is here so the Spark schema has it."""
from daemon_runtime.eventlog import Catalogue, EventSpec

E = EventSpec

MARLIN_EVENTS = Catalogue("marlin", [
    E("marlin.producer.chunk_sent", "a producer sent an attested chunk",
      {"chunk": "long", "cluster": "string", "size": "long"}),
    E("marlin.cluster.witnessed", "a cluster member witnessed a chunk and relayed it",
      {"chunk": "long", "peer": "string", "size": "long"}),
    E("marlin.cluster.acknowledged", "a cluster member acknowledged a chunk to its producer",
      {"chunk": "long", "cluster": "string"}),
    E("marlin.cluster.rejected", "a chunk was refused (forged, duplicate, late, stake reuse)",
      {"chunk": "long", "reason": "string", "peer": "string"}),
    E("marlin.consumer.chunk_received", "a consumer received a chunk",
      {"chunk": "long", "peer": "string", "size": "long"}),
    E("marlin.consumer.block_rebuilt", "a consumer rebuilt a block from MIN_CHUNKS chunks",
      {"count": "long", "size": "long", "duration_ms": "double"}),
    E("marlin.consumer.dispute", "a consumer raised a dispute naming producers",
      {"reason": "string", "peer": "string"}),
])
