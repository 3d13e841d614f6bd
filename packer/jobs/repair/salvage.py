"""Salvage of a JPEG record: complete one that lost only its EOI marker, or leave it be.

Repair keeps a damaged JPEG record only when this gives back bytes that decode cleanly under the
build's strict decode (:func:`packer.core.integrity.turbo_decode`); a scan cut short is never
padded. (Reading a damaged *store* is :mod:`packer.stores.salvage`.)
"""
from __future__ import annotations

from typing import Optional

from packer.core.integrity import turbo_decode

_EOI = b"\xff\xd9"


def salvage_jpeg(data: bytes, channels: int) -> Optional[tuple[bytes, str]]:
    """Complete a JPEG that lost its EOI marker; None unless the result decodes cleanly.

    Only a JPEG whose scan is whole but whose end marker is gone can be completed: a scan cut
    short does not decode cleanly under the strict decode and is never padded.
    """
    data = bytes(data)
    if not data.startswith(b"\xff\xd8") or data.endswith(_EOI):
        return None
    # A lost tail often reads back as zeros (a store's fixed-size slot, a sparse file): try
    # without them first.
    stripped = data.rstrip(b"\0")
    for body in dict.fromkeys([stripped, data]):
        fixed = (body[:-1] if body.endswith(b"\xff") else body) + _EOI
        try:
            turbo_decode(fixed, pixel_format="gray" if channels == 1 else "rgb", strict=True)
        except ValueError:
            continue
        zeros = f", {len(data) - len(body)} zero byte(s) dropped" if len(body) < len(data) else ""
        return fixed, f"salvaged: EOI marker lost (restored{zeros}); the scan is whole and decodes cleanly"
    return None



__all__ = ["salvage_jpeg"]
