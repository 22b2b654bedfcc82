"""The `translate` capstone (chapter 10): `tformer translate`'s pipeline on Multi30k de->en in 30 minutes on a
CPU: preset `small` where the CPU has bf16 matrix units, `small-avx2` (float32) elsewhere; on CUDA the GPU
tier: preset `gpu`, 5 minutes (not yet measured through this command).

The training part is `tformer.translate.train_run` into RUN/train (its own run folder: BPE, atomic
checkpoints, snapshots, averaging); then test_2016_flickr is translated greedily and with beam 4 and
scored with sacreBLEU. Data: `--data DIR` (a folder with the Multi30k files), else the loader's cache or
download (offline without --data: one line says so).
"""
from __future__ import annotations

from pathlib import Path

from ..data.sources import MULTI30K_FILES, multi30k
from .base import Capstone, local_path
from .runfolder import CapstoneRun


class TranslateMulti30k(Capstone):
    name, chapter = "translate", 10
    summary = "a Transformer on Multi30k de->en in 30 minutes: sacreBLEU beam-4"
    RECIPE = {"preset": "small", "src": "de", "tgt": "en", "budget_minutes": 30.0, "test": "test_2016_flickr",
              "beams": [1, 4], "alpha": 0.6, "examples": 10}
    # A CPU without bf16 matrix units trains in float32 (a 2-core AVX2 laptop, this project's CI): preset
    # small-avx2, chosen there by a sweep (benchmarks/RESULTS.md, "Translation on the 2-core EPYC"), and beam
    # search's length penalty 1.0 (chosen on the validation split: at 0.6 beam-4 output is ~5% short of the
    # references and sacreBLEU's brevity penalty takes ~5% of the score). A faster float32 CPU (cpu-fast,
    # an estimate) takes the same recipe
    AVX2 = {"preset": "small-avx2", "alpha": 1.0}
    RECIPES = {"cpu-avx2": AVX2, "cpu-fast": AVX2}
    GPU = {"preset": "gpu", "budget_minutes": 5.0}
    TINY = {"preset": "tiny", "budget_minutes": 1.0}
    # Multi30k's sentences are the dataset's, not the course's: a committed reference keeps the model's own
    # translations and the attention weights, not the sources and references (a local run keeps everything)
    NOT_SHIPPED = {"examples": ("src", "ref"), "attention": ("src_tokens",)}

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--data", type=local_path, default=None, metavar="DIR",
                            help=f"a folder with the Multi30k files ({', '.join(MULTI30K_FILES)}); default: the "
                                 f"download cache, else a download")

    def prepare(self) -> None:
        """`self.data`, the Multi30k folder run() reads: `--data DIR` once checked, else the cache or a download."""
        from ..utils.errors import UserError
        if self.own["data"] is None:
            self.data = multi30k(None)                  # the cache, or a download; offline: DataUnavailableError
            return
        folder = Path(self.own["data"])
        if not folder.is_dir():
            raise UserError(f"--data {folder} is not a folder; give the folder with the Multi30k files "
                            f"({', '.join(MULTI30K_FILES)})")
        missing = [n for n in MULTI30K_FILES if not (folder / n).exists()]
        if missing:
            raise UserError(f"--data {folder} lacks the Multi30k files {', '.join(missing)}; give the folder that "
                            f"holds {', '.join(MULTI30K_FILES)}")
        self.data = folder

    def config(self) -> dict:
        from ..translate.presets import get_preset
        config = super().config()
        config["recipe"] = get_preset(config["preset"]).to_dict()   # the preset's fields: a changed preset shows
        return config

    def run(self, run: CapstoneRun) -> dict:
        return run_translate(run, run.config, self.data)

    @classmethod
    def show(cls, result: dict, where: str, plot: bool = True) -> None:
        """The ten test translations (beside their sources and references when the run has them) and the
        cross-attention of the first one, target tokens against source tokens."""
        if "steps" in result:                           # BLEU follows the steps made: they stand beside it
            print(f"{result['steps']:,} steps at {result['tokens_per_s']:,.0f} target tokens/s "
                  f"({result.get('precision', 'float32')}); sacreBLEU greedy {result['greedy_bleu']:.2f}, "
                  f"beam-4 {result['value']:.2f}")
        for i, e in enumerate(result.get("examples", [])):
            print(f"\n[{i}] model:     {e['hyp']}" + (f"\n    source:    {e['src']}\n    reference: {e['ref']}"
                                                       if "src" in e else ""))
        if "src" not in (result.get("examples") or [{}])[0]:
            print("\n(the sources and references are Multi30k's test_2016_flickr lines 1-10, not shipped with the "
                  "course; your own run shows them)")
        att = result.get("attention")
        if not (plot and att):
            return
        import matplotlib.pyplot as plt
        w = att["weights"]
        fig, ax = plt.subplots(figsize=(0.35 * len(w[0]) + 2, 0.3 * len(w) + 1.5))
        ax.imshow(w, cmap="Blues", aspect="auto", vmin=0)
        src = att.get("src_tokens") or [str(j) for j in range(len(w[0]))]
        ax.set_xticks(range(len(src)), src, rotation=90, fontsize=8)
        ax.set_yticks(range(len(att["tgt_tokens"])), att["tgt_tokens"], fontsize=8)
        ax.set_xlabel("source token" + ("" if att.get("src_tokens") else " (position)"))
        ax.set_ylabel("target token (input)")
        ax.set_title("cross-attention, last decoder layer, mean of heads")
        plt.show()


def cross_attention(model, bpe, src: str, hyp: str) -> dict:
    """The last decoder layer's cross-attention (averaged over heads) while the model reads its own
    translation `hyp` of `src` (teacher-forced): rows are target tokens, columns source tokens, as token
    strings (byte-level BPE pieces decoded one by one), with the weights rounded to 3 digits: a few KB."""
    import torch
    from ..attention import capture_attention
    s = bpe.encode([src])[0][: model.cfg.context_length - 2] + [bpe.eos_id]
    t = [bpe.bos_id] + bpe.encode([hyp])[0][: model.cfg.context_length - 2]
    dev = next(model.parameters()).device
    with torch.no_grad(), capture_attention(model.decoder.layers[-1].cross_attn) as w:
        model.eval()(torch.tensor([s], device=dev), torch.tensor([t], device=dev))
    weights = w[-1][0].mean(0)                                    # (T, S): the heads' average

    def piece(ids):                                               # one string per token; blank ones shown quoted
        return [x if x.strip() else repr(x) for x in bpe.decode([[i] for i in ids])]
    return {"src_tokens": piece(s[:-1]) + ["</s>"], "tgt_tokens": ["<s>"] + piece(t[1:]),
            "weights": [[round(float(v), 3) for v in row] for row in weights.cpu()]}


def run_translate(run: CapstoneRun, recipe: dict, data: Path) -> dict:
    from ..translate.pipeline import load_run, read_lines, score_lines, train_run
    budget = run.part_budget(1.0, recipe["budget_minutes"])
    train_dir = run.part_dir("train")

    def train(folder: Path):
        rec = train_run(folder, recipe["preset"], data=data, src=recipe["src"], tgt=recipe["tgt"], time_budget=budget,
                        max_steps=recipe.get("max_steps"), progress=run.opts.progress, stop_after=run.opts.stop_after)
        if not (folder / "choice.json").exists():            # finish_run writes it when training ended
            return None
        rows = rec["history"]                                 # every record of the run, resumes included
        steps = [r for r in rows if "loss" in r and "step" in r]
        last = steps[-1] if steps else {}
        from ..training.checkpoint import load_checkpoint
        tokens = int(load_checkpoint(folder / "last.pt")["train"]["tokens"])
        return {"steps": last.get("step", rec.get("step")), "tokens": tokens, "precision": rec["precision"],
                "minutes": round(last.get("minutes", 0.0), 2),
                "val_loss": rec.get("val_loss"),
                "tokens_per_s": round(sum(r["tokens_per_s"] for r in steps[-20:]) / max(len(steps[-20:]), 1), 1),
                "curve": {"step": [r["step"] for r in steps], "loss": [round(r["loss"], 4) for r in steps],
                          "minutes": [round(r["minutes"], 3) for r in steps]},
                "val": [{"step": r["step"], "minutes": round(r["minutes"], 3), "val_loss": round(r["val_loss"], 4)}
                        for r in rows if "val_loss" in r and "step" in r]}
    tr = run.part("train", train, f"preset {recipe['preset']}, {budget:g} min")

    def score(folder: Path):
        model, bpe, info = load_run(train_dir)
        src = read_lines(data / f"{recipe['test']}.{recipe['src']}", "test source")
        ref = read_lines(data / f"{recipe['test']}.{recipe['tgt']}", "test reference")
        if recipe.get("max_steps") is not None:              # a smoke test scores a few sentences
            src, ref = src[:20], ref[:20]
        out = {"weights": info["weights"]}
        for beam in recipe["beams"]:
            s = score_lines(model, bpe, src, ref, beam=beam, alpha=recipe["alpha"], lang=recipe["tgt"])
            out[f"beam{beam}"] = {"bleu": round(s["bleu"], 2), "signature": s["signature"],
                                  "hyp_len_ratio": round(len(" ".join(s["hypotheses"]).split()) /
                                                         max(len(" ".join(ref).split()), 1), 3),
                                  "seconds": round(s["seconds"], 1)}
            if beam == recipe["beams"][-1]:
                out["examples"] = [{"src": a, "ref": b, "hyp": h} for a, b, h in
                                   list(zip(src, ref, s["hypotheses"]))[:recipe["examples"]]]
                out["attention"] = {"sentence": 0, **cross_attention(model, bpe, src[0], s["hypotheses"][0])}
        return out
    sc = run.part("score", score, f"{recipe['test']}, beams {recipe['beams']}")
    b4, g = sc[f"beam{recipe['beams'][-1]}"], sc["beam1"]
    precision = tr.get("precision", "float32")              # a train part saved before runs recorded it: float32
    result = {"metric": f"sacrebleu_beam{recipe['beams'][-1]}", "value": b4["bleu"], "greedy_bleu": g["bleu"],
              "signature": b4["signature"], "hyp_len_ratio": {"greedy": g["hyp_len_ratio"], "beam": b4["hyp_len_ratio"]},
              "test": f"{recipe['test']} {recipe['src']}->{recipe['tgt']}", "data": str(data), "weights": sc["weights"],
              "steps": tr["steps"], "tokens": tr["tokens"], "tokens_per_s": tr["tokens_per_s"],
              "precision": precision, "train_minutes": tr["minutes"],
              "val_loss": tr["val_loss"], "examples": sc["examples"], "attention": sc.get("attention"),
              "curves": {"train": tr["curve"]}, "val": tr["val"]}
    report = (f"Transformer (preset {recipe['preset']}) on Multi30k {recipe['src']}->{recipe['tgt']}, "
              f"{tr['steps']} steps in {tr['minutes']} min at {tr['tokens_per_s']:.0f} target tokens/s "
              f"({precision}): sacreBLEU on "
              f"{recipe['test']} **{b4['bleu']}** beam-{recipe['beams'][-1]}, {g['bleu']} greedy "
              f"(`{b4['signature']}`).\n\n" +
              "\n".join(f"- {e['src']}\n  - reference: {e['ref']}\n  - model: {e['hyp']}" for e in sc["examples"]))
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(tr["curve"]["minutes"], tr["curve"]["loss"], label="training loss")
    if tr["val"]:
        ax.plot([v["minutes"] for v in tr["val"]], [v["val_loss"] for v in tr["val"]], marker=".", label="validation")
    ax.set_xlabel("minutes"), ax.set_ylabel("loss"), ax.legend()
    return run.finish(result, report, {"curves.png": fig})
