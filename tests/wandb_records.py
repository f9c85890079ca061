"""Read the records of an offline W&B run file (``run-ID.wandb``), as W&B's own sync reads them.

The file is a LevelDB-style log: a 7-byte header (``:W&B``, a 2-byte magic, a version byte), then
blocks of 32 KiB holding chunks of 7-byte header (CRC-32, little-endian length, type) and payload;
a record too long for the rest of its block is split into FIRST, MIDDLE and LAST chunks. Each
record is a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    offset, pending = HEADER, b""
    while offset + HEADER <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < HEADER:  # too little room for a chunk header: the block is padded
            offset += left_in_block
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, offset)
        payload = data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        if kind == 0 and length == 0:  # zero padding at the end of the file
            break
        pending = payload if kind in (FULL, FIRST) else pending + payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""
