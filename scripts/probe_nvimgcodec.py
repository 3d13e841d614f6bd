"""Probe of nvImageCodec's decode backends on one bench set (run on a GPU): which backends can be
created, how fast each decodes a batch of 256, how much CPU it takes, whether ROI and gray work.

    python3 scripts/probe_nvimgcodec.py [SET]      # SET: hd (default) or small, from .bench/sets

The numbers behind readers/gpu/nvimgcodec.py's choices (readers/gpu/BENCH_VS_DALI.md, call 2).
"""
