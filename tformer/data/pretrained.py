"""Pretrained weights from the Hugging Face hub for the notebooks' optional cells: load, or say what to do.

    loaded = load_pretrained(lambda: transformers.GPT2LMHeadModel.from_pretrained("gpt2"), "gpt2")
    if loaded is not None:
        ...                                      # the cell's work with the real weights

Offline (HF_HUB_OFFLINE unset and the hub unreachable) it returns None at once, after printing why and
how to get the weights, instead of letting `transformers` retry for minutes. With HF_HUB_OFFLINE=1,
`transformers` reads its cache; a model not cached there is explained the same way.
"""
from __future__ import annotations

import os
from typing import Callable, TypeVar

from .sources import offline_reason

T = TypeVar("T")


def load_pretrained(load: Callable[[], T], name: str) -> T | None:
    """`load()` (e.g. a `from_pretrained` call, or a tuple of them), or None after printing why `name`
    could not be loaded and what to do: run once online (the weights are then cached in
    ~/.cache/huggingface, or under $HF_HOME), or point HF_HOME at a copy of that cache."""
    how = (f"Run this cell once with a network connection (the weights are cached in ~/.cache/huggingface, "
           f"or under $HF_HOME), or set HF_HOME to a copy of that cache; the rest of the notebook does not need {name}.")
    hf_offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false", "no")
    reason = None if hf_offline else offline_reason("huggingface.co")
    if reason:
        print(f"could not download {name}: {reason}. {how}")
        return None
    try:
        return load()
    except Exception as e:  # noqa: BLE001  (network, hub or cache errors: one explanation)
        print(f"could not load {name} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). {how}")
        return None
