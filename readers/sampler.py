"""Samplers for several GPUs: every record once per epoch across ranks, resumable mid-epoch.

:class:`DistributedSampler` is a drop-in for ``torch.utils.data.DistributedSampler`` (same
``(num_replicas, rank, shuffle, seed, drop_last)``; with ``block_size=None`` and the default
remainder it yields exactly the indices torch's sampler yields) that adds:

* ``remainder="pad" | "drop" | "uneven"``: what to do when ``len(dataset)`` is not a multiple of
  the world size. ``"pad"`` (torch's default) repeats the first few indices of the epoch's order so
  every rank gets ``ceil(N / R)`` (some records twice); ``"drop"`` (torch's ``drop_last=True``)
  leaves the last ``N % R`` of the epoch's order out (different records each shuffled epoch);
  ``"uneven"`` gives every record exactly once, ranks differing by at most one sample (use
  ``torch.distributed.algorithms.Join`` or per-rank step counts for DDP).
* ``block_size=K`` or ``boundaries=[...]``: *block shuffle* for read locality: the order of blocks
  of neighbouring records (fixed-size, or the given shard boundaries) is shuffled, then the order
  within each block; each rank then reads a contiguous slice of that order, so it touches few
  blocks at a time.
* ``shard_window=K`` (with ``boundaries`` or ``shard_local``): *shard-aware shuffle*, as MDS's
  ``py1b`` or WebDataset's shard shuffle plus buffer: the shards' order is shuffled, then the
  samples of each group of ``K`` consecutive shards in that order are shuffled together, so the
  order mixes ``K`` shards at a time while a reader holds only those ``K`` (and what it reads
  ahead). Measured on 20 shards of 50 (tests/readers/test_sampler.py): the fraction of neighbouring
  samples from the same shard is about ``1/K`` (a full shuffle: ``1/20``; ``block_size``-style
  shuffle: ~1). When the dataset has ``plan_shards`` (a :class:`readers.StoreDataset` over a
  manifest in a bucket), each ``__iter__`` hands it this epoch's shard order followed by the
  next epoch's, so its cache evicts by next use and reads ahead in that order.
* ``state_dict()`` / ``load_state_dict()``: the protocol of torchdata's ``StatefulDataLoader``
  (and of its ``StatefulDistributedSampler``): ``{"yielded": n, "epoch": e, ...}``; after loading,
  the next ``__iter__`` continues the same epoch's order from sample ``n``.

The order depends only on ``(seed, epoch)``: call :meth:`set_epoch` at the start of each epoch.

Example:
    >>> s = DistributedSampler(10, num_replicas=3, rank=0, seed=1, remainder="uneven")
    >>> s.set_epoch(0); len(list(s))
    4
"""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from packer.core.errors import UsageError

REMAINDERS = ("pad", "drop", "uneven")


class DistributedSampler(Sampler[int]):
    """Disjoint, complete per-rank shares of a dataset's indices each epoch.

    Args:
        dataset: a sized dataset, or its length as an ``int``.
        num_replicas, rank: world size and this rank (default: from ``torch.distributed``).
        shuffle: shuffle each epoch (deterministic under ``(seed, epoch)``).
        seed: the shared seed; must be the same on every rank.
        drop_last: torch's name for ``remainder="drop"`` (``remainder`` wins when given).
        remainder: ``"pad"``, ``"drop"`` or ``"uneven"`` (see the module docstring).
        block_size: shuffle blocks of this many neighbouring records, then within blocks.
        boundaries: instead of ``block_size``, block (shard) start offsets, e.g. ``[0, 1000,
            2400]`` (each block runs to the next start; the first must be 0). A dataset's
            ``shard_boundaries`` (``[0, end_0, ..., len]``, empty shards repeating an offset) are
            accepted as they are.
        shard_local: take ``boundaries`` from ``dataset.shard_boundaries`` (a
            :class:`readers.StoreDataset` or a manifest reader): the blocks are the store's
            shards, so each rank reads mostly whole shards, each shard file from one rank.
        shard_window: shard-aware shuffle: mix the samples of this many consecutive shards (of
            the shuffled shard order) at a time (needs ``boundaries`` or ``shard_local``).

    Example:
        >>> ds = StoreDataset("train.packer-manifest.json")             # doctest: +SKIP
        >>> s = DistributedSampler(ds, num_replicas=2, rank=0, shard_local=True)  # doctest: +SKIP

    Raises:
        UsageError: inconsistent arguments.
    """

    def __init__(self, dataset, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *,
                 remainder: Optional[str] = None, block_size: Optional[int] = None,
                 boundaries: Optional[Sequence[int]] = None, shard_local: bool = False,
                 shard_window: Optional[int] = None):
        self.n = int(dataset) if isinstance(dataset, int) else len(dataset)
        #: Where each epoch's shard order goes (a dataset with ``plan_shards``), and the store's
        #: own shard ends (empty shards included) to name shards by their manifest index.
        self._plan_target = dataset if callable(getattr(dataset, "plan_shards", None)) else None
        self._store_ends = (list(boundaries) if boundaries is not None
                            else list(getattr(dataset, "shard_boundaries", None) or []))
        if shard_local:
            if boundaries is not None:
                raise UsageError("give boundaries or shard_local=True, not both")
            boundaries = getattr(dataset, "shard_boundaries", None)
            if boundaries is None:
                raise UsageError(f"shard_local=True needs a dataset with shard_boundaries (StoreDataset, a "
                                 f"store reader), got {type(dataset).__name__}")
            if int(list(boundaries)[-1]) != self.n:
                raise UsageError(f"the dataset's shard_boundaries end at {list(boundaries)[-1]}, its length "
                                 f"is {self.n} (a subset of a store? pass boundaries= for it)")
        if boundaries is not None:   # shard ends as a store gives them: drop empty shards
            b = [int(x) for x in boundaries]
            boundaries = [x for j, x in enumerate(b) if j == 0 or x != b[j - 1]]
        if num_replicas is None or rank is None:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                raise UsageError("num_replicas and rank are needed when torch.distributed is not initialized")
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise UsageError(f"need num_replicas >= 1 and 0 <= rank < num_replicas, got {num_replicas}, {rank}")
        remainder = remainder or ("drop" if drop_last else "pad")
        if remainder not in REMAINDERS:
            raise UsageError(f"remainder must be one of {REMAINDERS}, got {remainder!r}")
        if block_size is not None and boundaries is not None:
            raise UsageError("give block_size or boundaries, not both")
        if block_size is not None and int(block_size) < 1:
            raise UsageError(f"block_size must be >= 1, got {block_size!r}")
        if boundaries is not None:
            b = [int(x) for x in boundaries]
            if not b or b[0] != 0 or any(x >= y for x, y in zip(b, b[1:])) or b[-1] > self.n:
                raise UsageError(f"boundaries must start at 0, increase strictly and stay <= {self.n}, "
                                 f"got {list(boundaries)[:8]}...")
            boundaries = b + ([self.n] if b[-1] != self.n else [])
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.remainder = bool(shuffle), int(seed), remainder
        if shard_window is not None and (boundaries is None or int(shard_window) < 1):
            raise UsageError(f"shard_window={shard_window!r} needs boundaries= or shard_local=True and "
                             f"must be >= 1")
        self.block_size, self.boundaries = block_size, boundaries
        self.shard_window = None if shard_window is None else int(shard_window)
        self.epoch = 0
        self.yielded = 0
        self._resume_at: Optional[int] = None

    # -- sizes -------------------------------------------------------------------------------
    def __len__(self) -> int:
        R, n = self.num_replicas, self.n
        if self.remainder == "pad":
            return -(-n // R)
        if self.remainder == "drop":
            return n // R
        return n // R + (1 if self.rank < n % R else 0)

    @property
    def total_size(self) -> int:
        """Indices handed out per epoch over all ranks."""
        R, n = self.num_replicas, self.n
        return {"pad": -(-n // R) * R, "drop": n // R * R, "uneven": n}[self.remainder]

    # -- order -------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next ``__iter__`` on (call it on every rank)."""
        self.epoch = int(epoch)

    def epoch_order(self, epoch: Optional[int] = None) -> torch.Tensor:
        """All ``N`` indices in epoch ``epoch``'s order (default: the current one), before the
        split among ranks."""
        if not self.shuffle:
            return torch.arange(self.n)
        g = torch.Generator()
        g.manual_seed(self.seed + (self.epoch if epoch is None else int(epoch)))
        if self.shard_window is not None:
            return self._window_order(g)
        if self.block_size is None and self.boundaries is None:
            return torch.randperm(self.n, generator=g)  # what torch's DistributedSampler draws
        if self.boundaries is not None:
            starts = self.boundaries[:-1]
            ends = self.boundaries[1:]
        else:
            starts = list(range(0, self.n, int(self.block_size)))
            ends = starts[1:] + [self.n]
        parts = []
        for b in torch.randperm(len(starts), generator=g).tolist():
            s, e = starts[b], ends[b]
            parts.append(s + torch.randperm(e - s, generator=g))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)

    def _window_order(self, g: torch.Generator) -> torch.Tensor:
        """Shard-aware shuffle: shards shuffled, then samples mixed within groups of
        ``shard_window`` consecutive shards of that order."""
        starts, ends = self.boundaries[:-1], self.boundaries[1:]
        perm = torch.randperm(len(starts), generator=g).tolist()
        parts = []
        for w in range(0, len(perm), self.shard_window):
            members = torch.cat([torch.arange(starts[b], ends[b]) for b in perm[w:w + self.shard_window]])
            parts.append(members[torch.randperm(len(members), generator=g)])
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)

    def shard_order(self, epoch: Optional[int] = None) -> list[int]:
        """The shards (manifest indices) this rank reads in epoch ``epoch``, in order, with
        consecutive repeats collapsed: what the shard cache plans by."""
        if not self._store_ends:
            return []
        idx = np.asarray(self.rank_indices(epoch), dtype=np.int64)
        ids = np.searchsorted(np.asarray(self._store_ends, dtype=np.int64), idx, side="right") - 1
        if not len(ids):
            return []
        keep = np.concatenate([[True], ids[1:] != ids[:-1]])
        return ids[keep].tolist()

    def rank_indices(self, epoch: Optional[int] = None) -> list[int]:
        """This rank's indices for epoch ``epoch`` (default: the current one), in order."""
        order = self.epoch_order(epoch)
        R, r = self.num_replicas, self.rank
        if self.remainder == "pad" and self.total_size > self.n:
            extra = self.total_size - self.n
            reps = -(-extra // max(self.n, 1))
            order = torch.cat([order, order.repeat(reps)[:extra]]) if self.n else order
        elif self.remainder == "drop":
            order = order[:self.total_size]
        if self.block_size is None and self.boundaries is None:
            return order[r::R].tolist()  # strided, as torch's sampler
        # Block shuffle: contiguous slices keep each rank inside few blocks at a time.
        size, extra = divmod(len(order), R)
        start = r * size + min(r, extra)
        return order[start:start + size + (1 if r < extra else 0)].tolist()

    def __iter__(self) -> Iterator[int]:
        indices = self.rank_indices()
        if self._plan_target is not None and self._store_ends:
            # This epoch's shard order and the next one's: the cache keeps, at the end of this
            # epoch, the shards the next one starts with.
            plan = self.shard_order() + self.shard_order(self.epoch + 1)
            self._plan_target.plan_shards(plan, epoch=self.epoch)
        start = 0
        if self._resume_at is not None:
            start, self._resume_at = self._resume_at, None
        self.yielded = start
        for i in indices[start:]:
            self.yielded += 1
            yield i

    # -- resume ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"yielded", "epoch", "seed", "num_replicas", "rank", "n"}`` (torchdata's protocol)."""
        return {"yielded": self.yielded, "epoch": self.epoch, "seed": self.seed,
                "num_replicas": self.num_replicas, "rank": self.rank, "n": self.n}

    def load_state_dict(self, state: dict) -> None:
        """Continue the saved epoch at its ``yielded``-th sample on the next ``__iter__``.

        Raises:
            UsageError: the state is malformed or was saved for another dataset size, world
                size or seed (the order would differ).
        """
        if "yielded" not in state or int(state["yielded"]) < 0:
            raise UsageError(f"not a DistributedSampler state (need yielded >= 0): {state!r}")
        for name in ("n", "num_replicas", "seed"):
            if name in state and int(state[name]) != getattr(self, name):
                raise UsageError(f"sampler state was saved with {name}={state[name]}, this sampler has "
                                 f"{name}={getattr(self, name)}: resuming would change the order")
        if "epoch" in state:
            self.epoch = int(state["epoch"])
        self._resume_at = int(state["yielded"])
        self.yielded = self._resume_at
