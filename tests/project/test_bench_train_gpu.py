"""scripts/bench_train_gpu.py's trace summary (its --profile), on hand-made profiler traces: which
stream is the training stream, its idle time, the other streams' overlap with it, the CUDA calls."""
import itertools
import json
import statistics
import sys

import pytest
import torch

from tests import REPO

sys.path.insert(0, str(REPO / "scripts"))
bench = pytest.importorskip("bench_train_gpu")


def _kernel(ts, dur, stream, name="k", cat="kernel"):
    return {"ph": "X", "cat": cat, "ts": ts, "dur": dur, "name": name, "args": {"stream": stream}}


def test_union_merges_overlapping_spans():
    assert bench._union([]) == 0
    assert bench._union([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17


def test_summary_of_a_training_stream_and_a_loader_stream():
    trace = {"traceEvents": [
        _kernel(0, 10, 7, "conv"), _kernel(15, 10, 7, "bn"),            # training: busy 20 of 25
        _kernel(20, 3, 7, "Memcpy HtoD", cat="gpu_memcpy"),               # inside bn's span
        _kernel(5, 12, 30, "rgba2rgb"), _kernel(40, 4, 30, "rgba2rgb"),   # loader: 7 us over training
        {"ph": "X", "cat": "cuda_runtime", "ts": 1, "dur": 3, "name": "cudaLaunchKernel", "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "ts": 2, "dur": 9, "name": "cudaLaunchKernel", "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "ts": 3, "dur": 40, "name": "cudaEventSynchronize", "args": {}},
        {"ph": "i", "cat": "kernel", "ts": 3, "name": "not a span"},
    ]}
    s = bench.trace_summary(trace)
    assert s["main_stream"] == 7
    assert (s["window_us"], s["main_busy_us"], s["main_idle_us"]) == (25, 20, 5)
    assert s["others_overlap_us"] == 7
    assert s["streams"]["7"] == {"n": 3, "kernel_us": 20, "copy_us": 3}
    assert s["streams"]["30"] == {"n": 2, "kernel_us": 16, "copy_us": 0}
    assert s["other_kernels"] == {"rgba2rgb": {"n": 2, "us": 16}}
    assert list(s["runtime"]) == ["cudaEventSynchronize", "cudaLaunchKernel"]  # by total time
    assert s["runtime"]["cudaLaunchKernel"] == {"n": 2, "total_us": 12, "max_us": 9}


def test_summary_without_gpu_events_is_empty():
    assert bench.trace_summary({"traceEvents": []}) == {}
    assert bench.trace_summary({}) == {}


def test_feed_only_row_reports_rate_busy_cores_and_host_split(monkeypatch):
    """Model ``none`` (the feed alone) through the same timing loop as a training row, with CUDA's
    events and synchronize stood in for on this GPU-less machine: the row has every figure."""
    class FakeEvent:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 1.0  # milliseconds

    monkeypatch.setattr(bench.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(bench, "Timer", _CpuTimer)
    taken = []

    def feed():
        while True:
            taken.append(1)
            yield None, None

    row = bench.train(None, None, feed(), steps=5, warmup=2, batch=4)
    assert len(taken) == 7
    assert row["img_per_s"] > 0 and row["wall_s"] >= 0 and row["cpu_cores"] >= 0
    assert 0 < row["gpu_busy"]
    assert set(row["host_ms_per_step"]) == {"feed", "step"}
    assert all(v >= 0 for v in row["host_ms_per_step"].values())


def test_lookahead_waits_for_the_step_n_back_before_taking_a_batch(monkeypatch):
    """--lookahead N: before taking batch i the loop waits on the end event of step i-N (the host
    at most N steps ahead of the GPU); without it nothing waits."""
    log = []

    class FakeEvent:
        made = 0

        def __init__(self, enable_timing=False):
            self.n = FakeEvent.made
            FakeEvent.made += 1

        def record(self):
            pass

        def synchronize(self):
            log.append(("wait", self.n))

        def elapsed_time(self, other):
            return 1.0

    monkeypatch.setattr(bench.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(bench, "Timer", _CpuTimer)

    def feed():
        while True:
            log.append(("take",))
            yield None, None

    bench.train(None, None, feed(), steps=5, warmup=1, batch=4, lookahead=2)
    # Timed step i makes events 2i (start) and 2i+1 (end); the warm-up step takes one batch first.
    assert log == [("take",), ("take",), ("take",), ("wait", 1), ("take",), ("wait", 3), ("take",),
                   ("wait", 5), ("take",)]
    log.clear()
    FakeEvent.made = 0
    bench.train(None, None, feed(), steps=3, warmup=0, batch=4)
    assert log == [("take",)] * 3


def test_graph_step_captures_once_and_replays_with_each_batch_copied_in(monkeypatch):
    """--cuda-graph: a few eager steps on a side stream, one capture of forward, backward and
    optimizer step on the graph's static input, then per batch: the batch copied into that static
    input and one replay (CUDA's stream and graph calls stood in for on this GPU-less machine; the
    model and optimizer are real, on the CPU)."""
    import contextlib

    class FakeStream:
        def wait_stream(self, other):
            pass

    class FakeGraph:
        replays = 0

        def replay(self):
            FakeGraph.replays += 1

    capturing = []

    @contextlib.contextmanager
    def graph(g, capture_error_mode="global"):
        # the loader's threads go on with their CUDA calls while the step is captured
        assert capture_error_mode == "thread_local"
        capturing.append(True)
        yield
        capturing.pop()

    monkeypatch.setattr(bench.torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(bench.torch.cuda, "current_stream", lambda *a: FakeStream())
    monkeypatch.setattr(bench.torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(bench.torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(bench.torch.cuda, "graph", graph)
    monkeypatch.setattr(bench.torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    seen = []  # (captured?, the input tensor) per forward

    class Net(torch.nn.Linear):
        def forward(self, x):
            seen.append((bool(capturing), x))
            return super().forward(x)

    torch.manual_seed(0)
    model = Net(4, 1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x0, y0 = torch.zeros(2, 4), torch.tensor([1, 2])
    step = bench.graph_step(model, opt, x0, y0, eager_warmup=3)
    assert [c for c, _ in seen] == [False, False, False, True]  # 3 eager steps, then the capture
    static_x = seen[-1][1]
    assert all(x is static_x for _, x in seen)  # every step ran on the static input
    assert all(p.grad is not None for p in model.parameters())  # the capture made the gradients
    for k in range(1, 4):
        x = torch.full((2, 4), float(k))
        step(x, torch.tensor([1003, 5]))
        assert torch.equal(static_x, x) and FakeGraph.replays == k
    assert len(seen) == 4  # replays run the graph, not the model


class _CpuTimer:
    """bench_common.Timer without its CUDA synchronize."""

    def __enter__(self):
        import time
        self.t, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        import time
        self.wall = max(time.perf_counter() - self.t, 1e-6)
        self.cpu = time.process_time() - self.c


def test_idle_gaps_by_cause_and_what_ran_beside_the_waits():
    """Each gap before a training-stream op is put down to the op's launch: returned just before
    the op ran (the host was behind), long before (the stream waited; the other streams' work in
    that gap is named), no launch in the trace, or a gap too short to be more than launch latency."""
    def op(ts, dur, corr, name="k", stream=7, cat="kernel"):
        return {"ph": "X", "cat": cat, "ts": ts, "dur": dur, "name": name,
                "args": {"stream": stream, "correlation": corr}}

    def launch(ts, dur, corr):
        return {"ph": "X", "cat": "cuda_runtime", "ts": ts, "dur": dur, "name": "cudaLaunchKernel",
                "args": {"correlation": corr}}

    trace = {"traceEvents": [
        op(0, 10, 1), launch(0, 1, 1),
        op(30, 10, 2), launch(2, 3, 2),       # gap 20, launched 25 us before it ran: waiting
        op(50, 10, 3), launch(40, 5, 3),      # gap 10, launched 5 us before: launched late
        op(63, 7, 4), launch(1, 1, 4),        # gap 3: back to back
        op(80, 10, 5),                        # gap 10, no launch in the trace: unknown
        op(12, 13, 90, "rcmn", stream=30), op(28, 7, 91, "Memcpy HtoD", stream=31, cat="gpu_memcpy"),
        op(52, 6, 92, "rgba2rgb", stream=30),  # inside an op of the training stream, not a gap
    ]}
    s = bench.trace_summary(trace)
    assert s["main_idle_by_cause_us"] == {"back_to_back": 3, "launched_late": 10, "waiting": 20, "unknown": 10}
    assert s["beside_waiting_us"] == {"rcmn": 13, "Memcpy HtoD": 2}
    assert s["main_idle_us"] == sum(s["main_idle_by_cause_us"].values())


@pytest.mark.timeout(120)
def test_cpu_crop_feed_normalizes_the_cpu_readers_crops_epoch_after_epoch(tmp_path):
    """``packer-cpu``: BatchLoader's crops (decoded on the CPU) normalized into bf16 channels_last
    batches, the store's labels with them, epoch after epoch in one pass (the sampler's next
    epoch: another order, other crops) (on the CPU here: the same code with ``device="cuda"``
    copies the pinned batch to the GPU first)."""
    from readers import BatchLoader, CropDataset, DistributedSampler, RandomResizedCrop

    store = tmp_path / "s.lmdb"
    bench.make_store(store, 12)
    feed = bench.cpu_crop_feed(str(store), 4, 1, 0, 1, torch.device("cpu"))
    got = [next(feed) for _ in range(6)]  # two epochs of three batches
    del feed
    torch.manual_seed(0)  # rank 0's crops: torch's generator, drawn in batch order
    sampler = DistributedSampler(12, num_replicas=1, rank=0, shuffle=True, seed=0)
    order = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        order += list(sampler)
    ref = BatchLoader(CropDataset(str(store), RandomResizedCrop(224), layout="HWC"), 4, sampler=order,
                      drop_last=True)
    want = [(x.clone(), y.clone()) for x, y in ref]
    assert len(want) == 6
    mean = torch.tensor(bench.MEAN).view(1, 3, 1, 1)
    std = torch.tensor(bench.STD).view(1, 3, 1, 1)
    for (x, y), (xr, yr) in zip(got, want):
        assert x.shape == (4, 3, 224, 224) and x.dtype == torch.bfloat16
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(y, yr)
        expect = (xr.permute(0, 3, 1, 2).float() - mean) / std
        assert torch.allclose(x.float(), expect, atol=0.02, rtol=0.01)
    assert [y.tolist() for _, y in got[:3]] != [y.tolist() for _, y in got[3:]]  # epoch 1: another order
    assert not torch.equal(got[0][0], got[3][0])  # and other crops


@pytest.mark.timeout(120)
def test_packer_feed_takes_a_decoder_by_name_after_the_at(tmp_path):
    """``packer@turbojpeg``: what follows ``@`` that is neither ``engine...`` nor a number names the
    loader's decoder; a name no decoder has is an error, not a silent default."""
    store = tmp_path / "s.lmdb"
    bench.make_store(store, 8)
    info = {}
    x, y = next(bench.packer_feed(str(store), 4, 1, 0, 1, torch.device("cpu"), "turbojpeg", info))
    assert info["decoder"].name == "turbojpeg"
    assert x.shape == (4, 3, 224, 224) and x.dtype == torch.bfloat16 and y.shape == (4,)
    x, _ = next(bench.packer_feed(str(store), 4, 1, 0, 1, torch.device("cpu"), "cpu-crops", info))
    assert info["decoder"].name == "cpu-crops" and info["decoder"].supports_roi  # crops decoded at 224
    assert x.shape == (4, 3, 224, 224) and x.dtype == torch.bfloat16
    from packer.core.errors import UsageError

    with pytest.raises(UsageError, match="got 'nodecoder'"):
        next(bench.packer_feed(str(store), 4, 1, 0, 1, torch.device("cpu"), "nodecoder", {}))


def test_mixed_feed_splits_batches_and_indices_between_its_two_feeds():
    """``packer-mix``: ``share`` of the batches from the CPU feed, spread evenly, the rest from the
    GPU feed; the two parts of a sampler's indices are disjoint and together the whole, every epoch."""
    from readers import DistributedSampler

    gpu = iter(range(0, 1000, 2))   # even numbers: the GPU feed's batches, odd: the CPU feed's
    cpu = iter(range(1, 1000, 2))
    got = [b % 2 for b in itertools.islice(bench.mixed_feed(gpu, cpu, 0.4), 20)]
    assert sum(got) == 8 and "1, 1" not in str(got)  # 40%, never two CPU batches in a row
    assert [bench._takes(i, 0.25) for i in range(8)] == [False, False, False, True] * 2
    sampler = DistributedSampler(50, num_replicas=1, rank=0, shuffle=True, seed=0)
    parts = [bench._Part(sampler, 0.3, w) for w in (0, 1)]
    for epoch in (0, 1):
        for p in parts:
            p.set_epoch(epoch)
        a, b = list(parts[0]), list(parts[1])
        assert not set(a) & set(b) and sorted(a + b) == list(range(50))
        assert (len(a), len(b)) == (len(parts[0]), len(parts[1])) == (35, 15)
    first = list(parts[1])
    parts[1].set_epoch(2)
    assert list(parts[1]) != first  # the sampler's next epoch: other indices fall to the part


def test_mix_spec_reads_share_and_threads_and_refuses_nonsense():
    assert bench.mix_spec("0.4:4:8") == (0.4, 4, 8)
    for bad in ("0.4:4", "1.5:4:8", "0.4:0:8", "x:4:8"):
        with pytest.raises(SystemExit, match="packer-mix"):
            bench.mix_spec(bad)


def test_report_names_the_cuda_hardware_queues(monkeypatch, tmp_path):
    """The table's header and the JSON's env say which CUDA_DEVICE_MAX_CONNECTIONS the rows ran
    with (readers.gpu sets it on import; docs/gpu.md#cuda-hardware-queues)."""
    import json
    from types import SimpleNamespace

    from readers.gpu import queues

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    a = SimpleNamespace(out=tmp_path, batch=256, threads=12, steps=100)
    rows = [{"model": "resnet18", "feed": "synthetic", "gpus": 1, "img_per_s": 100.0, "gpu_busy": 0.99,
             "cpu_cores": 1.0}]
    bench.report(a, rows, 1)
    value = queues.status()["value"]
    header = (tmp_path / "bench_train_gpu.md").read_text().splitlines()[0]
    assert header.endswith(f"CUDA hardware queues {value or '8 (default)'}"), header
    assert json.loads((tmp_path / "bench_train_gpu.json").read_text())["env"]["cuda_queues"] == value


def test_cpu_lists_and_ranges_round_trip():
    import bench_common

    assert bench_common.cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert bench_common.cpu_list("") == set()
    assert bench_common.cpu_ranges({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert bench_common.cpu_ranges([]) == ""
    # gpu_check.sh's remote stage: the last quarter (at least one) for the S3 server
    assert bench_common.split_cpus(range(16)) == ("0-11", "12-15", 12)
    assert bench_common.split_cpus([0, 1, 2, 5, 6, 7, 8, 9]) == ("0-2,5-7", "8-9", 6)
    assert bench_common.split_cpus([3]) == ("-", "3", 0)


def test_bind_to_gpu_sets_every_thread_to_the_gpus_allowed_cpus(tmp_path, monkeypatch):
    """Every thread listed under /proc/self/task goes onto the GPU's local CPUs that the process may
    use; a thread that ended meanwhile is passed over; no local CPUs allowed: nothing is bound."""
    tasks = tmp_path / "task"
    for tid in ("101", "102", "103"):
        (tasks / tid).mkdir(parents=True)
    seen = {}

    def setaffinity(tid, cpus):
        if tid == 103:
            raise ProcessLookupError(tid)
        seen[tid] = set(cpus)

    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr(bench.os, "sched_setaffinity", setaffinity)
    assert bench.bind_to_gpu({"local_cpus": "4-7,16"}, tasks) == "4-5"
    assert seen == {101: {4, 5}, 102: {4, 5}}
    seen.clear()
    assert bench.bind_to_gpu({"local_cpus": "8-9"}, tasks) is None
    assert bench.bind_to_gpu({"local_cpus": None}, tasks) is None
    assert seen == {}


def test_gpu_placement_reads_the_gpus_node_and_cpus_from_sysfs(tmp_path, monkeypatch):
    class Props:
        pci_domain_id, pci_bus_id, pci_device_id = 0, 0x1B, 0

    monkeypatch.setattr(bench.torch.cuda, "get_device_properties", lambda device: Props())
    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    dev = tmp_path / "0000:1b:00.0"
    dev.mkdir()
    (dev / "numa_node").write_text("1\n")
    (dev / "local_cpulist").write_text("16-31\n")
    assert bench.gpu_placement(0, tmp_path) == {"pci": "0000:1b:00.0", "numa_node": 1, "local_cpus": "16-31",
                                                "allowed_cpus": "0-3"}
    (dev / "numa_node").unlink()  # a kernel that does not say: None, no error
    assert bench.gpu_placement(0, tmp_path)["numa_node"] is None


def _rows_file(folder, rows):
    folder.mkdir(parents=True)
    (folder / "bench_train_gpu.json").write_text(json.dumps({"env": {}, "rows": rows}))


def test_summarize_pairs_two_gpus_with_one_gpu_of_the_same_pass(tmp_path):
    """Three passes of one and two GPUs: each two-GPU row against the one-GPU row of its own pass
    and variant, min / median / max over the passes; a skipped row is left out; a bound two-GPU row
    is a row of its own, compared with the unbound one-GPU row; a variant's rows pair with their own."""
    def row(feed, gpus, label, rate, bind="none", **kw):
        r = {"model": "resnet50", "feed": feed, "gpus": gpus, "label": label, "bind": bind, "threads": 12,
             "img_per_s": rate, "gpu_busy": 0.99, "cpu_cores": 2.0}
        r.update(kw)
        return r

    for p, (one, two, s1, s2) in enumerate([(1000, 950, 1100, 1050), (1010, 900, 1100, 1060),
                                            (990, 980, 1100, 1070)], 1):
        _rows_file(tmp_path / f"p{p}" / "one" / "a",
                   [row("packer", 1, f"pass{p}", one), row("synthetic", 1, f"pass{p}", s1)])
        _rows_file(tmp_path / f"p{p}" / "two" / "a", [
            row("packer", 2, f"pass{p}", two, per_rank_cores=[2.0, 4.0],
                placement=[{"pci": "0000:1b:00.0", "numa_node": 0, "local_cpus": "0-15", "allowed_cpus": "0-31"}]),
            row("synthetic", 2, f"pass{p}", s2)])
    _rows_file(tmp_path / "p1" / "two_bound" / "a", [row("packer", 2, "pass1", 1000, bind="gpu")])
    _rows_file(tmp_path / "p1" / "view" / "a", [row("packer", 1, "pass1", 800, bucket_view=True),
                                               row("packer", 2, "pass1", 760, bucket_view=True, threads=4)])
    _rows_file(tmp_path / "p1" / "view4" / "a", [row("packer", 1, "pass1", 950, bucket_view=True, threads=4)])
    _rows_file(tmp_path / "p1" / "si" / "a", [row("packer", 2, "pass1", 990, switch_interval=0.0005,
                                                 loader_workers=3)])
    _rows_file(tmp_path / "p1" / "skipped", [{"model": "resnet50", "feed": "dali", "gpus": 1, "skipped": "no DALI"}])
    table = bench.summarize([tmp_path])
    lines = {tuple(c.strip() for c in ln.split("|")[1:5]): [c.strip() for c in ln.split("|")]
             for ln in table.splitlines() if ln.startswith("| resnet50")}
    two = lines[("resnet50", "packer", "2", "12 threads")]
    assert two[5:8] == ["3", "900 / 950 / 980", "0.891 / 0.950 / 0.990"]
    assert two[8] == f"{statistics.median([950 / 1050, 900 / 1060, 980 / 1070]):.3f}"
    assert two[10] == "3.00"  # the median of both ranks' cores over the runs
    assert lines[("resnet50", "packer", "2", "12 threads, bind gpu")][5:8] == ["1", "1,000", "1.000"]
    view = lines[("resnet50", "packer", "2", "4 threads, bucket view")]
    assert view[5:9] == ["1", "760", "0.800", f"{760 / 1050:.3f}"]  # its own one-GPU row; plain synthetic
    assert lines[("resnet50", "packer", "2", "12 threads, workers 3, switch 0.0005")][5:8] == ["1", "990", ""]
    one = lines[("resnet50", "packer", "1", "12 threads")]
    assert one[6:8] == ["990 / 1,000 / 1,010", ""]
    assert not any("dali" in k for k in lines)
    assert "0000:1b:00.0 node 0 local 0-15 allowed 0-31" in table


@pytest.mark.timeout(60)
def test_a_row_past_its_deadline_prints_every_threads_stack_and_exits():
    """--row-timeout: a row that stops making progress (here a thread asleep in a call that never
    returns, beside the main thread) leaves every thread's stack in the log and exits, instead of
    running into gpu_check.sh's stage cap with nothing said."""
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(REPO / "scripts")!r})
        import bench_train_gpu as b
        def stuck_loader():
            time.sleep(60)
        threading.Thread(target=stuck_loader, name="packer-gpu-decode", daemon=True).start()
        b.with_row_deadline(1.0, lambda: time.sleep(60))
        print("not reached")
    """)
    t0 = __import__("time").monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert __import__("time").monotonic() - t0 < 30
    assert p.returncode != 0 and "not reached" not in p.stdout
    assert "row deadline: 1 s" in p.stderr and "stuck_loader" in p.stderr and "<lambda>" in p.stderr, p.stderr


@pytest.mark.timeout(60)
def test_a_row_within_its_deadline_returns_its_result_and_disarms_it():
    """A row done before its deadline returns its result, and the deadline goes with it: the
    process lives on past it (in a process of its own: an armed deadline would end this one)."""
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO / "scripts")!r})
        import bench_train_gpu as b
        assert b.with_row_deadline(0.5, lambda: 42) == 42
        assert b.with_row_deadline(0, lambda: "none") == "none"
        time.sleep(1.5)
        print("alive past the deadline")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert p.returncode == 0 and "alive past the deadline" in p.stdout, p.stderr
