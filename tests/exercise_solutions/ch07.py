"""Chapter 7: the paper's training cost."""


def training_flops(days, n_gpus, flops_per_gpu):
    return days * 86400.0 * n_gpus * flops_per_gpu


SOLUTIONS = {"ch07.training_flops": training_flops}
