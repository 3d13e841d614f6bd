"""The decode step of one batch: the region-of-interest plan, then the decode dispatch.

**The dispatch.** :func:`decode_batch` decodes a raw batch by the one path its decoder's declared
capabilities (:class:`readers.gpu.decoders.Decoder`'s flags, never probed) and the pipeline allow:

* *pixels*: a pixel store's records (HDF5 pixel mode), copied to the device as they are;
* *parts* (``decodes_parts``, the native engine): the reader's pinned buffers read in place, one
  :class:`gpu_ops.RaggedBatch` out, ROI windows included;
* *ragged* (``decodes_ragged``): ``decode_ragged``, one RaggedBatch, the store's JPEG facts passed
  as ``jpeg=`` where the decoder ``takes_jpeg``;
* *list*: ``decode`` (with ``jpeg=`` and ``regions=`` where the decoder takes them), a list of
  images, each EXIF orientation applied.

A ragged path needs a pipeline that takes ragged batches (the built-in ones, or ``accepts_ragged``),
images with no orientation to apply, and no ROI plan unless the decoder decodes windows in place.
:func:`submit_batch` is the *parts* path of a decoder that ``submits``: it queues the batch and
returns the call that collects it, so the loader keeps two batches in flight
(:class:`~readers.gpu.loader.GPULoader` keeps the threads, queues and epochs; this module decides
what a batch becomes).

**ROI decode**, for the train pipeline: draw the random-resized-crop boxes from the sizes the
store recorded, BEFORE decoding, and decode only those windows.

A 1920x1080 photo whose crop covers 30% of it then costs about 30% of its decode (the decoder still
parses the whole entropy-coded stream, but skips the inverse DCT, colour conversion and write-out
outside the window). The same generator draws the same boxes and flips as the full-decode path,
so results differ only at the crop borders, where the resampling filter no longer sees the pixels
outside the window (it clamps to the window's edge instead).

Planned when the decoder has ``supports_roi`` (the native engine and the nvImageCodec decoder, each
with ``roi=True``; ``cpu-crops`` with a train pipeline) and the pipeline is a
:class:`~readers.gpu.pipelines.TrainPipeline`. A window the decoder clipped (a stored size larger
than the image) is cropped whole: once decoded, the plan's parameters are fitted to the sizes
decoded (:func:`fit_params`). Images with an EXIF orientation still to apply are decoded whole
(their box is drawn on the rotated image).

Example:
    >>> images = decode_batch(decoder, pipeline, raw, seed, "cuda")       # doctest: +SKIP
    >>> plan = raw.roi                                  # None: no ROI decode  # doctest: +SKIP
    >>> out = pipeline(images, generator=plan.generator, params=plan.params) # doctest: +SKIP
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, List, Optional, Union

import torch

from gpu_ops import RaggedBatch
from gpu_ops.random import ResizedCropParams

from .decoders import Decoder, adopt
from .pipelines import DetectionPipeline, TrainPipeline, ValPipeline

__all__ = ["RoiPlan", "roi_plan", "decode_raw", "fit_params", "decode_batch", "submit_batch", "takes_ragged"]

#: Pipelines that take a RaggedBatch as well as a list of images.
_RAGGED_PIPELINES = (TrainPipeline, ValPipeline, DetectionPipeline)


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
    if not (adopt(decoder).supports_roi and isinstance(pipeline, TrainPipeline)
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
    """Decodes a raw batch with ``decoder``'s ``decode`` (a list of images), passing what it can
    use: the store's per-record JPEG facts (``takes_jpeg``) and the plan's regions."""
    decoder = adopt(decoder)
    kwargs = {"jpeg": raw.jpeg} if decoder.takes_jpeg else {}
    if plan is not None:
        kwargs["regions"] = plan.regions
    return decoder.decode(raw.datas(), device, raw.keys, **kwargs)


def takes_ragged(decoder: Decoder, pipeline, raw, plan: Optional[RoiPlan] = None) -> bool:
    """True where ``raw`` decodes straight into one RaggedBatch: the decoder ``decodes_ragged``,
    there is no ROI plan (or the decoder decodes its windows in place: ``supports_roi`` and
    ``decodes_parts``, the native engine), no EXIF orientation is left to apply, and the pipeline
    takes ragged batches (the built-in ones, or any with ``accepts_ragged = True``; ``pipeline=None``
    returns a list)."""
    return (decoder.decodes_ragged
            and (plan is None or (decoder.supports_roi and decoder.decodes_parts))
            and (isinstance(pipeline, _RAGGED_PIPELINES) or getattr(pipeline, "accepts_ragged", False))
            and all(o in (0, 1) for o in raw.orientations))


def decode_batch(decoder: Decoder, pipeline, raw, seed: int, device) -> Union[List[torch.Tensor], RaggedBatch]:
    """The decoded ``[H, W, C]`` images of ``raw`` on ``device``, as a list or one RaggedBatch, by
    the path of the module docstring. Sets ``raw.roi`` (the batch's :class:`RoiPlan` drawn with
    ``seed``, or None), its parameters fitted to the sizes decoded.

    Raises:
        DecodeError: a record that does not decode (its position in the batch and key).
    """
    if raw.encoding == "raw":  # pre-decoded pixels (HDF5 pixel mode)
        raw.roi = None
        return [d.view(raw.raw_shape).to(device, non_blocking=True) for d in raw.datas()]
    plan = raw.roi = roi_plan(pipeline, decoder, raw, seed)
    if takes_ragged(decoder, pipeline, raw, plan) and decoder.decodes_parts:
        # The native engine reads the pinned buffers in place (readers/gpu/engine.py).
        return _fitted(plan, decoder.decode_parts(raw.buffers, raw.parts, raw.keys, _regions(plan)))
    if takes_ragged(decoder, pipeline, raw, plan):  # straight into one ragged batch: no per-image Python
        facts = {"jpeg": raw.jpeg} if decoder.takes_jpeg else {}
        return decoder.decode_ragged(raw.datas(), device, raw.keys, **facts)
    imgs = decode_raw(decoder, raw, device, plan)
    return _fitted(plan, [_orient(t, o) for t, o in zip(imgs, raw.orientations)])


def submit_batch(decoder: Decoder, pipeline, raw, seed: int) -> Optional[Callable[[], RaggedBatch]]:
    """Queues ``raw`` on a decoder that ``submits`` (the *parts* path, with the plan's windows; sets
    ``raw.roi`` as :func:`decode_batch` does) and returns at once the call that collects its
    RaggedBatch (it waits, and raises :class:`~readers.gpu.decoders.DecodeError` as
    :func:`decode_batch` does); None where this batch is not submitted (the caller decodes it with
    :func:`decode_batch`)."""
    if not (decoder.submits and raw.encoding != "raw" and takes_ragged(decoder, pipeline, raw)):
        return None
    plan = raw.roi = roi_plan(pipeline, decoder, raw, seed)
    pending = decoder.submit_parts(raw.buffers, raw.parts, raw.keys, _regions(plan))
    if plan is None:
        return functools.partial(decoder.collect, pending)
    return functools.partial(_collect_fitted, decoder, pending, plan)


def _collect_fitted(decoder: Decoder, pending, plan: RoiPlan) -> RaggedBatch:
    return _fitted(plan, decoder.collect(pending))


def _regions(plan: Optional[RoiPlan]):
    return plan.regions if plan is not None else None


def _fitted(plan: Optional[RoiPlan], imgs):
    """``imgs`` as they are; the plan's parameters (if any) fitted to their sizes (:func:`fit_params`)."""
    if plan is not None:
        sizes = imgs.sizes if isinstance(imgs, RaggedBatch) else torch.tensor([t.shape[:2] for t in imgs])
        plan.params = fit_params(plan, sizes)
    return imgs


def _orient(img: torch.Tensor, orientation: int) -> torch.Tensor:
    """EXIF orientation (2..8) applied to an [H, W, C] tensor, as packer.core.integrity does."""
    if orientation in (0, 1):
        return img
    ops = {2: lambda t: t.flip(1), 3: lambda t: t.flip(0).flip(1), 4: lambda t: t.flip(0),
           5: lambda t: t.transpose(0, 1), 6: lambda t: t.transpose(0, 1).flip(1),
           7: lambda t: t.transpose(0, 1).flip(0).flip(1), 8: lambda t: t.transpose(0, 1).flip(0)}
    return ops[orientation](img).contiguous()
