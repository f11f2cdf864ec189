"""Read an offline W&B run back: the summary W&B's runs table will show once `wandb sync` uploads it.

wandb 0.31 ships no Python reader of its `.wandb` files (the old `wandb.sdk.internal.datastore` went with the
Go core), so the framing is read here and each record is decoded with wandb's own protobuf (`wandb.proto.
wandb_internal_pb2.Record`). The framing is LevelDB's log format, as wandb writes it: a 7-byte header (`:W&B`,
0xBEE1, version 0), then 32 KiB blocks of chunks, each `crc32 (4) | length (2, little-endian) | type (1)`, a
record split over blocks as FIRST, MIDDLE..., LAST.

wandb-core writes every change of a run's summary as a `summary` record (a history row's values included), so
replaying those records in order gives the summary the server builds; a test holds it equal to summary.json.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> Iterator[bytes]:
    data = Path(path).read_bytes()
    if not data.startswith(HEADER):
        raise ValueError(f"{path}: not a W&B run file (header {data[:7]!r})")
    pos, pending = len(HEADER), b""
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        chunk = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""
        elif kind == 0 and length == 0:  # zero padding up to the block's end
            pos += (BLOCK - pos % BLOCK) % BLOCK


def records(path: Path):
    from wandb.proto import wandb_internal_pb2

    for raw in raw_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        yield record


def run_file(run_dir: Path) -> Path:
    """The one offline W&B run of a harness run dir (<run dir>/wandb/offline-run-*/run-*.wandb)."""
    found = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    if len(found) != 1:
        raise FileNotFoundError(f"{run_dir}: {len(found)} offline W&B runs, expected 1")
    return found[0]


def summary(path: Path) -> dict:
    """The run's final summary: every `summary` record's updates and removals, in the order wandb wrote them."""
    out: dict = {}
    for record in records(path):
        if record.WhichOneof("record_type") != "summary":
            continue
        for item in record.summary.update:
            _put(out, _key(item), json.loads(item.value_json))
        for item in record.summary.remove:
            _put(out, _key(item), None, remove=True)
    return out


def run_metadata(path: Path) -> dict:
    """The run record's group, job type, name and tags, as W&B will show them."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            run = record.run
            return {"group": run.run_group, "job_type": run.job_type, "name": run.display_name,
                    "tags": list(run.tags)}
    return {}


def _key(item) -> tuple:
    return tuple(item.nested_key) if item.nested_key else (item.key,)


def _put(out: dict, key: tuple, value, remove: bool = False) -> None:
    # nested keys are kept flat, joined by '/', as the harness logs them ('throughput/tokens_per_s' is one key)
    flat = "/".join(key)
    if remove:
        out.pop(flat, None)
    else:
        out[flat] = value
