"""What labels cost: COCO parsing at build time and target decoding at read time.

Generates a COCO file of N images x K annotations (boxes + polygons), times
``packer.labels.parse_coco`` and, per sample, ``readers.targets.decode_target`` next to the
JPEG decode of a 640x480 image (the baseline a sample costs anyway). Prints one JSON line.

    PYTHONPATH=$PWD python3 scripts/bench_labels.py --images 5000 --per-image 7
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--per-image", type=int, default=7, help="annotations per image (COCO averages ~7)")
    ap.add_argument("--reads", type=int, default=2000)
    args = ap.parse_args()

    from packer.core.integrity import turbo_decode, turbo_encode
    from packer.labels.coco import parse_coco
    from packer.labels.model import bind_to_image
    from readers.targets import decode_target

    rng = np.random.default_rng(0)
    keys = [f"{i:06d}.jpg" for i in range(args.images)]
    anns = []
    for i in range(args.images):
        for _ in range(args.per_image):
            x, y = rng.uniform(0, 530), rng.uniform(0, 370)
            w, h = rng.uniform(5, 100, 2)
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": int(rng.integers(1, 81)),
                         "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)], "area": round(w * h, 2),
                         "iscrowd": 0,
                         "segmentation": [[round(v, 2) for v in (x, y, x + w, y, x + w, y + h, x, y + h)]]})
    coco = {"images": [{"id": i, "file_name": k, "width": 640, "height": 480} for i, k in enumerate(keys)],
            "annotations": anns, "categories": [{"id": c, "name": f"c{c}"} for c in range(1, 81)]}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "instances.json"
        path.write_text(json.dumps(coco))
        t0 = time.perf_counter()
        parsed = parse_coco(path, Path(tmp), keys)
        parse_s = time.perf_counter() - t0
    assert not parsed.problems, parsed.problems[:3]
    labels = [bind_to_image(parsed.mapping[k], 640, 480)[0] for k in keys[:args.reads]]
    decode_target(labels[0], 480, 640, instance_masks=True)   # imports torchvision, cv2: not timed
    t0 = time.perf_counter()
    for lab in labels:
        decode_target(lab, 480, 640)
    target_us = (time.perf_counter() - t0) / len(labels) * 1e6
    t0 = time.perf_counter()
    for lab in labels[:200]:
        decode_target(lab, 480, 640, instance_masks=True)
    masks_us = (time.perf_counter() - t0) / min(200, len(labels)) * 1e6
    jpeg = turbo_encode(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8), 90)
    t0 = time.perf_counter()
    for _ in range(200):
        turbo_decode(jpeg)
    jpeg_us = (time.perf_counter() - t0) / 200 * 1e6
    meta_bytes = np.mean([len(json.dumps(lab, separators=(",", ":"))) for lab in labels])
    print(json.dumps({"images": args.images, "annotations": len(anns), "parse_coco_s": round(parse_s, 3),
                      "decode_target_us": round(target_us, 1), "decode_target_instance_masks_us": round(masks_us, 1),
                      "jpeg_decode_640x480_us (noise image, baseline)": round(jpeg_us, 1),
                      "label_json_bytes_per_image": round(float(meta_bytes), 1)}))


if __name__ == "__main__":
    main()
