#!/usr/bin/env python3
"""Write a small sample dataset (images + YOLO labels) for the README's first command."""
import argparse

from packer.sample import make_dataset


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", help="folder to create (images/ and labels/ go inside)")
    ap.add_argument("-n", type=int, default=48, help="number of images")
    ap.add_argument("--kind", choices=["boxes", "classes", "csv"], default="boxes")
    args = ap.parse_args()
    images, labels = make_dataset(args.out, args.n, kind=args.kind)
    print(images, labels or "")


if __name__ == "__main__":
    main()
