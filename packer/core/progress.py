"""The progress bar every long command shows (tqdm, drawn only on a terminal)."""
from __future__ import annotations


def progress_bar(total: int, initial: int, enabled: bool, desc: str):
    """A tqdm bar over ``total`` images starting at ``initial``; a no-op unless ``enabled``.

    ``disable=None`` when enabled: tqdm turns itself off when stderr is not a terminal, so logs
    get no ``\\r`` lines.
    """
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="img", disable=None if enabled else True, dynamic_ncols=True,
                smoothing=0.1, desc=desc)
