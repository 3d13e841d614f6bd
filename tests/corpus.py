"""Deterministic test images: good JPEGs of several kinds and damaged variants made from them."""
from __future__ import annotations

import gzip
import io
import struct

import numpy as np

from packer.sample import encode_jpeg, synthetic_image


def class_store(root, count: int, seed: int, name: str = "s.lmdb") -> str:
    """An LMDB store of ``count`` generated JPEGs in class folders (``make_dataset``), built in the
    folder ``root`` (a pathlib.Path); its location."""
    import packer
    from packer.sample import make_dataset

    images, _ = make_dataset(root / "ds", count, kind="classes", seed=seed)
    loc = str(root / name)
    assert packer.build(images, None, loc, "lmdb", workers=1).ok
    return loc


def rgb(seed: int, h: int = 48, w: int = 64) -> np.ndarray:
    return synthetic_image(np.random.default_rng(seed), h, w)


def good_jpeg(seed: int = 0, h: int = 48, w: int = 64, **kw) -> bytes:
    return encode_jpeg(rgb(seed, h, w), **kw)


def photo_of_size(h: int, w: int, seed: int = 0, gray: bool = False) -> np.ndarray:
    """A seeded photo-like image of ``h`` x ``w`` (HWC, one channel when ``gray``)."""
    return synthetic_image(np.random.default_rng(seed), h, w, gray=gray)


def pil_jpeg(img: np.ndarray, **kw) -> bytes:
    """``img`` (HWC) as a JPEG written by Pillow with its ``save`` options ``kw``."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img[:, :, 0] if img.shape[2] == 1 else img).save(buf, "JPEG", **kw)
    return buf.getvalue()


def cv_jpeg(img: np.ndarray, *params) -> bytes:
    """``img`` (HWC, RGB or one channel) as a JPEG written by OpenCV at quality 92, plus ``params``."""
    import cv2

    arr = img[:, :, 0] if img.shape[2] == 1 else cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".jpg", arr, [cv2.IMWRITE_JPEG_QUALITY, 92, *params])
    assert ok
    return buf.tobytes()


def jpeg_kinds() -> dict:
    """name -> JPEG of each kind the decode kernels meet: baseline and progressive, 4:4:4 / 4:2:2 /
    4:2:0, gray, restart markers, odd sizes (the crop and full decode tests run over all)."""
    import cv2

    img = photo_of_size(203, 301, 1)
    return {
        "baseline-420": cv_jpeg(img),
        "progressive": cv_jpeg(img, cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
        "444": pil_jpeg(img, quality=92, subsampling=0),
        "422": pil_jpeg(img, quality=92, subsampling=1),
        "420-pil-optimized": pil_jpeg(img, quality=92, subsampling=2, optimize=True),
        "gray": cv_jpeg(photo_of_size(203, 301, 2, gray=True)),
        "restart-markers": cv_jpeg(img, cv2.IMWRITE_JPEG_RST_INTERVAL, 3),
        "odd-size-1x1": cv_jpeg(photo_of_size(1, 1, 3)),
        "odd-size-17x999": cv_jpeg(photo_of_size(17, 999, 4)),
        "progressive-444-odd": pil_jpeg(photo_of_size(131, 97, 5), quality=90, subsampling=0, progressive=True),
    }


def exif_app1(orientation: int) -> bytes:
    """An APP1 EXIF segment holding only the orientation tag (little-endian TIFF)."""
    tiff = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1)
    tiff += struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack("<I", 0)
    payload = b"Exif\x00\x00" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def with_exif(jpeg: bytes, orientation: int) -> bytes:
    return jpeg[:2] + exif_app1(orientation) + jpeg[2:]


def scan_start(jpeg: bytes) -> int:
    """Offset of the first entropy-coded byte (just after the SOS header)."""
    pos = jpeg.index(b"\xff\xda")
    return pos + 2 + struct.unpack(">H", jpeg[pos + 2:pos + 4])[0]


def bomb_jpeg(width: int = 30000, height: int = 30000) -> bytes:
    """A real small JPEG whose frame header (SOF) claims ``width`` x ``height``."""
    data = bytearray(good_jpeg(1))
    i = 2
    while True:
        marker, length = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
        if 0xC0 <= marker <= 0xC2:
            struct.pack_into(">HH", data, i + 5, height, width)
            return bytes(data)
        i += 2 + length


def bit_flipped(jpeg: bytes) -> bytes:
    """Scramble 24 bytes in the middle of the scan: libjpeg-turbo reports corrupt data."""
    start = scan_start(jpeg)
    mid = start + (len(jpeg) - 2 - start) // 2
    buf = bytearray(jpeg)
    for i in range(mid, mid + 24):
        if buf[i] not in (0xFF, 0x00):
            buf[i] ^= 0x5A
    return bytes(buf)


def cmyk_jpeg(seed: int = 0) -> tuple[bytes, np.ndarray]:
    """(CMYK JPEG bytes written by Pillow, the RGB image it came from)."""
    from PIL import Image

    img = rgb(seed)
    buf = io.BytesIO()
    Image.fromarray(img).convert("CMYK").save(buf, format="JPEG", quality=95)
    return buf.getvalue(), img


def png_bytes(seed: int = 0) -> tuple[bytes, np.ndarray]:
    import cv2

    img = rgb(seed)
    ok, buf = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes(), img


def damaged_set(seed: int = 7) -> dict:
    """name -> (bytes, expected reason fragment) for inputs every build must reject."""
    j = good_jpeg(seed)
    return {
        "truncated.jpg": (j[: len(j) // 2], "truncated"),
        "bitflip.jpg": (bit_flipped(j), "libjpeg-turbo"),
        "no_eoi.jpg": (j[:-2], "no EOI"),
        "zero.jpg": (b"", "empty file"),
        "text.jpg": (b"this is not an image\n", "not an image"),
        "gzip.jpg": (gzip.compress(j), "gzip"),
    }


# (height, width, gray): odd sizes, grey, one larger than a pixel-mode target, one smaller
RECORD_SHAPES = [(37, 51, False), (64, 64, True), (75, 100, False), (20, 33, False), (121, 97, False)]


def jpeg_of_shape(h: int, w: int, seed: int, gray: bool = False) -> bytes:
    """A photo-like JPEG of ``h`` x ``w`` (one channel when ``gray``), seeded."""
    img = rgb(seed, h, w)
    return encode_jpeg(img[:, :, :1] if gray else img)


def make_records(n: int = 12, schema: str = "class", *, key_template: str = "cls{c}/img_{i:03d}.jpg",
                 box_scale: float = 10.0, orientations: dict | None = None) -> list:
    """Records as a build would hand them to a writer, for backend tests that drive writers directly.

    Record 3 says it was converted, record 4 carries a note; with ``schema="boxes"`` record 2 has
    zero boxes and record 5 no label. ``orientations`` maps index -> EXIF orientation to record.
    """
    from packer.core.records import Record, checksum

    recs = []
    for i in range(n):
        h, w, gray = RECORD_SHAPES[i % len(RECORD_SHAPES)]
        data = jpeg_of_shape(h, w, seed=i, gray=gray)
        if schema == "class":
            label = i % 4
        elif schema == "boxes":
            label = None if i == 5 else np.arange((i % 3) * 5, dtype=np.float32).reshape(-1, 5) / box_scale
        else:
            label = None
        recs.append(Record(index=i, key=key_template.format(c=i % 4, i=i), data=data, label=label,
                           width=w, height=h, channels=1 if gray else 3, source_format="jpeg",
                           converted="png->jpeg" if i == 3 else "",
                           orientation=(orientations or {}).get(i, 1),
                           checksum=checksum(data), source_checksum=checksum(data + b"src"),
                           source_size=len(data) + 3,
                           notes=["trimmed 3 trailing bytes after EOI"] if i == 4 else []))
    return recs


def cut_lmdb_record(store, index: int, keep: int = None) -> None:
    """Damage record ``index`` of an LMDB store in place: keep only its first ``keep`` bytes
    (default: half), as a torn write would leave it (the record's checksum no longer matches)."""
    import lmdb

    env = lmdb.open(str(store), max_dbs=8, subdir=True)
    try:
        db = env.open_db(b"data")
        with env.begin(write=True, db=db) as txn:
            key = int(index).to_bytes(8, "big")
            data = bytes(txn.get(key))
            txn.put(key, data[: len(data) // 2 if keep is None else keep])
    finally:
        env.close()


def same_size_lmdb(tmp_path_factory, name: str, n: int, size: tuple, seed: int):
    """An LMDB store of ``n`` generated class images, all ``size`` (h, w): what CropDataset's
    FullDecode and the loaders need (one image size per batch)."""
    import packer
    from packer.sample import make_dataset

    images, _ = make_dataset(tmp_path_factory.mktemp(name), n, kind="classes", sizes=(tuple(size),), seed=seed)
    out = tmp_path_factory.mktemp(name + "s") / "s.lmdb"
    packer.build(images, None, out, workers=1)
    return out
