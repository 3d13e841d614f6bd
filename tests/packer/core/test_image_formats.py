"""Image formats beyond JPEG/PNG: converted with a note, or refused as "unsupported: install X"."""
from __future__ import annotations

import builtins
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import packer
from packer.core.errors import ImageError
from packer.core.integrity import process_image, sniff_format
from packer.sources.folders import list_images
from readers.dataset import StoreDataset
from tests import corpus

pytestmark = pytest.mark.timeout(120)


def _save(arr, fmt, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **kw)
    return buf.getvalue()


def _frames(n=3, h=24, w=32):
    return [corpus.rgb(i, h, w) for i in range(n)]


def _gif_animated() -> bytes:
    frames = [Image.fromarray(f) for f in _frames()]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50)
    return buf.getvalue()


def _heic() -> bytes:
    pillow_heif = pytest.importorskip("pillow_heif", reason="pillow-heif is not installed")
    pillow_heif.register_heif_opener()
    return _save(corpus.rgb(3, 24, 32), "HEIF")


def _close(rec, ref, tol=12.0):
    from packer.core.integrity import turbo_decode
    got = turbo_decode(rec.data).astype(float)
    return np.abs(got - ref.astype(float)).mean() < tol


def test_gif_first_frame_noted():
    raw = _gif_animated()
    assert sniff_format(raw[:16]) == "gif"
    rec = process_image("a.gif", raw)
    assert rec.converted == "gif->jpeg" and rec.notes == ["multi-frame file: first of 3 frames kept"]
    first = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
    assert (rec.width, rec.height) == (32, 24) and _close(rec, first, tol=4)


def test_single_frame_gif_has_no_note():
    rec = process_image("a.gif", _save(corpus.rgb(1, 16, 16), "GIF"))
    assert rec.notes == [] and rec.converted == "gif->jpeg"


@pytest.mark.parametrize("kind", ["avif", "heic", "jp2", "j2k"])
def test_modern_formats_converted(kind):
    ref = corpus.rgb(3, 24, 32)
    if kind == "heic":
        raw = _heic()
    elif kind == "avif":
        from PIL import features
        if not features.check("avif"):
            pytest.importorskip("pillow_avif", reason="no AVIF support in this Pillow")
        raw = _save(ref, "AVIF", quality=95)
    elif kind == "jp2":
        raw = _save(ref, "JPEG2000")
    else:
        raw = _save(ref, "JPEG2000", no_jp2=True)
    assert sniff_format(raw[:16]) == kind
    rec = process_image(f"x.{kind}", raw)
    assert rec.source_format == kind and rec.converted == f"{kind}->jpeg"
    assert (rec.width, rec.height) == (32, 24) and _close(rec, ref, tol=20)


def test_missing_decoder_is_unsupported_not_damaged(monkeypatch):
    raw = _heic()
    real_import = builtins.__import__

    def no_heif(name, *a, **kw):
        if name == "pillow_heif":
            raise ImportError("No module named 'pillow_heif'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_heif)
    with pytest.raises(ImageError) as err:
        process_image("p.heic", raw)
    assert err.value.reason == "unsupported format HEIC: install pillow-heif (pip install pillow-heif)"


def test_sixteen_bit_png_and_multipage_tiff_noted():
    arr16 = (np.arange(24 * 32, dtype=np.uint32).reshape(24, 32) * 80).astype(np.uint16)
    rec = process_image("d.png", _save(arr16, "PNG"))
    assert "16-bit PNG scaled to 8 bits" in rec.notes and rec.channels == 1
    pages = [Image.fromarray(f) for f in _frames(2)]
    buf = io.BytesIO()
    pages[0].save(buf, "TIFF", save_all=True, append_images=pages[1:])
    rec = process_image("m.tif", buf.getvalue())
    assert rec.notes == ["multi-frame file: first of 2 frames kept"] and rec.converted == "tiff->jpeg"


def test_heic_avif_are_candidates_not_ignored(tmp_path):
    (tmp_path / "a.heic").write_bytes(_heic())
    (tmp_path / "noext").write_bytes(_heic())
    (tmp_path / "b.gif").write_bytes(_gif_animated())
    keys, ignored = list_images(tmp_path)
    assert keys == ["a.heic", "b.gif", "noext"] and ignored == []


def test_build_reports_unsupported_with_exit_code(tmp_path):
    images = tmp_path / "imgs"
    (images / "c").mkdir(parents=True)
    (images / "c/ok.jpg").write_bytes(corpus.good_jpeg(1))
    (images / "c/anim.gif").write_bytes(_gif_animated())
    (images / "c/photo.heic").write_bytes(_heic())
    rep = packer.build(images, None, tmp_path / "s.lmdb", workers=1)
    assert rep.ok and rep.records == 3
    assert {"path": "c/anim.gif", "note": "multi-frame file: first of 3 frames kept"} in rep.notes
    assert StoreDataset(tmp_path / "s.lmdb")[0][0].shape[0] == 3
    # Without the plugin (a fresh interpreter where pillow_heif cannot be imported):
    code = ("import sys; sys.modules['pillow_heif'] = None\n"
            "from packer.cli import cli\n"
            f"cli(['build', {str(images)!r}, '-o', {str(tmp_path / 't.lmdb')!r}, '-j', '1', '-q', "
            f"'--on-corrupt', 'skip'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 1, proc.stderr
    assert "unsupported: c/photo.heic: unsupported format HEIC: install pillow-heif" in proc.stderr
    report = json.loads((tmp_path / "t.lmdb.report.json").read_text())
    assert report["published"] and report["records"] == 2


@pytest.mark.parametrize("kind", ["gif", "heic", "avif"])
def test_damaged_pillow_formats_are_damaged(kind):
    raw = {"gif": _gif_animated, "heic": _heic, "avif": lambda: _save(corpus.rgb(1, 24, 32), "AVIF")}[kind]()
    with pytest.raises(ImageError, match=f"damaged {kind.upper()}"):
        process_image(f"x.{kind}", raw[: len(raw) // 2])


def test_gif_bomb_refused_not_crashing():
    # A GIF header promising 65535 x 65535 pixels (4.3 GP): Pillow's bomb check, not a crash.
    raw = b"GIF89a\xff\xff\xff\xff\x00\x00\x00" + b",\x00\x00\x00\x00\xff\xff\xff\xff\x00\x02\x02D\x01\x00;"
    with pytest.raises(ImageError) as err:
        process_image("bomb.gif", raw)
    assert "65535x65535" in err.value.reason and "over the limit" in err.value.reason  # --max-pixels guard
    with pytest.raises(ImageError) as err:       # guard off: Pillow's own bomb check, still no crash
        process_image("bomb.gif", raw, max_pixels=0)
    assert "too many pixels" in err.value.reason or "damaged GIF" in err.value.reason


@pytest.mark.parametrize("kind", ["gif", "heic", "avif", "jp2", "j2k", "tiff16"])
def test_cut_or_flipped_files_never_escape_as_library_errors(kind):
    """Every truncation / bit flip gives a record or an ImageError, never another exception."""
    ref = corpus.rgb(2, 24, 32)
    raw = {"gif": _gif_animated, "heic": _heic, "avif": lambda: _save(ref, "AVIF"),
           "jp2": lambda: _save(ref, "JPEG2000"), "j2k": lambda: _save(ref, "JPEG2000", no_jp2=True),
           "tiff16": lambda: _save((ref[:, :, 0].astype(np.uint16) * 257), "TIFF")}[kind]()
    rng = np.random.default_rng(1)
    variants = [raw[:n] for n in sorted(set(rng.integers(12, len(raw), 12).tolist()))]
    for _ in range(12):
        b = bytearray(raw)
        b[int(rng.integers(16, len(raw)))] ^= 1 << int(rng.integers(0, 8))
        variants.append(bytes(b))
    for v in variants:
        try:
            process_image(f"x.{kind}", v)
        except ImageError:
            pass
