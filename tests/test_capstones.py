"""`tformer capstone NAME`: each capstone at a tiny size through the real entry point (result.json and
report.md written, an interrupted run resumes to the same result, a second job on the folder refused),
bad input as one line and exit 2, one subcommand per capstone found in tformer/capstones/ with its own
options, the chapter cells' `show`, and the committed references' recipes."""
import json

import pytest
import torch

from tformer.capstones import CAPSTONES, Capstone, Options, reference_dir, run_capstone, show
from tformer.cli import main
from tformer.training.checkpoint import RunLock

TEXT = "".join(f"def f{i}(x):\n    return x * {i} + len('{w}')\n" for i, w in enumerate("abcdefghij" * 8))


def _extra(name, tmp_path, multi30k):
    if name == "translate":
        return ["--data", str(multi30k)]
    if name == "moe":
        (tmp_path / "code.txt").write_text(TEXT, encoding="utf-8")
        return ["--text", str(tmp_path / "code.txt")]
    return []


@pytest.mark.parametrize("name", list(CAPSTONES))
def test_each_capstone_runs_tiny_through_the_command_and_writes_its_result(name, tmp_path, multi30k, capsys):
    out = tmp_path / "run"
    argv = ["capstone", name, "--out", str(out), "--tiny", "--max-steps", "4", "--threads", "1",
            *_extra(name, tmp_path, multi30k)]
    assert main(argv) == 0, capsys.readouterr().err
    res = json.loads((out / "result.json").read_text())
    for key in ("metric", "value", "config", "steps", "tokens", "wall_minutes", "cpu_minutes", "device", "torch",
                "git_commit", "date", "command"):
        assert key in res, key
    assert (out / "report.md").read_text().startswith(f"# Capstone `{name}`")
    assert (out / "curves.png").exists()
    if name == "moe":
        assert len(res["dense_val_loss"]) == len(res["moe_val_loss"]) == len(res["seeds"])
        assert set(res["tokens_per_s"]) >= {"dense", "moe"}
        assert res["params"]["moe_active"] < 1.1 * res["params"]["dense_active"]     # equal active FFN width
        moe = res["config"]["moe"]                            # busiest expert: 1 (balanced) to E / k (collapsed)
        assert len(res["busiest_expert_vs_uniform"]) == len(res["seeds"])
        assert all(1.0 <= b <= moe["n_experts"] / moe["top_k"] for b in res["busiest_expert_vs_uniform"])
    # a second job on the same folder is refused, one line, exit 2
    capsys.readouterr()
    with RunLock(out):
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "in use" in err and len(err.splitlines()) == 1
    # run again when finished: every part is done, nothing trains, the same result
    assert main(argv) == 0
    assert json.loads((out / "result.json").read_text())["value"] == res["value"]


@pytest.mark.parametrize("name,threads", [("vit", 1), ("vit", 2), ("moe", 1)])
def test_an_interrupted_capstone_resumes_to_the_same_result(name, threads, tmp_path, multi30k):
    """At --threads 2 the ViT's seeds train side by side in processes of their own (`CapstoneRun.parts`)."""
    kw = dict(tiny=True, max_steps=6, threads=threads, progress=False)
    if name == "moe":
        (tmp_path / "code.txt").write_text(TEXT, encoding="utf-8")
        kw["text"] = str(tmp_path / "code.txt")
    whole = run_capstone(name, tmp_path / "whole", **kw)
    assert run_capstone(name, tmp_path / "cut", stop_after=3, **kw) is None          # stopped mid-part
    assert not (tmp_path / "cut" / "result.json").exists()
    resumed = run_capstone(name, tmp_path / "cut", **kw)
    assert resumed["sessions"] >= 2
    keys = ["per_seed"] if name == "vit" else ["dense_val_loss", "moe_val_loss"]
    for k in keys:
        assert whole[k] == resumed[k], k
    for part in sorted(p.name for p in (tmp_path / "whole").iterdir() if (p / "last.pt").exists()):
        a = torch.load(tmp_path / "whole" / part / "last.pt", weights_only=False)["model"]
        b = torch.load(tmp_path / "cut" / part / "last.pt", weights_only=False)["model"]
        for key in a:                                         # the same final weights, bit for bit
            assert torch.equal(a[key], b[key]), (part, key)


def test_the_load_at_start_is_read_before_training_and_kept_across_a_resume(tmp_path, monkeypatch):
    """result.json's load_average_at_start is the machine before the run's first session trained (other
    jobs), not the run's own load at the end (which was recorded as the start before)."""
    import tformer.capstones.runfolder as runfolder
    loads = iter([(3.0, 2.0, 1.0), (9.0, 9.0, 9.0), (7.0, 7.0, 7.0)])     # first start, second start, end
    monkeypatch.setattr(runfolder.os, "getloadavg", lambda: next(loads))
    kw = dict(tiny=True, max_steps=4, threads=1, progress=False)
    assert run_capstone("vit", tmp_path / "run", stop_after=2, **kw) is None
    res = run_capstone("vit", tmp_path / "run", **kw)
    assert res["sessions"] == 2
    assert res["load_average_at_start"] == [3.0, 2.0, 1.0] and res["load_average_at_end"] == [7.0, 7.0, 7.0]


@pytest.mark.parametrize("argv, says", [
    (["capstone", "nope"], "invalid choice: 'nope'"),
    (["capstone", "vit", "--data", "DIR"], "unrecognized arguments: --data"),       # translate's option, not vit's
    (["capstone", "moe", "--text", "EMPTY"], "is empty"),
    (["capstone", "moe", "--text", "LATIN1"], "is not UTF-8"),
    (["capstone", "translate", "--data", "DIR"], "lacks the Multi30k files"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, tmp_path, capsys):
    (tmp_path / "EMPTY").write_text("  \n")
    (tmp_path / "LATIN1").write_bytes("Müller".encode("latin-1"))
    (tmp_path / "DIR").mkdir()
    argv = [str(tmp_path / a) if a in ("EMPTY", "LATIN1", "DIR") else a for a in argv]
    try:
        code = main([*argv, "--out", str(tmp_path / "out")])
    except SystemExit as e:                                 # argparse's own checks exit from parse_args
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()                 # nothing written for bad input


def test_a_chapter_cell_shows_a_finished_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    res = run_capstone("vit", out, tiny=True, max_steps=3, threads=1, progress=False)
    got = show("vit", out, plot=False)
    text = capsys.readouterr().out
    assert got == res
    assert f"test_accuracy = {res['value']}" in text and f"your run ({out})" in text
    empty = tmp_path / "none"
    got = show("vit", empty, plot=False)                   # no run here: the committed reference, or a hint
    text = capsys.readouterr().out
    if (reference_dir("vit") / "result.json").exists():
        assert "committed reference" in text and "tformer capstone vit" in text
    else:
        assert got is None and "tformer capstone vit" in text


@pytest.mark.parametrize("name", list(CAPSTONES))
def test_each_committed_reference_matches_todays_recipe(name):
    ref = reference_dir(name) / "result.json"
    if not ref.exists():
        pytest.skip(f"no committed reference for {name} yet")
    res = json.loads(ref.read_text())
    recipe = Options(machine_class=res.get("machine_class"))           # the machine class it ran as (none before)
    today = json.loads(json.dumps(CAPSTONES[name](recipe).config()))    # config() reads no data: no download
    assert res["config"] == today, (f"data/capstones/{name} is stale: its recipe differs from today's; regenerate it "
                                    f"with `{res['command']}` and copy result.json there")
    for key in ("command", "git_commit", "device_name", "date", "wall_minutes", "cpu_minutes"):
        assert res[key], key
    if name in ("vit", "clip"):                            # every part ran its recipe to the end, none cut by time
        from tformer.capstones.vit_digits import steps
        from tformer.data.images import load_digits
        n = len(load_digits().y_train)
        parts = [(res["config"]["train"] if name == "vit" else res["config"]["tower"]["train"],
                  res["steps"] if name == "vit" else res["tower_steps"])]
        if name == "clip":
            parts.append((res["config"]["train"], res["steps"]))
        for tc, steps_made in parts:
            assert steps_made == [steps(n, tc)] * len(steps_made), f"{name}: a part stopped early: {steps_made}"


def test_the_translate_cell_shows_translations_and_attention_and_the_reference_ships_no_dataset_text(
        tmp_path, multi30k, capsys, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    import importlib
    show_mod = importlib.import_module("tformer.capstones.show")          # the module (the package exports show())
    out = tmp_path / "run"
    res = run_capstone("translate", out, tiny=True, max_steps=4, threads=1, progress=False, data=str(multi30k))
    att = res["attention"]
    assert len(att["weights"]) == len(att["tgt_tokens"]) and len(att["weights"][0]) == len(att["src_tokens"])
    assert all(abs(sum(row) - 1) < 0.01 for row in att["weights"])          # each query's weights sum to 1
    capsys.readouterr()
    show("translate", out, plot=True)
    text = capsys.readouterr().out
    assert res["examples"][0]["hyp"] in text and res["examples"][0]["src"] in text
    assert f"{res['steps']:,} steps at" in text and f"greedy {res['greedy_bleu']:.2f}" in text   # BLEU beside its steps
    monkeypatch.setattr("tformer.capstones.runfolder.reference_dir", lambda name: tmp_path / "ref" / name)
    ref = show_mod.save_reference("translate", out)
    shipped = json.loads((ref / "result.json").read_text())
    assert [e["hyp"] for e in shipped["examples"]] == [e["hyp"] for e in res["examples"]]   # the model's own
    text = json.dumps(shipped, ensure_ascii=False) + (ref / "report.md").read_text()
    for f in ("de", "en"):                                  # no line of the test set, in either language
        assert not any(line in text for line in (multi30k / f"test_2016_flickr.{f}").read_text().splitlines())
    assert "src_tokens" not in shipped["attention"]


def test_a_reference_line_names_command_date_cores_and_torch_not_local_paths_or_load():
    """The chapter's line about a reference: the command as a learner types it, the date, the cores and
    the torch version; no local data path, no working-tree commit, no load average."""
    from tformer.capstones.show import describe
    res = {"capstone": "translate", "metric": "sacrebleu_beam4", "value": 39.97, "wall_minutes": 31.3,
           "cpu_minutes": 60.9, "command": "tformer capstone translate --data ../shared/data/multi30k",
           "git_commit": "d7b03e464d7a+changes", "device": "cpu", "device_name": "x86_64",
           "cpu_model": "Intel(R) Xeon(R) Platinum 8488C", "cpu_count": 2, "threads": 1,
           "torch": "2.13.0+cpu", "date": "2026-12-02 02:55 UTC", "load_average_at_start": [3.1, 2.0, 1.5]}
    line = describe(res, "reference")
    assert "`tformer capstone translate --data DIR`" in line, line
    for part in ("Intel(R) Xeon(R) Platinum 8488C", "2 cores", "1 thread)", "torch 2.13.0,", "2026-12-02"):
        assert part in line, (part, line)
    for gone in ("../shared", "+changes", "d7b03e4", "load", "3.1"):
        assert gone not in line, (gone, line)


def test_the_command_lists_every_capstone_found_with_its_chapter_and_line(capsys):
    from tformer.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["capstone", "--help"])
    text = "".join(capsys.readouterr().out.split())            # argparse wraps the lines where it likes
    assert set(CAPSTONES) == {"vit", "clip", "translate", "moe", "grpo"}
    for name, cls in CAPSTONES.items():
        assert issubclass(cls, Capstone) and cls.summary and cls.chapter
        assert "".join(f"{name} (ch. {cls.chapter}) {cls.summary}".split()) in text, name


def test_a_capstone_is_one_class_and_its_own_options_reach_it_alone(tmp_path):
    """The registry holds every Capstone subclass with a name; each subcommand takes the common options and
    its capstone's own; run_capstone refuses another capstone's option; the recorded command keeps the
    own options, and the one a reference shows puts a path's metavar in place of a local path."""
    from tformer.capstones.show import public_command
    assert {a.dest for a in CAPSTONES["translate"].own_options()} == {"data"}
    assert {a.dest for a in CAPSTONES["moe"].own_options()} == {"text"}
    assert CAPSTONES["vit"].own_options() == []
    with pytest.raises(TypeError):
        run_capstone("vit", tmp_path / "out", tiny=True, text="code.txt")
    assert not (tmp_path / "out").exists()
    cap = CAPSTONES["moe"](Options(time_budget=80, threads=2, own={"text": "/home/me/code.txt"}))
    assert cap.command() == "tformer capstone moe --time-budget 80 --text /home/me/code.txt --threads 2"
    assert public_command(cap.command(), "moe") == "tformer capstone moe --time-budget 80 --text FILE --threads 2"
    assert public_command("tformer capstone vit --threads 2", "vit") == "tformer capstone vit --threads 2"


def test_config_overlays_tiny_and_gpu_and_caps_steps_once_for_all(monkeypatch):
    class Toy(Capstone):
        RECIPE = {"model": {"d": 128, "layers": 4}, "train": {"steps": 1000, "lr": 1e-3}, "seeds": [0, 1, 2]}
        TINY = {"model": {"d": 16}, "seeds": [0]}
        GPU = {"train": {"lr": 3e-3}}
        STEPS = ("train.steps",)
    assert Toy().config() == Toy.RECIPE and Toy().config() is not Toy.RECIPE
    tiny = Toy(Options(tiny=True, max_steps=5)).config()
    assert tiny == {"model": {"d": 16, "layers": 4}, "train": {"steps": 5, "lr": 1e-3}, "seeds": [0], "max_steps": 5}
    assert Toy.RECIPE["model"]["d"] == 128                                     # the class's recipe is untouched
    import torch as _torch
    monkeypatch.setattr("tformer.utils.device.device", lambda **kw: _torch.device("cuda"))
    assert Toy().config()["train"]["lr"] == 3e-3


# -- the recipe of this machine's class (tformer.measure.machine) -------------------------------------------
class _Toy(Capstone):
    RECIPE = {"train": {"steps": 1000, "lr": 1e-3, "batch": 64}}
    RECIPES = {"cpu-avx2": {"train": {"steps": 600}}, "cpu-bf16": {"train": {"batch": 128}}}


def _probe_says(monkeypatch, **kw):
    from tformer.measure import machine
    fake = machine.Probe("cpu", "a test CPU", kw.pop("threads", 2), kw.pop("float32", 68.0), **kw)
    monkeypatch.setattr(machine, "probe", lambda **_: fake)


@pytest.mark.parametrize("probe, recipe, want", [
    ({}, None, {"steps": 600, "lr": 1e-3, "batch": 64}),                         # 2-core AVX2: its overlay
    ({"bf16_units": True}, None, {"steps": 1000, "lr": 1e-3, "batch": 128}),     # bf16 units: theirs
    ({"float32": 400.0, "threads": 8}, None, {"steps": 1000, "lr": 1e-3, "batch": 64}),   # cpu-fast: RECIPE
    ({}, "cpu-bf16", {"steps": 1000, "lr": 1e-3, "batch": 128}),                 # --recipe overrides the probe
])
def test_the_probe_picks_its_classs_recipe_and_recipe_overrides_it(monkeypatch, tmp_path, probe, recipe, want):
    from tformer.capstones.base import choose_recipe
    _probe_says(monkeypatch, **probe)
    opts = Options(recipe=recipe)
    choose_recipe(opts, tmp_path)
    assert _Toy(opts).config()["train"] == want
    assert opts.probe["line"] == "this CPU (a test CPU): " + opts.probe["line"].split(": ", 1)[1]
    assert opts.machine_class == (recipe or opts.probe["class"])


def test_a_resumed_run_keeps_the_recipe_it_started_with(monkeypatch, tmp_path):
    """A busier machine today must not change a run's recipe halfway: the folder's recorded class wins."""
    from tformer.capstones.base import choose_recipe
    (tmp_path / "config.json").write_text(json.dumps({"capstone": "toy", "machine_class": "cpu-bf16", "recipe": {}}))
    _probe_says(monkeypatch)                                    # today's probe says cpu-avx2
    opts = Options()
    choose_recipe(opts, tmp_path)
    assert opts.machine_class == "cpu-bf16" and opts.probe["class"] == "cpu-avx2" and opts.probe["resumed"]


def test_recipe_as_typed_is_recorded_and_a_wrong_name_is_one_line(tmp_path):
    """`tformer capstone vit --recipe CLASS`, the entry point from a folder outside the checkout."""
    import subprocess
    import sys
    from pathlib import Path
    tformer = str(Path(sys.executable).with_name("tformer"))
    run = lambda *a: subprocess.run([tformer, "capstone", "vit", "--out", str(tmp_path / "run"), *a],  # noqa: E731
                                    cwd=tmp_path, capture_output=True, text=True, timeout=300)
    bad = run("--recipe", "avx2")
    assert bad.returncode == 2 and "invalid choice: 'avx2'" in bad.stderr and "cpu-avx2" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    ok = run("--tiny", "--max-steps", "2", "--threads", "1", "--recipe", "cpu-bf16")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "recipe cpu-bf16 (--recipe)" in ok.stderr and "GFLOP/s float32" in ok.stderr
    res = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res["machine_class"] == "cpu-bf16" and res["probe"]["float32"] > 0 and res["probe"]["device"] == "cpu"
    assert "--recipe cpu-bf16" in res["command"]
    assert "recipe `cpu-bf16`" in (tmp_path / "run" / "report.md").read_text()


def test_the_vit_seeds_side_by_side_give_what_they_give_one_after_another(tmp_path):
    """`tformer capstone vit --threads 2` trains its seeds in two processes of one thread each; every seed's
    weights and accuracy equal those of `--threads 1` (one seed after another, in the command's process),
    bit for bit, and the run's CPU time counts the workers'."""
    import subprocess
    import sys
    from pathlib import Path
    tformer = str(Path(sys.executable).with_name("tformer"))
    runs = {}
    for threads in ("1", "2"):
        out = tmp_path / f"t{threads}"
        p = subprocess.run([tformer, "capstone", "vit", "--tiny", "--max-steps", "8", "--threads", threads,
                            "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        runs[threads] = (out, json.loads((out / "result.json").read_text()), p.stderr)
    (one, r1, err1), (two, r2, err2) = runs["1"], runs["2"]
    assert "side by side, 2 at a time, one thread each" in err2 and "side by side" not in err1
    assert r1["per_seed"] == r2["per_seed"] and r1["steps"] == r2["steps"] and len(r2["per_seed"]) == 2
    for seed in r2["seeds"]:
        a = torch.load(one / f"vit-seed{seed}" / "last.pt", weights_only=False)["model"]
        b = torch.load(two / f"vit-seed{seed}" / "last.pt", weights_only=False)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), seed
    state = json.loads((two / "state.json").read_text())
    assert state["cpu_s"] > 0.5 * sum(p["minutes"] for p in state["parts"].values()) * 60     # the workers' CPU


def test_the_busiest_expert_counts_every_batch_it_is_given():
    """The MoE capstone's balance figure sums each layer's routing over all the batches: two batches give
    what the same rows give as one batch (a token's routing does not depend on the other rows)."""
    from tformer.capstones.moe_stdlib import busiest_expert, gpt_config
    from tformer.models.gpt import GPT
    torch.manual_seed(0)
    moe = {"n_experts": 4, "top_k": 2, "balance_weight": 0.01}
    model = GPT(gpt_config(dict(d_model=16, n_layers=2, n_heads=2, context_length=8, dropout=0.0), 50, 32, moe))
    a, b = torch.randint(0, 50, (3, 8)), torch.randint(0, 50, (5, 8))
    both = busiest_expert(model, [(a, a), (b, b)])
    assert both == busiest_expert(model, [(torch.cat([a, b]), None)])
    assert both != busiest_expert(model, [(a, a)]) or both != busiest_expert(model, [(b, b)])
    assert 1.0 <= both <= 2.0                                   # E / k = 2 if every token went to the same two


def test_translate_trains_the_float32_preset_where_the_cpu_has_no_bf16_units(multi30k, tmp_path):
    """`tformer capstone translate --recipe cpu-avx2` trains preset small-avx2 (no dropout on attention weights
    or FFN units, float32), the entry point from a folder outside the checkout; a CPU with bf16 units keeps
    small, the recipe it was tuned with."""
    import subprocess
    import sys
    from pathlib import Path

    from tformer.capstones.base import Options
    tformer = str(Path(sys.executable).with_name("tformer"))
    out = tmp_path / "run"
    ok = subprocess.run([tformer, "capstone", "translate", "--out", str(out), "--data", str(multi30k), "--max-steps",
                         "2", "--threads", "1", "--recipe", "cpu-avx2"], cwd=tmp_path, capture_output=True, text=True,
                        timeout=600)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "recipe cpu-avx2 (--recipe): {'preset': 'small-avx2', 'alpha': 1.0}" in ok.stderr
    config = json.loads((out / "config.json").read_text())["recipe"]
    assert config["preset"] == "small-avx2"
    assert config["recipe"]["attn_dropout"] == config["recipe"]["ffn_dropout"] == 0.0
    assert not config["recipe"]["cpu_bf16"] and config["recipe"]["d_model"] == 256
    trained = json.loads((out / "train" / "config.json").read_text())
    assert trained["preset_name"] == "small-avx2" and trained["preset"]["max_steps"] == 2       # --max-steps 2
    assert {**trained["preset"], "max_steps": None} == {**config["recipe"], "max_steps": None}
    assert config["alpha"] == 1.0 and json.loads((out / "result.json").read_text())["config"]["alpha"] == 1.0
    bf16 = CAPSTONES["translate"](Options(machine_class="cpu-bf16")).config()
    assert (bf16["preset"], bf16["alpha"]) == ("small", 0.6)
