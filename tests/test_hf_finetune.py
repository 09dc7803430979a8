"""The worked examples of docs/huggingface.md on tiny random local checkpoints (golden files made
by the ``build_*`` functions below, `tests/make_golden.py`, with their own tokenizer built here,
nothing downloaded): a RoBERTa classifier fine-tuned on a TSV and a BART fine-tuned for seq2seq,
each scored with ``jaxformer.cli.evaluate`` and exported with ``--to-hf``; the ``hf`` tests run the
export in transformers (PyTorch) on the same examples.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import jax
import numpy as np
import pytest
from golden import golden_copy
from test_fast_tokenizer import build_byte_level_bpe

from jaxformer.checkpoint import read_metrics
from jaxformer.cli.convert import main as convert_main
from jaxformer.convert import load_hf
from jaxformer.data.fast_tokenizer import FastTokenizer
from jaxformer.data.sources import SourceSettings, get_source
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.evaluate_run import evaluate_run, load_run
from jaxformer.evaluation import sequence_scores
from jaxformer.evaluation.decoding import decode_prompts, decoding_examples, generation_config
from jaxformer.settings import read
from jaxformer.train.config import load_config
from jaxformer.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 400  # the tokenizer's (build_byte_level_bpe)
WORDS = "good great fine bad awful poor the a movie film plot was very and but not".split()
LABELS = ("neg", "pos")
TINY = {"num_train_steps": 6, "data.seq_len": 24, "data.batch_size": 8, "eval.every_steps": 6,
        "eval.num_batches": 2, "checkpoint.every_steps": 6, "checkpoint.async_save": False,
        "progress_bar": False, "log_every_steps": 3, "optimizer.warmup_steps": 2}


def build_roberta():
    """RobertaForMaskedLM (2 layers, width 32) over `build_byte_level_bpe`'s vocabulary."""
    import torch
    import transformers
    torch.manual_seed(7)
    return transformers.RobertaForMaskedLM(transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=66, type_vocab_size=1)).eval()


def build_bart():
    """BartForConditionalGeneration (2 + 2 layers, width 32) over the same vocabulary; init_std
    0.3 so that greedy search does not end at once (see test_convert_roberta_distilbert_bart)."""
    import torch
    import transformers
    torch.manual_seed(8)
    return transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, init_std=0.3)).eval()


def build_distilbert():
    """DistilBertForMaskedLM (1 layer, width 32) over `build_wordpiece`'s vocabulary."""
    import torch
    import transformers
    torch.manual_seed(9)
    return transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=1, n_heads=4, hidden_dim=64,
        max_position_embeddings=32)).eval()


def checkpoint(name: str, path: Path, tokenizer=build_byte_level_bpe) -> str:
    """The golden checkpoint ``name`` (one of the builders above, `tests/make_golden.py`) at
    ``path``, with the tokenizer files ``tokenizer`` writes (transformers, no torch)."""
    golden_copy(name, path)
    return tokenizer(path)


def _write(directory: Path, row) -> None:
    rng = random.Random(0)
    for split, n in (("train", 80), ("validation", 16), ("test", 24)):
        lines = [row(rng, header=True)] + [row(rng) for _ in range(n)]
        (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n")


def _write_text(directory: Path, seed: int, words: int) -> None:
    """Raw text (40 lines of ``words`` words) for ``text_{train,validation}.txt``."""
    rng = random.Random(seed)
    for split in ("train", "validation"):
        (directory / f"text_{split}.txt").write_text("\n".join(
            " ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(40)) + "\n")


def _review(rng, header=False) -> str:
    if header:
        return "text\tlabel"
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
    score = sum(w in ("good", "great", "fine") for w in words) - sum(
        w in ("bad", "awful", "poor") for w in words)
    return f"{' '.join(words)}\t{LABELS[int(score > 0)]}"


def _pair(rng, header=False) -> str:
    if header:
        return "source\ttarget"
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
    return f"{' '.join(words)}\t{' '.join(reversed(words))}"


@pytest.fixture(scope="module")
def roberta_classifier(tmp_path_factory):
    """The RoBERTa worked example: fine-tuned on a TSV (resumed once), evaluated on the test split,
    exported with ``--to-hf``: (tmp dir, loaded run, evaluation metrics)."""
    tmp = tmp_path_factory.mktemp("roberta_classifier")
    hf_dir = checkpoint("roberta_bpe400", tmp / "roberta")
    _write(tmp, _review)
    run = tmp / "run"
    config = load_config(ROOT / "configs" / "hf_classify_finetune.py", {
        **TINY, "init_from": hf_dir, "data.source": f"files:{tmp}/{{split}}.tsv",
        "data.label_names": LABELS, "optimizer.peak_lr": 1e-3})
    Trainer(config, run).run()
    with config.unlocked():  # a resume reads the run's stored tokenizer (checksummed)
        config.num_train_steps = 8
    resumed = Trainer(config, run)
    assert resumed.start_step == 6 and isinstance(resumed.tokenizer, FastTokenizer)
    resumed.run()
    results = evaluate_run(run, split="test", progress=False)["metrics"]
    assert convert_main(["--from", str(run), "--to-hf", str(tmp / "export")]) == 0
    return tmp, load_run(run), results


def test_roberta_classifier_fine_tuned_on_a_tsv(roberta_classifier):
    tmp, loaded, results = roberta_classifier
    assert isinstance(loaded.tokenizer, FastTokenizer)  # the checkpoint's, stored with the run
    assert (loaded.model_cfg.position_offset, loaded.model_cfg.pooler_activation) == (2, "tanh")
    examples = list(get_source(read(SourceSettings, loaded.config.data), "test"))
    assert results["examples"] == len(examples) and 0 <= results["accuracy"] <= 1
    # The export: AutoTokenizer (transformers without torch) gives the run's ids, framed <s> … </s>
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(tmp / "export")
    s = loaded.tokenizer.special
    for e in examples[:4]:
        assert tok(e["text"])["input_ids"] == [s.cls_id, *loaded.tokenizer.encode(e["text"]),
                                               s.sep_id]
    cfg, params, _ = load_hf(tmp / "export")  # and its weights are the run's
    assert (cfg["head"], cfg["num_classes"], cfg["position_offset"]) == ("classify", 2, 2)
    jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(loaded.params))


@pytest.mark.hf
def test_roberta_classifiers_export_scores_the_test_split_as_evaluate(roberta_classifier):
    """The export, read by transformers (PyTorch), classifies the test split as the evaluation
    scored it."""
    import torch
    import transformers
    tmp, loaded, results = roberta_classifier
    tok = transformers.AutoTokenizer.from_pretrained(tmp / "export")
    model = transformers.RobertaForSequenceClassification.from_pretrained(
        tmp / "export", attn_implementation="eager").eval()
    examples = list(get_source(read(SourceSettings, loaded.config.data), "test"))
    enc = tok([e["text"] for e in examples], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits.numpy().astype(np.float64)
    labels = np.array([e["label"] for e in examples])
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert results["examples"] == len(examples)
    assert results["accuracy"] == pytest.approx(np.mean(logits.argmax(-1) == labels))
    assert results["loss"] == pytest.approx(-log_probs[np.arange(len(labels)), labels].mean(),
                                            rel=1e-4)


@pytest.fixture(scope="module")
def bart_seq2seq(tmp_path_factory):
    """The BART worked example: import → denoise → fine-tune on pairs → evaluate → ``--to-hf``:
    (tmp dir, loaded run, generation scores, decoding examples, their config, our decodings)."""
    tmp = tmp_path_factory.mktemp("bart_seq2seq")
    hf_dir = checkpoint("bart_bpe400", tmp / "bart")
    _write(tmp, _pair)
    # BART's own pretraining objective on raw text first: import → denoise → fine-tune
    _write_text(tmp, seed=1, words=8)
    denoised = tmp / "denoised"
    Trainer(load_config(ROOT / "configs" / "hf_seq2seq_finetune.py", {
        **TINY, "init_from": hf_dir, "objective.name": "denoise", "data.source_key": None,
        "data.target_key": None, "data.source": f"files:{tmp}/text_{{split}}.txt",
        "data.target_len": 24, "eval.generate_examples": 0, "checkpoint.best_metric": "eval_loss",
        "checkpoint.best_mode": "min"}), denoised).run()
    assert load_run(denoised).config.objective.decoder_start_id == 2  # BART's
    run = tmp / "run"
    config = load_config(ROOT / "configs" / "hf_seq2seq_finetune.py", {
        **TINY, "init_from": str(denoised), "data.source": f"files:{tmp}/{{split}}.tsv",
        "data.target_len": 12, "eval.generate_examples": 8, "eval.generate_max_new_tokens": 8,
        "optimizer.peak_lr": 1e-4})
    Trainer(config, run).run()
    loaded = load_run(run)
    results = evaluate_run(run, split="test", progress=False)["generation"]
    examples = decoding_examples(loaded.settings, loaded.tokenizer, "test")
    gen = generation_config(loaded.settings, loaded.tokenizer)
    ours = decode_prompts(loaded.model, loaded.params, [e.prompt for e in examples], gen,
                          batch_size=8)
    assert convert_main(["--from", str(run), "--to-hf", str(tmp / "export")]) == 0
    return tmp, loaded, results, examples, gen, ours


def test_bart_denoised_fine_tuned_for_seq2seq_and_evaluated(bart_seq2seq):
    tmp, loaded, results, examples, _, ours = bart_seq2seq
    assert loaded.config.objective.decoder_start_id == 2  # from the denoising run
    assert any(ours)
    # evaluate's scores are those of these decodings
    scores = sequence_scores([loaded.tokenizer.decode(s) for s in ours],
                             [e.reference for e in examples])
    assert results["examples"] == len(examples)
    assert (results["bleu"], results["chrf"]) == pytest.approx((scores["bleu"], scores["chrf"]))
    # the export carries BART's decoder start and the run's weights
    cfg, params, _ = load_hf(tmp / "export")
    assert json.loads((tmp / "export" / "config.json").read_text())["decoder_start_token_id"] == 2
    jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(loaded.params))


@pytest.mark.hf
def test_bart_exports_greedy_search_gives_the_same_tokens(bart_seq2seq):
    """The export's greedy search in transformers (PyTorch), on the same source ids, gives the same
    tokens as jaxformer's decoding."""
    import torch
    import transformers
    tmp, loaded, results, examples, gen, ours = bart_seq2seq
    model = transformers.BartForConditionalGeneration.from_pretrained(
        tmp / "export", attn_implementation="eager").eval()
    theirs = []
    for e in examples:
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([e.prompt]), do_sample=False,
                                 num_beams=1, max_new_tokens=gen.max_new_tokens,
                                 forced_eos_token_id=None, no_repeat_ngram_size=0)[0, 1:]
        ids = out.tolist()
        theirs.append(ids[:ids.index(2)] if 2 in ids else ids)
    assert theirs == ours


def test_the_classify_config_keeps_distilberts_pre_classifier(tmp_path):
    """The classification config on a DistilBERT checkpoint: the pooler is its pre_classifier
    (ReLU), so the run exports as DistilBertForSequenceClassification."""
    from test_fast_tokenizer import build_wordpiece

    from jaxformer.convert.hf import export_converter, hf_distilbert
    from jaxformer.train.setup import resolve_config

    hf_dir = checkpoint("distilbert_wp400", tmp_path / "distilbert", build_wordpiece)
    _write(tmp_path, _review)
    resolved = resolve_config(load_config(ROOT / "configs" / "hf_classify_finetune.py", {
        **TINY, "init_from": hf_dir, "data.source": f"files:{tmp_path}/{{split}}.tsv",
        "data.label_names": LABELS}))
    cfg = resolved.model_cfg
    assert Tokenizer.load(resolved.config.data.tokenizer.path).encode("the movie") == \
        FastTokenizer.from_directory(hf_dir).encode("the movie")  # its WordPiece vocabulary
    assert (cfg.head, cfg.pooler, cfg.pooler_activation, cfg.type_vocab_size, cfg.num_classes) == (
        "classify", True, "relu", 0, 2)
    assert export_converter(cfg) is hf_distilbert
    assert hf_distilbert.config_to_hf(cfg)[0]["architectures"] == [
        "DistilBertForSequenceClassification"]


@pytest.fixture(scope="module")
def roberta_mlm(tmp_path_factory):
    """More masked-LM pretraining of a RoBERTa on raw text with whole-word masking (the
    tokenizer's ``Ġ`` word starts) and its ``<mask>``, exported: (tmp dir, loaded run)."""
    tmp = tmp_path_factory.mktemp("roberta_mlm")
    hf_dir = checkpoint("roberta_bpe400", tmp / "roberta")
    _write_text(tmp, seed=3, words=10)
    run = tmp / "run"
    Trainer(load_config(ROOT / "configs" / "bert_pretrain_tiny.py", {
        **TINY, "init_from": hf_dir, "data.source": f"files:{tmp}/text_{{split}}.txt",
        "objective.whole_word_mask": True, "objective.mask_rate": 0.15,
        # no evaluation: nothing here reads it, and an MLM run's eval through the Trainer is
        # tests/test_train.py's (test_pretraining_lowers_loss_and_checkpoints[bert])
        "eval.num_batches": 0}), run).run()
    assert convert_main(["--from", str(run), "--to-hf", str(tmp / "export")]) == 0
    return tmp, load_run(run)


def _mlm_ids(tmp) -> np.ndarray:
    """AutoTokenizer's framed ids of a sentence with ``<mask>`` (transformers without torch)."""
    import transformers
    return np.asarray(transformers.AutoTokenizer.from_pretrained(tmp / "export")(
        "the movie was very good <mask> fine")["input_ids"], np.int32)[None]


def test_roberta_mlm_continued_with_whole_word_masking_exports_its_weights(roberta_mlm):
    """The Trainer hands whole-word masking its tokenizer's word starts and trains every step
    (tests/test_train.py leaves whole-word masking through the Trainer to this run)."""
    tmp, loaded = roberta_mlm
    losses = {r["step"]: r["loss"] for r in read_metrics(tmp / "run") if "loss" in r}
    assert max(losses) == TINY["num_train_steps"] and all(np.isfinite(v) for v in losses.values())
    assert loaded.tokenizer.special.mask_id == loaded.tokenizer.encode("<mask>")[0] == 4
    assert loaded.tokenizer.special.mask_id in _mlm_ids(tmp)
    cfg, params, _ = load_hf(tmp / "export")
    jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(loaded.params))


@pytest.mark.hf
def test_roberta_mlms_export_computes_the_runs_logits(roberta_mlm):
    import torch
    import transformers
    tmp, loaded = roberta_mlm
    model = transformers.RobertaForMaskedLM.from_pretrained(
        tmp / "export", attn_implementation="eager").eval()
    ids = _mlm_ids(tmp)
    with torch.no_grad():
        want = model(input_ids=torch.tensor(ids).long()).logits.numpy()
    got = np.asarray(loaded.model.apply(loaded.params, ids))
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= 1e-5


def test_a_row_longer_than_the_checkpoints_position_table_takes_its_length(tmp_path, capsys):
    """Issue 60: configs/hf_classify_finetune.py's ``data.seq_len=128`` exceeded a small RoBERTa's
    64 positions and was refused with "raise model.max_len", which a pretrained table cannot.
    The length is the checkpoint's, said in one line (``run_glue.py``'s min(max_seq_length,
    model_max_length)); a shorter one is kept. BART: the targets' length too."""
    from jaxformer.train.setup import resolve_config

    roberta = checkpoint("roberta_bpe400", tmp_path / "roberta")
    bart = checkpoint("bart_bpe400", tmp_path / "bart")
    source = {"data.source": f"files:{tmp_path}/{{split}}.tsv"}
    resolved = resolve_config(load_config(ROOT / "configs" / "hf_classify_finetune.py", {
        "init_from": roberta, **source, "data.label_names": LABELS}))
    assert (resolved.model_cfg.max_len, resolved.config.data.seq_len) == (64, 64)
    assert f"data.seq_len=128 is longer than init_from={roberta}'s position table: data.seq_len=64, " \
           "the checkpoint's" in capsys.readouterr().out
    resolved = resolve_config(load_config(ROOT / "configs" / "hf_classify_finetune.py", {
        "init_from": roberta, **source, "data.label_names": LABELS, "data.seq_len": 40}))
    assert resolved.config.data.seq_len == 40
    resolved = resolve_config(load_config(ROOT / "configs" / "hf_seq2seq_finetune.py", {
        "init_from": bart, **source}))
    assert (resolved.config.data.seq_len, resolved.config.data.target_len) == (64, 64)
