"""Batches of a command stream's records (gateway/cluster/commands.py, docs/cluster.md).

The dialled side's answers that become ready in one loop turn leave together: one sealed frame
(one seal, one grpclib send, one HTTP/2 DATA frame up to h2's frame size) instead of one per
answer, so a broadcast's answers from a peer cost a few frames, not one each. A batch is one
frame to auth.py's `Sealer` and `Opener` (its own sequence number and MAC over every record in
it), so nothing of the per-frame security changes: a record cannot be altered, dropped or moved
without its frame being refused.

A record is `(kind, command id, body)`. `pack` groups records, in order, into the frames to
seal: a group of one record is that record as a plain frame (a lone answer crosses exactly as
it did before batching); a group of several is one `BATCH` frame whose body is each record as
`RECORD` (kind, command id, body length) then its body. A group stops before it would pass
`limit` bytes; a record larger than `limit` on its own travels alone. `unpack` reverses a batch
body, or says it is malformed (None), which the reader refuses as it refuses a bad MAC.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Final

__all__ = ["BATCH", "MAX_BATCH_BYTES", "RECORD", "Record", "pack", "unpack"]

BATCH: Final = b"B"
# A record in a batch: kind (1 byte), command id (8 bytes), body length (4 bytes).
RECORD: Final = struct.Struct(">cQI")
# A batch frame's body at most this many bytes: well under grpclib's 4 MiB stream and connection
# windows (a frame is never held mid-message for the reader's WINDOW_UPDATE), and one frame's
# seal and copies hold the loop for a small fraction of a millisecond; about 600 answers of 100
# bytes, far more than batching needs to amortise a frame's cost.
MAX_BATCH_BYTES: Final = 64 * 1024

Record = tuple[bytes, int, bytes]


def pack(records: Iterable[Record], limit: int = MAX_BATCH_BYTES) -> list[Record]:
    """The frames to seal for `records`, in order (module doc)."""
    frames: list[Record] = []
    group: list[Record] = []
    size = 0

    def close() -> None:
        if len(group) == 1:
            frames.append(group[0])
        elif group:
            parts = [RECORD.pack(k, i, len(b)) + b for k, i, b in group]
            frames.append((BATCH, 0, b"".join(parts)))

    for record in records:
        cost = RECORD.size + len(record[2])
        if group and size + cost > limit:
            close()
            group, size = [], 0
        group.append(record)
        size += cost
    close()
    return frames


def unpack(body: bytes) -> list[Record] | None:
    """A batch frame's records in order, or None when its body is not two or more whole
    records, as `pack` makes it (a sealed frame cannot be altered, so only a faulty peer sends
    one)."""
    records: list[Record] = []
    view = memoryview(body)
    offset, end = 0, len(body)
    while offset < end:
        if end - offset < RECORD.size:
            return None
        kind, command_id, length = RECORD.unpack_from(view, offset)
        offset += RECORD.size
        if end - offset < length:
            return None
        records.append((kind, command_id, bytes(view[offset : offset + length])))
        offset += length
    return records if len(records) > 1 else None
