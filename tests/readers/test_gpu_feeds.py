"""``GPULoader(decoder="auto")`` picks its feed by measuring it (readers/gpu/feeds.py): the policy
alone, the loader switching between two decoders on the CPU (one slows the consumer, as GPU decoding
slows a model that keeps the GPU busy), and on a GPU the engine against the crops on the CPU (the
``cuda`` test, run by ``gpu_check.sh``)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

import packer
from packer.sample import make_dataset
from readers.gpu import CpuCropDecoder, GPULoader, TrainPipeline, ValPipeline
from readers.gpu.decoders import adopt
from readers.gpu.feeds import FeedChoice
from tests.corpus import class_store
from tests.gpu_ops_helpers import require_cuda  # noqa: F401 (fixture)


def run_round(choice: FeedChoice, period, first: int = 0) -> list:
    """Picks and observes one round's batches from ``first``; ``period(decoder, seq)`` is the
    consumer's seconds for a batch. Returns the picks."""
    picks = []
    for seq in range(first, first + choice.span * len(choice.names)):
        picks.append(choice.pick(seq))
    for seq, which in zip(range(first, first + len(picks)), picks):
        choice.observe(seq, period(which, seq))
    return picks


def test_a_round_measures_each_decoder_in_turn_and_keeps_the_faster():
    choice = FeedChoice(["engine", "cpu-crops"], lag=3, trial=4, every=100)
    assert choice.span == 10
    picks = run_round(choice, lambda which, seq: 0.050 if which == 0 else 0.045)
    assert picks == [0] * 10 + [1] * 10
    assert choice.current == 1 and choice.rounds[0][2] == "cpu-crops"
    assert choice.rounds[0][1] == pytest.approx({"engine": 0.050, "cpu-crops": 0.045})
    assert choice.counts == {"engine": 10, "cpu-crops": 10}
    # until the next round (every 100 batches from the first) the chosen one decodes everything
    assert [choice.pick(seq) for seq in range(20, 100)] == [1] * 80
    # the next round starts with the decoder in use, then measures the other again
    picks = run_round(choice, lambda which, seq: 0.030 if which == 0 else 0.045, first=100)
    assert picks == [1] * 10 + [0] * 10 and choice.current == 0 and len(choice.rounds) == 2


def test_the_batches_at_each_end_of_a_phase_do_not_count():
    """The first and last ``lag`` batches of a phase are still fed partly by the other decoder
    (queues, batches in flight): their periods, however long, change nothing."""
    choice = FeedChoice(["a", "b"], lag=3, trial=4, every=1000)

    def period(which, seq):
        edge = seq % choice.span < 3 or seq % choice.span >= choice.span - 3
        return 9.0 if edge and which == 1 else (0.050 if which == 0 else 0.040)

    run_round(choice, period)
    assert choice.rounds[0][1] == pytest.approx({"a": 0.050, "b": 0.040}) and choice.current == 1


def test_another_decoder_replaces_the_one_in_use_only_beyond_the_margin():
    choice = FeedChoice(["a", "b"], lag=1, trial=3, every=1000, margin=0.05)
    run_round(choice, lambda which, seq: 0.100 if which == 0 else 0.097)  # 3% shorter: not enough
    assert choice.current == 0 and choice.rounds[0][2] == "a"


def test_a_new_epoch_drops_a_round_not_measured_to_its_end_and_starts_it_again():
    choice = FeedChoice(["a", "b"], lag=1, trial=2, every=1000)
    picks = [choice.pick(seq) for seq in range(6)]  # the round's first phase and part of the second
    for seq in range(6):
        choice.observe(seq, 0.01)
    assert picks == [0, 0, 0, 0, 1, 1] and not choice.rounds
    choice.restart()
    picks = run_round(choice, lambda which, seq: 0.02 if which == 0 else 0.01, first=6)
    assert picks == [0] * 4 + [1] * 4 and choice.current == 1 and len(choice.rounds) == 1


def test_one_decoder_is_no_choice():
    with pytest.raises(ValueError):
        FeedChoice(["engine"])


# -- the loader switching decoders (CPU) ---------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return class_store(tmp_path_factory.mktemp("feeds"), 24, seed=7)


class Timed(CpuCropDecoder):
    """The crops on the CPU, each batch's submit taking ``seconds``, holding ``lock`` meanwhile
    when given: the consumer takes the same lock at each step, as a model waits for the GPU
    time a GPU decoder takes."""

    def __init__(self, name, seconds, lock=None):
        super().__init__(1, "cpu")
        self.name, self.seconds, self.lock = name, seconds, lock

    def submit_parts(self, *a, **kw):
        if self.lock is None:
            time.sleep(self.seconds)
        else:
            with self.lock:
                time.sleep(self.seconds)
        return super().submit_parts(*a, **kw)


def consume(store, decoders, step_lock=None, step_s=0.005):
    """Every batch of 60 (the store's 24 records over and over, batches of 2) through a loader
    whose decoders are ``decoders`` (the feed measuring them, as ``decoder="auto"`` does on a
    GPU), each consumed in ``step_s`` holding ``step_lock``; returns the loader and its batches."""
    sampler = [i % 24 for i in range(120)]
    with GPULoader(store, TrainPipeline(32), batch_size=2, sampler=sampler, device="cpu", decoder=decoders[0],
                   threads=1, seed=3) as L:
        if len(decoders) > 1:
            L._decoders = [adopt(d) for d in decoders]
            for d in L._decoders[1:]:
                d.bind_pipeline(L.pipeline, L.device)
            L.feed = FeedChoice([d.name for d in decoders], lag=L.prefetch + 5, trial=4)
        got = []
        for b in L:
            with step_lock or threading.Lock():
                time.sleep(step_s)
            got.append((b.indices, b.labels, b.images))
        return L, got


@pytest.mark.timeout(120)
def test_the_loader_moves_to_the_decoder_that_slows_the_consumer_less(store):
    """The first decoder holds the consumer's lock 20 ms a batch (a period of ~25 ms), the
    second decodes in 2 ms beside it: after one round the second feeds every batch, and the
    batches are the second one's alone, to the bit (the same boxes and flips from each seed)."""
    lock = threading.Lock()
    L, got = consume(store, [Timed("hog", 0.020, lock), Timed("light", 0.002)], step_lock=lock)
    first, periods, chosen = L.feed.rounds[0]
    assert chosen == "light" and periods["light"] < periods["hog"], L.feed.rounds
    span = L.feed.span
    assert L.feed.counts["hog"] >= span and L.feed.counts["light"] == 60 - L.feed.counts["hog"]
    _, alone = consume(store, [Timed("light", 0.0)])
    assert len(got) == len(alone) == 60
    for (ig, yg, xg), (ia, ya, xa) in zip(got, alone):
        assert ig == ia and torch.equal(yg, ya) and torch.equal(xg, xa)


@pytest.mark.timeout(120)
def test_the_loader_keeps_its_decoder_where_the_other_cannot_keep_up(store):
    """The second decoder takes 40 ms a batch, longer than the first one's ~25 ms period."""
    lock = threading.Lock()
    L, got = consume(store, [Timed("hog", 0.020, lock), Timed("slow", 0.040)], step_lock=lock)
    assert L.feed.rounds[0][2] == "hog" and L.feed.current == 0, L.feed.rounds
    # its phase ends where the round is decided: once its counted batches are consumed
    assert len(got) == 60 and L.feed.lag + L.feed.trial <= L.feed.counts["slow"] <= L.feed.span, L.feed.counts


@pytest.mark.timeout(120)
def test_short_epochs_never_measure_the_other_decoder(store):
    """Epochs shorter than a round's first phase: each epoch starts the round again, so the other
    decoder never decodes a batch (nothing is half measured across an epoch's end)."""
    with GPULoader(store, TrainPipeline(32), batch_size=2, shuffle=True, device="cpu", decoder=Timed("a", 0.0),
                   threads=1, seed=3) as L:
        L._decoders = [L._decoder, adopt(Timed("b", 0.0))]
        L._decoders[1].bind_pipeline(L.pipeline, L.device)
        L.feed = FeedChoice(["a", "b"], lag=L.prefetch + 5, trial=4)
        for epoch in range(3):
            L.set_epoch(epoch)
            assert sorted(i for b in L for i in b.indices) == list(range(24))
    assert L.feed.counts == {"a": 36} and not L.feed.rounds


@pytest.mark.timeout(120)
def test_a_damaged_record_is_skipped_by_whichever_decoder_has_its_batch(tmp_path):
    """on_error="skip" while the feed switches: the record is left out and logged once, and the
    batches are the single decoder's."""
    images, _ = make_dataset(tmp_path / "ds", 24, kind="classes", seed=6)
    loc = str(tmp_path / "bad.h5")
    assert packer.build(images, None, loc, "hdf5", workers=1).ok
    import h5py

    with h5py.File(loc, "r+") as f:  # an end-of-image marker in the middle of record 5's scan
        start, end = int(f["jpeg_offsets"][5]), int(f["jpeg_offsets"][6])
        f["jpeg_bytes"][(start + end) // 2:(start + end) // 2 + 2] = [0xFF, 0xD9]
    lock = threading.Lock()
    sampler = [i % 24 for i in range(120)]
    runs = []
    for decoders in ([Timed("hog", 0.020, lock), Timed("light", 0.002)], [Timed("light", 0.0)]):
        with GPULoader(loc, TrainPipeline(32), batch_size=2, sampler=sampler, device="cpu", decoder=decoders[0],
                       threads=1, seed=3, check=False, on_error="skip") as L:
            if len(decoders) > 1:
                L._decoders = [adopt(d) for d in decoders]
                L._decoders[1].bind_pipeline(L.pipeline, L.device)
                L.feed = FeedChoice([d.name for d in decoders], lag=L.prefetch + 5, trial=4)
            got = []
            for b in L:
                with lock:
                    time.sleep(0.005)
                got.append((b.indices, b.images))
            runs.append((got, L.skipped, L.feed))
    (mixed, skipped, feed), (alone, skipped_alone, _) = runs
    assert skipped == skipped_alone == 5 and feed.rounds and feed.counts["light"] > 0
    assert [i for idx, _ in mixed for i in idx] == [i for i in sampler if i != 5]
    assert len(mixed) == len(alone) and all(a[0] == b[0] and torch.equal(a[1], b[1]) for a, b in zip(mixed, alone))


def test_auto_on_the_cpu_has_one_decoder(store):
    with GPULoader(store, TrainPipeline(32), batch_size=8, device="cpu") as L:
        assert L.feed is None and [d.name for d in L._decoders] == ["turbojpeg"]


# -- on a GPU -------------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_auto_on_the_gpu_measures_the_engine_against_the_crops_on_the_cpu(store, require_cuda):  # noqa: F811
    """A train pipeline on a GPU: the engine and the crops on the CPU each feed a round's phase,
    one is kept, and every batch comes out whole and in order."""
    sampler = [i % 24 for i in range(4 * 120)]
    with GPULoader(store, TrainPipeline(64), batch_size=4, sampler=sampler, device="cuda", threads=2, seed=1) as L:
        assert L.decoder.name == "engine" and [d.name for d in L._decoders] == ["engine", "cpu-crops"]
        got = [(b.indices, b.images.shape, b.images.device.type) for b in L]
    assert [g[0] for g in got] == [sampler[i:i + 4] for i in range(0, len(sampler), 4)]
    assert all(shape == (4, 3, 64, 64) and dev == "cuda" for _, shape, dev in got)
    assert L.feed.rounds and set(L.feed.rounds[0][1]) == {"engine", "cpu-crops"}, L.feed.rounds
    # the second phase ends where the round is decided: once its counted batches are consumed
    least = L.feed.lag + L.feed.trial
    assert L.feed.counts["engine"] >= least and L.feed.counts["cpu-crops"] >= least, L.feed.counts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("decoder, pipeline", [("engine", TrainPipeline(64)), ("auto", ValPipeline(64))])
def test_a_named_decoder_or_another_pipeline_is_not_measured(store, require_cuda, decoder, pipeline):  # noqa: F811
    with GPULoader(store, pipeline, batch_size=8, device="cuda", decoder=decoder, threads=2) as L:
        assert L.feed is None and len(L._decoders) == 1
        assert sum(len(b.indices) for b in L) == 24
