"""nvJPEG as a batch decoder: ``torchvision.io.decode_jpeg(list, device="cuda")``, batched, with a
per-image libjpeg-turbo fallback.

Grayscale JPEGs are decoded by libjpeg-turbo: torchvision's batched decode runs them through the
hardware JPEG engine, whose RGB output of a one-component JPEG is wrong (nvJPEG 13, torchvision
0.26, H100 and H200: 47 levels of mean error against libjpeg-turbo and nvJPEG's own hybrid
decoder). They are told apart by the store's recorded JPEG facts (``jpeg=``, what the loader
passes to a decoder with ``routes``), else by the frame header.

The decoder of ``decoder="nvjpeg"`` and the choice of ``"auto"`` on a CUDA device where the native
engine (readers/gpu/engine.py) is unavailable. When the batched call fails, the batch is decoded
again one image at a time and each image nvJPEG rejects goes to libjpeg-turbo alone (counted in
``fallbacks``, logged with its key).

Example:
    >>> dec = NvJpegDecoder()                                            # doctest: +SKIP
    >>> imgs = dec.decode(jpeg_tensors, "cuda", keys=keys)               # doctest: +SKIP
"""
from __future__ import annotations

import logging
from typing import List, Optional, Sequence

import torch

from packer.core.errors import DependencyError
from readers.gpu.decoders import DecodeError, Decoder, new_decoder, register_decoder, sniff_jpeg

log = logging.getLogger(__name__)

__all__ = ["NvJpegDecoder"]


def _in_batch(positions: List[int], keys, decode):
    """``decode()`` of the images at ``positions`` of a batch; a DecodeError it raises names the
    image's place in the whole batch (the loader finds the record by it), not in the subset."""
    try:
        return decode()
    except DecodeError as exc:
        if exc.position is None or not 0 <= exc.position < len(positions):
            raise
        pos = positions[exc.position]
        raise DecodeError(pos, keys[pos] if keys is not None else None, exc.reason) from exc


@register_decoder
class NvJpegDecoder(Decoder):
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
        #: grayscale images sent to libjpeg-turbo so far (see the module docstring)
        self.routed_cpu = 0

    @classmethod
    def from_settings(cls, device: torch.device, threads: int) -> "NvJpegDecoder":
        """The decoder ``get_decoder("nvjpeg", device, threads)`` gives: half the threads for the fallback."""
        return cls(fallback_threads=max(1, threads // 2))

    def routes(self, datas: Sequence, jpeg: Optional[Sequence[tuple]] = None) -> List[str]:
        """Per image ``"gpu"`` or ``"cpu"`` (grayscale, see the module docstring). Its presence
        makes the loader pass the store's ``(coding, subsampling)`` facts as ``jpeg``."""
        subs = [j[1] if jpeg is not None and j and j[0] else sniff_jpeg(d)[1]
                for d, j in zip(datas, jpeg if jpeg is not None else [None] * len(datas))]
        return ["cpu" if sub == "gray" else "gpu" for sub in subs]

    def _split(self, tensors: List[torch.Tensor], device, keys, jpeg, gpu_decode):
        """``(None, [])`` when every image goes to nvJPEG; else the batch decoded with grayscale
        images on libjpeg-turbo (``[H, W, C]``) and the rest by ``gpu_decode`` (its own layout), in
        order, and the positions that went to libjpeg-turbo."""
        cpu = [i for i, r in enumerate(self.routes(tensors, jpeg)) if r == "cpu"]
        if not cpu:
            return None, cpu
        gpu = [i for i in range(len(tensors)) if i not in set(cpu)]
        out: List[Optional[torch.Tensor]] = [None] * len(tensors)
        pick = (lambda idx: None if keys is None else [keys[i] for i in idx])  # noqa: E731
        imgs = _in_batch(cpu, keys, lambda: self._cpu().decode([tensors[i] for i in cpu], device, pick(cpu)))
        for i, img in zip(cpu, imgs):
            out[i] = img
        if gpu:
            for i, img in zip(gpu, _in_batch(gpu, keys, lambda: gpu_decode([tensors[i] for i in gpu], pick(gpu)))):
                out[i] = img
        self.routed_cpu += len(cpu)
        return out, cpu

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

    def decode(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None,
               jpeg: Optional[Sequence[tuple]] = None) -> List[torch.Tensor]:
        device = torch.device(device)
        tensors = self._tensors(datas)
        if device.type != "cuda":
            return self._cpu().decode(tensors, device, keys)
        if not tensors:
            return []
        split, _ = self._split(tensors, device, keys, jpeg, lambda ts, ks: self._decode_gpu(ts, device, ks))
        return split if split is not None else self._decode_gpu(tensors, device, keys)

    def _decode_gpu(self, tensors: List[torch.Tensor], device, keys) -> List[torch.Tensor]:
        try:
            return self._gpu(tensors, device)
        except (RuntimeError, ValueError) as exc:
            return self._one_by_one(tensors, device, keys, exc)

    def decode_chw(self, datas: Sequence, device: torch.device, keys: Optional[Sequence[str]] = None,
                   jpeg: Optional[Sequence[tuple]] = None) -> List[torch.Tensor]:
        """The batch as ``[3, H, W]`` uint8 CUDA tensors (nvJPEG's own layout, no view), in the
        order given; images nvJPEG rejects are decoded by libjpeg-turbo (as :meth:`decode`).

        Raises:
            DecodeError: an image libjpeg-turbo cannot decode either.
        """
        tensors = self._tensors(datas)
        split, cpu = self._split(tensors, device, keys, jpeg, lambda ts, ks: self._chw_gpu(ts, device, ks))
        if split is not None:
            on_cpu = set(cpu)
            return [t.permute(2, 0, 1) if i in on_cpu else t for i, t in enumerate(split)]
        return self._chw_gpu(tensors, device, keys)

    def _chw_gpu(self, tensors: List[torch.Tensor], device, keys) -> List[torch.Tensor]:
        try:
            return list(self._tvio.decode_jpeg(tensors, mode=self._tvio.ImageReadMode.RGB, device=device))
        except (RuntimeError, ValueError) as exc:  # one bad image: one by one, CPU fallback
            return [t.permute(2, 0, 1) for t in self._one_by_one(tensors, device, keys, exc)]

    def decode_ragged(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None,
                      jpeg: Optional[Sequence[tuple]] = None):
        """The batch decoded straight into one :class:`gpu_ops.RaggedBatch` (nvJPEG's ``[C, H, W]``
        outputs packed by one C++ call: no per-image Python), the form the pipelines take."""
        from gpu_ops import RaggedBatch

        device = torch.device(device)
        tensors = self._tensors(datas)
        if device.type == "cuda" and tensors:
            split, _ = self._split(tensors, device, keys, jpeg, lambda ts, ks: self._decode_gpu(ts, device, ks))
            if split is not None:  # grayscale among them: decoded apart, then packed
                return RaggedBatch.from_list(split)
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
        idx = [i for i, _ in bad]
        host = _in_batch(idx, keys, lambda: self._cpu().decode([tensors[i] for i in idx], device,
                                                                None if keys is None else [keys[i] for i in idx]))
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
