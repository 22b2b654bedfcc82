"""Measuring training and inference (chapters 7-9, 13-15; benchmarks): above training, which it times.

    timing   step time, peak memory, operator counts, interleaved timing, tables, training FLOPs
    flash    the flash kernel forced, which SDPA kernel ran, LM training tokens/s and MFU
    machine  a probe of this machine's matmul speed, the class it falls in (doctor, README, capstones)
"""
