"""Batch JPEG decode on nvImageCodec: the GPU's hardware JPEG engine and its CUDA decoder at once,
routed by what the store knows, with region-of-interest decode and a libjpeg-turbo fallback.

Optional: ``pip install 'packer-vision[nvimgcodec]'`` (``nvidia-nvimgcodec-cu13`` + ``nvidia-nvjpeg``).

How a batch is decoded (:meth:`NvImageCodecDecoder.decode`):

1. **Routing before decoding.** Each record's JPEG coding and chroma subsampling come from the
   store (``RawBatch.jpeg``, parsed from the SOF marker at build time) or, for stores built before
   those fields, from the first marker segments of the bytes (no decode). Baseline JPEGs with a
   usual subsampling go to the *hardware* decoder; progressive / extended ones to the *CUDA*
   decoder (the hardware engine takes baseline only); anything else (arithmetic coding, lossless,
   odd sampling) to libjpeg-turbo on CPU threads.
2. **The hardware share.** The hardware decoder is one nvImageCodec ``Decoder`` with the backends
   ``HW_GPU_ONLY(load_hint=hw_load)`` then ``HYBRID_CPU_GPU``: nvImageCodec gives about ``hw_load``
   of the batch to the NVJPG engines and decodes the rest at the same time with nvJPEG's hybrid
   decoder (Huffman on CPU threads, the rest in CUDA kernels), as DALI's ``hw_decoder_load`` does.
   ``hw_load=0`` leaves the engine out; ``hw_load=1`` (the default) is the engine alone, which
   measured twice as fast as any split on the H100 (see DEFAULT_HW_LOAD). On a GPU without the
   engine, images it does not take come back undecoded and go to libjpeg-turbo: use ``hw_load=0``.
   (Measured on the H100 with nvImageCodec 0.9: its ``GPU_ONLY`` backend cannot be
   created there, "Could not create decoder. Code: 7", and a ``CPU_ONLY`` backend in the list takes
   a large share of the batch onto the CPU whatever the load hints say (4.4k -> 0.9k img/s at
   1080p), so neither is used.)
3. **ROI.** ``regions`` (one ``(top, left, height, width)`` box or ``None`` per image) decode only
   that window (``CodeStream.get_sub_code_stream(region=...)``): the train pipeline draws its
   random-resized-crop boxes from the stored sizes first (see :mod:`readers.gpu.roi`). A window
   nvImageCodec returns nothing for is decoded whole by the same decoder and cut on the GPU
   (``roi_retries`` counts them) before any CPU fallback.
4. **Fallback.** An image no nvImageCodec backend decodes (it returns ``None``) is decoded by
   libjpeg-turbo alone, counted in ``fallbacks`` and logged with its key; one libjpeg-turbo cannot
   decode either raises :class:`~readers.gpu.decoders.DecodeError` with its position and key.

Output: per image a uint8 ``[H, W, 3]`` (RGB) CUDA tensor that shares nvImageCodec's device buffer
(DLPack, no copy, no host round trip), made on the caller's current CUDA stream: the ragged gpu_ops
kernels read it as HWC, without a permute.

Example:
    >>> dec = NvImageCodecDecoder(hw_load=0.75)                          # doctest: +SKIP
    >>> imgs = dec.decode(list_of_jpeg_tensors, "cuda", keys=keys)       # doctest: +SKIP
    >>> dec.routed                                                       # doctest: +SKIP
    Counter({'hw': 250, 'cuda': 6})
"""
from __future__ import annotations

import collections
import logging
from typing import List, Optional, Sequence

import torch

from packer.core.errors import DependencyError, PackerError, UsageError
from readers.gpu.decoders import DecodeError, Decoder, as_array, new_decoder, register_decoder, sniff_jpeg

log = logging.getLogger(__name__)

__all__ = ["NvImageCodecDecoder", "DEFAULT_HW_LOAD", "route", "sniff_jpeg", "available"]

#: Share of each (baseline) batch given to the hardware JPEG engine; the rest goes to the hybrid
#: decoder at the same time. 1.0 = the engine alone. Measured on an H100 (nvImageCodec 0.9, 1080p
#: photos, batch 256, 12 threads): the engine alone 4.4k img/s at 1.2 CPU cores; engine + hybrid at
#: any load hint 2.2k img/s at 10.5 cores (the hybrid decoder takes most of the batch whatever the
#: hint says). See docs/benchmarks/vs_dali.md.
DEFAULT_HW_LOAD = 1.0

#: Subsamplings the hardware and CUDA decoders take. Grayscale goes to libjpeg-turbo: on the H100
#: with nvImageCodec 0.9, a gray JPEG decoded to RGB inside a mixed batch came back with only its
#: first third written (seen in tests/readers/test_gpu_nvimgcodec.py); gray photos are rare in datasets.
_GPU_SUBSAMPLING = {"444", "422", "420", "440", "411"}
#: JPEG MCU size in pixels at 4:2:0 (the largest usual one): ROI windows start on its multiples.
_MCU = 16
_INSTALL = "pip install 'packer-vision[nvimgcodec]' (nvidia-nvimgcodec-cu13 and nvidia-nvjpeg)"


def _module():
    try:
        from nvidia import nvimgcodec
    except ImportError as exc:
        raise DependencyError(f"the nvImageCodec decoder needs nvImageCodec: {_INSTALL}") from exc
    return nvimgcodec


def available() -> bool:
    """True when nvImageCodec imports and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False
    try:
        _module()
    except PackerError:
        return False
    return True


def route(coding: str, subsampling: str) -> str:
    """Which decoder takes a JPEG: ``"hw"`` (hardware engine + CUDA share), ``"cuda"`` or
    ``"cpu"``; ``""`` when the coding is unknown (the caller sniffs the bytes)."""
    if not coding:
        return ""
    if subsampling not in _GPU_SUBSAMPLING:
        return "cpu"
    if coding == "baseline":
        return "hw"
    if coding in ("extended", "progressive"):
        return "cuda"
    return "cpu"  # arithmetic, lossless, hierarchical: libjpeg-turbo or nothing


@register_decoder
class NvImageCodecDecoder(Decoder):
    """nvImageCodec batch decode (hardware engine + CUDA decoder), routed per record, with ROI
    decode and a per-image libjpeg-turbo fallback. See the module docstring.

    Args:
        device: the CUDA device (default: the current one).
        hw_load: share of each baseline batch sent to the hardware JPEG engine (0..1); the rest
            goes to the CUDA decoder at the same time.
        threads: CPU threads nvImageCodec may use (Huffman decoding of the CUDA path and its CPU
            backend).
        fallback_threads: libjpeg-turbo threads for the CPU route and the fallback.
        load_policy: ``"fixed"`` (the hardware share is ``hw_load``) or ``"adaptive"`` (nvImageCodec
            moves the share to keep both decoders busy, starting from ``hw_load``).
        roi: offer region-of-interest decode to the train pipeline (``supports_roi``); off (the
            default), the loader decodes whole images and crops in the resampling kernel. A
            window nvImageCodec returns nothing for is decoded whole and cut (``roi_retries``).

    Attributes:
        routed: images per route so far (``hw``, ``cuda``, ``cpu``).
        fallbacks: images nvImageCodec did not decode and libjpeg-turbo did (each logged).

    Raises:
        DependencyError: nvImageCodec is not installed, or no CUDA device.
    """

    name = "nvimgcodec"

    def __init__(self, device=None, hw_load: float = DEFAULT_HW_LOAD, threads: int = 4, fallback_threads: int = 2,
                 roi: bool = False, load_policy: str = "fixed"):
        nvi = _module()
        if not torch.cuda.is_available():
            raise DependencyError("the nvImageCodec decoder needs a CUDA device")
        if not 0.0 <= float(hw_load) <= 1.0:
            raise UsageError(f"hw_load must be in [0, 1], got {hw_load!r}")
        self.device = torch.device(device if device is not None else "cuda")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.hw_load = float(hw_load)
        self.supports_roi = bool(roi)
        if load_policy not in ("fixed", "adaptive"):
            raise UsageError(f"load_policy must be 'fixed' or 'adaptive', got {load_policy!r}")
        self.load_policy = load_policy
        B, K = nvi.Backend, nvi.BackendKind
        policy = (nvi.LoadHintPolicy.ADAPTIVE_MINIMIZE_IDLE_TIME if load_policy == "adaptive"
                  else nvi.LoadHintPolicy.FIXED)
        main = ([B(K.HW_GPU_ONLY, load_hint=self.hw_load, load_hint_policy=policy)] if self.hw_load > 0 else []) + (
            [] if self.hw_load >= 1.0 else [B(K.HYBRID_CPU_GPU, load_hint=1.0)])
        threads = max(1, int(threads))
        self._nvi = nvi
        self._hw = nvi.Decoder(device_id=self.device.index, max_num_cpu_threads=threads, backends=main)
        self._cuda = nvi.Decoder(device_id=self.device.index, max_num_cpu_threads=threads,
                                 backends=[B(K.HYBRID_CPU_GPU, load_hint=1.0)])
        # The loader applies the store's EXIF orientation itself: the decoder must not rotate too.
        self._params = nvi.DecodeParams(apply_exif_orientation=False, color_spec=nvi.ColorSpec.SRGB,
                                        sample_format=nvi.SampleFormat.I_RGB)
        self._fallback_threads = fallback_threads
        self._fallback: Optional[Decoder] = None
        self.routed: collections.Counter = collections.Counter()
        self.fallbacks = 0
        #: ROI windows nvImageCodec returned nothing for, decoded whole instead (and cut).
        self.roi_retries = 0

    @classmethod
    def from_settings(cls, device: torch.device, threads: int) -> "NvImageCodecDecoder":
        """The decoder ``get_decoder("nvimgcodec", device, threads)`` gives: half the threads for the fallback."""
        return cls(device, threads=threads, fallback_threads=max(1, threads // 2))

    def _cpu(self) -> Decoder:
        if self._fallback is None:
            self._fallback = new_decoder("turbojpeg", self._fallback_threads)
        return self._fallback

    def routes(self, datas: Sequence, jpeg: Optional[Sequence[tuple]] = None) -> List[str]:
        """The route of each image: from the store's ``(coding, subsampling)`` when known, else
        from the bytes' frame header."""
        out = []
        for i, d in enumerate(datas):
            r = route(*jpeg[i]) if jpeg is not None else ""
            if not r:
                r = route(*sniff_jpeg(d)) or "cuda"  # no frame header: let the decoder say so
            out.append(r)
        return out

    def decode(self, datas: Sequence, device=None, keys: Optional[Sequence[str]] = None,
               regions: Optional[Sequence[Optional[Sequence[int]]]] = None,
               jpeg: Optional[Sequence[tuple]] = None) -> List[torch.Tensor]:
        """Decodes a batch; returns ``[H, W, 3]`` uint8 CUDA tensors in the order given.

        Args:
            datas: JPEG bytes per image (1-D uint8 CPU tensors, pinned or not, or bytes-like).
            device: must be this decoder's device (or None).
            keys: names used in errors and fallback logs.
            regions: per image ``(top, left, height, width)`` to decode only that window, or None.
            jpeg: per image ``(coding, subsampling)`` as stored (``RawBatch.jpeg``), or None.

        Raises:
            DecodeError: an image neither nvImageCodec nor libjpeg-turbo decodes (``position``
                and ``key`` name it).
        """
        if device is not None and torch.device(device).type != "cuda":
            return self._cpu().decode(datas, device, keys) if regions is None else [
                _crop(t, r) for t, r in zip(self._cpu().decode(datas, device, keys), regions)]
        if jpeg is not None and len(jpeg) != len(datas):
            jpeg = None  # hints that do not line up are ignored, never misapplied
        n = len(datas)
        out: List[Optional[torch.Tensor]] = [None] * n
        groups = collections.defaultdict(list)
        for i, r in enumerate(self.routes(datas, jpeg)):
            groups[r].append(i)
        stream = torch.cuda.current_stream(self.device)
        failed: List[int] = list(groups.get("cpu", ()))
        for r, dec in (("hw", self._hw), ("cuda", self._cuda)):
            idx = groups.get(r)
            if not idx:
                continue
            self.routed[r] += len(idx)
            got = self._nv_decode(dec, idx, datas, regions, stream)
            if regions is not None:
                # A window nvImageCodec returned nothing for: the whole image, cut on the GPU,
                # before any CPU fallback (seen in batches on the H100 with nvImageCodec 0.9,
                # while the same windows decoded one at a time).
                again = [i for i in idx if got[i] is None and regions[i] is not None]
                if again:
                    self.roi_retries += len(again)
                    whole = self._nv_decode(dec, again, datas, None, stream)
                    for i in again:
                        if whole[i] is not None:
                            got[i] = _crop_view(whole[i], regions[i])
            for i in idx:
                if got[i] is None:
                    failed.append(i)
                else:
                    out[i] = got[i]
        if failed:
            self.routed["cpu"] += len(groups.get("cpu", ()))
            self._decode_cpu(datas, keys, regions, sorted(failed), set(groups.get("cpu", ())), out)
        return out  # type: ignore[return-value]

    def _nv_decode(self, dec, idx, datas, regions, stream) -> dict:
        """``{i: [H, W, 3] CUDA tensor or None}`` for the images ``idx`` through nvImageCodec
        decoder ``dec`` (windows where ``regions`` gives one)."""
        imgs = None
        if regions is None:  # whole images: hand nvImageCodec the arrays (its code streams are made in C++)
            try:
                imgs = dec.decode([as_array(datas[i]) for i in idx], params=self._params,
                                  cuda_stream=stream.cuda_stream)
            except TypeError:  # a version that takes code streams only
                imgs = None
        trim = {}
        parents = []  # kept alive until the batch is decoded (a sub-code-stream refers to its parent)
        if imgs is None:
            streams = []
            for i in idx:
                cs = self._nvi.CodeStream(as_array(datas[i]))
                box = None if regions is None else regions[i]
                if box is not None:
                    t, l, h, w = (int(v) for v in box)
                    # The window's start moved back to an MCU corner (16 px covers every usual
                    # sampling); the decoded window is then cut to the box (a view).
                    t0, l0 = t - t % _MCU, l - l % _MCU
                    parents.append(cs)
                    cs = cs.get_sub_code_stream(region=self._nvi.Region(t0, l0, t + h, l + w))
                    trim[i] = (t - t0, l - l0, h, w)
                streams.append(cs)
            imgs = dec.decode(streams, params=self._params, cuda_stream=stream.cuda_stream)
        got = {}
        for i, img in zip(idx, imgs):
            t = None if img is None else torch.from_dlpack(img)
            if t is not None and i in trim:
                dt, dl, h, w = trim[i]
                t = t[dt : dt + h, dl : dl + w] if t.shape[0] >= dt + h and t.shape[1] >= dl + w else None
            got[i] = t
        del parents
        return got

    def _decode_cpu(self, datas, keys, regions, idx, routed_cpu, out) -> None:
        try:
            host = self._cpu().decode([datas[i] for i in idx], self.device,
                                      None if keys is None else [keys[i] for i in idx])
        except DecodeError as exc:  # position within the sub-batch -> position in the batch
            pos = idx[exc.position]
            raise DecodeError(pos, None if keys is None else keys[pos], exc.reason) from exc
        fell = [i for i in idx if i not in routed_cpu]
        if fell:  # one line per batch, not per image
            self.fallbacks += len(fell)
            names = [keys[i] if keys is not None else f"image {i}" for i in fell]
            log.warning("nvImageCodec did not decode %d image(s) (%s%s); decoded with libjpeg-turbo instead "
                        "(%d fallbacks so far)", len(fell), ", ".join(names[:3]), ", ..." if len(fell) > 3 else "",
                        self.fallbacks)
        for i, img in zip(idx, host):
            out[i] = img if regions is None else _crop(img, regions[i])

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None


def _crop_view(img: torch.Tensor, box) -> torch.Tensor:
    t, l, h, w = (int(v) for v in box)
    return img[t : t + h, l : l + w]


def _crop(img: torch.Tensor, box) -> torch.Tensor:
    if box is None:
        return img
    t, l, h, w = (int(v) for v in box)
    return img[t : t + h, l : l + w].contiguous()
