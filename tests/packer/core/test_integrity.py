"""Write-time checks: every damaged input is caught with a reason; odd-but-valid inputs are kept
or converted, and the record says which."""
from __future__ import annotations

import numpy as np
import pytest

from packer.core.errors import ImageError
from packer.core.integrity import apply_orientation, parse_jpeg_structure, process_image, sniff_format, turbo_decode
from tests import corpus


@pytest.mark.parametrize("name", sorted(corpus.damaged_set()))
def test_damaged_inputs_are_rejected_with_a_reason(name):
    data, reason = corpus.damaged_set()[name]
    with pytest.raises(ImageError) as err:
        process_image(name, data)
    assert err.value.path == name
    assert reason in err.value.reason


def test_clean_baseline_jpeg_is_kept_byte_for_byte():
    j = corpus.good_jpeg(1, 37, 53)
    out = process_image("a.jpg", j)
    assert out.data == j and out.converted == "" and out.notes == []
    assert (out.width, out.height, out.channels) == (53, 37, 3)
    assert out.checksum == out.source_checksum


def test_progressive_and_gray_are_kept():
    prog = corpus.good_jpeg(2, progressive=True)
    assert parse_jpeg_structure(prog).sof == "progressive"
    out = process_image("p.jpg", prog)
    assert out.data == prog and out.converted == ""
    gray = corpus.encode_jpeg(corpus.rgb(3)[:, :, :1])
    out = process_image("g.jpg", gray)
    assert out.channels == 1 and out.data == gray


def test_trailing_bytes_are_trimmed_and_noted():
    j = corpus.good_jpeg(4)
    out = process_image("t.jpg", j + b"\x00" * 37)
    assert out.data == j
    assert out.notes == ["trimmed 37 bytes after EOI"]
    assert out.source_size == len(j) + 37 and out.source_checksum != out.checksum


def test_png_named_jpg_is_converted():
    png, img = corpus.png_bytes(5)
    assert sniff_format(png) == "png"
    out = process_image("x.jpg", png, quality=95)
    assert out.source_format == "png" and out.converted == "png->jpeg"
    dec = turbo_decode(out.data)
    assert np.abs(dec.astype(int) - img.astype(int)).mean() < 4


def test_cmyk_is_converted_to_rgb():
    data, img = corpus.cmyk_jpeg(6)
    assert parse_jpeg_structure(data).components == 4
    out = process_image("c.jpg", data, quality=95)
    assert out.converted.endswith("->rgb") and out.channels == 3
    dec = turbo_decode(out.data)
    assert np.abs(dec.astype(int) - img.astype(int)).mean() < 6


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_applied(orientation):
    j = corpus.good_jpeg(7, 40, 64, quality=98)
    rotated_src = corpus.with_exif(j, orientation)
    out = process_image("r.jpg", rotated_src, exif="apply", quality=98)
    assert out.converted == f"exif-orientation {orientation} applied" and out.orientation == 1
    expect = apply_orientation(turbo_decode(j), orientation)
    got = turbo_decode(out.data)
    assert got.shape == expect.shape
    assert np.abs(got.astype(int) - expect.astype(int)).mean() < 3


def test_exif_orientation_recorded():
    j = corpus.with_exif(corpus.good_jpeg(8, 40, 64), 6)
    out = process_image("r.jpg", j, exif="record")
    assert out.data == j and out.orientation == 6 and out.converted == ""
    assert (out.width, out.height) == (64, 40)


def test_apply_orientation_matches_definition():
    img = np.arange(6, dtype=np.uint8).reshape(2, 3, 1)
    assert apply_orientation(img, 6)[:, :, 0].tolist() == [[3, 0], [4, 1], [5, 2]]  # 90 deg clockwise
    assert apply_orientation(img, 8)[:, :, 0].tolist() == [[2, 5], [1, 4], [0, 3]]
    assert apply_orientation(img, 1) is not None


def test_structure_errors_name_the_defect():
    j = corpus.good_jpeg(9)
    with pytest.raises(ValueError, match="missing SOI"):
        parse_jpeg_structure(b"\x00" + j)
    sof = j.index(b"\xff\xc0")
    broken = j[:sof + 2] + b"\xff\xff" + j[sof + 4:]
    with pytest.raises(ValueError, match="beyond the end"):
        parse_jpeg_structure(broken)


def test_header_opencv_refuses_is_damaged_not_a_crash():
    huge = b"P6\n99999 99999\n255\n" + b"\x00" * 64
    with pytest.raises(ImageError, match="OpenCV refused the image"):
        process_image("big.ppm", huge, max_pixels=0)
    with pytest.raises(ImageError, match="over the limit of 89,478,485"):
        process_image("big.ppm", huge)  # the default pixel limit refuses it from the header first
