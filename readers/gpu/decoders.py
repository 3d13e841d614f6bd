"""Batch JPEG decoders behind one small interface, so backends can be swapped (nvImageCodec next).

A decoder is any object with::

    name: str
    decode(datas, device, keys=None) -> list of uint8 [H, W, C] tensors on `device`

``datas`` are 1-D uint8 CPU tensors (or bytes-like) of JPEG files; images come back in the order
given, RGB (C = 3). A tensor may be stored channels first (a ``[C, H, W]`` decode viewed as HWC):
:class:`gpu_ops.RaggedBatch` packs either without a transposing copy. A decoder raises
:class:`DecodeError` (with the position of the bad image in the batch) for data it cannot decode.

* :class:`NvJpegDecoder`: ``torchvision.io.decode_jpeg(list, device="cuda")`` (batched nvJPEG). An
  image nvJPEG rejects is decoded with libjpeg-turbo alone (the rest of the batch stays on the
  GPU); each fallback is counted in ``fallbacks`` and logged with its key.
* :class:`TurboJpegDecoder`: libjpeg-turbo on CPU threads, then one host-to-device copy.

:func:`get_decoder` picks ``"auto"``: nvJPEG when torchvision and CUDA are there, else libjpeg-turbo
with one log line saying why.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence

import numpy as np
import torch

from packer.errors import PackerError

log = logging.getLogger(__name__)

__all__ = ["DecodeError", "NvJpegDecoder", "TurboJpegDecoder", "get_decoder", "DECODERS"]


class DecodeError(PackerError):
    """An image of a batch does not decode; ``position`` is its place in the batch."""

    def __init__(self, position: int, key: Optional[str] = None, reason: Optional[str] = None):
        if reason is None:   # a message alone (see PackerError): position and key are not known apart
            super().__init__(position)
            self.position, self.key, self.reason = None, None, position
            return
        self.position, self.key, self.reason = position, key, reason
        super().__init__(f"{key if key is not None else f'image {position}'}: JPEG does not decode: {reason}")


def _as_array(data) -> np.ndarray:
    if isinstance(data, torch.Tensor):
        return data.numpy()
    return np.frombuffer(data, dtype=np.uint8)


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


class TurboJpegDecoder:
    """libjpeg-turbo on ``threads`` CPU threads (it releases the GIL), strict: a decoder warning
    (truncated or corrupt data) is an error, never grey padding.

    Example:
        >>> imgs = TurboJpegDecoder(threads=4).decode(list_of_jpeg_bytes, "cpu")   # doctest: +SKIP
    """

    name = "turbojpeg"

    def __init__(self, threads: int = 4):
        from packer.integrity import turbojpeg

        turbojpeg()  # fail now, with the install hint, when libturbojpeg is missing
        self.threads = max(1, int(threads))
        self._pool: Optional[ThreadPoolExecutor] = None

    def _one(self, item):
        pos, data, key = item
        from packer.integrity import turbo_decode

        try:
            arr = turbo_decode(_as_array(data), pixel_format="rgb", strict=True)
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


class NvJpegDecoder:
    """Batched nvJPEG through ``torchvision.io.decode_jpeg(list, device=...)``, with a per-image
    libjpeg-turbo fallback.

    Args:
        fallback_threads: CPU threads of the libjpeg-turbo fallback.

    Attributes:
        fallbacks: images decoded by the fallback so far (each is logged with its key).

    Raises:
        DependencyError: torchvision is not installed.
    """

    name = "nvjpeg"

    def __init__(self, fallback_threads: int = 2):
        try:
            import torchvision.io as tvio
        except ImportError as exc:
            from packer.errors import DependencyError

            raise DependencyError("GPU decode needs torchvision (pip install 'packer-vision[gpu]' or torchvision "
                                  "matching your torch)") from exc
        self._tvio = tvio
        self._fallback: Optional[TurboJpegDecoder] = None
        self._fallback_threads = fallback_threads
        self.fallbacks = 0

    def _cpu(self) -> TurboJpegDecoder:
        if self._fallback is None:
            self._fallback = TurboJpegDecoder(self._fallback_threads)
        return self._fallback

    def _gpu(self, datas: List[torch.Tensor], device) -> List[torch.Tensor]:
        out = self._tvio.decode_jpeg(datas, mode=self._tvio.ImageReadMode.RGB, device=device)
        return [t.permute(1, 2, 0) for t in out]  # CHW storage, HWC view

    @staticmethod
    def _tensors(datas: Sequence) -> List[torch.Tensor]:
        return [d if isinstance(d, torch.Tensor) else torch.frombuffer(bytearray(d), dtype=torch.uint8)
                for d in datas]

    def decode(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None) -> List[torch.Tensor]:
        device = torch.device(device)
        tensors = self._tensors(datas)
        if device.type != "cuda":
            return self._cpu().decode(tensors, device, keys)
        if not tensors:
            return []
        try:
            return self._gpu(tensors, device)
        except (RuntimeError, ValueError) as exc:
            return self._one_by_one(tensors, device, keys, exc)

    def decode_ragged(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None):
        """The batch decoded straight into one :class:`gpu_ops.RaggedBatch` (nvJPEG's ``[C, H, W]``
        outputs packed by one C++ call: no per-image Python), the form the pipelines take."""
        from gpu_ops import RaggedBatch

        device = torch.device(device)
        tensors = self._tensors(datas)
        if device.type == "cuda" and tensors:
            try:
                chw = self._tvio.decode_jpeg(tensors, mode=self._tvio.ImageReadMode.RGB, device=device)
            except (RuntimeError, ValueError) as exc:
                return RaggedBatch.from_list(self._one_by_one(tensors, device, keys, exc))
            return RaggedBatch.from_chw(chw)
        return RaggedBatch.from_list(self.decode(tensors, device, keys))

    def _one_by_one(self, tensors: List[torch.Tensor], device, keys, batch_error: BaseException) -> List[torch.Tensor]:
        """After the batched call failed: each image alone, the ones nvJPEG rejects on the CPU."""
        out: List[Optional[torch.Tensor]] = [None] * len(tensors)
        bad = []
        for i, t in enumerate(tensors):
            try:
                out[i] = self._gpu([t], device)[0]
            except (RuntimeError, ValueError) as exc:
                bad.append((i, exc))
        if not bad:  # the batch failed but every image alone decodes: a real nvJPEG problem
            raise batch_error
        host = self._cpu().decode([tensors[i] for i, _ in bad], device,
                                  None if keys is None else [keys[i] for i, _ in bad])
        for (i, exc), img in zip(bad, host):
            self.fallbacks += 1
            key = keys[i] if keys is not None else f"image {i}"
            log.warning("nvJPEG rejected %s (%s); decoded with libjpeg-turbo instead (%d fallbacks so far)",
                        key, str(exc).splitlines()[0][:200], self.fallbacks)
            out[i] = img
        return out  # type: ignore[return-value]

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()


DECODERS = ("auto", "nvimgcodec", "nvjpeg", "split", "turbojpeg")


def _auto(device: torch.device, threads: int):
    """On a CUDA device: torchvision's batched nvJPEG, else nvImageCodec, else libjpeg-turbo on
    the CPU; says why it stepped down.

    nvJPEG comes first because it measured fastest inside GPULoader on the H100 (1080p: 3.6-3.8k
    img/s at 1.8 CPU cores against nvImageCodec's 1.0-1.4k; ~500 px: 6.1-6.7k against 4.5k; README,
    "packer vs DALI"). Pass ``decoder="nvimgcodec"`` for the hardware JPEG engine."""
    if device.type != "cuda":
        return TurboJpegDecoder(threads)
    try:
        return NvJpegDecoder(fallback_threads=max(1, threads // 2))
    except PackerError as exc:
        log.info("torchvision nvJPEG unavailable (%s); trying nvImageCodec", exc)
    from .nvimgcodec import NvImageCodecDecoder

    try:
        return NvImageCodecDecoder(device, threads=threads, fallback_threads=max(1, threads // 2))
    except PackerError as exc:
        log.warning("GPU decode unavailable (%s); decoding on the CPU with libjpeg-turbo", exc)
    return TurboJpegDecoder(threads)


def get_decoder(name="auto", device="cuda", threads: int = 4):
    """A decoder by name (or a decoder object, returned as is).

    ``"auto"``: on a CUDA device torchvision's nvJPEG, else nvImageCodec (readers/gpu/nvimgcodec.py)
    when it imports, else libjpeg-turbo (see :func:`_auto` for why in this order); the choice is
    logged (``decoder: NAME``) and is the returned object's ``name`` (``GPULoader.decoder.name``).

    Raises:
        UsageError: unknown name.
    """
    if not isinstance(name, str):
        return name
    device = torch.device(device)
    if name == "auto":
        dec = _auto(device, threads)
        log.info("decoder: %s (auto)", dec.name)
        return dec
    if name == "nvimgcodec":
        from .nvimgcodec import NvImageCodecDecoder

        return NvImageCodecDecoder(device, threads=threads, fallback_threads=max(1, threads // 2))
    if name == "nvjpeg":
        return NvJpegDecoder(fallback_threads=max(1, threads // 2))
    if name == "split":
        from .split import SplitDecoder

        return SplitDecoder(device, threads=threads, fallback_threads=max(1, threads // 2))
    if name == "turbojpeg":
        return TurboJpegDecoder(threads)
    from packer.errors import UsageError

    raise UsageError(f"decoder must be one of {DECODERS} or a decoder object, got {name!r}")
