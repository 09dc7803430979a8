"""Every converter family end to end in transformers (PyTorch): fine-tune → ``--to-hf`` →
``AutoTokenizer`` + ``AutoModel…`` give the run's own ids and predictions (issue 60, items 1 and 2).

For each family a tiny random checkpoint is made here, offline: transformers' own model classes
(2 layers, width 32–64; the worked examples' golden checkpoints where they exist) saved beside the
tokenizer files the family's checkpoints ship, built locally (`tests/test_fast_tokenizer.py`,
`tests/test_convert_export.py`): BERT ``vocab.txt``, DistilBERT ``vocab.txt`` only (issue 60's
case), RoBERTa and BART ``vocab.json`` + ``merges.txt``, ALBERT / T5 / mT5 ``spiece.model``, GPT-2
a ``tokenizer.json`` saved by ``GPT2Tokenizer``, Llama and Mistral ``tokenizer.model``, Qwen2 a
byte-level ``tokenizer.json``. A few steps of fine-tuning through ``init_from`` (a classifier for
the encoders, seq2seq for the encoder-decoders, causal LM for GPT-2, SFT for the Llama family —
Llama with LoRA, exported merged), then ``jaxformer-convert --to-hf``, then on the export:

- ``AutoTokenizer.from_pretrained(checkpoint)`` equals the run's tokenizer on the hard sample
  (accents, emoji, CJK, whitespace runs, leading spaces: `HARD`), ``add_special_tokens=False``;
- ``AutoTokenizer.from_pretrained(export)(text)`` is the row the run feeds its model: a
  classifier's pipeline row (``truncation=True`` to ``data.seq_len``, as the pipeline cuts), the
  prompt ``predict`` / ``generate`` encode for the others;
- ``AutoModelFor…`` on those ids: a classifier's class probabilities equal `jaxformer.predict`'s
  (``classify``, what ``jaxformer.cli.predict`` writes), a generator's logits equal the run's
  model's, and its greedy search (``generate``) gives the tokens `evaluate`'s decoding gives.

Each case prints one row of the table in docs/huggingface.md (``pytest -s``). `make test-hf` runs
this file; `make test` skips it (no torch).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from golden import golden_copy
from test_convert_export import HARD, _mistral, _t5
from test_convert_export import _albert as _albert_spiece
from test_fast_tokenizer import (
    ENCODER_CORPUS,
    _write_class,
    build_byte_level_bpe,
    build_llama2_tokenizer,
    build_llama3_tokenizer,
    build_wordpiece,
)
from test_hf_finetune import LABELS, ROOT, TINY, _pair, _review, _write, _write_text
from test_llama_sft import _pairs

from jaxformer.cli.convert import main as convert_main
from jaxformer.data.pipeline import example_framing, make_dataset
from jaxformer.decode.api import encode_prompts
from jaxformer.evaluate_run import load_run
from jaxformer.evaluation.decoding import decode_prompts, generation_config
from jaxformer.predict import classify
from jaxformer.train.config import load_config
from jaxformer.train.loop import Trainer

pytestmark = pytest.mark.hf

PROB_ATOL = 1e-5  # class probabilities, float32
LOGITS_RTOL = 1e-5  # max |ours - theirs| / max |theirs|, float32
TARGET = "the movie was very good"  # teacher-forced decoder text of the encoder-decoders


def _vocab(path: Path) -> int:
    """The size of the tokenizer transformers reads in ``path`` (the model's vocabulary)."""
    import transformers
    return len(transformers.AutoTokenizer.from_pretrained(path))


def _save(model, path: Path) -> str:
    model.eval().save_pretrained(path)
    return str(path)


def _bert(path: Path) -> str:
    """A ``BertModel`` (pooler included) over an uncased ``vocab.txt`` (BertTokenizer's)."""
    import torch
    import transformers
    build_wordpiece(path, legacy=True)
    _write_class(path, "BertTokenizer")
    torch.manual_seed(0)
    return _save(transformers.BertModel(transformers.BertConfig(
        vocab_size=_vocab(path), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128)), path)


def _distilbert(path: Path) -> str:
    """The DistilBERT worked example's checkpoint with a ``vocab.txt`` only (issue 60's case)."""
    golden_copy("distilbert_wp400", path)
    return build_wordpiece(path, legacy=True)


def _roberta(path: Path) -> str:
    golden_copy("roberta_bpe400", path)
    return build_byte_level_bpe(path, legacy=True)


def _albert(path: Path) -> str:
    """An ``AlbertModel`` (factorised embedding, one shared layer, pooler) over ALBERT's
    ``spiece.model`` (lowercased, accents stripped by AlbertTokenizer)."""
    import torch
    import transformers
    _albert_spiece(path)
    torch.manual_seed(1)
    return _save(transformers.AlbertModel(transformers.AlbertConfig(
        vocab_size=_vocab(path), embedding_size=16, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=128)), path)


def _gpt2(path: Path) -> str:
    """A ``GPT2LMHeadModel`` over GPT-2's layout: byte-level BPE, ``<|endoftext|>`` its only special
    token (BOS, EOS and UNK), saved by ``GPT2Tokenizer``."""
    import tokenizers
    import torch
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(ENCODER_CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.mkdir(parents=True)
    tok.model.save(str(path))
    transformers.GPT2Tokenizer(vocab=str(path / "vocab.json"),
                               merges=str(path / "merges.txt")).save_pretrained(path)
    torch.manual_seed(2)
    return _save(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=_vocab(path), n_positions=128, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0)), path)


def _bart(path: Path) -> str:
    """The BART worked example's checkpoint with ``vocab.json`` + ``merges.txt`` (issue 60's
    case), named BartTokenizer's."""
    golden_copy("bart_bpe400", path)
    build_byte_level_bpe(path, legacy=True)
    _write_class(path, "BartTokenizer")
    return str(path)


def _t5_family(cls_name: str, config_name: str):
    def build(path: Path) -> str:
        """A ``T5ForConditionalGeneration`` (v1.0) / ``MT5ForConditionalGeneration`` (v1.1:
        gated GELU, untied head) over a ``spiece.model`` (T5Tokenizer adds 100 sentinels)."""
        import torch
        import transformers
        _t5(path)
        torch.manual_seed(3)
        gated = cls_name.startswith("MT5")
        config = getattr(transformers, config_name)(
            vocab_size=_vocab(path), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=16,
            feed_forward_proj="gated-gelu" if gated else "relu", tie_word_embeddings=not gated,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        model = getattr(transformers, cls_name)(config)
        if gated:  # transformers 5 ties lm_head to `shared` regardless: give it its own weights
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight))
        return _save(model, path)
    return build


def _saved_by_transformers(build_tokenizer: Callable, model_type: str) -> Callable:
    """``build_tokenizer``'s files as a ``model_type`` checkpoint ships them: rewritten by
    ``AutoTokenizer(…).save_pretrained`` (Qwen2's tokenizer.json is its class's pipeline)."""
    def build(path: Path) -> str:
        import transformers
        build_tokenizer(path)
        (path / "config.json").write_text(json.dumps({"model_type": model_type}))
        transformers.AutoTokenizer.from_pretrained(path).save_pretrained(path)
        return str(path)
    return build


def _llama_family(cls_name: str, build_tokenizer: Callable, seed: int, **extra):
    def build(path: Path) -> str:
        """A ``{Llama,Mistral,Qwen2}ForCausalLM`` (GQA, untied head) over its tokenizer files."""
        import torch
        import transformers
        build_tokenizer(path)
        with open(path / "tokenizer_config.json") as f:
            tokens = json.load(f)
        ids = {k: transformers.AutoTokenizer.from_pretrained(path).convert_tokens_to_ids(
            tokens[k] if isinstance(tokens[k], str) else tokens[k]["content"])
            for k in ("bos_token", "eos_token") if k in tokens}
        torch.manual_seed(seed)
        config_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
        model = getattr(transformers, cls_name)(config_cls(
            vocab_size=_vocab(path), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            tie_word_embeddings=False, bos_token_id=ids.get("bos_token"),
            eos_token_id=ids.get("eos_token"), **extra))
        return _save(model, path)
    return build


CLASSIFY = ("hf_classify_finetune.py", "classify")
SEQ2SEQ = ("hf_seq2seq_finetune.py", "seq2seq")
SFT = ("llama_sft.py", "sft")
DECODER_RUN = {"model.dtype": "float32", "model.remat_policy": "none", "data.seq_len": 64,
               "eval.generate_max_new_tokens": 8, "optimizer.peak_lr": 1e-3}


@dataclasses.dataclass(frozen=True)
class Family:
    """A converter family: its checkpoint builder, the run (config file, data kind), config
    overrides, and the transformers Auto class its export loads with."""

    checkpoint: Callable[[Path], str]
    run: tuple[str, str]
    auto_class: str
    overrides: dict = dataclasses.field(default_factory=dict)


FAMILIES = {
    "bert": Family(_bert, CLASSIFY, "AutoModelForSequenceClassification"),
    "distilbert": Family(_distilbert, CLASSIFY, "AutoModelForSequenceClassification"),
    "roberta": Family(_roberta, CLASSIFY, "AutoModelForSequenceClassification"),
    "albert": Family(_albert, CLASSIFY, "AutoModelForSequenceClassification"),
    "gpt2": Family(_gpt2, ("gpt_pretrain_tiny.py", "text"), "AutoModelForCausalLM",
                   {"data.seq_len": 64, "eval.generate_max_new_tokens": 8,
                    "optimizer.peak_lr": 1e-3}),
    "bart": Family(_bart, SEQ2SEQ, "AutoModelForSeq2SeqLM", {"data.target_len": 12}),
    "t5": Family(_t5_family("T5ForConditionalGeneration", "T5Config"), SEQ2SEQ,
                 "AutoModelForSeq2SeqLM", {"data.target_len": 12, "optimizer.peak_lr": 1e-3}),
    "mt5": Family(_t5_family("MT5ForConditionalGeneration", "MT5Config"), SEQ2SEQ,
                  "AutoModelForSeq2SeqLM", {"data.target_len": 12, "optimizer.peak_lr": 1e-3}),
    "llama_lora": Family(_llama_family("LlamaForCausalLM", build_llama2_tokenizer, 4), SFT,
                         "AutoModelForCausalLM",
                         {**DECODER_RUN, "optimizer.lora.rank": 4, "optimizer.peak_lr": 1e-2}),
    "mistral": Family(_llama_family("MistralForCausalLM", _mistral, 5,
                                    sliding_window=16), SFT, "AutoModelForCausalLM", DECODER_RUN),
    "qwen2": Family(_llama_family("Qwen2ForCausalLM", _saved_by_transformers(
        build_llama3_tokenizer, "qwen2"), 6), SFT,
                    "AutoModelForCausalLM", {**DECODER_RUN, "data.framing": "eos"}),
}


def fine_tune(family: Family, hf_dir: str, tmp: Path) -> Path:
    """A few steps of ``family``'s run from ``hf_dir``; the workdir."""
    config_file, kind = family.run
    keys = {**TINY, "init_from": hf_dir, "data.seq_len": 64, **family.overrides}
    if kind == "classify":
        _write(tmp, _review)
        keys.update({"data.source": f"files:{tmp}/{{split}}.tsv", "data.label_names": LABELS,
                     "optimizer.peak_lr": 1e-3})
    elif kind == "seq2seq":
        _write(tmp, _pair)
        keys.update({"data.source": f"files:{tmp}/{{split}}.tsv", "eval.generate_examples": 0,
                     "eval.generate_max_new_tokens": 8})
    elif kind == "text":
        _write_text(tmp, seed=2, words=12)
        keys["data.source"] = f"files:{tmp}/text_{{split}}.txt"
    else:
        keys["data.source"] = _pairs(tmp / "pairs.jsonl")
    workdir = tmp / "run"
    trainer = Trainer(load_config(ROOT / "configs" / config_file, keys), workdir)
    trainer.run()
    trainer.lock.release()
    return workdir


def run_rows(loaded, texts: list[str]) -> list[list[int]]:
    """The ids the run feeds its model for each text: a classifier's pipeline rows (framed and
    cut to ``data.seq_len``), else the prompts ``predict`` / ``generate`` encode."""
    settings, tok = loaded.settings, loaded.tokenizer
    if loaded.model_cfg.head == "classify":
        data = dataclasses.replace(settings.data, batch_size=4, shuffle=False, worker_count=0)
        batches = make_dataset(data, "predict", tok, seed=0, objective=settings.objective.name,
                               options=settings.objective_options,
                               process_index=0, process_count=1, num_epochs=1,
                               source=[{"text": t, "label": 0} for t in texts], report=False)
        rows = [list(x[s > 0]) for b in batches
                for x, s in zip(b["inputs"], b["inputs_segment_ids"])]
        return [[int(i) for i in r] for r in rows[:len(texts)]]
    add_bos = example_framing(settings.data, settings.objective.name) == "bos_eos"
    return encode_prompts(tok, texts, loaded.model_cfg.family, add_bos=add_bos)


def _hf_ids(auto, text: str, loaded) -> list[int]:
    if loaded.model_cfg.head == "classify":
        return auto(text, truncation=True, max_length=loaded.config.data.seq_len)["input_ids"]
    return auto(text)["input_ids"]


def _classifier_predictions(loaded, model, rows, texts) -> dict:
    import torch
    ours = np.stack(list(classify(loaded.model, loaded.params, loaded.tokenizer,
                                  loaded.config.to_dict(), texts, batch_size=8)))
    with torch.no_grad():
        theirs = np.concatenate([torch.softmax(model(input_ids=torch.tensor([r])).logits, -1)
                                 .numpy() for r in rows])
    diff = float(np.max(np.abs(ours - theirs)))
    assert diff <= PROB_ATOL, diff
    assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))
    return {"compared": "class probabilities (predict)", "max_abs_diff": diff}


def _generator_predictions(loaded, model, rows) -> dict:
    """Logits (teacher-forced `TARGET` for encoder-decoders) and greedy tokens of each row."""
    import torch
    cfg, tok = loaded.model_cfg, loaded.tokenizer
    gen = generation_config(loaded.settings, tok)
    room = cfg.max_len - gen.max_new_tokens if cfg.position == "learned" else None
    rows = [r for r in rows if room is None or len(r) <= room]  # the prompts the table fits
    assert len(rows) >= 10
    worst, greedy_equal = 0.0, 0
    start = [gen.decoder_start_id] + tok.encode(TARGET)
    for r in rows:
        if cfg.family == "encoder_decoder":
            ours = loaded.model.apply(loaded.params, jnp.asarray([r]),
                                      jnp.asarray([start]))
            with torch.no_grad():
                theirs = model(input_ids=torch.tensor([r]),
                               decoder_input_ids=torch.tensor([start])).logits.numpy()
        else:
            ours = loaded.model.apply(loaded.params, jnp.asarray([r]))
            with torch.no_grad():
                theirs = model(input_ids=torch.tensor([r])).logits.numpy()
        ours = np.asarray(ours)[..., :theirs.shape[-1]]
        worst = max(worst, float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs))))
    assert worst <= LOGITS_RTOL, worst
    ours = decode_prompts(loaded.model, loaded.params, rows, gen, batch_size=8)
    for r, want in zip(rows, ours):
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([r]), do_sample=False, num_beams=1,
                max_new_tokens=gen.max_new_tokens, eos_token_id=gen.eos_id,
                pad_token_id=gen.pad_id, forced_eos_token_id=None, forced_bos_token_id=None,
                no_repeat_ngram_size=0, repetition_penalty=1.0)[0].tolist()
        out = out[1:] if cfg.family == "encoder_decoder" else out[len(r):]
        out = out[:out.index(gen.eos_id)] if gen.eos_id in out else out
        assert out == want, (r, out, want)
        greedy_equal += 1
    return {"compared": "logits, greedy tokens (evaluate's decoding)", "max_rel_diff": worst,
            "greedy_equal": f"{greedy_equal}/{len(rows)}"}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_export_gives_the_runs_ids_and_predictions(name, tmp_path):
    import transformers
    family = FAMILIES[name]
    hf_dir = family.checkpoint(tmp_path / "hf")
    workdir = fine_tune(family, hf_dir, tmp_path)
    export = tmp_path / "export"
    assert convert_main(["--from", str(workdir), "--to-hf", str(export)]) == 0
    loaded = load_run(workdir)
    tok = loaded.tokenizer
    # one checkpoint, one tokenization: the run's tokenizer is AutoTokenizer's on the checkpoint
    source = transformers.AutoTokenizer.from_pretrained(hf_dir)
    for text in HARD:
        assert tok.encode(text) == source(text, add_special_tokens=False)["input_ids"], repr(text)
    # the export's tokenizer gives the rows the run feeds its model
    auto = transformers.AutoTokenizer.from_pretrained(export)
    texts = list(HARD)
    if (tmp_path / "test.tsv").exists():  # and the test split's first texts
        texts += [line.split("\t")[0] for line in
                  (tmp_path / "test.tsv").read_text().splitlines()[1:9]]
    rows = run_rows(loaded, texts)
    for text, row in zip(texts, rows):
        assert _hf_ids(auto, text, loaded) == row, repr(text)
    # … and AutoModel… on them predicts as the run does
    model = getattr(transformers, family.auto_class).from_pretrained(
        export, attn_implementation="eager").eval()
    config = json.loads((export / "config.json").read_text())
    assert config["model_type"] == json.loads((Path(hf_dir) / "config.json").read_text())[
        "model_type"]  # an mT5 stays one, a Mistral keeps its window
    assert all(v != -1 for k, v in config.items() if k.endswith("token_id"))
    if loaded.model_cfg.head == "classify":
        assert model.config.id2label == dict(enumerate(LABELS))
        result = _classifier_predictions(loaded, model, rows, texts)
    else:
        result = _generator_predictions(loaded, model, rows)
    print(f"\nHF-EXPORT {name}: " + json.dumps({
        "model_type": config["model_type"], "architecture": config["architectures"][0],
        "texts": len(texts), "tokenizer_ids_equal": True, **result}))
