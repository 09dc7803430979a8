"""Encoder-decoder demo: BART-style denoising on English+Spanish verses (no pairs), then KJV →
Reina-Valera translation with few pairs from the pretrained checkpoint and from random init (same
tokenizer, pairs, steps; each init's own learning rate; several seeds); greedy test BLEU and chrF
(sacrebleu). The decoding helpers here also serve `demo.t5_budget`.

Verse-length limit: translation pairs are kept when both sides fit in
``DemoSettings.t5_max_tokens`` tokens (EOS included) — dropped, not truncated, so no target is cut
mid-verse and every EOS the model learns ends a real verse; the kept pairs are packed into the
config's rows. The same limit selects the test verses; the report states how many of the test
split that is.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from demo.compare import compare_inits
from demo.configs import Overrides, pretrain_config, regime_config, scale_budget
from demo.output import banner, write_jsonl
from demo.runs import best_step, checkpoint_params, count_params, saved_steps, train_run
from demo.settings import DemoSettings
from demo.stats import fmt
from jaxformer.data.builders.base import SPLITS
from jaxformer.data.containers import read_records
from jaxformer.data.sources import SourceSettings, get_source
from jaxformer.decode import GenerationConfig, generate_padded
from jaxformer.evaluation import sequence_scores
from jaxformer.settings import read


def write_translation_split(directory: Path, tokenizer, max_source: int, max_target: int
                            ) -> tuple[dict, dict]:
    """``<directory>/{split}.jsonl``: the pairs of ``bible_en_es`` whose source / target fit in
    ``max_source`` / ``max_target`` tokens with EOS. Returns (data-config keys, counts)."""
    counts = {}
    for split in SPLITS:
        src = get_source(SourceSettings(source="bible_en_es"), split)
        kept = [r for r in read_records(src)
                if len(tokenizer.encode(r["source"])) < max_source
                and len(tokenizer.encode(r["target"])) < max_target]
        write_jsonl(directory / f"{split}.jsonl",
                    ({"source": r["source"], "target": r["target"], "id": r["id"]} for r in kept))
        counts[split] = {"kept": len(kept), "total": len(src)}
    keys = {"data.source": f"files:{directory}/{{split}}.jsonl", "data.format": "jsonl",
            "data.source_key": "source", "data.target_key": "target"}
    return keys, counts


def write_pair_subset(pairs: Path, directory: Path, size: int) -> dict:
    """``<directory>/{split}.jsonl``: the first ``size`` training pairs of ``<pairs>/train.jsonl``
    in sha256(id) order (spread over the whole Bible), every validation / test pair. Returns the
    data-config keys that read them (written once: the content depends on ``size`` only)."""
    for split in SPLITS if not (directory / "test.jsonl").exists() else ():
        lines = (pairs / f"{split}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        if split == "train":
            records = sorted(records, key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
            records = records[:size]
        write_jsonl(directory / f"{split}.jsonl", records)
    return {"data.source": f"files:{directory}/{{split}}.jsonl", "data.format": "jsonl",
            "data.source_key": "source", "data.target_key": "target"}


def spread(records, n: int) -> list:
    """``n`` records evenly spaced over ``records`` (all of them when ``n`` <= 0 or >= len)."""
    n = len(records) if n <= 0 else min(n, len(records))
    return [records[i * len(records) // n] for i in range(n)]


def translate(model, params, tokenizer, sources: list[str], *, max_source: int,
              max_new_tokens: int, beam_size: int, batch: int, decoder_start_id: int = 0,
              length_penalty: float = 0.6, no_repeat_ngram_size: int = 0) -> list[str]:
    """Translate ``sources`` in fixed-shape batches (one compilation): `[batch, max_source]`
    right-padded inputs ending with EOS, beam search with GNMT length penalty ``length_penalty``
    (greedy when ``beam_size`` is 1), optionally never repeating an n-gram."""
    special = tokenizer.special
    cfg = GenerationConfig(strategy="beam" if beam_size > 1 else "greedy",
                           max_new_tokens=max_new_tokens, beam_size=beam_size,
                           eos_id=special.eos_id, pad_id=special.pad_id,
                           decoder_start_id=decoder_start_id, length_penalty=length_penalty,
                           no_repeat_ngram_size=no_repeat_ngram_size)
    out = []
    for start in tqdm(range(0, len(sources), batch), desc=f"translate (beam {beam_size})",
                      unit="batch"):
        chunk = sources[start:start + batch]
        inputs = np.full((batch, max_source), special.pad_id, np.int32)
        lengths = np.ones(batch, np.int32)
        inputs[:, 0] = special.eos_id  # filler rows: an empty source
        for i, text in enumerate(chunk):
            ids = (tokenizer.encode(text) + [special.eos_id])[-max_source:]
            inputs[i, :len(ids)], lengths[i] = ids, len(ids)
        result = generate_padded(model, params, inputs, lengths, cfg)
        out += [tokenizer.decode(s) for s in result.sequences(special.eos_id)[:len(chunk)]]
    return out


def bleu(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF (`jaxformer.evaluation.sequence_scores`: sacrebleu defaults, 13a
    tokenization, exponential smoothing), rounded for the report."""
    s = sequence_scores(hypotheses, references)
    return {"bleu": round(s["bleu"], 2), "chrf": round(s["chrf"], 2),
            "length_ratio": round(s["length_ratio"], 3),
            "bleu_signature": s["bleu_signature"], "bleu_detail": s["bleu_detail"]}


def choose_decoding(model, params, tokenizer, pairs: list[dict], *, max_len: int, batch: int,
                    decoder_start_id: int, beam_size: int, length_penalties: tuple[float, ...],
                    no_repeat_ngrams: tuple[int, ...] = (0,)) -> dict:
    """Pick the decoding by validation BLEU: greedy, and beam search of width ``beam_size`` with
    each GNMT length penalty (Wu et al. 2016), each with every no-repeat n-gram size (0 = off). A
    weak model's beam search tends to end verses early (brevity penalty) or, with a strong length
    reward, to loop ("y á Moisés y á Moisés …"), which n-gram blocking stops. Returns the best
    ``{"beam_size", "length_penalty", "no_repeat_ngram_size", "validation_bleu"}`` and, under
    ``"tried"``, every candidate's validation BLEU and length ratio."""
    searches = [(1, 0.0)] + ([(beam_size, a) for a in length_penalties] if beam_size > 1 else [])
    tried = []
    for (width, alpha), ngram in ((s, g) for s in searches for g in no_repeat_ngrams):
        hyps = translate(model, params, tokenizer, [p["source"] for p in pairs],
                         max_source=max_len, max_new_tokens=max_len, beam_size=width, batch=batch,
                         decoder_start_id=decoder_start_id, length_penalty=alpha,
                         no_repeat_ngram_size=ngram)
        score = bleu(hyps, [p["target"] for p in pairs])
        tried.append({"beam_size": width, "length_penalty": alpha, "no_repeat_ngram_size": ngram,
                      "validation_bleu": score["bleu"], "length_ratio": score["length_ratio"]})
    best = max(tried, key=lambda t: t["validation_bleu"])  # the first (simplest) on ties
    shown = ", ".join(f"{describe_decoding(t)}: {t['validation_bleu']:.2f}" for t in tried)
    print(f"  decoding on {len(pairs)} validation verses: {shown}", flush=True)
    keys = ("beam_size", "length_penalty", "no_repeat_ngram_size", "validation_bleu")
    return {**{k: best[k] for k in keys}, "validation_verses": len(pairs), "tried": tried}


def decode_test(model, params, tokenizer, select: list[dict], test: list[dict], *, max_len: int,
                batch: int, decoder_start_id: int, beam_size: int,
                length_penalties: tuple[float, ...], no_repeat_ngrams: tuple[int, ...]
                ) -> tuple[dict, list[str], dict, float]:
    """`choose_decoding` on ``select`` (validation pairs), then translate ``test`` with the winner.
    Returns (decoding, hypotheses, `bleu` scores on ``test``, decoding seconds)."""
    decoding = choose_decoding(model, params, tokenizer, select, max_len=max_len, batch=batch,
                               decoder_start_id=decoder_start_id, beam_size=beam_size,
                               length_penalties=length_penalties,
                               no_repeat_ngrams=no_repeat_ngrams)
    t0 = time.perf_counter()
    hyps = translate(model, params, tokenizer, [p["source"] for p in test], max_source=max_len,
                     max_new_tokens=max_len, beam_size=decoding["beam_size"], batch=batch,
                     decoder_start_id=decoder_start_id, length_penalty=decoding["length_penalty"],
                     no_repeat_ngram_size=decoding["no_repeat_ngram_size"])
    seconds = time.perf_counter() - t0
    return decoding, hyps, bleu(hyps, [p["target"] for p in test]), seconds


def describe_decoding(d: dict) -> str:
    """"greedy", "beam 4, length penalty 0.6", "…, no repeated 3-grams"."""
    text = ("greedy" if d["beam_size"] == 1
            else f"beam {d['beam_size']}, length penalty {d['length_penalty']}")
    ngram = d.get("no_repeat_ngram_size", 0)
    return text + (f", no repeated {ngram}-grams" if ngram else "")


def bleu_curve(trainer, run, tokenizer, pairs: list[dict], max_len: int, config,
               batch: int) -> list[dict]:
    """Greedy test BLEU of every kept checkpoint of a fine-tuning run: BLEU against training
    steps, tokens and minutes (minutes pro rata of the run's wall time), with the validation loss
    logged at that step."""
    evals = {r["step"]: r["eval_loss"] for r in run.rows if "eval_loss" in r}
    out = []
    for step in saved_steps(run.workdir):
        hyps = translate(trainer.model, checkpoint_params(run.workdir, step), tokenizer,
                         [p["source"] for p in pairs], max_source=max_len, max_new_tokens=max_len,
                         beam_size=1, batch=batch,
                         decoder_start_id=int(config.objective.decoder_start_id))
        frac = step / max(run.steps, 1)
        out.append({"step": step, "tokens": int(run.tokens * frac),
                    "minutes": round(run.seconds * frac / 60, 2), "verses": len(pairs),
                    "validation_loss": evals.get(step),
                    "bleu_greedy": bleu(hyps, [p["target"] for p in pairs])["bleu"]})
    shown = ", ".join(f"{r['step']}: {r['bleu_greedy']:.2f}" for r in out)
    print(f"  greedy BLEU by step: {shown}", flush=True)
    return out


def run_t5(workdir: Path, settings: DemoSettings, overrides: Overrides | None = None) -> dict:
    workdir = Path(workdir) / "t5"
    banner("T5 1/2: denoising pretraining on English + Spanish verses (no pairs)")
    config = pretrain_config("t5", "t5_denoise_tiny", settings, overrides)
    trainer, pre = train_run("t5_pretrain", config, workdir / "pretrain")
    tokenizer = trainer.tokenizer
    max_len = settings.t5_max_tokens
    _, counts = write_translation_split(workdir / "pairs", tokenizer, max_len, max_len)
    print(f"  verse-length limit {max_len}/{max_len} tokens keeps "
          + ", ".join(f"{k} {v['kept']:,}/{v['total']:,}" for k, v in counts.items()), flush=True)
    pairs = {"source": f"files:{workdir / 'pairs'}/{{split}}.jsonl", "format": "jsonl",
             "source_key": "source", "target_key": "target"}
    test = spread(get_source(read(SourceSettings, pairs), "test"),
                  settings.t5_test_verses)  # over the whole Bible
    tok = {"data.tokenizer.path": str(workdir / "pretrain" / "tokenizer.model")}
    total = counts["train"]["kept"]

    def make_config(size, init_from, lr, seed):
        data = write_pair_subset(workdir / "pairs", workdir / f"pairs_{size}", size)
        c = regime_config("t5_finetune_tiny", overrides, init_from=init_from, seed=seed, **tok,
                          **data, **{"num_train_steps": settings.steps("t5", size),
                                     "optimizer.peak_lr": lr, "optimizer.end_lr": lr / 10,
                                     # greedy BLEU of the validation verses at every evaluation:
                                     # the kept checkpoint is the best by BLEU, not by loss
                                     "eval.generate_examples": settings.t5_select_verses,
                                     "eval.generate_max_new_tokens": max_len,
                                     "checkpoint.best_metric": "eval_bleu",
                                     "checkpoint.best_mode": "max"})
        scale_budget(c, settings.budget_scale, evals=settings.evals)
        return c

    def measure(ft, run):
        """Validation BLEU (greedy, logged at every evaluation) of the best checkpoint by it, and
        its greedy BLEU on the test verses. (Validation *loss* picks too early a checkpoint: a
        pretrained model's loss is lowest after a few epochs while its BLEU still rises.)"""
        step = best_step(run.rows, "eval_bleu", "max", saved_steps(run.workdir))
        params = checkpoint_params(run.workdir, step)
        hyps = translate(ft.model, params, tokenizer, [p["source"] for p in test],
                         max_source=max_len, max_new_tokens=max_len, beam_size=1,
                         batch=settings.decode_batch,
                         decoder_start_id=int(ft.config.objective.decoder_start_id))
        scores = bleu(hyps, [p["target"] for p in test])
        val = next(r for r in run.rows if r["step"] == step)
        return {"best_step": step, "validation": val["eval_bleu"], "test": scores["bleu"],
                "validation_chrf": val["eval_chrf"], "test_chrf": scores["chrf"],
                "samples": hyps[:settings.show_verses],
                "bleu_signature": scores["bleu_signature"]}

    sizes = tuple(n if 0 < n < total else total for n in settings.t5_sizes)
    rows = compare_inits("t5", "translation pairs", workdir, settings, sizes=sizes,
                         make_config=make_config, measure=measure, higher_is_better=True)
    for r in rows:
        t = r["test"]
        print(f"  {r['size']:,} pairs: greedy test BLEU pretrained {fmt(t['pretrained'], 1, 2)}, "
              f"scratch {fmt(t['scratch'], 1, 2)}", flush=True)
    last = rows[-1]["inits"]
    samples = [{"id": r["id"], "source": r["source"], "reference": r["target"],
                **{init: last[init]["runs"][0]["samples"][i] for init in last}}
               for i, r in enumerate(test[:settings.show_verses])]
    return {
        "pretrain": {**pre.summary(), "model_params": count_params(trainer.state.params),
                     "vocab_size": tokenizer.vocab_size, "corpus": config.data.source},
        "length_limit": {"source_tokens": max_len, "target_tokens": max_len, **counts},
        "test_verses": len(test), "validation_verses": settings.t5_select_verses, "regimes": rows,
        "samples": samples, "curves": {"pretrain": pre.rows},
    }
