"""Which decoder feeds the training loop: GPULoader's ``decoder="auto"`` measures and picks.

Two decoders feed a train pipeline on a GPU, and which one trains faster depends on the model:

* the native engine decodes on the GPU (its hardware JPEG engine and GPU kernels): fastest where
  the training step leaves the GPU room (ResNet-18 on an H200: 0.90x of synthetic input, against
  0.60x for the crops on 12 CPU threads, which cannot decode fast enough);
* ``cpu-crops`` decodes each crop at the output size on CPU threads, and the GPU only flips and
  normalizes: fastest where the model keeps the GPU busy by itself, since any decoding there takes
  GPU time from it (ResNet-50 on an H200: 0.996x of synthetic input against the engine's 0.972x).

Neither the loader nor the user knows in advance which case a training run is in (the model, its
batch size, the CPUs per GPU, other jobs on the host decide it), so the loader measures it the way
the training loop sees it: :class:`FeedChoice` times the period between the consumer's requests
for a batch (its step plus any wait for the batch) while each decoder feeds it, and keeps the one
with the shorter period. A round of measurement is a *phase* of ``span`` batches per decoder, the
one in use first; a phase's first and last ``lag`` batches are not counted (batches decoded ahead by
the previous or the next decoder are still in the queues or on the GPU then), its middle batches
are, and the median of those is its period. The other decoder replaces the one in use only when
its period is shorter by more than ``margin``. A new round starts every ``every`` batches, so a run
whose balance changes (another job on the host, a different phase of training) follows it.

The decoders draw the same crop boxes and flips from the same batch seed (:mod:`readers.gpu.roi`),
so a switch changes no augmentation; pixels differ between them by a few levels at most (the DCT
scale and the borders of a crop, see :mod:`readers.gpu.cpucrops`). A run that must be the same
to the bit names its decoder (``decoder="engine"`` or ``"cpu-crops"``): the engine's own share of
hardware decode already follows timings.

Example:
    >>> choice = FeedChoice(["engine", "cpu-crops"], lag=2, trial=2, every=100)
    >>> picks = [choice.pick(seq) for seq in range(12)]
    >>> picks[:6], picks[6:]
    ([0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1])
    >>> for seq, name in enumerate(picks):
    ...     choice.observe(seq, 0.050 if name == 0 else 0.045)
    >>> choice.current, choice.names[choice.current]
    (1, 'cpu-crops')
"""
from __future__ import annotations

import collections
import logging
import statistics
import threading
from typing import Dict, List, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

__all__ = ["FeedChoice"]


class FeedChoice:
    """Picks, batch by batch, which of ``names`` decodes (see the module docstring).

    The loader's decode stage calls :meth:`pick` with each batch's sequence number (increasing, in
    the order batches reach the consumer) and the consumer calls :meth:`observe` with the seconds
    between its request for that batch and its request for the next one. Thread-safe.

    Args:
        names: the decoders, the first in use at the start.
        lag: batches at each end of a phase that are not counted: at least the batches the loader
            holds decoded ahead of the consumer (its queues and the decoder's batches in flight).
        trial: batches counted per phase (their median is the phase's period).
        every: batches between the starts of two rounds.
        margin: how much shorter (a fraction) another decoder's period must be to replace the one
            in use.

    Attributes:
        current: the index of the decoder in use outside a round.
        counts: batches each decoder was given (by name).
        rounds: one ``(first batch, {name: period s}, chosen name)`` per finished round.
    """

    def __init__(self, names: Sequence[str], *, lag: int = 6, trial: int = 8, every: int = 2000,
                 margin: float = 0.01):
        if len(names) < 2:
            raise ValueError("FeedChoice needs two or more decoders")
        self.names = list(names)
        self.lag, self.trial, self.every, self.margin = int(lag), int(trial), int(every), float(margin)
        self.span = 2 * self.lag + self.trial
        self.current = 0
        self.counts: collections.Counter = collections.Counter()
        self.rounds: List[Tuple[int, Dict[str, float], str]] = []
        self._lock = threading.Lock()
        self._phases: Optional[List[Tuple[int, int, int]]] = None  # (decoder, first seq, end seq)
        self._samples: Dict[int, List[float]] = {}
        self._next_round = 0

    def pick(self, seq: int) -> int:
        """The index of the decoder that decodes batch ``seq``."""
        with self._lock:
            if self._phases is None and seq >= self._next_round:
                order = [self.current] + [i for i in range(len(self.names)) if i != self.current]
                self._phases = [(i, seq + k * self.span, seq + (k + 1) * self.span) for k, i in enumerate(order)]
                self._samples = {i: [] for i in order}
            which = self.current
            for i, first, end in self._phases or ():
                if first <= seq < end:
                    which = i
            self.counts[self.names[which]] += 1
            return which

    def observe(self, seq: int, seconds: float) -> None:
        """The consumer's period for batch ``seq``: from its request for it to its request for the
        next one. Ends the round once its last phase is measured."""
        with self._lock:
            if self._phases is None:
                return
            for i, first, end in self._phases:
                if first + self.lag <= seq < end - self.lag:
                    self._samples[i].append(float(seconds))
            if seq >= self._phases[-1][2] - self.lag - 1:
                self._decide(self._phases[0][1])

    def restart(self) -> None:
        """A new epoch: a round not yet measured to its end is dropped (its phases would count the
        queues filling again) and starts again with the next batch."""
        with self._lock:
            if self._phases is not None:
                self._phases, self._samples = None, {}
                self._next_round = 0

    def _decide(self, first: int) -> None:
        periods = {i: statistics.median(s) for i, s in self._samples.items() if s}
        self._phases, self._samples = None, {}
        self._next_round = first + self.every
        if self.current not in periods:
            return
        best = min(periods, key=periods.get)
        if best != self.current and periods[best] < periods[self.current] * (1.0 - self.margin):
            log.info("decoder auto: %s feeds the training loop faster than %s (%.1f against %.1f ms a batch); "
                     "switching", self.names[best], self.names[self.current], periods[best] * 1e3,
                     periods[self.current] * 1e3)
            self.current = best
        self.rounds.append((first, {self.names[i]: p for i, p in periods.items()}, self.names[self.current]))
