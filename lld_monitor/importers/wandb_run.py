"""W&B run folders as every W&B user has them on disk (``wandb/run-*``, ``wandb/offline-run-*``,
``wandb/latest-run``), online or offline.

The run's whole history is in ``run-<id>.wandb``: a LevelDB-style log (wandb's datastore). The
file starts with a 7-byte header (``b":W&B"``, magic 0xBEE1, version 0), then 32 KiB blocks;
each record is split into chunks (FULL, or FIRST / MIDDLE / LAST across block ends), each chunk
with a 7-byte header: CRC32 of (type byte + data), length, type. A block's tail shorter than a
chunk header is padding. The records are ``wandb.proto.wandb_internal_pb2.Record`` protobufs
(wandb ships them, not a reader); the ``history`` ones hold the logged rows as
``(nested_key, value_json)`` items, ``_step`` among them.

``read_wandb_history(path)`` reads it; a torn last block (a run still writing, a copy cut short)
or a bad checksum ends the reading there, with the rows before it kept and a note saying so.
Without the ``.wandb`` file a run folder falls back to ``files/output.log`` (the console: TRL's
printed dicts, verl's metric lines) and then ``files/wandb-summary.json`` (one row: the last
values). The notes say which source was read and what else is there.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lld_monitor.importers.base import ImportFormatError

HEADER_LEN = 7  # the file header and every chunk header
BLOCK_LEN = 32768
IDENT = b":W&B"
MAGIC = 0xBEE1
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_TYPE_CRC = {t: zlib.crc32(bytes([t])) & 0xFFFFFFFF for t in (FULL, FIRST, MIDDLE, LAST)}


def is_wandb_file(path: Path) -> bool:
    """True when ``path`` starts with the datastore header of a ``.wandb`` file."""
    try:
        with path.open("rb") as fh:
            return fh.read(4) == IDENT
    except OSError:
        return False


def wandb_file_of(folder: Path) -> Path | None:
    """The ``run-*.wandb`` file of a W&B run folder, if any (the newest, should there be two)."""
    files = sorted(folder.glob("run-*.wandb"), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else None


def is_wandb_run_dir(folder: Path) -> bool:
    """A W&B run folder: a ``run-*.wandb`` file, or its ``files/`` with the console or the
    summary W&B writes there."""
    if not folder.is_dir():
        return False
    if wandb_file_of(folder) is not None:
        return True
    files = folder / "files"
    return (files / "wandb-summary.json").is_file() or (
        (files / "output.log").is_file() and (files / "wandb-metadata.json").is_file()
    )


def _chunks(data: bytes, notes: list[str]) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of every chunk in order; stops (with a note) at a torn or bad chunk."""
    pos = HEADER_LEN
    end = len(data)
    while pos < end:
        left = BLOCK_LEN - pos % BLOCK_LEN
        if left < HEADER_LEN:
            pos += left  # a block's tail too short for a chunk header: padding
            continue
        if pos + HEADER_LEN > end:
            notes.append(f"the file ends inside a chunk header at byte {pos} (cut short?)")
            return
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0 and length == 0 and crc == 0:  # zero padding to the block's end
            pos += left
            continue
        start = pos + HEADER_LEN
        if kind not in _TYPE_CRC or length > left - HEADER_LEN:
            notes.append(f"an unreadable chunk at byte {pos} (type {kind}, length {length})")
            return
        if start + length > end:
            notes.append(
                f"the file ends inside a record at byte {pos} (a run still being written, or a "
                "copy cut short)"
            )
            return
        payload = data[start : start + length]
        if zlib.crc32(payload, _TYPE_CRC[kind]) & 0xFFFFFFFF != crc:
            notes.append(f"a bad checksum at byte {pos} (the file is damaged there)")
            return
        yield kind, payload
        pos = start + length


def records(data: bytes, notes: list[str]) -> Iterator[bytes]:
    """The serialized records of a ``.wandb`` file's bytes, chunks joined."""
    parts: list[bytes] | None = None
    for kind, payload in _chunks(data, notes):
        if kind == FULL:
            parts = None
            yield payload
        elif kind == FIRST:
            parts = [payload]
        elif kind == MIDDLE and parts is not None:
            parts.append(payload)
        elif kind == LAST and parts is not None:
            parts.append(payload)
            yield b"".join(parts)
            parts = None
        else:
            notes.append("a record continued without its first chunk: skipped")
            parts = None


def _value(text: str) -> Any:
    try:
        v = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return v  # (canonicalize names non-finite values)
    return None


def read_wandb_history(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The history rows of a ``.wandb`` file (each a dict of logged keys, ``_step`` among them)
    and notes (a torn end, a bad checksum: the rows before it are kept)."""
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError as exc:  # pragma: no cover - wandb is a dependency
        raise ImportFormatError(f"{path}: reading a .wandb file needs the wandb package") from exc
    data = path.read_bytes()
    if not data:
        raise ImportFormatError(f"{path}: empty .wandb file (the run logged nothing yet?)")
    if len(data) < HEADER_LEN or data[:4] != IDENT:
        raise ImportFormatError(f"{path}: not a W&B .wandb file (no ':W&B' header)")
    _, magic, version = struct.unpack_from("<4sHB", data, 0)
    if magic != MAGIC or version != 0:
        raise ImportFormatError(
            f"{path}: a .wandb file of an unknown version (magic {magic:#x}, version {version})"
        )
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    bad = 0
    for raw in records(data, notes):
        rec = pb.Record()
        try:
            rec.ParseFromString(raw)
        except Exception:  # protobuf's DecodeError; a damaged record is counted, not fatal
            bad += 1
            continue
        if rec.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in rec.history.item:
            key = "/".join(item.nested_key) if item.nested_key else item.key
            value = _value(item.value_json)
            if key and value is not None:
                row[key] = value
        if "_step" not in row and rec.history.HasField("step"):
            row["_step"] = float(rec.history.step.num)
        if row:
            rows.append(row)
    if bad:
        notes.append(f"{bad} record(s) that did not parse were skipped")
    if notes:
        notes = [f"{path.name}: {n}; the {len(rows)} rows before it were read" for n in notes[:1]]
    return rows, notes


def summary_row(path: Path) -> dict[str, Any]:
    """The numbers of ``wandb-summary.json`` as one row (the run's last values)."""
    doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    if not isinstance(doc, dict):
        raise ImportFormatError(f"{path}: not a W&B summary (a JSON object)")
    row = {
        k: float(v)
        for k, v in doc.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return {k: v for k, v in row.items() if not math.isnan(v)}
