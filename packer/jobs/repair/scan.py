"""Find: what ``verify --deep`` finds, per record, with the record when it is readable."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from packer.core.errors import RecordError, StoreError, UnreachableError
from packer.core.records import Record
from packer.jobs.verify import deep_check


@dataclass
class Slot:
    index: int
    record: Optional[Record]       # as read (None when unreadable)
    damage: Optional[str]          # None when the record is good
    key: Optional[str] = None


def scan(reader, bar=None) -> list[Slot]:
    """Every record as read, with what ``verify --deep`` finds wrong with it (None when good)."""
    slots = []
    for i in range(reader.metadata.count):
        try:
            rec = reader.get(i)
        except RecordError as exc:
            key = None if exc.key.startswith("#") else exc.key
            slots.append(Slot(i, None, exc.reason, key))
        except UnreachableError:
            raise   # a server that went away has not lost the record
        except (StoreError, IndexError) as exc:
            slots.append(Slot(i, None, f"unreadable: {exc}"))
        else:
            rec.data = bytes(rec.data)
            if not rec.meta_ok():
                damage = "record checksum mismatch: the label or other record fields changed since the build"
            elif not rec.data_ok():
                damage = "checksum mismatch: the stored bytes changed since the build"
            else:
                damage = deep_check(rec, reader.encoding, reader.raw_shape)
            slots.append(Slot(i, rec, damage, rec.key))
        if bar is not None:
            bar.update(1)
    return slots



__all__ = ["Slot", "scan"]
