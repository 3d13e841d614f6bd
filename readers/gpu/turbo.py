"""libjpeg-turbo as a batch decoder: CPU threads, then one host-to-device copy.

:meth:`TurboJpegDecoder.decode_ragged` hands the loader one :class:`gpu_ops.RaggedBatch`: the
images packed by one C++ copy (the GIL released) into one pinned buffer, one copy to the device,
and the pipeline takes that batch as it is (a list of images is packed once more, on the device).

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

from readers.gpu.decoders import DecodeError, Decoder, as_array, register_decoder

__all__ = ["TurboJpegDecoder"]


def _upload(arrays: List[np.ndarray], device: torch.device):
    """``[H, W, 3]`` uint8 host images (at least one) -> ``(data, index)``: ``data`` on ``device``,
    the images back to back, packed by one C++ copy (the GIL released) into one host buffer,
    pinned for CUDA, then one asynchronous copy; ``index`` ``[B, 3]`` (offset, height, width) on
    the host."""
    if any(a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8 for a in arrays):
        raise ValueError("turbojpeg: expected [H, W, 3] uint8 images, got "
                         f"{sorted({(a.dtype.name, a.shape[2:]) for a in arrays})}")
    sizes = torch.tensor([a.shape[:2] for a in arrays], dtype=torch.int64)
    numels = sizes[:, 0] * sizes[:, 1] * 3
    host = torch.empty(int(numels.sum()), dtype=torch.uint8, pin_memory=device.type == "cuda")
    torch.cat([torch.from_numpy(a).reshape(-1) for a in arrays], out=host)
    data = host if device.type == "cpu" else host.to(device, non_blocking=True)
    return data, torch.cat([(torch.cumsum(numels, 0) - numels)[:, None], sizes], dim=1)


@register_decoder
class TurboJpegDecoder(Decoder):
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
        return list(self._executor().map(self._one, items))

    def _executor(self) -> ThreadPoolExecutor:
        """The decode threads (``threads`` of them, started at first use, ended by :meth:`close`)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="packer-decode")
        return self._pool

    def decode(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None) -> List[torch.Tensor]:
        return self._to_device(self.decode_host(datas, keys), torch.device(device))

    @staticmethod
    def _to_device(arrays: List[np.ndarray], device: torch.device) -> List[torch.Tensor]:
        """Host ``[H, W, 3]`` images on ``device``: for CUDA one pinned buffer, one copy, views of it."""
        if device.type == "cuda" and arrays:
            data, index = _upload(arrays, device)
            return [data[o:o + h * w * 3].view(h, w, 3) for o, h, w in index.tolist()]
        return [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]

    def decode_ragged(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None):
        """The batch as one HWC :class:`gpu_ops.RaggedBatch` on ``device`` (see the module
        docstring), what the pipelines take in one launch.

        Raises:
            DecodeError: an image libjpeg-turbo does not decode (its position and key).
        """
        from gpu_ops import RaggedBatch
        from gpu_ops.ragged import to_device

        device = torch.device(device)
        arrays = self.decode_host(datas, keys)
        if not arrays:
            return RaggedBatch.from_list([], device=device)
        data, index = _upload(arrays, device)
        return RaggedBatch(data, to_device(index, device), index[:, 1:].clone(), 3, "HWC")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
