"""nvJPEG as a batch decoder: ``torchvision.io.decode_jpeg(list, device="cuda")``, batched, with a
per-image libjpeg-turbo fallback.

The decoder of ``decoder="nvjpeg"`` and the first choice of ``"auto"`` on a CUDA device. When the
batched call fails, the batch is decoded again one image at a time and each image nvJPEG rejects
goes to libjpeg-turbo alone (counted in ``fallbacks``, logged with its key).

Example:
    >>> dec = NvJpegDecoder()                                            # doctest: +SKIP
    >>> imgs = dec.decode(jpeg_tensors, "cuda", keys=keys)               # doctest: +SKIP
"""
from __future__ import annotations

import logging
from typing import List, Optional, Sequence

import torch

from packer.core.errors import DependencyError
from readers.gpu.decoders import Decoder, new_decoder, register_decoder

log = logging.getLogger(__name__)

__all__ = ["NvJpegDecoder"]


@register_decoder
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
            raise DependencyError("GPU decode needs torchvision (pip install 'packer-vision[gpu]' or torchvision "
                                  "matching your torch)") from exc
        self._tvio = tvio
        self._fallback: Optional[Decoder] = None
        self._fallback_threads = fallback_threads
        self.fallbacks = 0

    @classmethod
    def from_settings(cls, device: torch.device, threads: int) -> "NvJpegDecoder":
        """The decoder ``get_decoder("nvjpeg", device, threads)`` gives: half the threads for the fallback."""
        return cls(fallback_threads=max(1, threads // 2))

    def _cpu(self) -> Decoder:
        if self._fallback is None:
            self._fallback = new_decoder("turbojpeg", self._fallback_threads)
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

    def decode_chw(self, datas: Sequence, device: torch.device,
                   keys: Optional[Sequence[str]] = None) -> List[torch.Tensor]:
        """The batch as ``[3, H, W]`` uint8 CUDA tensors (nvJPEG's own layout, no view), in the
        order given; images nvJPEG rejects are decoded by libjpeg-turbo (as :meth:`decode`).

        Raises:
            DecodeError: an image libjpeg-turbo cannot decode either.
        """
        tensors = self._tensors(datas)
        try:
            return list(self._tvio.decode_jpeg(tensors, mode=self._tvio.ImageReadMode.RGB, device=device))
        except (RuntimeError, ValueError) as exc:  # one bad image: one by one, CPU fallback
            return [t.permute(2, 0, 1) for t in self._one_by_one(tensors, device, keys, exc)]

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
