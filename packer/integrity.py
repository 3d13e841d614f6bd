"""Image checks on the way in: magic-byte sniffing, JPEG structure, full decode, conversion.

:func:`process_image` is the one entry point the build uses: it takes the raw bytes of one
input file and returns the JPEG bytes to store (the original when it passes every check,
otherwise a baseline RGB re-encode with the reason recorded), or raises
:class:`~packer.errors.ImageError` naming the file and what is wrong.

Checks, in order:

1. magic bytes decide the type (a PNG named ``.jpg`` is a PNG; gzip or text is "not an image");
2. JPEG structure: SOI, marker segments with valid lengths, a frame header (SOF), at least one
   scan (SOS) with entropy-coded data, EOI; bytes after EOI are trimmed and noted;
3. a full decode with libjpeg-turbo in which decoder warnings ("premature end of data
   segment", "corrupt JPEG data") are errors, never padding;
4. EXIF orientation is applied (re-encode) or recorded for the reader, by option.

JPEGs libjpeg-turbo cannot decode to RGB (CMYK/YCCK, lossless) and non-JPEG images are
decoded with OpenCV and re-encoded as baseline RGB JPEG at the chosen quality.
"""
from __future__ import annotations

import struct
import warnings
from dataclasses import dataclass, field

import numpy as np

from .errors import DependencyError, ImageError
from .records import Record, checksum

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
CONVERTIBLE = {"png", "bmp", "tiff", "webp", "jp2", "pnm"}
#: Extensions that promise an image: such a file that is not one is damaged, not ignored.
IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".dib", ".tif", ".tiff",
                    ".webp", ".gif", ".jp2", ".j2k", ".ppm", ".pgm", ".pbm", ".pnm"}


def is_image_bytes(head: bytes) -> bool:
    """True when a file's first bytes are those of an image format packer knows."""
    return sniff_format(head) in CONVERTIBLE | {"jpeg", "gif"}


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
    if head[:1] == b"P" and head[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6") and head[2:3].isspace():
        return "pnm"
    return "unknown"


# ---------------------------------------------------------------------------------------
# JPEG structure
# ---------------------------------------------------------------------------------------
_SOF_NAMES = {
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
    return {(1, 1): "444", (2, 1): "422", (2, 2): "420", (1, 2): "440", (4, 1): "411"}.get((yh // ch, yv // cv), "other")


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
        if marker in _SOF_NAMES:
            if sof is not None:
                raise ValueError("more than one frame header (SOF)")
            if len(seg) < 6:
                raise ValueError("frame header too short")
            sof = _SOF_NAMES[marker]
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
        try:
            import turbojpeg as tj
        except ImportError as exc:
            raise DependencyError("PyTurboJPEG is not installed (pip install 'PyTurboJPEG<2')") from exc
        try:
            _TURBO = tj.TurboJPEG()
        except (OSError, RuntimeError) as exc:
            raise DependencyError(
                "libturbojpeg (libjpeg-turbo's TurboJPEG library) was not found: install it with "
                "'apt-get install libturbojpeg0' (Debian/Ubuntu), 'dnf install turbojpeg' or "
                "'brew install jpeg-turbo', or run scripts/install.sh") from exc
    return _TURBO


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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error" if strict else "ignore")
            return jpeg.decode(data, pixel_format=fmt, scaling_factor=scaling_factor, flags=flags, dst=dst)
    except (OSError, UserWarning) as exc:
        raise ValueError(f"libjpeg-turbo: {exc}") from exc


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
# The build's per-image step
# ---------------------------------------------------------------------------------------
EXIF_MODES = ("apply", "record")


def process_image(path: str, raw: bytes, *, quality: int = 95, exif: str = "apply") -> Record:
    """Check one input file and produce the record to store, without index and label.

    Returns:
        A :class:`~packer.records.Record` with ``key=path``, ``index=-1`` and ``label=None``;
        the build fills in both.

    Args:
        path: the input's relative path (only used in messages).
        raw: the file's bytes.
        quality: JPEG quality for re-encoded images (non-JPEG, CMYK, EXIF-rotated).
        exif: ``"apply"`` rotates pixels per EXIF orientation (re-encoding the image);
            ``"record"`` keeps the original bytes and stores the orientation for readers.

    Raises:
        ImageError: the file is empty, not an image, or damaged; ``reason`` says how.
    """
    kind = sniff_format(raw[:16])
    if kind == "empty":
        raise ImageError(path, "empty file (0 bytes)")
    source_sum = checksum(raw)
    if kind == "jpeg":
        return _process_jpeg(path, raw, source_sum, quality, exif)
    if kind in CONVERTIBLE:
        try:
            rgb = opencv_decode(raw)
        except ValueError as exc:
            raise ImageError(path, f"damaged {kind.upper()}: {exc}") from exc
        return _encoded(path, rgb, kind, f"{kind}->jpeg", raw, source_sum, quality, 1, [])
    if kind == "gif":
        raise ImageError(path, "GIF is not supported (animated/paletted); convert it to PNG or JPEG first")
    if kind == "unknown":
        raise ImageError(path, f"not an image (first bytes {raw[:8].hex(' ')})")
    raise ImageError(path, f"not an image ({kind} data)")


def _checked(path, data, width, height, channels, kind, why, orientation, raw, source_sum, notes,
             coding="baseline", subsampling="") -> Record:
    return Record(index=-1, key=path, data=data, label=None, width=width, height=height,
                  channels=channels, source_format=kind, converted=why, orientation=orientation,
                  checksum=checksum(data), source_checksum=source_sum, source_size=len(raw),
                  notes=notes, coding=coding, subsampling=subsampling or ("gray" if channels == 1 else "420"))


def _encoded(path, rgb, kind, why, raw, source_sum, quality, orientation, notes) -> Record:
    return _checked(path, turbo_encode(rgb, quality), rgb.shape[1], rgb.shape[0], rgb.shape[2], kind, why,
                    orientation, raw, source_sum, notes)


def _process_jpeg(path, raw, source_sum, quality, exif) -> Record:
    try:
        info = parse_jpeg_structure(raw)
    except ValueError as exc:
        raise ImageError(path, f"damaged JPEG: {exc}") from exc
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
