"""tformer: the package behind the course. Hand-written by topic; notebooks import it.

The map of the package, one line per entry, bottom layer first (the ground: utils, data; the core: masks
to moe; models; training and inference; measure; the commands): a module imports only from its own layer
and the layers before it (tests/test_layers.py; `python tests/test_layers.py` prints them). What the
chapters build sits flat at the top; the rest is grouped in folders named for what they hold, and each
folder's `__init__.py` describes its modules. CONTRIBUTING.md's "How the package is laid out" is a copy of
this map; tests/test_layout.py keeps the three in agreement.

    utils/       runtime (SMALL, seeds, threads), device (the device and dtype policy, device()), gpu,
                 plot, checks, errors (UserError, JobFailed, MissingExtra)
    data/        every loader and tokenizer: sources, corpus, tokenizer (shared BPE), batching, text (LM
                 text, MLM masking, IGNORE), bpe (from scratch), images, captions, augment, pretrained
    masks        causal, padding, sliding-window masks and combining them (True = may attend)      ch. 6
    attention    scaled_dot_product_attention (reference), MultiHeadAttention (MHA/GQA/MQA),
                 split_heads / merge_heads, capture_attention                                    ch. 1-3
    kernels      which attention kernel runs: fast_attention (fused SDPA), use_fused (the rule)   ch. 9
    positional   sinusoidal, learned, RoPE (+ position interpolation, NTK, YaRN)                ch. 4, 8
    activations  the feed-forward activations by name (relu, gelu, gelu_tanh, quick_gelu, silu)    ch. 5
    blocks       FeedForward, TransformerBlock, DecoderLayer (post-LN and pre-LN)                  ch. 5
    dropout      Dropout / dropout: F.dropout with one random draw per four elements on a CPU     ch. 10
    sparse       sliding-window, strided, Longformer and BigBird patterns                        ch. 8-9
    efficient    tiled online-softmax attention, Linformer, Performer                              ch. 9
    cache        KVCache: one attention layer's keys and values while decoding; make_caches   ch. 10, 14
    sampling     sample_next: repetition penalty, temperature, top-k, top-p, then a draw          ch. 11
    moe/         the router, top-k routing, the balancing loss, MoE; dispatch (the fast paths),
                 params (published models' counts)                                  ch. 13
    models/      transformer (encoder-decoder), gpt, bert, vit, clip, rnn (LSTM baselines)
    training/    schedules, losses, checkpoint (atomic save, run lock, RNG state), distributed, trainer,
                 metrics; the methods sft, lora, dpo, grpo                                     ch. 10-13
    inference/   decode (greedy, beam), paged_cache, engine (continuous batching), quantize,
                 speculative, rag                                                              ch. 10-14
    measure/     timing (step time, peak memory, op counts), flash (the flash kernel, tokens/s, MFU), machine
                 (a probe of this machine's speed, its class: the README's hardware table)
    translate/   the translation capstone: presets, pipeline, peer, cli (`tformer translate`)      ch. 10
    capstones/   `tformer capstone NAME`: base (the Capstone protocol, the registry), runfolder, show,
                 cli; one module per capstone, named for what it trains (`tformer capstone --help`
                 lists them); the notebooks' recipes sft_start and vision_training (ViT / CLIP)  ch. 10-13
    serve/       `tformer serve` (an OpenAI-compatible server): runs, app, export (`tformer export
                 --to hf`), cli                                                                   ch. 14
    grading/     check("chNN.name", fn): core (the checker), questions, result, guards, equality, messages,
                 inputs, public (a teacher's exercises as handed out), exercises/;
                 classroom/ (`tformer grade`: one learner; `tformer class`: a class)                ch. 1-15
    doctor       `tformer doctor`: the environment, backend parity, what to expect here
    cli          the `tformer` command
"""
import importlib
import importlib.abc
import importlib.util
import sys

# name -> the module it comes from. The names load lazily (`__getattr__` below), so that `import tformer` and the
# `tformer` command's parser import no torch; `from tformer import X`, `tformer.X` and `from tformer import *`
# import X's module on first use
_SOURCES = {name: module for module, names in {
    "attention": ("MultiHeadAttention", "capture_attention", "merge_heads", "scaled_dot_product_attention",
                  "split_heads"),
    "kernels": ("fast_attention",),
    "blocks": ("BlockConfig", "DecoderLayer", "FeedForward", "TransformerBlock"),
    "cache": ("KVCache",),
    "masks": ("causal_mask", "combine_masks", "lengths_mask", "padding_mask", "sliding_window_mask"),
    "positional": ("LearnedPositionalEmbedding", "RotaryEmbedding", "SinusoidalPositionalEncoding", "rope_frequencies",
                   "sinusoidal_shift_matrix", "sinusoidal_table"),
    "moe": ("MoE", "MoEConfig"),
    "inference.paged_cache": ("BlockPool", "PagedConfig", "PagedKVCache"),
    "inference.quantize": ("QuantLinear", "quantize_model"),
    "utils.device": ("device",),
    "utils.runtime": ("SMALL", "seed_everything"),
    "inference.speculative": ("speculative_generate",),
}.items() for name in names}

__version__ = "0.1.0"
__all__ = [
    "scaled_dot_product_attention", "fast_attention", "MultiHeadAttention", "FeedForward", "TransformerBlock", "BlockConfig",
    "DecoderLayer", "KVCache", "causal_mask", "padding_mask", "lengths_mask", "sliding_window_mask",
    "combine_masks", "sinusoidal_table", "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding",
    "RotaryEmbedding", "rope_frequencies", "SMALL", "device", "seed_everything",
    "split_heads", "merge_heads", "capture_attention", "sinusoidal_shift_matrix",
    "BlockPool", "PagedConfig", "PagedKVCache", "QuantLinear", "quantize_model", "speculative_generate",
    "MoE", "MoEConfig",
]


def _switches() -> None:
    """Load utils/runtime.py, whose import applies the run-time switches (small mode's torch threads): before
    any name of this package loads, and at once when torch is already loaded."""
    importlib.import_module(".utils.runtime", __name__)


def __getattr__(name: str):
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _switches()
    # not cached here: the package's name is always its module's, also while the grader has swapped that one out
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _SwitchesAfterTorch(importlib.abc.MetaPathFinder):
    """Where tformer is imported before torch (`python -m tformer.grading.classroom.worker`, `import
    tformer.attention`), the run-time switches are applied as soon as torch has loaded: once."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenSwitches(spec.loader)
        return spec


class _ThenSwitches(importlib.abc.Loader):
    """torch's own loader, with the switches after its module has run; anything else is the loader's."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):                  # get_resource_reader, get_source, is_package, ...
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _switches()


if "torch" in sys.modules:          # a notebook starts `import torch`, then `import tformer`
    _switches()
else:
    sys.meta_path.insert(0, _SwitchesAfterTorch())
