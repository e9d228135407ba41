"""Read monitor output back with each tool's own reader or file format."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_history(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """History records of an offline run's ``.wandb`` file: wandb's record log (a LevelDB-style
    log of 32 KiB blocks, each record framed by crc32, length and type) holding wandb's own
    protobuf ``Record`` messages, decoded with wandb's generated classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B", "not a wandb run file"
    pos, block = 7, 32768
    records, pending = [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            records.append(pending)
            pending = b""
    out = []
    for raw in records:
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            items = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    items[key] = json.loads(item.value_json)
            out.append((rec.history.step.num, items))
    return out


def comet_metrics(archive: Path) -> list[tuple[str, float, int]]:
    with zipfile.ZipFile(archive) as z:
        lines = z.read("messages.json").decode().splitlines()
    out = []
    for line in lines:
        msg = json.loads(line)
        if msg.get("type") == "metric_msg":
            m = msg["payload"]["metric"]
            if m.get("step") is None:  # comet's own system metrics
                continue
            out.append((m["metricName"], float(m["metricValue"]), int(m["step"])))
    return out
