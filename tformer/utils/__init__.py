"""What every layer leans on: run-time switches, the device and its abilities, plots, input checks, errors.

    runtime   SMALL (env TFORMER_SMALL), seed_everything(), small mode's thread count
    device    the device and dtype policy: device(), CUDA, else MPS, else CPU; autocast dtype and SDPA kernel per device
    gpu       what the accelerator can do: bf16/fp16, flash/memory-efficient SDPA, DDP backend, peak FLOP/s
    plot      heat maps and curves for the notebooks
    checks    shared input checks: bad input raises an error naming what was expected
    errors    UserError, JobFailed, MissingExtra: what a command reports as one line (imports nothing)
"""
