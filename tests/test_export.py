"""`tformer export --to hf`: a run folder becomes a GPT-2 folder that transformers loads with the same logits."""
import pytest
import torch

from tformer.moe import MoEConfig
from tformer.cli import main
from tformer.models.gpt import GPT, GPTConfig
from tformer.serve.runs import byte_tokenizer, load_gpt_run, load_hf, save_gpt_run


def run_folder(tmp_path, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=257, context_length=64, n_layers=2, n_heads=4, d_model=32)
    cfg.update(kw)
    model = GPT(GPTConfig(**cfg)).eval()
    return save_gpt_run(tmp_path / "run", model, byte_tokenizer()), model


@pytest.mark.parametrize("kw", [{}, {"bias": False, "activation": "gelu", "d_ff": 48}])
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, kw, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run, model = run_folder(tmp_path, **kw)
    again, tok, _ = load_gpt_run(run)
    ids = torch.tensor([tok.encode("Hello, export!").ids])
    assert torch.equal(again(ids), model(ids))                       # the run folder round-trips
    assert main(["export", "--to", "hf", str(run), str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=1e-5)
    fast = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    assert fast("Hello, export!")["input_ids"] == ids[0].tolist()
    back, tok_back = load_hf(tmp_path / "hf")                          # what `tformer serve --hf DIR` loads
    torch.testing.assert_close(back(ids), model(ids), atol=1e-5, rtol=1e-5)
    assert tok_back.encode("Hello").ids == tok.encode("Hello").ids


@pytest.mark.parametrize("kw, feature", [({"positional": "rope"}, "RoPE"), ({"activation": "swiglu"}, "SwiGLU"),
                                         ({"n_kv_heads": 2}, "GQA"), ({"moe": MoEConfig(n_experts=2)}, "MoE")])
def test_export_refuses_what_gpt2_cannot_express(tmp_path, capsys, kw, feature):
    run, _ = run_folder(tmp_path, **kw)
    assert main(["export", "--to", "hf", str(run), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and feature in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "hf").exists()


def test_export_not_a_run_folder(tmp_path, capsys):
    assert main(["export", "--to", "hf", str(tmp_path), str(tmp_path / "hf")]) == 2
    assert "not a run folder" in capsys.readouterr().err
