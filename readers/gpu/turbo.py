"""libjpeg-turbo as a batch decoder: CPU threads, then one host-to-device copy.

The decoder of ``decoder="turbojpeg"``, the one ``"auto"`` picks without a GPU, and the fallback
the GPU decoders build by name (``new_decoder("turbojpeg", threads)``) for images they reject.

Example:
    >>> from readers.gpu import TurboJpegDecoder
    >>> TurboJpegDecoder(threads=2).decode([], "cpu")
    []
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence

import numpy as np
import torch

from readers.gpu.decoders import DecodeError, as_array, register_decoder

__all__ = ["TurboJpegDecoder"]


def _pinned_upload(arrays: List[np.ndarray], device: torch.device) -> List[torch.Tensor]:
    """HWC host images -> device, through ONE pinned buffer and ONE copy; returns views."""
    sizes = [a.size for a in arrays]
    host = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=True)
    h = host.numpy()
    pos = 0
    for a, n in zip(arrays, sizes):
        h[pos : pos + n] = a.reshape(-1)
        pos += n
    dev = host.to(device, non_blocking=True)
    out, pos = [], 0
    for a, n in zip(arrays, sizes):
        out.append(dev[pos : pos + n].view(a.shape))
        pos += n
    return out


@register_decoder
class TurboJpegDecoder:
    """libjpeg-turbo on ``threads`` CPU threads (it releases the GIL), strict: a decoder warning
    (truncated or corrupt data) is an error, never grey padding.

    Example:
        >>> imgs = TurboJpegDecoder(threads=4).decode(list_of_jpeg_bytes, "cpu")   # doctest: +SKIP
    """

    name = "turbojpeg"

    def __init__(self, threads: int = 4):
        from packer.core.integrity import turbojpeg

        turbojpeg()  # fail now, with the install hint, when libturbojpeg is missing
        self.threads = max(1, int(threads))
        self._pool: Optional[ThreadPoolExecutor] = None

    @classmethod
    def from_settings(cls, device: torch.device, threads: int) -> "TurboJpegDecoder":
        """The decoder ``get_decoder("turbojpeg", device, threads)`` gives."""
        return cls(threads)

    def _one(self, item):
        pos, data, key = item
        from packer.core.integrity import turbo_decode

        try:
            arr = turbo_decode(as_array(data), pixel_format="rgb", strict=True)
        except (ValueError, OSError) as exc:
            raise DecodeError(pos, key, str(exc)) from exc
        return arr

    def decode_host(self, datas: Sequence, keys: Optional[Sequence[str]] = None) -> List[np.ndarray]:
        """HWC uint8 arrays on the host."""
        items = [(i, d, None if keys is None else keys[i]) for i, d in enumerate(datas)]
        if self.threads == 1 or len(items) < 2:
            return [self._one(it) for it in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="packer-decode")
        return list(self._pool.map(self._one, items))

    def decode(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None) -> List[torch.Tensor]:
        device = torch.device(device)
        arrays = self.decode_host(datas, keys)
        if device.type == "cuda" and arrays:
            return _pinned_upload(arrays, device)
        return [torch.from_numpy(a).to(device) for a in arrays]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
