# %% [markdown]
# # Chapter 1: Attention
#
# **What this chapter covers.** What queries, keys and values are; scaled dot-product attention,
# $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$; and why the $1/\sqrt{d_k}$ is there.
#
# **How to check an exercise.** Write the body of the function in an exercise cell, run it, then run
# the cell below it: `check("ch01.attention", my_attention)` prints PASS, or the smallest input where
# your function disagrees with the reference, with a hint.
#
# Set `TFORMER_SMALL=1` before starting Jupyter for the quick CPU version (`make lab` does).

# %%
import math

import torch

import tformer
from tformer.grading import check

torch.manual_seed(0)
print("small mode:", tformer.SMALL)

# %% [markdown]
# ## Exercise: scaled dot-product attention
# Return `(out, weights)`. `mask` is bool, True = may attend; a query with every key masked must get
# zero weights and a zero output.

# %%
def my_attention(q, k, v, mask=None):
    ### BEGIN SOLUTION
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        any_key = mask.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~mask, float("-inf")).masked_fill(~any_key, 0.0)
        weights = torch.softmax(scores, dim=-1).masked_fill(~any_key, 0.0)
    return weights @ v, weights
    ### END SOLUTION


# %%
check("ch01.attention", my_attention)
