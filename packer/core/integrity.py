"""Image checks on the way in: magic-byte sniffing, JPEG structure, full decode, conversion.

:func:`process_image` is the one entry point the build uses: it takes the raw bytes of one
input file and returns the JPEG bytes to store (the original when it passes every check,
otherwise a baseline RGB re-encode with the reason recorded), or raises
:class:`~packer.core.errors.ImageError` naming the file and what is wrong.

Checks, in order:

1. magic bytes decide the type (a PNG named ``.jpg`` is a PNG; gzip or text is "not an image");
2. JPEG structure: SOI, marker segments with valid lengths, a frame header (SOF), at least one
   scan (SOS) with entropy-coded data, EOI; bytes after EOI are trimmed and noted;
3. a full decode with libjpeg-turbo in which decoder warnings ("premature end of data
   segment", "corrupt JPEG data") are errors, never padding;
4. EXIF orientation is applied (re-encode) or recorded for the reader, by option.

JPEGs libjpeg-turbo cannot decode to RGB (CMYK/YCCK, lossless) and non-JPEG images are
decoded with OpenCV and re-encoded as baseline RGB JPEG at the chosen quality. GIF, HEIC/HEIF
and AVIF go through Pillow (HEIC with the ``pillow-heif`` plugin, AVIF with Pillow's own AVIF
support or ``pillow-avif-plugin``): the first frame of a multi-frame file is kept, with a note,
as is 16-bit -> 8-bit. A format whose decoder is not installed is refused as
``unsupported format X: install Y``, never as damaged or ignored.
"""
from __future__ import annotations

import dataclasses
import struct
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np

from packer.core.deps import optional_import
from packer.core.errors import DependencyError, ImageError
from packer.core.records import Record, checksum

# ---------------------------------------------------------------------------------------
# Magic bytes
# ---------------------------------------------------------------------------------------
_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"\x1f\x8b", "gzip"),
    (b"\x89HDF\r\n\x1a\n", "hdf5"),
    (b"PK\x03\x04", "zip"),
    (b"%PDF", "pdf"),
)
#: Formats OpenCV decodes and we convert to JPEG.
CONVERTIBLE = {"png", "bmp", "tiff", "webp", "jp2", "j2k", "pnm"}
#: Formats decoded through Pillow (and its plugins): name -> (plugin module, pip name).
PILLOW_FORMATS = {"gif": (None, "Pillow"), "heic": ("pillow_heif", "pillow-heif"),
                  "avif": ("pillow_avif", "pillow-avif-plugin")}
#: Extensions that promise an image: such a file that is not one is damaged, not ignored.
IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".dib", ".tif", ".tiff",
                    ".webp", ".gif", ".jp2", ".j2k", ".j2c", ".jpf", ".jpx", ".ppm", ".pgm", ".pbm", ".pnm",
                    ".heic", ".heif", ".hif", ".avif"}
#: ISO-BMFF ``ftyp`` brands of HEIF (HEVC-coded) and AVIF files.
_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs", b"mif1", b"msf1"}
_AVIF_BRANDS = {b"avif", b"avis"}


def is_image_bytes(head: bytes) -> bool:
    """True when a file's first bytes are those of an image format packer knows."""
    return sniff_format(head) in CONVERTIBLE | {"jpeg"} | set(PILLOW_FORMATS)


def cv2_imdecode(data, flags: int) -> np.ndarray:
    """``cv2.imdecode`` that raises ValueError for anything OpenCV cannot or will not decode."""
    import cv2

    try:
        arr = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error as exc:  # e.g. a header promising more pixels than OpenCV allows
        raise ValueError(f"OpenCV refused the image: {str(exc).strip().splitlines()[-1]}") from exc
    if arr is None:
        raise ValueError("OpenCV could not decode the image")
    return arr


def sniff_format(head: bytes) -> str:
    """Name of the file type by its first bytes; ``"empty"`` or ``"unknown"`` otherwise."""
    if not head:
        return "empty"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n":
        return "jp2"
    if head[:4] == b"\xff\x4f\xff\x51":  # JPEG 2000 codestream (.j2k/.j2c): SOC + SIZ
        return "j2k"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in _AVIF_BRANDS:
            return "avif"
        if brand in _HEIF_BRANDS:
            return "heic"
    if head[:1] == b"P" and head[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6") and head[2:3].isspace():
        return "pnm"
    return "unknown"


# ---------------------------------------------------------------------------------------
# JPEG structure
# ---------------------------------------------------------------------------------------
SOF_NAMES = {
    0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive", 0xC3: "lossless",
    0xC5: "differential", 0xC6: "differential-progressive", 0xC7: "differential-lossless",
    0xC9: "arithmetic", 0xCA: "arithmetic-progressive", 0xCB: "arithmetic-lossless",
    0xCD: "arithmetic-differential", 0xCE: "arithmetic-differential-progressive",
    0xCF: "arithmetic-differential-lossless",
}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM, RST0-7: no length field


@dataclass
class JpegInfo:
    """What the structure walk found. ``end`` is the offset just past EOI."""

    sof: str
    width: int
    height: int
    components: int
    scans: int
    end: int
    orientation: int = 1
    adobe_transform: int | None = None
    notes: list = field(default_factory=list)
    #: (horizontal, vertical) sampling factors per component, from the SOF component table.
    sampling: tuple = ()

    @property
    def subsampling(self) -> str:
        """Chroma subsampling as readers route on it: ``"444"``, ``"422"``, ``"420"``, ``"440"``,
        ``"411"``, ``"gray"`` or ``"other"`` (e.g. CMYK, or chroma sampled unlike Y's divisors)."""
        return chroma_subsampling(self.sampling)


def chroma_subsampling(sampling) -> str:
    """Subsampling name from per-component (h, v) sampling factors (Y first)."""
    if len(sampling) == 1:
        return "gray"
    if len(sampling) != 3 or sampling[1] != sampling[2]:
        return "other"
    (yh, yv), (ch, cv) = sampling[0], sampling[1]
    if yh % ch or yv % cv:
        return "other"
    names = {(1, 1): "444", (2, 1): "422", (2, 2): "420", (1, 2): "440", (4, 1): "411"}
    return names.get((yh // ch, yv // cv), "other")


def parse_jpeg_structure(data: bytes) -> JpegInfo:
    """Walk the marker segments of a JPEG; raise ValueError describing the first defect."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        raise ValueError("missing SOI marker")
    pos = 2
    sof = None
    width = height = comps = 0
    scans = 0
    orientation = 1
    adobe = None
    sampling = ()
    while True:
        if pos >= n:
            raise ValueError("truncated: no EOI marker" if scans else "truncated before the first scan")
        if data[pos] != 0xFF:
            raise ValueError(f"expected a marker at byte {pos}, found 0x{data[pos]:02x}")
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            raise ValueError("truncated inside a marker")
        marker = data[pos]
        pos += 1
        if marker == 0xD9:  # EOI
            break
        if marker == 0xD8:
            raise ValueError(f"second SOI marker at byte {pos - 2}")
        if marker in _STANDALONE:
            continue
        if pos + 2 > n:
            raise ValueError(f"truncated in the length of marker 0x{marker:02x}")
        seg_len = struct.unpack(">H", data[pos:pos + 2])[0]
        if seg_len < 2 or pos + seg_len > n:
            raise ValueError(f"marker 0x{marker:02x} at byte {pos - 2} has length {seg_len}, "
                             f"beyond the end of the file ({n} bytes)")
        seg = data[pos + 2:pos + seg_len]
        if marker in SOF_NAMES:
            if sof is not None:
                raise ValueError("more than one frame header (SOF)")
            if len(seg) < 6:
                raise ValueError("frame header too short")
            sof = SOF_NAMES[marker]
            height, width = struct.unpack(">HH", seg[1:5])
            comps = seg[5]
            sampling = tuple((seg[7 + 3 * c] >> 4, seg[7 + 3 * c] & 15) for c in range(comps)
                             if 8 + 3 * c < len(seg))
            if width == 0 or height == 0:
                raise ValueError(f"frame header gives a {width}x{height} image")
        elif marker == 0xE1 and seg[:6] == b"Exif\x00\x00":
            orientation = _exif_orientation(seg[6:])
        elif marker == 0xEE and seg[:5] == b"Adobe" and len(seg) >= 12:
            adobe = seg[11]
        pos += seg_len
        if marker == 0xDA:  # SOS: entropy-coded data follows until the next non-RST marker
            if sof is None:
                raise ValueError("scan (SOS) before the frame header (SOF)")
            scans += 1
            start = pos
            while True:
                pos = data.find(b"\xff", pos)
                if pos < 0 or pos + 1 >= n:
                    raise ValueError("truncated: scan data runs to the end of the file with no EOI")
                nxt = data[pos + 1]
                if nxt == 0x00 or 0xD0 <= nxt <= 0xD7 or nxt == 0xFF:
                    pos += 1 if nxt == 0xFF else 2
                    continue
                break
            if pos == start:
                raise ValueError("empty scan")
    if sof is None:
        raise ValueError("no frame header (SOF)")
    if scans == 0:
        raise ValueError("no scan (SOS)")
    return JpegInfo(sof=sof, width=width, height=height, components=comps, scans=scans,
                    end=pos, orientation=orientation, adobe_transform=adobe, sampling=sampling)


def _exif_orientation(tiff: bytes) -> int:
    """Orientation tag (0x0112) from a TIFF-structured EXIF block; 1 when absent or unreadable."""
    if len(tiff) < 8:
        return 1
    endian = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if endian is None:
        return 1
    ifd = struct.unpack(endian + "I", tiff[4:8])[0]
    if ifd + 2 > len(tiff):
        return 1
    count = struct.unpack(endian + "H", tiff[ifd:ifd + 2])[0]
    for i in range(count):
        off = ifd + 2 + 12 * i
        if off + 12 > len(tiff):
            break
        tag, typ = struct.unpack(endian + "HH", tiff[off:off + 4])
        if tag == 0x0112 and typ == 3:
            value = struct.unpack(endian + "H", tiff[off + 8:off + 10])[0]
            return value if 1 <= value <= 8 else 1
    return 1


# ---------------------------------------------------------------------------------------
# Decoding and encoding
# ---------------------------------------------------------------------------------------
_TURBO = None


def turbojpeg():
    """The process-wide TurboJPEG handle (libjpeg-turbo), loaded on first use.

    Raises:
        DependencyError: PyTurboJPEG or the libturbojpeg shared library is missing.
    """
    global _TURBO
    if _TURBO is None:
        tj = optional_import("turbojpeg", "JPEG checks and decoding", package="'PyTurboJPEG<2'")
        try:
            _TURBO = _strict_class(tj)()
        except (OSError, RuntimeError) as exc:
            raise DependencyError(
                "libturbojpeg (libjpeg-turbo's TurboJPEG library) was not found: install it with "
                "'apt-get install libturbojpeg0' (Debian/Ubuntu), 'dnf install turbojpeg' or "
                "'brew install jpeg-turbo', or run scripts/install.sh") from exc
    return _TURBO


class _TurboWarning(Exception):
    """A libjpeg-turbo warning (corrupt or truncated data) during a strict decode."""


_TJ_CALL = threading.local()   # .strict: how the current thread's decode treats warnings


def _strict_class(tj):
    """TurboJPEG whose warnings follow the calling thread's ``_TJ_CALL.strict`` (raise or ignore).

    PyTurboJPEG reports libjpeg-turbo warnings with ``warnings.warn``; turning them into errors
    with ``warnings.catch_warnings()`` swaps the process-wide filters, which is not thread-safe
    (concurrent decodes leave ``"error"`` installed for everyone). Overriding its private
    reporter keeps the choice per call. Falls back to the plain class if PyTurboJPEG changed.
    """
    if not hasattr(tj.TurboJPEG, "_TurboJPEG__report_error"):
        return tj.TurboJPEG

    def report(self, handle):
        message = self._TurboJPEG__get_error_string(handle)
        get_code = getattr(self, "_TurboJPEG__get_error_code", None)
        if get_code is not None and get_code(handle) == tj.TJERR_WARNING:
            if getattr(_TJ_CALL, "strict", False):
                raise _TurboWarning(message)
            return
        raise OSError(message)

    return type("StrictTurboJPEG", (tj.TurboJPEG,), {"_TurboJPEG__report_error": report})


def turbo_decode(data, *, pixel_format: str = "rgb", scaling_factor=None, strict: bool = True,
                 dst=None) -> np.ndarray:
    """Decode JPEG bytes with libjpeg-turbo to an HxWxC uint8 array.

    Args:
        data: JPEG bytes (bytes, memoryview or uint8 array).
        pixel_format: ``"rgb"``, ``"bgr"`` or ``"gray"``.
        scaling_factor: ``(num, denom)`` from libjpeg-turbo's list, e.g. ``(1, 2)``.
        strict: decoder warnings (corrupt or truncated data) raise instead of being ignored.
        dst: optional preallocated output array of the right shape.

    Raises:
        ValueError: with libjpeg-turbo's message, when the data cannot be decoded cleanly.
    """
    import turbojpeg as tj

    jpeg = turbojpeg()
    fmt = {"rgb": tj.TJPF_RGB, "bgr": tj.TJPF_BGR, "gray": tj.TJPF_GRAY}[pixel_format]
    flags = tj.TJFLAG_STOPONWARNING if strict else 0
    if type(jpeg) is tj.TurboJPEG:  # PyTurboJPEG without the hook: filters (single-threaded use)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error" if strict else "ignore")
                return jpeg.decode(data, pixel_format=fmt, scaling_factor=scaling_factor, flags=flags, dst=dst)
        except (OSError, UserWarning) as exc:
            raise ValueError(f"libjpeg-turbo: {exc}") from exc
    _TJ_CALL.strict = strict
    try:
        return jpeg.decode(data, pixel_format=fmt, scaling_factor=scaling_factor, flags=flags, dst=dst)
    except (OSError, _TurboWarning) as exc:
        raise ValueError(f"libjpeg-turbo: {exc}") from exc
    finally:
        _TJ_CALL.strict = False


def turbo_encode(rgb: np.ndarray, quality: int) -> bytes:
    """Baseline JPEG (4:2:0, or grayscale for one channel) from an RGB / gray uint8 array."""
    import turbojpeg as tj

    jpeg = turbojpeg()
    if rgb.ndim == 2 or rgb.shape[2] == 1:
        return jpeg.encode(np.ascontiguousarray(rgb.reshape(rgb.shape[0], rgb.shape[1], 1)),
                           quality=quality, pixel_format=tj.TJPF_GRAY, jpeg_subsample=tj.TJSAMP_GRAY)
    return jpeg.encode(np.ascontiguousarray(rgb), quality=quality, pixel_format=tj.TJPF_RGB,
                       jpeg_subsample=tj.TJSAMP_420)


def opencv_decode(data: bytes) -> np.ndarray:
    """Decode any image OpenCV reads to uint8 RGB (or HxWx1 gray), EXIF orientation NOT applied.

    16-bit images are scaled to 8 bits; alpha is composited on black (documented loss).
    """
    import cv2

    arr = cv2_imdecode(data, cv2.IMREAD_UNCHANGED | cv2.IMREAD_IGNORE_ORIENTATION)
    if arr.dtype == np.uint16:
        arr = (arr.astype(np.uint32) * 255 // 65535).astype(np.uint8)
    elif arr.dtype != np.uint8:
        raise ValueError(f"unsupported pixel type {arr.dtype}")
    if arr.ndim == 2:
        return arr[:, :, None]
    if arr.shape[2] == 4:
        alpha = arr[:, :, 3:4].astype(np.uint16)
        arr = (arr[:, :, :3].astype(np.uint16) * alpha // 255).astype(np.uint8)
    return np.ascontiguousarray(cv2.cvtColor(arr[:, :, :3], cv2.COLOR_BGR2RGB))


def apply_orientation(img: np.ndarray, orientation: int) -> np.ndarray:
    """Rotate/flip an HxWxC array as EXIF orientation ``orientation`` (1-8) prescribes."""
    if orientation == 2:
        img = img[:, ::-1]
    elif orientation == 3:
        img = img[::-1, ::-1]
    elif orientation == 4:
        img = img[::-1]
    elif orientation == 5:
        img = img.transpose(1, 0, 2)
    elif orientation == 6:
        img = img.transpose(1, 0, 2)[:, ::-1]
    elif orientation == 7:
        img = img.transpose(1, 0, 2)[::-1, ::-1]
    elif orientation == 8:
        img = img.transpose(1, 0, 2)[::-1]
    return np.ascontiguousarray(img)


# ---------------------------------------------------------------------------------------
# Decompression-bomb guard: image size from the header, before any decoding
# ---------------------------------------------------------------------------------------
#: Default pixel limit per image: Pillow's ``Image.MAX_IMAGE_PIXELS`` convention (~89.5 MP,
#: a 1024 MiB 24-bit image / 4 / 3). ``0`` means no limit.
DEFAULT_MAX_PIXELS = 89_478_485


def header_dimensions(raw: bytes, kind: str) -> tuple[int, int] | None:
    """(width, height) read from the header of a ``kind`` image (see :func:`sniff_format`),
    without decoding any pixels; None when the header does not say or cannot be read (the
    decoder then reports the damage).

    JPEG: the frame header (SOF); PNG: IHDR; BMP: the info header; other formats through
    Pillow's lazy ``Image.open`` (reads the header only) where Pillow is installed.
    """
    try:
        if kind == "jpeg":
            info = parse_jpeg_structure(raw)
            return info.width, info.height
        if kind == "png":
            if raw[12:16] != b"IHDR":
                return None
            return struct.unpack(">II", raw[16:24])
        if kind == "bmp":
            size = struct.unpack("<I", raw[14:18])[0]
            if size == 12:  # BITMAPCOREHEADER: 16-bit dimensions
                return struct.unpack("<HH", raw[18:22])
            w, h = struct.unpack("<ii", raw[18:26])
            return abs(w), abs(h)
    except (ValueError, struct.error):
        return None
    return _pillow_dimensions(raw)


def _pillow_dimensions(raw: bytes) -> tuple[int, int] | None:
    try:
        from PIL import Image
    except ImportError:
        return None  # OpenCV's own limit (CV_IO_MAX_IMAGE_PIXELS, 2**30) still applies
    import io

    # Pillow's registered openers, called directly: they parse the header only (decoding is
    # lazy), and skip Image.open's own bomb check, which warns or raises through the
    # process-wide warnings machinery (not thread-safe to silence).
    Image.init()
    head = raw[:16]
    for fmt in Image.ID:
        factory, accept = Image.OPEN[fmt]
        try:
            if accept is not None and not accept(head):
                continue
            im = factory(io.BytesIO(raw), "")
        except (OSError, ValueError, SyntaxError, IndexError, TypeError, struct.error):
            continue
        try:
            return tuple(im.size)
        finally:
            im.close()
    return None


def check_pixel_limit(path: str, raw: bytes, kind: str, max_pixels: int) -> None:
    """Raise ImageError when the header of ``raw`` promises more than ``max_pixels`` pixels."""
    if not max_pixels:
        return
    dims = header_dimensions(raw, kind)
    if dims is None:
        return
    w, h = dims
    if w * h > max_pixels:
        size = f"{w}x{h} = {w * h:,} pixels" if h != 1 else f"{w:,} pixels"
        raise ImageError(path, f"image is {size}, over the limit of {max_pixels:,} "
                               f"(decompression-bomb guard, checked from the header without decoding; "
                               f"raise it with --max-pixels N / max_pixels=N, 0 = no limit)")


# ---------------------------------------------------------------------------------------
# The build's per-image step
# ---------------------------------------------------------------------------------------
EXIF_MODES = ("apply", "record")


def process_image(path: str, raw: bytes, *, quality: int = 95, exif: str = "apply",
                  max_size: int | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> Record:
    """Check one input file and produce the record to store, without index and label.

    With ``max_size``, an image whose long side exceeds it is then stored downscaled (see
    :func:`downscale_record`).

    Returns:
        A :class:`~packer.core.records.Record` with ``key=path``, ``index=-1`` and ``label=None``;
        the build fills in both.

    Args:
        path: the input's relative path (only used in messages).
        raw: the file's bytes.
        quality: JPEG quality for re-encoded images (non-JPEG, CMYK, EXIF-rotated).
        exif: ``"apply"`` rotates pixels per EXIF orientation (re-encoding the image);
            ``"record"`` keeps the original bytes and stores the orientation for readers.
        max_pixels: refuse images whose header promises more pixels than this (0 = no limit),
            before decoding anything.

    Raises:
        ImageError: the file is empty, not an image, damaged or over ``max_pixels``;
            ``reason`` says how.
    """
    rec = _process_image(path, raw, quality=quality, exif=exif, max_pixels=max_pixels)
    return rec if max_size is None else downscale_record(rec, max_size, quality)


def downscale_record(rec: Record, max_size: int, quality: int) -> Record:
    """``rec`` with its image shrunk to at most ``max_size`` pixels on the long side (aspect kept,
    OpenCV INTER_AREA, re-encoded at ``quality``), recorded in ``converted`` with the original
    size (FFCV's ``max_resolution``). Smaller images are returned unchanged.

    Example:
        >>> downscale_record(rec_1920x1080, 512, 90).converted                   # doctest: +SKIP
        'downscaled 1920x1080->512x288'
    """
    import cv2

    long_side = max(rec.width, rec.height)
    if long_side <= max_size:
        return rec
    f = max_size / long_side
    w, h = max(1, int(round(rec.width * f))), max(1, int(round(rec.height * f)))
    try:
        pixels = turbo_decode(rec.data, pixel_format="gray" if rec.channels == 1 else "rgb", strict=True)
    except ValueError as exc:
        raise ImageError(rec.key, f"cannot decode for --max-size: {exc}") from exc
    small = cv2.resize(pixels, (w, h), interpolation=cv2.INTER_AREA).reshape(h, w, rec.channels)
    why = f"downscaled {rec.width}x{rec.height}->{w}x{h}"
    data = turbo_encode(small, quality)
    return dataclasses.replace(rec, data=data, checksum=checksum(data), width=w, height=h,
                               converted=f"{rec.converted}, {why}" if rec.converted else why,
                               coding="baseline", subsampling="gray" if rec.channels == 1 else "420")


def _process_image(path: str, raw: bytes, *, quality: int, exif: str, max_pixels: int) -> Record:
    kind = sniff_format(raw[:16])
    if kind == "empty":
        raise ImageError(path, "empty file (0 bytes)")
    source_sum = checksum(raw)
    if kind == "jpeg":
        return _process_jpeg(path, raw, source_sum, quality, exif, max_pixels)
    if kind in CONVERTIBLE:
        check_pixel_limit(path, raw, kind, max_pixels)
        try:
            rgb = opencv_decode(raw)
        except ValueError as exc:
            raise ImageError(path, f"damaged {kind.upper()}: {exc}") from exc
        return _encoded(path, rgb, kind, f"{kind}->jpeg", raw, source_sum, quality, 1, _other_notes(kind, raw))
    if kind in PILLOW_FORMATS:
        _pillow_plugin(kind, path)  # "unsupported format X: install Y" comes first
        check_pixel_limit(path, raw, kind, max_pixels)
        rgb, notes = pillow_decode(path, raw, kind)
        return _encoded(path, rgb, kind, f"{kind}->jpeg", raw, source_sum, quality, 1, notes)
    if kind == "unknown":
        raise ImageError(path, f"not an image (first bytes {raw[:8].hex(' ')})")
    raise ImageError(path, f"not an image ({kind} data)")


def _other_notes(kind: str, raw: bytes) -> list:
    """Notes for an OpenCV-decoded file: bit depth reduced, frames beyond the first dropped."""
    notes = []
    if kind == "png" and len(raw) > 24 and raw[12:16] == b"IHDR" and raw[24] == 16:
        notes.append("16-bit PNG scaled to 8 bits")
    if kind == "tiff":
        import io

        from PIL import Image
        try:
            with Image.open(io.BytesIO(raw)) as im:
                frames = getattr(im, "n_frames", 1)
                if im.mode.startswith("I;16") or im.mode in ("I", "F"):
                    notes.append(f"{im.mode} TIFF scaled to 8 bits")
        except (ImportError, OSError, ValueError, Image.DecompressionBombError):
            frames = 1  # the OpenCV decode above has decided already; this only adds notes
        if frames > 1:
            notes.append(f"multi-frame file: first of {frames} frames kept")
    return notes


def _pillow_plugin(kind: str, path: str):
    """Make Pillow able to open ``kind``; raise ImageError 'unsupported format' otherwise."""
    module, pip_name = PILLOW_FORMATS[kind]
    try:
        from PIL import features
    except ImportError as exc:
        raise ImageError(path, f"unsupported format {kind.upper()}: install Pillow (pip install Pillow)") from exc
    if kind == "gif" or (kind == "avif" and features.check("avif")):
        return
    try:
        plugin = __import__(module)
    except ImportError as exc:
        extra = " or Pillow >= 11.3 with AVIF" if kind == "avif" else ""
        raise ImageError(path, f"unsupported format {kind.upper()}: install {pip_name} "
                               f"(pip install {pip_name}){extra}") from exc
    if kind == "heic":
        plugin.register_heif_opener()


def pillow_decode(path: str, raw: bytes, kind: str) -> tuple[np.ndarray, list]:
    """Decode GIF / HEIC / AVIF with Pillow: ``(uint8 RGB or HxWx1 gray, notes)``.

    The first frame of a multi-frame file is used (noted); alpha is composited on black and
    16-bit samples scaled to 8 bits, as for the OpenCV path.

    Raises:
        ImageError: ``unsupported format X: install Y`` when the decoder is missing, ``damaged X``
            when it fails.
    """
    import io

    _pillow_plugin(kind, path)
    from PIL import Image, UnidentifiedImageError

    notes = []
    try:
        with Image.open(io.BytesIO(raw)) as im:
            frames = getattr(im, "n_frames", 1)
            im.seek(0)
            if frames > 1:
                notes.append(f"multi-frame file: first of {frames} frames kept")
            im.load()
            if im.mode in ("I;16", "I;16B", "I;16L", "I"):
                arr = np.asarray(im).astype(np.uint32)
                notes.append(f"{im.mode} samples scaled to 8 bits")
                top = max(1, 65535 if arr.max() <= 65535 else int(arr.max()))
                return (arr * 255 // top).astype(np.uint8)[:, :, None], notes
            if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                rgba = np.asarray(im.convert("RGBA")).astype(np.uint16)
                rgb = (rgba[:, :, :3] * rgba[:, :, 3:4] // 255).astype(np.uint8)
                return np.ascontiguousarray(rgb), notes
            if im.mode == "L":
                return np.asarray(im)[:, :, None].copy(), notes
            return np.ascontiguousarray(np.asarray(im.convert("RGB"))), notes
    except Image.DecompressionBombError as exc:
        raise ImageError(path, f"too many pixels for a {kind.upper()}: {exc}") from exc
    except (UnidentifiedImageError, OSError, ValueError, RuntimeError, SyntaxError, EOFError, IndexError,
            KeyError, struct.error) as exc:
        # RuntimeError: pillow-heif on a damaged HEIC; IndexError/KeyError/struct.error: Pillow's
        # plugins on truncated headers (a GIF cut inside its image descriptor)
        raise ImageError(path, f"damaged {kind.upper()}: {exc}") from exc


def _checked(path, data, width, height, channels, kind, why, orientation, raw, source_sum, notes,
             coding="baseline", subsampling="") -> Record:
    return Record(index=-1, key=path, data=data, label=None, width=width, height=height,
                  channels=channels, source_format=kind, converted=why, orientation=orientation,
                  checksum=checksum(data), source_checksum=source_sum, source_size=len(raw),
                  notes=notes, coding=coding, subsampling=subsampling or ("gray" if channels == 1 else "420"))


def _encoded(path, rgb, kind, why, raw, source_sum, quality, orientation, notes) -> Record:
    return _checked(path, turbo_encode(rgb, quality), rgb.shape[1], rgb.shape[0], rgb.shape[2], kind, why,
                    orientation, raw, source_sum, notes)


def _process_jpeg(path, raw, source_sum, quality, exif, max_pixels=DEFAULT_MAX_PIXELS) -> Record:
    try:
        info = parse_jpeg_structure(raw)
    except ValueError as exc:
        raise ImageError(path, f"damaged JPEG: {exc}") from exc
    if max_pixels and info.width * info.height > max_pixels:
        check_pixel_limit(path, raw, "jpeg", max_pixels)  # raises, with the message
    notes = []
    data = raw
    if info.end < len(raw):
        trailing = len(raw) - info.end
        notes.append(f"trimmed {trailing} bytes after EOI")
        data = raw[:info.end]
    cmyk = info.components == 4
    if cmyk or info.sof.endswith("lossless") or "differential" in info.sof:
        # libjpeg-turbo 2.x cannot produce RGB from these: decode with OpenCV, re-encode.
        try:
            rgb = opencv_decode(data)
        except ValueError as exc:
            raise ImageError(path, f"damaged JPEG ({info.sof}, {info.components} components): {exc}") from exc
        why = ("cmyk" if info.adobe_transform != 2 else "ycck") + "->rgb" if cmyk else f"{info.sof}->baseline"
        rgb, why = _orient(rgb, info.orientation, exif, why)
        return _encoded(path, rgb, "jpeg", why, raw, source_sum, quality,
                        1 if exif == "apply" else info.orientation, notes)
    gray = info.components == 1
    try:
        pixels = turbo_decode(data, pixel_format="gray" if gray else "rgb", strict=True)
    except ValueError as exc:
        raise ImageError(path, f"damaged JPEG: {exc}") from exc
    if pixels.shape[:2] != (info.height, info.width):
        raise ImageError(path, f"decoded size {pixels.shape[1]}x{pixels.shape[0]} differs from the "
                               f"frame header's {info.width}x{info.height}")
    if info.orientation != 1 and exif == "apply":
        rotated, why = _orient(pixels, info.orientation, exif, "")
        return _encoded(path, rotated, "jpeg", why, raw, source_sum, quality, 1, notes)
    return _checked(path, data, info.width, info.height, 1 if gray else 3, "jpeg", "", info.orientation,
                    raw, source_sum, notes, info.sof, info.subsampling)


def _orient(img, orientation, exif, why):
    if orientation == 1 or exif != "apply":
        return img, why
    applied = f"exif-orientation {orientation} applied"
    return apply_orientation(img, orientation), (f"{why}, {applied}" if why else applied)
