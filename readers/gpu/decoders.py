"""The decoder contract: what a batch JPEG decoder is (:class:`Decoder`), its error, and the registry
that names them.

Every decoder module (:mod:`readers.gpu.turbo`, :mod:`readers.gpu.nvjpeg`,
:mod:`readers.gpu.nvimgcodec`, :mod:`readers.gpu.split`, :mod:`readers.gpu.engine`;
:mod:`readers.gpu.cpucrops` extends turbo's) imports this module and none imports another: a
decoder that needs another one (a CPU fallback, the parts of the split decoder) builds it by name
with :func:`new_decoder`. The import-linter contracts in ``pyproject.toml`` check this.

A decoder subclasses :class:`Decoder`, the contract: ``name`` and ``decode(datas, device, keys=None)
-> list of uint8 [H, W, C] tensors on device`` are required, every other part has a "not supported"
default (listed in :class:`Decoder`), and what a decoder implements sets the capability flags
(``decodes_ragged``, ``decodes_parts``, ``submits``, ``takes_jpeg``; ``supports_roi`` it sets itself)
that the decode dispatch (:func:`readers.gpu.roi.decode_batch`, :func:`readers.gpu.roi.submit_batch`)
reads. ``datas`` are 1-D uint8 CPU tensors (or bytes-like) of JPEG files; images come back in the
order given, RGB (C = 3). A tensor may be stored channels first (a ``[C, H, W]`` decode viewed as
HWC): :class:`gpu_ops.RaggedBatch` packs either without a transposing copy. A decoder raises
:class:`DecodeError` (with the position of the bad image in the batch) for data it cannot decode.
An object that does not subclass :class:`Decoder` (duck-typed, as decoders were before the
contract) is taken as it is: :func:`adopt` finds its methods once.

A registered decoder class's ``from_settings(device, threads)`` (default ``cls()``) is the decoder
:func:`get_decoder` gives for that name.

* ``"nvjpeg"`` :class:`~readers.gpu.nvjpeg.NvJpegDecoder`: ``torchvision.io.decode_jpeg(list,
  device="cuda")`` (batched nvJPEG). An image nvJPEG rejects is decoded with libjpeg-turbo alone (the
  rest of the batch stays on the GPU); each fallback is counted in ``fallbacks`` and logged with its key.
* ``"turbojpeg"`` :class:`~readers.gpu.turbo.TurboJpegDecoder`: libjpeg-turbo on CPU threads, then
  one host-to-device copy (the pipelines get one ragged batch).
* ``"nvimgcodec"``, ``"split"``: the hardware JPEG engine (see those modules).

:func:`get_decoder` picks ``"auto"``: the native engine (``"engine"``) on a CUDA device where it
builds and loads, else nvJPEG when torchvision is there, else nvImageCodec, else libjpeg-turbo,
with one log line saying why.

Example:
    >>> from readers.gpu import get_decoder
    >>> get_decoder("turbojpeg", "cpu").name
    'turbojpeg'
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Type

import numpy as np
import torch

from packer.core.errors import PackerError, UsageError

log = logging.getLogger(__name__)

__all__ = ["DecodeError", "Decoder", "CAPABILITIES", "adopt", "get_decoder", "new_decoder", "register_decoder",
           "available_decoders", "as_array", "sniff_jpeg", "DECODERS"]


class DecodeError(PackerError):
    """An image of a batch does not decode; ``position`` is its place in the batch."""

    def __init__(self, position: int, key: Optional[str] = None, reason: Optional[str] = None):
        if reason is None:   # a message alone (see PackerError): position and key are not known apart
            super().__init__(position)
            self.position, self.key, self.reason = None, None, position
            return
        self.position, self.key, self.reason = position, key, reason
        super().__init__(f"{key if key is not None else f'image {position}'}: JPEG does not decode: {reason}")


#: The capability flags a Decoder subclass gets from the methods it implements (all of them).
CAPABILITIES = {"decodes_ragged": ("decode_ragged",), "decodes_parts": ("decode_parts",),
                "submits": ("submit_parts", "collect"), "takes_jpeg": ("routes",)}


class Decoder:
    """The decoder contract: a batch JPEG decoder, what it may offer, and the defaults where it does not.

    Required: ``name`` (the registry's name for it) and :meth:`decode`. Optional, each with the
    default here: :meth:`decode_ragged`, :meth:`decode_parts`, :meth:`submit_parts` with
    :meth:`collect`, :meth:`routes` (each raises ``NotImplementedError``: not supported),
    :meth:`bind_pipeline` and :meth:`close` (do nothing), :meth:`from_settings` (``cls()``).

    The dispatch (:mod:`readers.gpu.roi`) never probes for methods: it reads these flags.
    ``decodes_ragged``, ``decodes_parts``, ``submits`` (``submit_parts`` and ``collect``) and
    ``takes_jpeg`` (``routes``: the decoder's ``decode``/``decode_ragged`` take the store's JPEG
    facts as ``jpeg=``) are set on each subclass from the methods it implements; a class that sets a
    flag itself keeps it, and one that sets a method to None withdraws it. ``supports_roi``
    (``decode(..., regions=)`` decodes windows, see :mod:`readers.gpu.roi`) is False unless the
    decoder sets it, on the class or the instance.

    Example:
        >>> class Grey(Decoder):
        ...     name = "grey"
        ...     def decode(self, datas, device, keys=None):
        ...         return [torch.full((2, 2, 3), 128, dtype=torch.uint8, device=device) for _ in datas]
        >>> Grey().decodes_ragged, Grey().supports_roi, Grey.submits
        (False, False, False)
    """

    name: str
    supports_roi: bool = False
    decodes_ragged: bool = False
    decodes_parts: bool = False
    submits: bool = False
    takes_jpeg: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for flag, methods in CAPABILITIES.items():
            if flag not in cls.__dict__:
                setattr(cls, flag, all(_implements(cls, m) for m in methods))

    @classmethod
    def from_settings(cls, device: torch.device, threads: int) -> "Decoder":
        """The decoder ``get_decoder(name, device, threads)`` gives (default: ``cls()``)."""
        return cls()

    def decode(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None) -> List[torch.Tensor]:
        """``[H, W, 3]`` uint8 images on ``device``, in the order given (required). A decoder
        with ``takes_jpeg`` also takes ``jpeg=`` (per image ``(coding, subsampling)`` or None), one
        with ``supports_roi`` ``regions=`` (per image ``(top, left, height, width)`` or None).

        Raises:
            DecodeError: an image that does not decode, with its batch position and key.
        """
        raise NotImplementedError(f"{type(self).__name__}: a decoder must implement decode()")

    def decode_ragged(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None, **kwargs):
        """The batch as one HWC :class:`gpu_ops.RaggedBatch` on ``device`` (``decodes_ragged``)."""
        raise self._unsupported("decode_ragged")

    def decode_parts(self, buffers: Sequence[torch.Tensor], parts, keys: Optional[Sequence[str]] = None,
                     regions=None):
        """The batch from the reader's host ``buffers`` and ``(buffer, offset, length)`` ``parts``
        read in place, as one HWC RaggedBatch; ``regions`` as in :meth:`decode` (``decodes_parts``)."""
        raise self._unsupported("decode_parts")

    def submit_parts(self, buffers: Sequence[torch.Tensor], parts, keys: Optional[Sequence[str]] = None,
                     regions=None):
        """Queues the batch of :meth:`decode_parts` and returns at once a handle for :meth:`collect`
        (``submits``: the loader keeps two batches in flight)."""
        raise self._unsupported("submit_parts")

    def collect(self, pending):
        """The RaggedBatch of a batch :meth:`submit_parts` queued (waits for it); raises
        :class:`DecodeError` as :meth:`decode` does."""
        raise self._unsupported("collect")

    def routes(self, datas: Sequence, jpeg: Optional[Sequence[tuple]] = None) -> List[str]:
        """Per image the route it takes inside the decoder, from the store's ``(coding,
        subsampling)`` facts or the bytes (``takes_jpeg``)."""
        raise self._unsupported("routes")

    def bind_pipeline(self, pipeline, device=None) -> None:
        """Called once by the loader with its pipeline and device (default: nothing to do)."""

    def close(self) -> None:
        """Frees threads and buffers (default: nothing to free); the loader calls it on exit."""

    def _unsupported(self, method: str) -> NotImplementedError:
        return NotImplementedError(f"decoder {getattr(self, 'name', type(self).__name__)!r} does not support "
                                   f"{method}() (its capability flags say which parts it has)")


def _implements(cls: Type, method: str) -> bool:
    """``cls`` has ``method``, callable, other than the contract's default."""
    fn = getattr(cls, method, None)
    return callable(fn) and fn is not Decoder.__dict__[method]


class _Adopted(Decoder):
    """A decoder object that does not subclass :class:`Decoder`, behind the contract: its methods
    looked up once (:func:`adopt`), ``supports_roi`` read from it at each batch."""

    def __init__(self, obj):
        self.obj = obj
        self.name = getattr(obj, "name", type(obj).__name__)
        for flag, methods in CAPABILITIES.items():
            setattr(self, flag, all(callable(getattr(obj, m, None)) for m in methods))

    @property
    def supports_roi(self) -> bool:
        return bool(getattr(self.obj, "supports_roi", False))

    def decode(self, datas, device, keys=None, **kwargs):
        return self.obj.decode(datas, device, keys, **kwargs)

    def decode_ragged(self, datas, device, keys=None, **kwargs):
        return self.obj.decode_ragged(datas, device, keys, **kwargs)

    def decode_parts(self, buffers, parts, keys=None, regions=None):
        return self.obj.decode_parts(buffers, parts, keys, regions)

    def submit_parts(self, buffers, parts, keys=None, regions=None):
        return self.obj.submit_parts(buffers, parts, keys, regions)

    def collect(self, pending):
        return self.obj.collect(pending)

    def routes(self, datas, jpeg=None):
        return self.obj.routes(datas, jpeg)

    def bind_pipeline(self, pipeline, device=None) -> None:
        bind = getattr(self.obj, "bind_pipeline", None)
        if callable(bind):
            bind(pipeline, device)

    def close(self) -> None:
        close = getattr(self.obj, "close", None)
        if callable(close):
            close()


def adopt(decoder) -> Decoder:
    """``decoder`` as a :class:`Decoder`: itself when it subclasses the contract, else (a
    duck-typed object) wrapped so that the dispatch reads the same flags and defaults."""
    return decoder if isinstance(decoder, Decoder) else _Adopted(decoder)


#: The decoders a name selects, in the order of the error message; "auto" picks one of them.
DECODERS = ("auto", "cpu-crops", "nvimgcodec", "nvjpeg", "split", "turbojpeg")

_REGISTRY: Dict[str, Type] = {}


def register_decoder(cls: Type) -> Type:
    """Class decorator: makes ``cls`` selectable by its ``name`` (:func:`get_decoder`,
    :func:`new_decoder`). ``cls`` subclasses :class:`Decoder` (its ``from_settings(device, threads)``
    builds it).

    Example:
        >>> @register_decoder                                            # doctest: +SKIP
        ... class MyDecoder(Decoder):
        ...     name = "mine"
        ...     def decode(self, datas, device, keys=None): ...
    """
    _REGISTRY[cls.name] = cls
    return cls


def available_decoders() -> Tuple[str, ...]:
    """The names :func:`get_decoder` takes: ``"auto"`` and every registered decoder."""
    return ("auto",) + tuple(sorted(_REGISTRY))


def sniff_jpeg(data) -> Tuple[str, str]:
    """``(coding, subsampling)`` of a JPEG from the marker segments before the first scan, without decoding
    (for records of stores built before the store kept them). ``("", "")`` when no frame header
    is found (the decoders then say what is wrong)."""
    from packer.core.integrity import SOF_NAMES, chroma_subsampling

    b = as_array(data)
    n, pos = len(b), 2
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        return "", ""
    while pos + 4 <= n:
        if b[pos] != 0xFF:
            return "", ""
        marker = int(b[pos + 1])
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # standalone
            pos += 2
            continue
        seg_len = (int(b[pos + 2]) << 8) | int(b[pos + 3])
        if marker in SOF_NAMES:
            seg = b[pos + 4 : pos + 2 + seg_len].tobytes()
            comps = seg[5] if len(seg) > 5 else 0
            sampling = tuple((seg[7 + 3 * c] >> 4, seg[7 + 3 * c] & 15) for c in range(comps) if 8 + 3 * c < len(seg))
            return SOF_NAMES[marker], chroma_subsampling(sampling)
        if marker in (0xDA, 0xD9):
            return "", ""
        pos += 2 + seg_len
    return "", ""


def _decoder_class(name: str) -> Type:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UsageError(f"decoder must be one of {available_decoders()} or a decoder object, got {name!r}") from None


def new_decoder(name: str, *args, **kwargs) -> Decoder:
    """The registered decoder ``name`` built with these constructor arguments (how a decoder gets
    another one, e.g. its libjpeg-turbo fallback, without importing its module).

    Raises:
        UsageError: unknown name.
    """
    return _decoder_class(name)(*args, **kwargs)


def as_array(data) -> np.ndarray:
    """JPEG bytes (a 1-D uint8 CPU tensor or bytes-like) as a uint8 numpy array, without a copy."""
    if isinstance(data, torch.Tensor):
        return data.numpy()
    return np.frombuffer(data, dtype=np.uint8)


def _auto(device: torch.device, threads: int):
    """On a CUDA device: the native engine (readers/gpu/engine.py), else torchvision's batched
    nvJPEG, else nvImageCodec, else libjpeg-turbo on the CPU; says why it stepped down.

    The engine measured fastest inside GPULoader (1.14-1.54x torchvision's nvJPEG on the H100,
    docs/benchmarks/vs_dali.md); nvJPEG before nvImageCodec because it measured faster there
    (1080p: 3.6-3.8k img/s at 1.8 CPU cores against nvImageCodec's 1.0-1.4k; ~500 px: 6.1-6.7k
    against 4.5k)."""
    make: Callable = lambda name: _decoder_class(name).from_settings(device, threads)  # noqa: E731
    if device.type != "cuda":
        return make("turbojpeg")
    try:
        return make("engine")
    except PackerError as exc:
        log.info("native engine unavailable (%s); trying torchvision nvJPEG", exc)
    try:
        return make("nvjpeg")
    except PackerError as exc:
        log.info("torchvision nvJPEG unavailable (%s); trying nvImageCodec", exc)
    try:
        return make("nvimgcodec")
    except PackerError as exc:
        log.warning("GPU decode unavailable (%s); decoding on the CPU with libjpeg-turbo", exc)
    return make("turbojpeg")


def get_decoder(name="auto", device="cuda", threads: int = 4):
    """A decoder by name (or a decoder object, returned as is).

    ``"auto"``: on a CUDA device the native engine, else torchvision's nvJPEG, else nvImageCodec
    (readers/gpu/nvimgcodec.py) when it imports, else libjpeg-turbo (see :func:`_auto` for why in
    this order); the choice is logged (``decoder: NAME``) and is the returned object's ``name``
    (``GPULoader.decoder.name``).

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
    return _decoder_class(name).from_settings(device, threads)
