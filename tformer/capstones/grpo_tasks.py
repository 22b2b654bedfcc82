"""The `grpo` capstone (chapter 11): GRPO on verifiable rewards, 3 seeds, against the SFT model it starts from.

The recipe is the chapter's, run longer than a notebook may: byte-level BPE on the offline corpus, a
small GPT pretrained on it, SFT on the chapter's instruction set plus the training prompts of the two
verifiable tasks (`tformer.training.grpo`: two-digit addition with carries, sorting four digits), then
for each seed GRPO from that SFT model (a group of G sampled answers per prompt, the checker's 0/1
reward, DeepSeekMath's loss with the k3 KL to the frozen SFT model). Every accuracy is measured on
prompts held out by a hash of their text: neither SFT nor GRPO ever saw one.

The headline is the gain in greedy exact-answer accuracy (both tasks, held out) of the mean of the GRPO
seeds over the SFT model, beside the seeds' max-minus-min; result.json also holds sampled pass@1 and the
SFT model's pass@k (unbiased estimator), per task, and the reward / KL curves.

Parts: `sft` (base and SFT, saved as sft.pt with the tokenizer), then `grpo-seedS`, each saving its
policy, optimiser, generator and log every `save_every` iterations (grpo-seedS/last.pt): a killed run
resumes at its last save, a finished part is never run again.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from ..data.text import offline_text, train_tokenizer
from ..models.gpt import GPT, GPTConfig
from ..training import grpo
from ..training.checkpoint import atomic_save, load_checkpoint
from .base import Capstone
from .runfolder import CapstoneRun, Options
from .sft_start import train_sft_start


class GRPOTasks(Capstone):
    name, chapter = "grpo", 11
    summary = "GRPO from an SFT model on verifiable tasks, 3 seeds: held-out exact answers gained"
    RECIPE = {
        "model": dict(d_model=64, n_layers=2, n_heads=4, context_length=64),
        "vocab_size": 1024,
        "pretrain": dict(steps=150, batch_size=16, lr=3e-3, weight_decay=0.1),
        "sft": dict(n_train=2000, steps=600, batch_size=16, lr=3e-3),
        "grpo": dict(iterations=150, prompts=16, group=8, lr=3e-4, updates=2, eps=0.2, beta=0.04, temperature=1.0,
                     max_new=10),
        "test_prompts": 400, "samples": 8, "eval_every": 50, "save_every": 25,
        "seeds": [0, 1, 2],
    }
    TINY = {"model": dict(d_model=16, n_layers=1, n_heads=2, context_length=128), "vocab_size": 300,
            "pretrain": dict(steps=4, batch_size=4, lr=3e-3, weight_decay=0.1),
            "sft": dict(n_train=40, steps=4, batch_size=8, lr=3e-3),
            "grpo": dict(iterations=4, prompts=4, group=4, max_new=6),
            "test_prompts": 16, "samples": 4, "eval_every": 2, "save_every": 2, "seeds": [0, 1],
            "corpus_chars": 20000}                  # the tests' size: a slice of the corpus
    STEPS = ("pretrain.steps", "sft.steps", "grpo.iterations")

    def run(self, run: CapstoneRun) -> dict:
        return run_grpo(run, run.config)


def evaluate(model, tok, data, end_id: int, samples: int, max_new: int, seed: int = 0) -> dict:
    """Greedy exact answers per task and overall, sampled pass@1, and pass@k (k = 1, 2, 4, ... samples)."""
    r = grpo.greedy_accuracy(model, tok, data, end_id, max_new=max_new, samples=samples, seed=seed)
    g = {k: round(v, 4) for k, v in r["greedy"].items()}
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= samples]
    pass_k = {}
    for kind in sorted(g):
        cs = [c for c, (kk, _, _) in zip(r["correct"], data) if kk == kind]
        pass_k[kind] = {str(k): round(sum(grpo.pass_at_k(samples, c, k) for c in cs) / len(cs), 4) for k in ks}
    overall = {str(k): round(sum(grpo.pass_at_k(samples, c, k) for c in r["correct"]) / len(data), 4) for k in ks}
    return {"greedy": g, "greedy_mean": round(sum(g.values()) / len(g), 4), "pass_at_k": overall,
            "pass_at_k_per_task": pass_k}


def train_sft(folder: Path, recipe: dict, progress: bool) -> dict:
    """The base model and its SFT (the chapter's recipe, `tformer.capstones.sft_start`); saves folder/sft.pt
    (weights, config, tokenizer)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = offline_text()[:recipe.get("corpus_chars")]
    tok = train_tokenizer([text], vocab_size=recipe["vocab_size"])
    end_id = tok.token_to_id("<|endoftext|>")
    pre, sft = recipe["pretrain"], recipe["sft"]
    start = train_sft_start(tok, text, recipe)
    model, pre_losses, sft_losses = start.model, start.pre_losses, start.sft_losses
    atomic_save({"model": model.state_dict(), "config": recipe["model"], "tokenizer": tok.to_str()}, folder / "sft.pt")
    test = grpo.problems(recipe["test_prompts"], seed=1, split="test")
    ev = evaluate(model, tok, test, end_id, recipe["samples"], recipe["grpo"]["max_new"])
    if progress:
        print(f"  SFT: held-out greedy exact answers {ev['greedy']}, pass@k {ev['pass_at_k']}", flush=True)
    return {**ev, "pretrain_loss": [round(pre_losses[0], 4), round(pre_losses[-1], 4)],
            "sft_loss": [round(sft_losses[0], 4), round(sft_losses[-1], 4)], "params": model.num_params(),
            "steps": pre["steps"] + sft["steps"]}


def load_sft(folder: Path):
    """(model, tokenizer, end id) from a run's sft/sft.pt."""
    from tokenizers import Tokenizer
    d = load_checkpoint(folder / "sft.pt", weights_only=False)
    tok = Tokenizer.from_str(d["tokenizer"])
    model = GPT(GPTConfig(vocab_size=tok.get_vocab_size(), **d["config"]))
    model.load_state_dict(d["model"])
    return model, tok, tok.token_to_id("<|endoftext|>")


def train_grpo_seed(folder: Path, sft_folder: Path, recipe: dict, seed: int, opts: Options) -> dict | None:
    """GRPO from the SFT model for one seed, saving every `save_every` iterations; None when `stop_after`
    stopped it early (the same command resumes it)."""
    folder.mkdir(parents=True, exist_ok=True)
    g = recipe["grpo"]
    sft, tok, end_id = load_sft(sft_folder)
    policy, ref, opt = grpo.start_from(sft, g["lr"])
    gen, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    rl_train = grpo.problems(recipe["sft"]["n_train"], seed=0)
    test = grpo.problems(recipe["test_prompts"], seed=1, split="test")
    log, evals = [], []
    ckpt = folder / "last.pt"
    if ckpt.exists():
        s = load_checkpoint(ckpt, weights_only=False)
        policy.load_state_dict(s["model"])
        opt.load_state_dict(s["optimizer"])
        gen.set_state(s["generator"])
        rng.setstate(s["rng"])
        log, evals = s["log"], s["evals"]
    done_here = 0
    while len(log) < g["iterations"]:
        if opts.stop_after is not None and done_here >= opts.stop_after:
            return None
        step = grpo.grpo_step(policy, ref, opt, tok, rng.sample(rl_train, g["prompts"]), group=g["group"],
                              max_new=g["max_new"], end_id=end_id, updates=g["updates"], eps=g["eps"], beta=g["beta"],
                              temperature=g["temperature"], generator=gen)
        log.append({k: round(v, 4) for k, v in step.items()})
        done_here += 1
        i = len(log)
        if i % recipe["eval_every"] == 0 and i < g["iterations"]:
            acc = grpo.greedy_accuracy(policy, tok, test, end_id, max_new=g["max_new"])["greedy"]
            evals.append({"iteration": i, "greedy_mean": round(sum(acc.values()) / len(acc), 4)})
        if opts.progress and (i % 10 == 0 or i == g["iterations"]):
            last = log[-10:]
            print(f"  GRPO seed {seed}: iteration {i}/{g['iterations']}, reward "
                  f"{sum(s['reward'] for s in last) / len(last):.3f}, KL {log[-1]['kl']:.4f}", flush=True)
        if i % recipe["save_every"] == 0 or i == g["iterations"]:
            atomic_save({"model": policy.state_dict(), "optimizer": opt.state_dict(), "generator": gen.get_state(),
                         "rng": rng.getstate(), "log": log, "evals": evals}, ckpt, keep_previous=True)
    ev = evaluate(policy, tok, test, end_id, recipe["samples"], g["max_new"], seed=seed)
    evals.append({"iteration": len(log), "greedy_mean": ev["greedy_mean"]})
    return {"seed": seed, **ev, "iterations": len(log), "evals": evals,
            "curve": {"reward": [s["reward"] for s in log], "kl": [s["kl"] for s in log]},
            "samples_seen": len(log) * g["prompts"] * g["group"]}


def run_grpo(run: CapstoneRun, recipe: dict) -> dict:
    opts = run.opts
    sft = run.part("sft", lambda folder: train_sft(folder, recipe, opts.progress), "base model and SFT")
    seeds = recipe["seeds"]
    parts = [run.part(f"grpo-seed{s}", lambda folder, s=s: train_grpo_seed(folder, run.part_dir("sft"), recipe, s, opts),
                      f"GRPO from the SFT model, seed {s}") for s in seeds]
    rl = [p["greedy_mean"] for p in parts]
    mean_rl = sum(rl) / len(rl)
    gain, spread = mean_rl - sft["greedy_mean"], max(rl) - min(rl)
    p1 = [p["pass_at_k"]["1"] for p in parts]
    g = recipe["grpo"]
    result = {"metric": "grpo_minus_sft_greedy_accuracy", "value": round(gain, 4),
              "sft": sft, "grpo": parts, "sft_greedy_mean": sft["greedy_mean"], "grpo_greedy_mean": rl,
              "grpo_mean": round(mean_rl, 4), "seed_spread": round(spread, 4), "gain_above_spread": gain > spread,
              "grpo_sampled_pass_at_1": p1, "seeds": seeds,
              "steps": [sft["steps"]] + [p["iterations"] for p in parts],
              "tokens": sum(p["samples_seen"] for p in parts) * g["max_new"],
              "curves": {f"grpo-seed{p['seed']}": {"step": list(range(1, p["iterations"] + 1)),
                                                   "loss": p["curve"]["reward"]} for p in parts}}
    report = (f"GRPO from an SFT model ({sft['params']:,} parameters), {len(seeds)} seeds, {g['iterations']} iterations "
              f"of {g['prompts']} prompts x {g['group']} sampled answers, on {recipe['test_prompts']} held-out prompts "
              f"(add, sort): greedy exact answers SFT {sft['greedy_mean']:.1%} ({sft['greedy']}), GRPO "
              f"{mean_rl:.1%} (seeds {rl}); gain {gain:+.1%} against the seeds' max-minus-min {spread:.1%}. Sampled "
              f"pass@1: SFT {sft['pass_at_k']['1']:.1%}, GRPO {p1}; "
              f"the SFT model's pass@k: {sft['pass_at_k']}.")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 3))
    for p in parts:
        r = p["curve"]["reward"]
        w = max(1, len(r) // 15)
        smooth = [sum(r[max(0, i - w + 1):i + 1]) / len(r[max(0, i - w + 1):i + 1]) for i in range(len(r))]
        ax[0].plot(range(1, len(r) + 1), smooth, label=f"seed {p['seed']}")
        ax[1].plot(range(1, len(r) + 1), p["curve"]["kl"], label=f"seed {p['seed']}")
    ax[0].set_xlabel("GRPO iteration"), ax[0].set_ylabel(f"mean sampled reward ({w}-iteration average)")
    ax[1].set_xlabel("GRPO iteration"), ax[1].set_ylabel("KL to the SFT model (k3, per token)")
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    return run.finish(result, report, {"curves.png": fig})
