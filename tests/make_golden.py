"""Make (or check) the committed Hugging Face references the torch-free tests compare with.

    python tests/make_golden.py            # rewrite tests/data/golden/ (needs the [hf] extra)
    python tests/make_golden.py --check    # the committed files against the installed transformers
    python tests/make_golden.py --cases modernbert_mlm   # (re)write only these cases

Each case builds a tiny random transformers model (PyTorch, CPU, float32) from a config and a fixed
seed, saves it with ``save_pretrained`` (safetensors) and, for the cases the tests run, its outputs
on fixed inputs (eager attention, ``torch.no_grad``) in ``reference.npz``; `tests/golden.py` reads
them. ``init_stats.json`` holds transformers' fresh-init statistics for `tests/test_init.py`.
``MANIFEST.json`` records the versions and this command.

``--check`` (run by ``make test-hf``) reloads every committed model with the installed transformers
and recomputes its outputs: a transformers release that changes a model's behaviour (or its saved
layout) fails here, and the golden files are then regenerated deliberately. The fresh-init
statistics are recomputed and compared within the tolerance `tests/test_init.py` uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers

# tests/ (golden.py, the test modules holding the zoo's builders) and the repository root (jaxformer,
# also where only a .pth file points at the project's environment, as in .venv-hf)
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import test_convert_llama as llama  # noqa: E402  (the model zoo's builders live beside their tests)
import test_convert_mixtral as mixtral  # noqa: E402
import test_convert_moe as moe  # noqa: E402
import test_convert_mt5 as mt5  # noqa: E402
import test_convert_roberta_distilbert_bart as zoo  # noqa: E402
import test_hf_finetune as finetune  # noqa: E402
import test_modernbert as modernbert  # noqa: E402
from golden import GOLDEN, rel_err  # noqa: E402

RTOL = 1e-5  # a reloaded model against its committed outputs: the same program, so ~1e-7 in practice


@dataclasses.dataclass(frozen=True)
class Case:
    """A tiny random HF model: ``build()`` (called after ``torch.manual_seed(seed)``), optional
    ``inputs()`` (named int arrays) and ``run(model, inputs)`` → named output arrays; ``save``
    overrides ``save_pretrained`` (bfloat16 shards)."""

    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], dict[str, np.ndarray]] | None = None
    run: Callable[[torch.nn.Module, dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None
    seed: int = 0
    save: Callable[[torch.nn.Module, Path], None] | None = None


V, B, L = 128, 2, 12
SMALL_BERT = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=64)
SMALL_T5 = dict(vocab_size=V, d_model=64, d_kv=8, d_ff=96, num_layers=2, num_decoder_layers=3,
                num_heads=4, relative_attention_num_buckets=16, relative_attention_max_distance=20)
ALBERT = dict(vocab_size=64, embedding_size=8, hidden_size=32, num_attention_heads=4,
              intermediate_size=64, num_hidden_layers=3, max_position_embeddings=16)


def _tokens(seed: int, shape=(B, L), vocab: int = V, low: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, vocab, shape).astype(np.int32)


def gpt_inputs() -> dict[str, np.ndarray]:
    """Logits on ``input_ids`` [2, 12]; greedy continuation (6 tokens) of ``prompt`` [2, 5]."""
    return {"input_ids": _tokens(0), "prompt": _tokens(5, (B, 5), low=2)}


def bert_inputs(vocab: int = V, length: int = L, seed: int = 1, pad: int = 4) -> dict[str, np.ndarray]:
    """Two segments (token types 0 | 1) and ``pad`` padding positions in the second row."""
    x = _tokens(seed, (B, length), vocab)
    types = np.zeros_like(x)
    types[:, length // 2:] = 1
    mask = np.ones_like(x)
    mask[1, length - pad:] = 0
    return {"input_ids": x, "token_type_ids": types, "attention_mask": mask}


def t5_inputs() -> dict[str, np.ndarray]:
    """Sources [2, 12] (3 padding positions in row 0) and decoder inputs [2, 7]; greedy targets."""
    mask = np.ones((B, L), np.int32)
    mask[0, L - 3:] = 0
    return {"input_ids": _tokens(2), "attention_mask": mask, "decoder_input_ids": _tokens(3, (B, 7))}


def qa_inputs() -> dict[str, np.ndarray]:
    tokens = np.random.default_rng(0).integers(1, 99, (2, 12)).astype(np.int32)
    types = np.concatenate([np.zeros((2, 5), np.int32), np.ones((2, 7), np.int32)], axis=1)
    return {"input_ids": tokens, "token_type_ids": types}


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.tensor(np.asarray(x, np.int64))


def _forward(keys: tuple[str, ...], outputs: tuple[str, ...]):
    """run(): the model on the named inputs, keeping the named output fields."""
    def run(model, inputs):
        out = model(**{k: _t(inputs[k]) for k in keys})
        return {name: getattr(out, name).numpy() for name in outputs}
    return run


def run_gpt(model, inputs):
    out = {"logits": model(_t(inputs["input_ids"])).logits.numpy()}
    generated = model.generate(_t(inputs["prompt"]), max_new_tokens=6, do_sample=False,
                               num_beams=1, pad_token_id=0, eos_token_id=None)
    out["greedy"] = generated[:, inputs["prompt"].shape[1]:].numpy().astype(np.int32)
    return out


def run_t5(model, inputs):
    out = _forward(("input_ids", "attention_mask", "decoder_input_ids"), ("logits",))(model, inputs)
    generated = model.generate(_t(inputs["input_ids"]), attention_mask=_t(inputs["attention_mask"]),
                               max_new_tokens=6, do_sample=False, num_beams=1, eos_token_id=None,
                               decoder_start_token_id=0, use_cache=False)
    # use_cache=False: transformers 5.24's cache sizes the cross-attention cache by num_layers and
    # fails when the decoder has more layers (num_decoder_layers=3 here); greedy is the same.
    out["greedy"] = generated[:, 1:].numpy().astype(np.int32)  # after the decoder start token
    return out


def _t5_v11():
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        **SMALL_T5, feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    # transformers 5 ties lm_head to `shared` regardless; give it its own weights like the
    # published v1.1 checkpoints (transformers 4 already made it untied).
    model.lm_head.weight = torch.nn.Parameter(torch.randn(V, 64))
    return model


def _t5_tied():
    """transformers 5's default v1.1 (tied lm_head, no d_model^-0.5), the head set equal to the
    shared table by hand (transformers 4 does not tie it when ``tie_word_embeddings=False``)."""
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight.copy_(model.shared.weight)
    return model


def llama_inputs() -> dict[str, np.ndarray]:
    """`tests/test_convert_llama.py`'s logits inputs (right padding in row 1) and prompts."""
    return {"input_ids": llama.TOKENS, "attention_mask": llama.MASK, "prompt": llama.PROMPTS}


def run_llama(model, inputs):
    return llama.reference_outputs(model)


def switch_inputs() -> dict[str, np.ndarray]:
    return {"input_ids": moe.SOURCES, "attention_mask": moe.SOURCE_MASK,
            "decoder_input_ids": moe.TARGETS}


def run_switch(model, inputs):
    return moe.switch_outputs(model)


def run_zoo(name: str):
    """run() of `tests/test_convert_roberta_distilbert_bart.py`'s model ``name`` (on its batch)."""
    return lambda model, inputs: zoo.reference_outputs(name, model)


def run_classifier(model, inputs):
    return {"logits": model(_t(inputs["input_ids"])).logits.numpy()}


def _gpt2(**kw):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=64, bos_token_id=1,
        eos_token_id=1, **kw))


def _save_bf16_shards(model, path):
    model.to(torch.bfloat16).save_pretrained(path, max_shard_size="40KB")


VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           image_size=8, patch_size=2, num_channels=3)


def vit_inputs() -> dict[str, np.ndarray]:
    """Pixels `[2, 3, 8, 8]` (the model's size) and `[2, 3, 12, 12]` (read with the position grid
    resampled: ``interpolate_pos_encoding=True``), NCHW as HF takes them."""
    rng = np.random.default_rng(7)
    return {"pixel_values": rng.normal(size=(B, 3, 8, 8)).astype(np.float32),
            "pixel_values_big": rng.normal(size=(B, 3, 12, 12)).astype(np.float32)}


def run_vit(fields: tuple[str, ...]):
    """run(): the named outputs at the model's size, and ``<name>_big`` at 12×12 (interpolated)."""
    def run(model, inputs):
        x, big = (torch.tensor(inputs[k]) for k in ("pixel_values", "pixel_values_big"))
        out, out_big = model(pixel_values=x), model(pixel_values=big, interpolate_pos_encoding=True)
        return {**{f: getattr(out, f).numpy() for f in fields},
                **{f"{f}_big": getattr(out_big, f).numpy() for f in fields}}
    return run


BERT_KEYS = ("input_ids", "token_type_ids", "attention_mask")
T5_KEYS = ("input_ids", "attention_mask", "decoder_input_ids")
def modernbert_inputs():
    return {"input_ids": modernbert.TOKENS, "attention_mask": modernbert.MASK}


def run_modernbert(model, inputs):
    return modernbert.reference_outputs(model)


CASES: dict[str, Case] = {
    # tests/test_convert.py: logit parity, greedy tokens and export of each family
    "gpt2": Case(_gpt2, gpt_inputs, run_gpt),
    "bert_mlm": Case(lambda: transformers.BertForMaskedLM(transformers.BertConfig(**SMALL_BERT)),
                     bert_inputs, _forward(BERT_KEYS, ("logits",))),
    "bert_cls": Case(lambda: transformers.BertForSequenceClassification(
        transformers.BertConfig(**SMALL_BERT, num_labels=3)), bert_inputs, _forward(BERT_KEYS, ("logits",))),
    "t5_v1_0": Case(lambda: transformers.T5ForConditionalGeneration(
        transformers.T5Config(**SMALL_T5, feed_forward_proj="relu")), t5_inputs, run_t5),
    "t5_v1_1": Case(_t5_v11, t5_inputs, run_t5),
    "t5_tied": Case(_t5_tied, t5_inputs, _forward(T5_KEYS, ("logits",)), seed=1),
    "gpt2_bf16_shards": Case(_gpt2, save=_save_bf16_shards),
    # architectures whose shared parts the logit cases cover: tensors and loading only
    "GPT2Model": Case(lambda: transformers.GPT2Model(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=V, n_positions=16)), seed=2),
    "GPT2LMHeadModel-untied": Case(lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=V, n_positions=16, tie_word_embeddings=False)),
        seed=2),
    "BertForPreTraining": Case(lambda: transformers.BertForPreTraining(transformers.BertConfig(
        **dict(SMALL_BERT, num_hidden_layers=1))), seed=2),
    "BertForTokenClassification": Case(lambda: transformers.BertForTokenClassification(
        transformers.BertConfig(**dict(SMALL_BERT, num_hidden_layers=1), num_labels=4)), seed=2),
    "BertModel": Case(lambda: transformers.BertModel(transformers.BertConfig(
        **dict(SMALL_BERT, num_hidden_layers=1))), seed=2),
    # tests/test_qa.py
    "bert_qa": Case(lambda: transformers.BertForQuestionAnswering(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)),
        qa_inputs, _forward(("input_ids", "token_type_ids"), ("start_logits", "end_logits"))),
    # tests/test_albert.py: one shared group, one group per layer, the pretraining heads (SOP and
    # an untied E-wide decoder)
    "albert_mlm": Case(lambda: transformers.AlbertForMaskedLM(transformers.AlbertConfig(**ALBERT)),
                       lambda: bert_inputs(64, 10, 4, 3), _forward(BERT_KEYS, ("logits",))),
    "albert_groups": Case(lambda: transformers.AlbertModel(transformers.AlbertConfig(
        **ALBERT, num_hidden_groups=3)), lambda: bert_inputs(64, 10, 4, 3),
        _forward(BERT_KEYS, ("last_hidden_state",))),
    "albert_pretraining": Case(lambda: transformers.AlbertForPreTraining(transformers.AlbertConfig(
        **ALBERT, tie_word_embeddings=False)), lambda: bert_inputs(64, 10, 4, 3),
        _forward(BERT_KEYS, ("prediction_logits", "sop_logits")), seed=3),
    # tests/test_convert_llama.py: Llama (llama3 RoPE, GQA), tied + biases + linear RoPE + MQA,
    # dynamic NTK, Mistral's sliding window, Qwen2 (q/k/v biases, yarn), a sequence classifier
    "llama": Case(llama.build_llama, llama_inputs, run_llama),
    "llama_tied_bias": Case(llama.build_llama_tied_bias, llama_inputs, run_llama),
    "llama_dynamic": Case(llama.build_llama_dynamic, llama_inputs, run_llama),
    "mistral": Case(llama.build_mistral, llama_inputs, run_llama),
    "qwen2": Case(llama.build_qwen2, llama_inputs, run_llama),
    "llama_classifier": Case(llama.build_llama_classifier, llama_inputs, run_classifier),
    # tests/test_convert_mixtral.py: Mixtral (4 experts, top-2, sliding window), Qwen2-MoE
    "mixtral": Case(mixtral.build_mixtral, llama_inputs, run_llama),
    # tests/test_modernbert.py: ModernBERT's MLM, sequence ("cls"; "mean" with every bias) and
    # token classifiers, local window 6 < the 20 tokens
    "modernbert_mlm": Case(modernbert.BUILDERS["modernbert_mlm"], modernbert_inputs, run_modernbert),
    "modernbert_cls": Case(modernbert.BUILDERS["modernbert_cls"], modernbert_inputs, run_modernbert),
    "modernbert_cls_mean_bias": Case(modernbert.BUILDERS["modernbert_cls_mean_bias"], modernbert_inputs,
                                     run_modernbert),
    "modernbert_token": Case(modernbert.BUILDERS["modernbert_token"], modernbert_inputs, run_modernbert),
    "qwen2_moe": Case(mixtral.build_qwen2_moe, llama_inputs, run_llama),
    # tests/test_convert_moe.py: Switch-T5 (its outputs with room for every token, and with HF's
    # expert_capacity=2, where both drop tokens)
    "switch": Case(moe.build_switch, switch_inputs, run_switch),
    # tests/test_convert_mt5.py: T5 v1.1 graphs
    "mt5": Case(mt5.build_mt5, lambda: {"input_ids": mt5.INPUTS, "decoder_input_ids": mt5.TARGETS},
                lambda model, inputs: mt5.reference_outputs(model)),
    "flan_t5": Case(mt5.build_flan_t5, lambda: {"input_ids": mt5.INPUTS,
                                                "decoder_input_ids": mt5.TARGETS},
                    lambda model, inputs: mt5.reference_outputs(model)),
    # tests/test_convert_roberta_distilbert_bart.py: RoBERTa and DistilBERT (MLM, sequence and
    # token classification, QA), BART (logits and greedy tokens)
    "roberta_mlm": Case(zoo.build_roberta_mlm, zoo.batch, run_zoo("roberta_mlm")),
    "roberta_cls": Case(zoo.build_roberta_cls, zoo.batch, run_zoo("roberta_cls")),
    "roberta_token": Case(zoo.build_roberta_token, zoo.batch, run_zoo("roberta_token")),
    "roberta_qa": Case(zoo.build_roberta_qa, zoo.batch, run_zoo("roberta_qa")),
    "distilbert_mlm": Case(zoo.build_distilbert_mlm, zoo.batch, run_zoo("distilbert_mlm")),
    "distilbert_cls": Case(zoo.build_distilbert_cls, zoo.batch, run_zoo("distilbert_cls")),
    "distilbert_token": Case(zoo.build_distilbert_token, zoo.batch, run_zoo("distilbert_token")),
    "distilbert_qa": Case(zoo.build_distilbert_qa, zoo.batch, run_zoo("distilbert_qa")),
    "bart": Case(zoo.build_bart, zoo.batch, run_zoo("bart")),
    # tests/test_hf_finetune.py: the worked examples' checkpoints (the tests add the tokenizers)
    "roberta_bpe400": Case(finetune.build_roberta),
    "bart_bpe400": Case(finetune.build_bart),
    "distilbert_wp400": Case(finetune.build_distilbert),
    # tests/test_convert_vit.py: ViT's classifier and backbone (+ pooler), at 8×8 and interpolated
    # (every weight redrawn at std 0.1, norms included, so a swapped tensor changes the outputs)
    "vit_cls": Case(lambda: llama._randomized(transformers.ViTForImageClassification(
        transformers.ViTConfig(**VIT, num_labels=5)), 4), vit_inputs, run_vit(("logits",)), seed=4),
    "vit_model": Case(lambda: llama._randomized(transformers.ViTModel(transformers.ViTConfig(**VIT)),
                                                5), vit_inputs,
                      run_vit(("last_hidden_state", "pooler_output")), seed=5),
    # init_from an HF directory (tests/test_train.py, test_nnx_train.py, test_lora.py): the tiny
    # configs' 512-token vocabulary
    "gpt2_v512": Case(lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=512, n_positions=64, n_embd=32, n_layer=1, n_head=2))),
}


def _load(path: Path) -> torch.nn.Module:
    config = transformers.AutoConfig.from_pretrained(path)
    cls = getattr(transformers, config.architectures[0])
    return cls.from_pretrained(path, attn_implementation="eager").eval()


def _outputs(case: Case, model: torch.nn.Module, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        return case.run(model.float().eval(), inputs)


def write_case(name: str, case: Case, root: Path) -> None:
    torch.manual_seed(case.seed)
    model = case.build().eval()
    path = root / name
    if case.save:
        case.save(model, path)
    else:
        model.save_pretrained(path, safe_serialization=True)
    if case.inputs:
        inputs = case.inputs()
        outputs = _outputs(case, _load(path), inputs)  # what a user's from_pretrained computes
        np.savez_compressed(path / "reference.npz", **inputs, **outputs)


# ------------------------------------------------------------------------------------------------
# tests/test_init.py: HF PyTorch's fresh initialisation, in jaxformer's parameter names
def init_statistics() -> dict:
    import test_init  # noqa: PLC0415 (tests/ is on sys.path)

    from jaxformer.config import ModelConfig
    from jaxformer.convert import load_hf, save_hf
    from jaxformer.convert.mapping import flatten, unflatten

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg_dict in sorted(test_init.HF_CASES.items()):
            cfg = ModelConfig.from_dict(cfg_dict)
            save_hf(cfg, unflatten(test_init.fresh(cfg)), Path(tmp) / name / "exported")
            hf_config = transformers.AutoConfig.from_pretrained(Path(tmp) / name / "exported")
            torch.manual_seed(0)
            model = getattr(transformers, hf_config.architectures[0])(hf_config)
            model.save_pretrained(Path(tmp) / name / "hf", safe_serialization=True)
            _, params, _ = load_hf(Path(tmp) / name / "hf")
            stats = {k: [float(np.mean(v)), float(np.std(v))] for k, v in flatten(params).items()}
            out[name] = {"config": cfg.to_dict(), "stats": stats}
        # T5's step-0 loss: 3 fresh T5ForConditionalGeneration on the test's byte batch
        cfg = ModelConfig.from_dict(test_init.T5_STEP0_CONFIG)
        save_hf(cfg, unflatten(test_init.fresh(cfg)), Path(tmp) / "t5_step0")
        hf_config = transformers.AutoConfig.from_pretrained(Path(tmp) / "t5_step0")
        x = torch.tensor(test_init.text_rows(8, 48), dtype=torch.long)
        losses = []
        for seed in range(3):
            torch.manual_seed(seed)
            model = transformers.T5ForConditionalGeneration(hf_config).eval()
            with torch.no_grad():  # labels are shifted right behind decoder start id 0, as step0's
                losses.append(float(model(input_ids=x[:, :-1], labels=x[:, 1:].contiguous()).loss))
        out["t5_step0"] = {"config": cfg.to_dict(), "losses": losses}
    return out


def check_init_statistics(committed: dict, live: dict) -> list[str]:
    bad = []
    for name, case in live.items():
        if name == "t5_step0":
            if abs(np.mean(case["losses"]) - np.mean(committed[name]["losses"])) > 0.1:
                bad.append(f"t5_step0: losses {case['losses']} vs committed {committed[name]['losses']}")
            continue
        for path, (mean, std) in case["stats"].items():
            c_mean, c_std = committed[name]["stats"][path]
            if (c_std == 0) != (std == 0) or (std == 0 and mean != c_mean):
                bad.append(f"{name} {path}: constant {mean} vs committed {c_mean}")
            elif std and abs(std / c_std - 1) > 0.05:
                bad.append(f"{name} {path}: std {std:.5f} vs committed {c_std:.5f}")
    return bad


def manifest(command: str) -> dict:
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "numpy": np.__version__, "command": command,
            "cases": sorted(CASES), "note": "made by tests/make_golden.py; do not edit by hand"}


def make(root: Path, only: list[str] | None = None) -> None:
    """Write every case (``only``: just these, keeping the others and init_stats.json)."""
    unknown = sorted(set(only or ()) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    if only is None and root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    for name in only or CASES:
        if (root / name).exists():
            shutil.rmtree(root / name)
        write_case(name, CASES[name], root)
    if only is None:
        (root / "init_stats.json").write_text(json.dumps(init_statistics(), indent=1,
                                                         sort_keys=True))
    (root / "MANIFEST.json").write_text(json.dumps(
        manifest("python tests/make_golden.py"), indent=1) + "\n")


def check(root: Path) -> list[str]:
    """What differs between the committed references and the installed transformers."""
    bad = []
    for name, case in CASES.items():
        path = root / name
        if not (path / "config.json").is_file():
            bad.append(f"{name}: missing; run python tests/make_golden.py")
            continue
        if not case.inputs:
            _load(path)  # still loads
            continue
        with np.load(path / "reference.npz") as f:
            committed = {k: f[k] for k in f.files}
        inputs = {k: committed[k] for k in case.inputs()}
        for key, value in _outputs(case, _load(path), inputs).items():
            if value.dtype.kind in "iu":
                if not np.array_equal(value, committed[key]):
                    bad.append(f"{name} {key}: {value.tolist()} vs committed {committed[key].tolist()}")
            elif rel_err(value, committed[key]) > RTOL:
                bad.append(f"{name} {key}: relative error {rel_err(value, committed[key]):.2e}")
    bad += check_init_statistics(json.loads((root / "init_stats.json").read_text()),
                                 init_statistics())
    return bad


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, don't write")
    parser.add_argument("--out", type=Path, default=GOLDEN)
    parser.add_argument("--cases", nargs="+", help="(re)write only these cases")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    torch.use_deterministic_algorithms(True)
    if args.check:
        bad = check(args.out)
        print("\n".join(bad) or f"golden files match transformers {transformers.__version__}")
        return 1 if bad else 0
    make(args.out, args.cases)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"wrote {len(args.cases or CASES)} cases to {args.out} ({size / 2**20:.2f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
