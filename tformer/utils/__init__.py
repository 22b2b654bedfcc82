"""What every layer leans on: run-time switches, the device and its abilities, timing, plots, input checks.

    runtime   SMALL (env TFORMER_SMALL), device(), seed_everything(), small mode's thread count
    device    the device and dtype policy: CUDA, else MPS, else CPU; autocast dtype and SDPA kernel per device
    doctor    `tformer doctor`: the environment, backend parity against float64 on the CPU, what to expect here
    gpu       what the accelerator can do: bf16/fp16, flash/memory-efficient SDPA, DDP backend, peak FLOP/s
    flash     the flash kernel forced, LM training tokens/s and MFU
    timing    step time, peak memory, FLOP counts, power-law fits
    plot      heat maps and curves for the notebooks
    checks    shared input checks: bad input raises an error naming what was expected
    errors    UserError, JobFailed, MissingExtra: what a command reports as one line (imports nothing)
"""
