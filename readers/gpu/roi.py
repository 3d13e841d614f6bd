"""Region-of-interest decode for the train pipeline: draw the random-resized-crop boxes from the
sizes the store recorded, BEFORE decoding, and decode only those windows.

A 1920x1080 photo whose crop covers 30% of it then costs about 30% of its decode (the decoder still
parses the whole entropy-coded stream, but skips the inverse DCT, colour conversion and write-out
outside the window). The same generator draws the same boxes and flips as the full-decode path,
so results differ only at the crop borders, where the resampling filter no longer sees the pixels
outside the window (it clamps to the window's edge instead).

Used by :class:`~readers.gpu.loader.GPULoader` when its decoder has ``supports_roi`` (the native
engine and the nvImageCodec decoder, each with ``roi=True``) and its pipeline is a
:class:`~readers.gpu.pipelines.TrainPipeline`. A window the decoder clipped (a stored size larger
than the image) is cropped whole: :func:`fit_params` takes the boxes from the sizes decoded.
Images with an EXIF orientation still to apply are decoded whole (their box is drawn on the
rotated image).

Example:
    >>> plan = roi_plan(pipeline, decoder, raw, seed)                      # doctest: +SKIP
    >>> imgs = decode_raw(decoder, raw, "cuda", plan)                      # doctest: +SKIP
    >>> out = pipeline(imgs, generator=plan.generator, params=plan.params) # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from gpu_ops.random import ResizedCropParams

from .pipelines import TrainPipeline

__all__ = ["RoiPlan", "roi_plan", "decode_raw", "fit_params"]


@dataclass
class RoiPlan:
    """What the decode stage hands the pipeline stage.

    Attributes:
        generator: the batch's generator, already past the box draws (colour jitter goes on from it).
        regions: per image the window to decode ``(top, left, height, width)``, or None (whole image).
        params: the pipeline's parameters for the DECODED images: ``(0, 0, h, w)`` boxes for the
            windows, the drawn box for whole images; the drawn flips.
    """

    generator: torch.Generator
    regions: List[Optional[tuple]]
    params: ResizedCropParams


def oriented_sizes(sizes: torch.Tensor, orientations) -> torch.Tensor:
    """Stored (height, width) -> the size after the EXIF orientation is applied."""
    out = sizes.clone()
    for i, o in enumerate(orientations):
        if o in (5, 6, 7, 8):
            out[i, 0], out[i, 1] = sizes[i, 1], sizes[i, 0]
    return out


def roi_plan(pipeline, decoder, raw, seed: int) -> Optional[RoiPlan]:
    """The ROI plan of one raw batch, or None where ROI decode does not apply (decoder without
    ROI, pipeline other than TrainPipeline, pixel stores)."""
    if not (getattr(decoder, "supports_roi", False) and isinstance(pipeline, TrainPipeline)
            and raw.encoding == "jpeg" and len(raw)):
        return None
    gen = torch.Generator().manual_seed(int(seed))
    p = pipeline.sample(oriented_sizes(raw.sizes, raw.orientations), gen)
    upright = [o in (0, 1) for o in raw.orientations]
    regions: List[Optional[tuple]] = [tuple(b) if u else None for b, u in zip(p.boxes.tolist(), upright)]
    boxes = p.boxes.clone()
    boxes[torch.tensor(upright, dtype=torch.bool), :2] = 0  # a window is cropped whole: (0, 0, h, w)
    return RoiPlan(gen, regions, ResizedCropParams(boxes, p.flip))


def fit_params(plan: RoiPlan, sizes: torch.Tensor) -> ResizedCropParams:
    """The plan's parameters with each window's box set to the size really decoded (``sizes``
    [B, 2], height and width): the same as drawn unless the decoder clipped a window."""
    boxes = plan.params.boxes.clone()  # a window's box is (0, 0, h, w) already (roi_plan)
    win = torch.tensor([r is not None for r in plan.regions], dtype=torch.bool)
    boxes[win, 2:] = torch.as_tensor(sizes).cpu().to(boxes.dtype)[win]
    return ResizedCropParams(boxes, plan.params.flip)


def decode_raw(decoder, raw, device, plan: Optional[RoiPlan] = None) -> List[torch.Tensor]:
    """Decodes a raw batch with ``decoder``, passing what it can use: the store's per-record JPEG
    facts (routing) and the plan's regions."""
    kwargs = {}
    if callable(getattr(decoder, "routes", None)):  # a routing decoder takes the store's JPEG facts
        kwargs["jpeg"] = getattr(raw, "jpeg", None)
    if plan is not None:
        kwargs["regions"] = plan.regions
    return decoder.decode(raw.datas(), device, raw.keys, **kwargs)
