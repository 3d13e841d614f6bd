"""Real training steps fed three ways (run on a GPU): packer's GPU loader from an LMDB store, NVIDIA
DALI from the same JPEG bytes, and synthetic tensors already on the GPU (the ceiling).

    python3 scripts/bench_train_gpu.py --store S.lmdb --out OUT [--models resnet50,resnet18]
        [--threads 12] [--batch 256] [--steps 60] [--no-dali]
    torchrun --nproc-per-node 2 scripts/bench_train_gpu.py ...      # DDP: each rank its loader and GPU

On one GPU every row (model, feed) runs in a process of its own, as users run one loader per
training process: one feed's decoders, threads and GPU memory never weigh on the next row.
``--in-process`` runs them all in this one (torchrun runs each rank's rows in its process).

torchvision ResNet-50 / ResNet-18 (random init, 1000 classes), bf16 autocast, channels_last,
SGD (momentum 0.9), batch ``--batch`` per GPU. Feeds:

* ``packer``: ``GPULoader(store, TrainPipeline(224, bfloat16, channels_last), threads=T)``, the
  store split across ranks by ``readers.DistributedSampler``, with the decoder ``"auto"`` picks
  (the row's ``decoder``; for the native engine also the images its hardware JPEG engine decoded
  and its failed hardware batches); ``packer@engine[:SHARE]`` names the engine and its hardware
  share, ``packer@engine-roi[:SHARE]`` the engine decoding only the crop windows (ROI),
  ``packer@SHARE`` nvImageCodec with that hardware share, ``packer@turbojpeg`` libjpeg-turbo on the
  loader's threads (the decoded images uploaded, the crop and resize on the GPU),
  ``packer@cpu-crops`` the crops decoded at 224 on the loader's threads (readers/gpu/cpucrops.py:
  ``packer-cpu``'s work inside GPULoader);
* ``packer-cpu``: packer's CPU reader feeding the GPU: ``CropDataset(store, RandomResizedCrop(224))``
  (crop + resize + flip while decoding, libjpeg-turbo at the smallest DCT scale that covers each
  crop) through ``BatchLoader`` on ``T`` C++ threads into pinned batches, one copy to the GPU,
  ``gpu_ops.crop_mirror_normalize`` there (bf16, channels_last): the GPU does no decoding (FFCV's
  split of the work);
* ``packer-mix@SHARE:TG:TC``: both at once: ``SHARE`` of the batches (spread evenly) from the
  ``packer-cpu`` feed on ``TC`` threads, the rest from ``packer@engine`` on ``TG`` threads, each
  on its own part of the rank's indices (so an epoch is still each index once): the engine's
  GPU time beside training falls with its share of the batches, the CPU reader's cores with its;
* ``dali``: ``fn.external_source`` of the store's JPEG bytes (read once into memory) ->
  ``decoders.image_random_crop(mixed)`` -> ``resize`` 224 -> ``crop_mirror_normalize`` (float16,
  CHW, random mirror), ``num_threads=T``; the same per-rank split. Skipped (with the reason) where
  DALI is not installed: it is not a dependency of packer;
* ``synthetic``: one random bf16 batch on the GPU, reused (no input cost at all).

Per row: images/s per GPU (after ``--warmup`` steps), GPU busy time (CUDA events around each
step's forward, backward and optimizer step, over the wall time), the CPU cores the process used,
and the training thread's host milliseconds per step waiting for its batch (``feed``) and in
the rest of the loop (``step``: launching the step, waiting where the GPU is behind); for the
native engine also its host milliseconds per batch. ``--profile DIR`` adds 10 steps under
``torch.profiler`` (the trace in DIR, a summary in the row). ``--train-stream high`` runs the
training steps on a CUDA stream of the highest priority (the loader's streams have the lowest);
``--lookahead N`` keeps the training thread at most N steps ahead of the GPU over the timed steps;
``--cuda-graph`` replays each step as one captured CUDA graph (a few launches a step).
``--make N`` first writes a synthetic store of N photo-like ~500x375 JPEGs (classes by folder) at
``--store`` when it is missing. Writes OUT/bench_train_gpu.json and .md (rank 0).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import Timer, cpu_list, cpu_ranges  # noqa: E402  (sibling module: scripts/ is on sys.path when run as a script)

from packer.stores import open_store  # noqa: E402
from readers import DistributedSampler  # noqa: E402
from readers.gpu import GPULoader, TrainPipeline, queues, read_raw  # noqa: E402

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
DALI_HW_LOAD = 0.65


def make_store(path: Path, n: int, seed: int = 0) -> None:
    """A class store of ``n`` synthetic ~500x375 JPEGs in 10 class folders."""
    import tempfile

    import numpy as np

    import packer
    from packer.sample import encode_jpeg, synthetic_image

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            h, w = (375, 500) if i % 3 else (500, 375)
            folder = Path(tmp) / f"c{i % 10}"
            folder.mkdir(exist_ok=True)
            (folder / f"{i:06d}.jpg").write_bytes(encode_jpeg(synthetic_image(rng, h, w), quality=90))
        packer.build(tmp, None, str(path), "lmdb", workers=os.cpu_count(), executor="thread")


def gpu_placement(device, sysfs: Path = Path("/sys/bus/pci/devices")) -> dict:
    """Where ``device`` sits: its PCI address, NUMA node and the CPUs local to it (sysfs; None
    where the kernel does not say), and the CPUs this process may run on."""
    props = torch.cuda.get_device_properties(device)
    addr = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    out = {"pci": addr, "numa_node": None, "local_cpus": None, "allowed_cpus": cpu_ranges(os.sched_getaffinity(0))}
    try:
        out["numa_node"] = int((sysfs / addr / "numa_node").read_text())
        out["local_cpus"] = cpu_ranges(cpu_list((sysfs / addr / "local_cpulist").read_text()))
    except (OSError, ValueError):
        pass
    return out


def bind_to_gpu(placement: dict, tasks: Path = Path("/proc/self/task")) -> str | None:
    """Every thread of this process (and the threads it starts later) onto the CPUs local to the
    GPU (``placement["local_cpus"]``, within those it may use), as DALI's ``set_affinity`` does;
    the CPUs bound, or None where the GPU's CPUs are unknown or none of them is allowed."""
    cpus = cpu_list(placement.get("local_cpus") or "") & os.sched_getaffinity(0)
    if not cpus:
        return None
    for task in tasks.iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (OSError, ValueError):  # a thread that ended meanwhile
            pass
    return cpu_ranges(cpus)


def setup_distributed(bind: str = "none"):
    """``(rank, world, device)``; initializes NCCL under torchrun. ``bind="gpu"``: first every thread
    onto the CPUs local to this rank's GPU (:func:`bind_to_gpu`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if bind == "gpu":
        bound = bind_to_gpu(gpu_placement(torch.device("cuda", local)))
        print(f"rank {os.environ.get('RANK', '0')}: bound to CPUs {bound or 'unchanged (the GPU names none)'}",
              flush=True)
    if world > 1:
        torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", local))
    return (torch.distributed.get_rank() if world > 1 else 0), world, torch.device("cuda", local)


def make_model(name: str, device, world: int, bucket_view: bool = False):
    """``(model, optimizer)``; ``none``: no model (the feed alone: each step only takes a batch).
    ``bucket_view``: DDP's gradients are views into its all-reduce buckets (no copy into them)."""
    if name == "none":
        return None, None
    import torchvision

    model = getattr(torchvision.models, name)(num_classes=1000).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index],
                                                          gradient_as_bucket_view=bucket_view)
    return model, opt


def _rank_sampler(store: str, rank: int, world: int, part=None):
    """This rank's share of the store (``readers.DistributedSampler``, shuffled, seed 0), wrapped
    by ``part`` where given (:class:`_Part`, the mixed feed's split)."""
    sampler = DistributedSampler(_count(store), num_replicas=world, rank=rank, shuffle=True, seed=0)
    return part(sampler) if part is not None else sampler


def packer_feed(store: str, batch: int, threads: int, rank: int, world: int, device, spec=None, info=None,
                part=None, workers: int = 0):
    """The ``packer`` feeds; ``spec``: what follows ``packer@`` in the feed's name (None: ``"auto"``);
    ``part``: wraps the rank's sampler (:class:`_Part`, the mixed feed's split); ``workers``: the
    loader reads in that many worker processes (GPULoader's ``workers``)."""
    sampler = _rank_sampler(store, rank, world, part)
    decoder = "auto"
    if spec is not None and spec.startswith("engine"):  # packer's native engine (engine:SHARE)
        from readers.gpu.engine import EngineDecoder

        share = float(spec.split(":")[1]) if ":" in spec else -1.0
        decoder = EngineDecoder(device, threads=threads, hardware_share=share, roi=spec.startswith("engine-roi"))
    elif spec is not None:
        try:
            share = float(spec)
        except ValueError:  # a decoder by name (turbojpeg: libjpeg-turbo on the loader's threads)
            decoder = spec
        else:  # nvImageCodec with this share of each batch on the hardware engine
            from readers.gpu.nvimgcodec import NvImageCodecDecoder
            decoder = NvImageCodecDecoder(device, hw_load=share, threads=threads,
                                          fallback_threads=max(1, threads // 2))
    loader = GPULoader(store, TrainPipeline(224, dtype=torch.bfloat16, channels_last=True), batch_size=batch,
                       sampler=_Epochs(sampler), drop_last=True, device=device, decoder=decoder, threads=threads,
                       prefetch=3, workers=workers)
    if info is not None:
        info["decoder"] = loader.decoder  # what "auto" picked, for the row
        info["feed"] = loader.feed  # and what it measured against it (readers/gpu/feeds.py), if anything
    timed = info.setdefault("engine", []) if info is not None and hasattr(loader.decoder, "last_timings") else None
    for b in loader:  # one pass of _Epochs: the prefetch never restarts (a small store is many epochs)
        if timed is not None:  # the engine's host milliseconds per batch and its hardware share then
            timed.append(dict(loader.decoder.last_timings, share=loader.decoder.hardware_share))
        yield b.images, b.labels.to(device, non_blocking=True)


def _takes(i: int, share: float) -> bool:
    """Whether position ``i`` falls to the part of a split that takes ``share`` of all positions,
    spread evenly (``floor((i + 1) * share) > floor(i * share)``)."""
    return int((i + 1) * share) > int(i * share)


class _Part(torch.utils.data.Sampler):
    """One of the two parts of ``sampler``'s indices in the mixed feed: ``which=1`` the ``share`` of
    the positions :func:`_takes` gives, ``which=0`` the rest (set_epoch passed on)."""

    def __init__(self, sampler, share: float, which: int):
        self.sampler, self.share, self.which = sampler, float(share), bool(which)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        return (idx for i, idx in enumerate(self.sampler) if _takes(i, self.share) == self.which)

    def __len__(self):
        return sum(_takes(i, self.share) == self.which for i in range(len(self.sampler)))


def mixed_feed(gpu, cpu, share: float):
    """The ``packer-mix`` feed's batches: ``share`` of them from ``cpu``, spread evenly
    (:func:`_takes`), the rest from ``gpu``; each feed runs its own prefetch meanwhile."""
    i = 0
    while True:
        yield next(cpu if _takes(i, share) else gpu)
        i += 1


def mix_spec(spec: str) -> tuple[float, int, int]:
    """``packer-mix@SHARE:GPU_THREADS:CPU_THREADS`` -> (share, gpu threads, cpu threads)."""
    try:
        share, tg, tc = spec.split(":")
        out = float(share), int(tg), int(tc)
    except ValueError:
        raise SystemExit(f"packer-mix@SHARE:GPU_THREADS:CPU_THREADS, got packer-mix@{spec}") from None
    if not (0.0 < out[0] < 1.0 and out[1] > 0 and out[2] > 0):
        raise SystemExit(f"packer-mix: SHARE in (0, 1) and threads > 0, got packer-mix@{spec}")
    return out


class _Epochs(torch.utils.data.Sampler):
    """Epoch after epoch of ``sampler`` (set_epoch between them) as one long pass, as DALI's
    cycling source does: the loader's threads and prefetch run on across epochs."""

    def __init__(self, sampler, epochs: int = 10_000):
        self.sampler, self.epochs = sampler, epochs

    def __iter__(self):
        for e in range(self.epochs):
            self.sampler.set_epoch(e)
            yield from iter(self.sampler)

    def __len__(self):
        return self.epochs * len(self.sampler)


def cpu_crop_feed(store: str, batch: int, threads: int, rank: int, world: int, device, part=None):
    """The ``packer-cpu`` feed (see the module docstring): crops decoded on the CPU, normalized on
    ``device``; ``part`` as :func:`packer_feed`'s."""
    import gpu_ops
    from readers import BatchLoader, CropDataset, RandomResizedCrop

    torch.set_num_threads(threads)  # BatchLoader's decode threads
    sampler = _rank_sampler(store, rank, world, part)
    # One long pass of _Epochs, as the packer feeds: a BatchLoader pass per epoch drains its
    # pipeline at each epoch's end, and the ~500 px bench store (480 images) is one batch of 256 an
    # epoch: one batch decoding at a time on threads_per_batch threads (session 11's first rows:
    # 1,000 img/s on 2 cores). The crops come from torch's generator (seed=None, torchvision's
    # way), seeded per rank: the loader's epoch stays 0 over the long pass, so seeded boxes would
    # repeat every epoch. The boxes are drawn on BatchLoader's one read thread, in batch order.
    torch.manual_seed(rank)
    ds = CropDataset(store, RandomResizedCrop(224), layout="HWC", pin_memory=device.type == "cuda")
    for x, y in BatchLoader(ds, batch, sampler=_Epochs(sampler), drop_last=True):
        x = gpu_ops.crop_mirror_normalize(x.to(device, non_blocking=True), MEAN, STD, dtype=torch.bfloat16)
        yield x.contiguous(memory_format=torch.channels_last), y.to(device, non_blocking=True)


def dali_feed(store: str, batch: int, threads: int, rank: int, world: int, device):
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    with open_store(store, "lmdb") as r:
        raw = read_raw(r, list(range(r.metadata.count)), check=False)
    arrays = [d.numpy().copy() for d in raw.datas()]
    labels = [np.array([int(x)], np.int64) for x in raw.labels]
    mine = list(_rank_sampler(store, rank, world))

    def source(info):
        i = mine[info.idx_in_epoch % len(mine)]
        return arrays[i], labels[i]

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=device.index, prefetch_queue_depth=3, seed=rank)
    def pipe():
        jpegs, lab = fn.external_source(source=source, num_outputs=2, batch=False, dtype=[types.UINT8, types.INT64])
        images = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB,
                                               hw_decoder_load=DALI_HW_LOAD, random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT16, output_layout="CHW", mean=MEAN, std=STD,
                                          mirror=fn.random.coin_flip())
        return images, lab.gpu()

    p = pipe()
    p.build()
    it = DALIGenericIterator([p], ["x", "y"], size=-1)
    while True:
        for out in it:
            yield (out[0]["x"].to(torch.bfloat16).contiguous(memory_format=torch.channels_last),
                   out[0]["y"].view(-1))


def synthetic_feed(batch: int, device):
    x = torch.randn(batch, 3, 224, 224, device=device, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device)
    while True:
        yield x, y


def _count(store: str) -> int:
    with open_store(store, "lmdb") as r:
        return r.metadata.count


def train(model, opt, feed, steps: int, warmup: int, batch: int, profile: Path | None = None,
          high_priority: bool = False, lookahead: int = 0, cuda_graph: bool = False) -> dict:
    """Images/s and GPU busy fraction over ``steps`` timed steps after ``warmup``; with ``profile``,
    then 10 more steps under ``torch.profiler`` (trace to ``profile``, summary in the row). With
    ``high_priority`` the steps run on a CUDA stream of the highest priority: the GPU's scheduler
    then starts their blocks before those of the loader's streams (default priority, the lowest).
    With ``lookahead`` N > 0 each timed step first waits until the step N before it has finished on
    the GPU (0: the host runs ahead until CUDA's launch queue is full). With ``cuda_graph`` the
    step (forward, backward, optimizer) is captured once as a CUDA graph (:func:`graph_step`) and
    replayed: a few launches a step instead of hundreds."""
    if not high_priority:
        return _train(model, opt, feed, steps, warmup, batch, profile, lookahead, cuda_graph)
    stream = torch.cuda.Stream(priority=-100)  # out of range maps to the highest priority there is
    stream.wait_stream(torch.cuda.current_stream())  # the model and optimizer were made on this one
    with torch.cuda.stream(stream):
        row = _train(model, opt, feed, steps, warmup, batch, profile, lookahead, cuda_graph)
    torch.cuda.current_stream().wait_stream(stream)
    return dict(row, train_stream_priority=stream.priority)


def classes(y: torch.Tensor) -> torch.Tensor:
    """The feed's labels as the models' 1000 class indices."""
    return y.long() % 1000


def eager_step(model, opt):
    """One training step as users write it: bf16 autocast, cross-entropy, SGD."""
    def step(x, y):
        if model is None:
            return
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), classes(y))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def graph_step(model, opt, x0, y0, eager_warmup: int = 3):
    """The training step captured as one CUDA graph (PyTorch's whole-network capture: a few eager
    steps on a side stream, then the capture with the gradients unset, so that every replay writes
    them anew); each call copies its batch into the graph's static input and replays it. ``x0`` /
    ``y0``: a batch of the feed's shapes and types."""
    static_x, static_y = x0.clone(), classes(y0)
    eager = eager_step(model, opt)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(eager_warmup):
            eager(static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    # thread_local: the loader's threads go on making CUDA calls (allocations, event queries)
    # during the capture; only this thread's calls must be capturable.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = F.cross_entropy(model(static_x), static_y)
        loss.backward()
        opt.step()

    def step(x, y):
        static_x.copy_(x)
        static_y.copy_(classes(y))
        graph.replay()

    return step


def _train(model, opt, feed, steps: int, warmup: int, batch: int, profile: Path | None, lookahead: int = 0,
           cuda_graph: bool = False) -> dict:
    step = eager_step(model, opt)
    if cuda_graph and model is not None:
        step = graph_step(model, opt, *next(feed))
    for _ in range(warmup):
        step(*next(feed))
    events = []
    feed_s = 0.0  # host seconds the training thread waited for its next batch (the rest: its steps)
    with Timer() as t:
        for i in range(steps):
            t0 = time.perf_counter()
            if lookahead and i >= lookahead:  # the host at most `lookahead` steps ahead of the GPU
                events[i - lookahead][1].synchronize()
            x, y = next(feed)
            feed_s += time.perf_counter() - t0
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(x, y)
            end.record()
            events.append((start, end))
    busy = sum(s.elapsed_time(e) for s, e in events) / 1000
    row = {"img_per_s": round(steps * batch / t.wall, 1), "gpu_busy": round(busy / t.wall, 3),
           "wall_s": round(t.wall, 2), "cpu_cores": round(t.cpu / t.wall, 2),
           "host_ms_per_step": {"feed": round(1000 * feed_s / steps, 2),
                                "step": round(1000 * (t.wall - feed_s) / steps, 2)}}
    if profile is not None:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step(*next(feed))
            torch.cuda.synchronize()
        profile.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(profile))
        row["profile"] = trace_summary(json.loads(profile.read_text()))
    return row


def _union(spans: list) -> float:
    """Microseconds covered by the union of ``(start, end)`` spans."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


#: A training-stream op that started within this many microseconds of its launch call's return was
#: waited for by the stream (the host was behind); one launched earlier waited on the GPU.
LAUNCHED_LATE_US = 20
#: Gaps between the training stream's ops up to this long are the GPU's own launch latency
#: (``back_to_back``), not a cause.
BACK_TO_BACK_US = 5


def _idle_causes(events: list, gpu: list, main) -> dict:
    """The training stream's idle gaps by cause: ``back_to_back`` (gaps up to BACK_TO_BACK_US),
    else the next op ``launched_late`` (its launch call returned under LAUNCHED_LATE_US before it
    ran: the host loop was behind), ``waiting`` (launched earlier, yet the stream waited: on an
    event, or for room beside other streams' work), or ``unknown`` (no launch call in the trace);
    and the other streams' kernels and copies running inside the ``waiting`` gaps (microseconds by
    name)."""
    import bisect

    launches = {e["args"].get("correlation"): e for e in events if e.get("cat") == "cuda_runtime"}
    ops = sorted((e for e in gpu if e["args"].get("stream") == main), key=lambda e: e["ts"])
    others = sorted((e["ts"], e["ts"] + e["dur"], e["name"][:80]) for e in gpu if e["args"].get("stream") != main)
    starts = [o[0] for o in others]
    longest = max((b - a for a, b, _ in others), default=0.0)
    causes = {"back_to_back": 0.0, "launched_late": 0.0, "waiting": 0.0, "unknown": 0.0}
    beside: dict = {}
    end = ops[0]["ts"] + ops[0]["dur"] if ops else 0.0
    for op in ops[1:]:
        gap = op["ts"] - end
        if gap > 0:
            call = launches.get(op["args"].get("correlation"))
            cause = "back_to_back" if gap <= BACK_TO_BACK_US else "unknown" if call is None else (
                "launched_late" if op["ts"] - (call["ts"] + call["dur"]) < LAUNCHED_LATE_US else "waiting")
            causes[cause] += gap
            if cause == "waiting":
                lo = bisect.bisect_left(starts, end - longest)
                hi = bisect.bisect_left(starts, op["ts"])
                for a, b, name in others[lo:hi]:
                    inside = min(b, op["ts"]) - max(a, end)
                    if inside > 0:
                        beside[name] = beside.get(name, 0.0) + inside
        end = max(end, op["ts"] + op["dur"])
    return {"main_idle_by_cause_us": {k: round(v) for k, v in causes.items()},
            "beside_waiting_us": {k: round(v) for k, v in sorted(beside.items(), key=lambda kv: -kv[1])[:6]}}


def trace_summary(trace: dict) -> dict:
    """Where a profiled window's GPU time went: per CUDA stream the kernel time, the training
    stream's (the one with the most kernel time) busy and idle time, its idle time by cause
    (:func:`_idle_causes`), the other streams' kernel time that overlaps it, and the CUDA runtime
    calls by name (count, total and longest, microseconds)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_stream: dict = {}
    for e in gpu:
        by_stream.setdefault(e["args"].get("stream"), []).append((e["ts"], e["ts"] + e["dur"], e["cat"]))
    if not by_stream:
        return {}
    main = max(by_stream, key=lambda s: sum(b - a for a, b, c in by_stream[s] if c == "kernel"))
    spans = sorted((a, b) for a, b, _ in by_stream[main])
    window = max(b for _, b in spans) - spans[0][0]
    busy = _union(spans)
    others = [(a, b) for s, v in by_stream.items() if s != main for a, b, c in v if c == "kernel"]
    overlap = _union(others) + busy - _union(others + spans)  # |A and B| = |A| + |B| - |A or B|
    names: dict = {}  # the other streams' kernels by name: count, microseconds
    for e in gpu:
        if e["args"].get("stream") != main and e["cat"] == "kernel":
            r = names.setdefault(e["name"][:80], [0, 0.0])
            r[0] += 1
            r[1] += e["dur"]
    idle = _idle_causes(events, gpu, main)
    runtime: dict = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
            r = runtime.setdefault(e["name"], [0, 0.0, 0.0])
            r[0] += 1
            r[1] += e["dur"]
            r[2] = max(r[2], e["dur"])
    top = sorted(runtime.items(), key=lambda kv: -kv[1][1])[:12]
    return {"window_us": round(window), "main_stream": main, "main_busy_us": round(busy),
            "main_idle_us": round(window - busy), "others_overlap_us": round(overlap),
            "streams": {str(s): {"n": len(v), "kernel_us": round(sum(b - a for a, b, c in v if c == "kernel")),
                                 "copy_us": round(sum(b - a for a, b, c in v if c != "kernel"))}
                        for s, v in by_stream.items()},
            **idle,
            "other_kernels": {k: {"n": n, "us": round(t)} for k, (n, t) in
                              sorted(names.items(), key=lambda kv: -kv[1][1])[:10]},
            "runtime": {k: {"n": n, "total_us": round(t), "max_us": round(m)} for k, (n, t, m) in top}}


def run_row(a, model_name: str, feed_name: str, rank: int, world: int, device) -> dict:
    torch.manual_seed(rank)
    model, opt = make_model(model_name, device, world, a.bucket_view)
    row = {"model": model_name, "feed": feed_name, "threads": a.threads, "batch": a.batch, "gpus": world,
           "bind": a.bind, "label": a.label, "placement": gpu_placement(device)}
    row.update({k: v for k, v in (("loader_workers", a.loader_workers), ("switch_interval", a.switch_interval),
                                  ("bucket_view", a.bucket_view)) if v})
    knobs = {k: v for k, v in sorted(os.environ.items()) if k.startswith("PACKER_ENGINE_")}
    if knobs:  # the engine's settings from the environment (readers/gpu/engine.py)
        row["engine_env"] = knobs
    info: dict = {}  # packer's feed puts its decoder here
    try:
        if feed_name == "packer-cpu":
            feed = cpu_crop_feed(a.store, a.batch, a.threads, rank, world, device)
        elif feed_name.startswith("packer-mix@"):  # the engine and the CPU reader, batches split
            share, tg, tc = mix_spec(feed_name.split("@")[1])
            gpu = packer_feed(a.store, a.batch, tg, rank, world, device, "engine", info,
                              part=lambda s: _Part(s, share, 0))
            cpu = cpu_crop_feed(a.store, a.batch, tc, rank, world, device, part=lambda s: _Part(s, share, 1))
            feed = mixed_feed(gpu, cpu, share)
        elif feed_name.startswith("packer"):   # packer, packer@SPEC (see packer_feed)
            spec = feed_name.split("@")[1] if "@" in feed_name else None
            feed = packer_feed(a.store, a.batch, a.threads, rank, world, device, spec, info, workers=a.loader_workers)
        elif feed_name == "dali":
            feed = dali_feed(a.store, a.batch, a.threads, rank, world, device)
        else:
            feed = synthetic_feed(a.batch, device)
        trace = a.profile / f"trace_{model_name}_{feed_name.replace('@', '_').replace(':', '_')}_r{rank}.json" \
            if a.profile else None
        row.update(train(model, opt, feed, a.steps, a.warmup, a.batch, trace, a.train_stream == "high", a.lookahead,
                         a.cuda_graph))
        row.update({k: v for k, v in (("lookahead", a.lookahead), ("cuda_graph", a.cuda_graph)) if v})
        dec = info.get("decoder")
        if dec is not None:
            row["decoder"] = dec.name
        choice = info.get("feed")
        if choice is not None:  # decoder="auto" measured its feeds: batches each decoded, what it chose
            row.update(feed_counts=dict(choice.counts), feed_chosen=choice.names[choice.current],
                       feed_rounds=[{"first": f, "ms": {k: round(v * 1e3, 2) for k, v in p.items()}, "chose": c}
                                    for f, p, c in choice.rounds])
        if hasattr(dec, "hardware_failures"):  # the engine: images on the hardware engine / threads
            row.update(engine_images=dict(dec.stats), hardware_failures=dec.hardware_failures)
            timed = info.get("engine", [])[-a.steps:]
            if timed and row.get("feed_chosen", dec.name) == dec.name:
                # mean host milliseconds per batch over the timed steps (and the mean share)
                row["engine_ms"] = {k: round(sum(t[k] for t in timed) / len(timed), 2) for k in timed[0]}
    except ImportError as exc:
        row["skipped"] = f"{type(exc).__name__}: {exc}"
    finally:
        del model, opt
        torch.cuda.empty_cache()
    return row


def report(a, rows: list, world: int) -> None:
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "cpus": os.cpu_count(), "gpus": world,
           "cuda_queues": queues.status().get("value")}  # CUDA_DEVICE_MAX_CONNECTIONS (None: CUDA's 8)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "bench_train_gpu.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    synth = {(r["model"], r["gpus"]): r.get("img_per_s") for r in rows if r["feed"] == "synthetic"}
    lines = [f"{env['gpu']}, torch {env['torch']}, {env['cpus']} CPUs, {world} GPU(s), batch {a.batch} per GPU, "
             f"{a.threads} loader threads, {a.steps} timed steps, CUDA hardware queues "
             f"{env['cuda_queues'] or '8 (default)'}", "",
             "| model | feed | images/s per GPU | vs synthetic | GPU busy | CPU cores |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['feed']} | skipped: {r['skipped'][:80]} | | | |")
            continue
        ref = synth.get((r["model"], r["gpus"]))
        vs = f"{r['img_per_s'] / ref:.3f}" if ref else ""
        feed = f"{r['feed']} ({r['feed_chosen']})" if "feed_chosen" in r else r["feed"]
        lines.append(f"| {r['model']} | {feed} | {r['img_per_s']:,.0f} | {vs} | {r['gpu_busy']:.1%} | "
                     f"{r.get('cpu_cores', '')} |")
    (a.out / "bench_train_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def _spread(values: list, fmt: str = "{:,.0f}") -> str:
    """``min / median / max`` (one value: itself)."""
    import statistics

    v = sorted(values)
    if not v:
        return ""
    if len(v) == 1:
        return fmt.format(v[0])
    return " / ".join(fmt.format(x) for x in (v[0], statistics.median(v), v[-1]))


def _variant(row: dict, bind: bool = True) -> str:
    """How a row was run: its loader threads and what it changed from the defaults (``--bind``,
    ``--loader-workers``, ``--switch-interval``, ``--bucket-view``, ``PACKER_ENGINE_*`` in the
    environment); ``bind=False`` leaves the binding
    out (a two-GPU row with ``--bind gpu`` is compared with the one-GPU row run without it)."""
    parts = [f"{row['threads']} threads" if row.get("threads") else "",
             f"bind {row['bind']}" if bind and row.get("bind", "none") != "none" else "",
             f"workers {row['loader_workers']}" if row.get("loader_workers") else "",
             f"switch {row['switch_interval']}" if row.get("switch_interval") else "",
             "bucket view" if row.get("bucket_view") else "",
             *(f"{k}={v}" for k, v in (row.get("engine_env") or {}).items())]
    return ", ".join(p for p in parts if p) or "-"


def collect_rows(folders: list) -> list:
    """The rows of every ``bench_train_gpu.json`` under ``folders`` (skipped rows too)."""
    rows = []
    for folder in folders:
        for f in sorted(Path(folder).rglob("bench_train_gpu.json")):
            rows += json.loads(f.read_text())["rows"]
    return rows


def summarize(folders: list) -> str:
    """One table from the rows of every ``bench_train_gpu.json`` under ``folders``: per model, feed,
    GPUs and variant (:func:`_variant`) the images/s per GPU (min / median / max over the runs), and
    for more than one GPU the ratio to the one-GPU row of the same model, feed, variant (binding
    aside) and label (a run's rows on one and two GPUs, made in the same pass), with GPU busy time
    and CPU cores per rank (medians); against synthetic input the plain synthetic row of the label."""
    import statistics

    rows = [r for r in collect_rows(folders) if "img_per_s" in r]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["feed"], r.get("gpus", 1), _variant(r)), []).append(r)
    one = {(r["model"], r["feed"], _variant(r), r.get("label", "")): r["img_per_s"] for r in rows
           if r.get("gpus", 1) == 1}
    synth = {(r["model"], r.get("gpus", 1), r.get("label", "")): r["img_per_s"] for r in rows
             if r["feed"] == "synthetic" and _variant(r, bind=False) == _variant({"threads": r.get("threads")})}
    lines = ["| model | feed | GPUs | variant | runs | images/s per GPU (min / median / max) | vs one GPU, same run "
             "(min / median / max) | vs synthetic, same run (median) | GPU busy | CPU cores per rank |",
             "|---|---|---:|---|---:|---|---|---:|---:|---|"]
    for (model, feed, gpus, variant), rs in sorted(groups.items(), key=lambda kv: kv[0]):
        vs_one = [r["img_per_s"] / one[k] for r in rs
                  if gpus > 1 and (k := (model, feed, _variant(r, bind=False), r.get("label", ""))) in one]
        vs_syn = [r["img_per_s"] / synth[k] for r in rs if (k := (model, gpus, r.get("label", ""))) in synth]
        cores = [c for r in rs for c in (r.get("per_rank_cores") or [r.get("cpu_cores")]) if c is not None]
        lines.append(f"| {model} | {feed} | {gpus} | {variant} | {len(rs)} | {_spread([r['img_per_s'] for r in rs])} | "
                     f"{_spread(vs_one, '{:.3f}')} | {f'{statistics.median(vs_syn):.3f}' if vs_syn else ''} | "
                     f"{statistics.median(r['gpu_busy'] for r in rs):.1%} | "
                     f"{f'{statistics.median(cores):.2f}' if cores else ''} |")
    places = {(p.get("pci"), p.get("numa_node"), p.get("local_cpus"), p.get("allowed_cpus"))
              for r in rows for p in (r.get("placement") if isinstance(r.get("placement"), list)
                                      else [r.get("placement")]) if p}
    lines += ["", "GPU placement seen (PCI address, NUMA node, CPUs local to it, CPUs the rank could use): "
              + "; ".join(f"{a} node {n} local {c} allowed {w}" for a, n, c, w in sorted(places, key=str))]
    return "\n".join(lines) + "\n"


def with_row_deadline(seconds: float, fn):
    """fn() with a deadline: past ``seconds`` (> 0) every thread's Python stack is written to
    stderr and the process exits (faulthandler: it works while a thread holds the GIL in a call
    that never returns), so a row that stops making progress leaves its stacks in the log and its
    table its other rows, instead of running into the stage's cap with nothing said."""
    import faulthandler

    if seconds <= 0:
        return fn()
    print(f"row deadline: {seconds:g} s (--row-timeout): past it every thread's stack is printed and the row's "
          "process exits", file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    try:
        return fn()
    finally:
        faulthandler.cancel_dump_traceback_later()


def _feeds(a) -> list:
    return [f for f in a.feeds.split(",") if not (a.no_dali and f == "dali")]


def _make_store_if_asked(a) -> None:
    if a.make and not Path(a.store).exists():
        make_store(Path(a.store), a.make)


def _rows_in_children(a, argv: list) -> int:
    """Each (model, feed) row in a child process of this script; the report from all of them."""
    import subprocess
    import tempfile

    _make_store_if_asked(a)
    feeds = _feeds(a)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in a.models.split(","):
            for feed_name in feeds:
                out = Path(tmp) / f"{model_name}-{len(rows)}.json"
                cmd = [sys.executable, __file__, *argv, "--models", model_name, "--feeds", feed_name,
                       "--row-json", str(out)]
                p = subprocess.run(cmd)
                if p.returncode != 0 or not out.exists():
                    row = {"model": model_name, "feed": feed_name, "threads": a.threads, "batch": a.batch, "gpus": 1,
                           "skipped": f"the row's process failed (exit {p.returncode})"}
                else:
                    row = json.loads(out.read_text())[0]
                print(json.dumps(row), flush=True)
                rows.append(row)
    report(a, rows, 1)
    return 1 if any("failed" in r.get("skipped", "") for r in rows) else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=".bench/train500.lmdb")
    ap.add_argument("--make", type=int, default=0, help="write a synthetic store of N images if --store is missing")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--models", default="resnet50,resnet18", help="torchvision models; none: the feed alone")
    ap.add_argument("--feeds", default="synthetic,packer,dali",
                    help="synthetic, packer, packer@engine[:SHARE], packer@engine-roi[:SHARE] (the native "
                         "engine; -roi: crop windows only), packer@SHARE (nvImageCodec, SHARE of each batch to the "
                         "hardware engine, the rest to its hybrid CPU+CUDA decoder), packer@turbojpeg, packer-cpu "
                         "(crops decoded on the CPU, normalized on the GPU), dali")
    ap.add_argument("--threads", type=int, default=12)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--no-dali", action="store_true")
    ap.add_argument("--profile", type=Path, help="after the timed steps, 10 steps under torch.profiler: the trace "
                    "in this folder, a summary (per-stream GPU time, the training stream's idle time, CUDA "
                    "runtime calls) in the row")
    ap.add_argument("--train-stream", choices=["default", "high"], default="default",
                    help="high: the training steps on a CUDA stream of the highest priority (the loader's "
                         "streams keep the default, lowest one)")
    ap.add_argument("--lookahead", type=int, default=0,
                    help="N > 0: before taking batch i the training thread waits until step i-N has finished on "
                         "the GPU (a loop that reads its loss every step has 1); 0: no limit")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="capture each model's training step once as a CUDA graph and replay it (one GPU)")
    ap.add_argument("--in-process", action="store_true", help="all rows in this process (torchrun does)")
    ap.add_argument("--bind", choices=["none", "gpu"], default="none",
                    help="gpu: each process's threads on the CPUs local to its GPU (its NUMA node, from sysfs)")
    ap.add_argument("--loader-workers", type=int, default=0,
                    help="the packer feeds read records in this many worker processes (GPULoader's workers)")
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="seconds: sys.setswitchinterval for the run (how long a thread keeps the GIL while "
                         "another waits for it; Python's default is 0.005)")
    ap.add_argument("--bucket-view", action="store_true",
                    help="DDP with gradient_as_bucket_view=True (its gradients are views into the all-reduce "
                         "buckets: no copy into them each step)")
    ap.add_argument("--row-timeout", type=float, default=0.0,
                    help="seconds: a row still running then prints every thread's stack and its process exits "
                         "(the table goes on with the next row where rows run in processes of their own); 0: none")
    ap.add_argument("--label", default="", help="put in every row (--summarize pairs rows of one label)")
    ap.add_argument("--summarize", type=Path, nargs="+", metavar="DIR",
                    help="no training: the rows of every bench_train_gpu.json under these folders as one table "
                         "(min / median / max a row; two GPUs against one, pairing rows of one label)")
    ap.add_argument("--rows-to", type=Path, metavar="FILE",
                    help="with --summarize: also every row found, as one JSON file (name it bench_train_gpu.json "
                         "for a later --summarize to read it)")
    ap.add_argument("--row-json", type=Path, help=argparse.SUPPRESS)  # a child's rows go here
    a = ap.parse_args(argv)
    if a.summarize:
        if a.rows_to:  # every row in one file (itself readable by --summarize)
            a.rows_to.parent.mkdir(parents=True, exist_ok=True)
            a.rows_to.write_text(json.dumps({"env": {}, "rows": collect_rows(a.summarize)}, indent=1))
        print(summarize(a.summarize), end="", flush=True)
        return 0
    if int(os.environ.get("WORLD_SIZE", "1")) == 1 and not a.in_process and a.row_json is None:
        return _rows_in_children(a, argv if argv is not None else sys.argv[1:])
    if a.switch_interval > 0:
        sys.setswitchinterval(a.switch_interval)
    rank, world, device = setup_distributed(a.bind)
    if a.cuda_graph and world > 1:
        ap.error("--cuda-graph: one GPU only (DDP's all-reduce is not captured here)")
    if rank == 0:
        _make_store_if_asked(a)
    if world > 1:
        torch.distributed.barrier()
    torch.backends.cudnn.benchmark = True
    feeds = _feeds(a)
    rows = []
    for model_name in a.models.split(","):
        for feed_name in feeds:
            row = with_row_deadline(a.row_timeout,
                                    lambda: run_row(a, model_name, feed_name, rank, world, device))
            if world > 1:
                gathered = [None] * world
                torch.distributed.all_gather_object(gathered, row)
                rates = [g["img_per_s"] for g in gathered if "img_per_s" in g]
                if rates:
                    cores = [g.get("cpu_cores") for g in gathered]
                    row = dict(row, img_per_s=round(sum(rates) / len(rates), 1), per_rank=rates,
                               gpu_busy=round(sum(g["gpu_busy"] for g in gathered) / world, 3),
                               per_rank_cores=cores, placement=[g.get("placement") for g in gathered])
            if rank == 0 and a.row_json is None:
                print(json.dumps(row), flush=True)
            rows.append(row)
    if a.row_json is not None:
        a.row_json.write_text(json.dumps(rows))
    elif rank == 0:
        report(a, rows, world)
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
