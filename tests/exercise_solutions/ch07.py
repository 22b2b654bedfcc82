"""Chapter 7: the paper's training cost; one LSTM layer (written from the equations, gate by gate)."""
import torch


def training_flops(days, n_gpus, flops_per_gpu):
    return days * 86400.0 * n_gpus * flops_per_gpu


def lstm_layer(x, w_ih, w_hh, b_ih, b_hh):
    """Each gate's own rows of the stacked weights, one time step per iteration."""
    hidden = w_hh.shape[1]
    rows = {k: slice(j * hidden, (j + 1) * hidden) for j, k in enumerate("ifgo")}
    w = {k: (w_ih[r], w_hh[r], b_ih[r] + b_hh[r]) for k, r in rows.items()}
    h = torch.zeros(x.shape[0], hidden, dtype=x.dtype)
    c = torch.zeros_like(h)
    out = torch.empty(x.shape[0], x.shape[1], hidden, dtype=x.dtype)
    for t in range(x.shape[1]):
        z = {k: x[:, t] @ wi.T + h @ wh.T + b for k, (wi, wh, b) in w.items()}
        c = torch.sigmoid(z["f"]) * c + torch.sigmoid(z["i"]) * torch.tanh(z["g"])
        h = torch.sigmoid(z["o"]) * torch.tanh(c)
        out[:, t] = h
    return out


SOLUTIONS = {"ch07.training_flops": training_flops, "ch07.lstm_layer": lstm_layer}
