"""Encoder-decoder demo: span corruption on English+Spanish verses, then KJV → Reina-Valera
translation fine-tuning from the pretrained checkpoint and from random init (same tokenizer,
hyper-parameters and budget); test BLEU and chrF (sacrebleu) of beam-search translations.

Verse-length limit: translation pairs are kept when both sides fit in
``DemoSettings.t5_max_tokens`` tokens (EOS included) — dropped, not truncated, so no target is cut
mid-verse and every EOS the model learns ends a real verse; the kept pairs are packed into the
config's rows. The same limit selects the test verses; the report states how many of the test
split that is.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from demo.common import (
    DemoSettings,
    Overrides,
    banner,
    checkpoint_params,
    count_params,
    load_config,
    saved_steps,
    scale_budget,
    train_run,
    write_jsonl,
)
from jaxformer.data.builders.base import SPLITS
from jaxformer.data.sources import get_source
from jaxformer.decode import GenerationConfig, generate_padded
from jaxformer.evaluation import sequence_scores


def write_translation_split(directory: Path, tokenizer, max_source: int, max_target: int
                            ) -> tuple[dict, dict]:
    """``<directory>/{split}.jsonl``: the pairs of ``bible_en_es`` whose source / target fit in
    ``max_source`` / ``max_target`` tokens with EOS. Returns (data-config keys, counts)."""
    counts = {}
    for split in SPLITS:
        src = get_source({"source": "bible_en_es"}, split)
        kept = [r for r in (src[i] for i in range(len(src)))
                if len(tokenizer.encode(r["source"])) < max_source
                and len(tokenizer.encode(r["target"])) < max_target]
        write_jsonl(directory / f"{split}.jsonl",
                    ({"source": r["source"], "target": r["target"], "id": r["id"]} for r in kept))
        counts[split] = {"kept": len(kept), "total": len(src)}
    keys = {"data.source": f"files:{directory}/{{split}}.jsonl", "data.format": "jsonl",
            "data.source_key": "source", "data.target_key": "target"}
    return keys, counts


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
    s = settings.budget_scale
    banner("T5 1/3: span-corruption pretraining on English + Spanish verses")
    config = load_config("t5_pretrain_tiny", overrides)
    scale_budget(config, s * settings.pretrain_scale, evals=10)
    trainer, pre = train_run("t5_pretrain", config, workdir / "pretrain")
    tokenizer = trainer.tokenizer

    max_source = max_target = settings.t5_max_tokens
    data, counts = write_translation_split(workdir / "pairs", tokenizer, max_source, max_target)
    print(f"  verse-length limit {max_source}/{max_target} tokens keeps "
          + ", ".join(f"{k} {v['kept']:,}/{v['total']:,}" for k, v in counts.items()), flush=True)
    pairs = {"source": f"files:{workdir / 'pairs'}/{{split}}.jsonl", "format": "jsonl",
             "source_key": "source", "target_key": "target"}
    test = spread(get_source(pairs, "test"), settings.t5_test_verses)  # over the whole Bible
    select = spread(get_source(pairs, "validation"), settings.t5_select_verses)
    results, shown, curves = {}, {}, {"pretrain": pre.rows}
    tok = {"data.tokenizer.path": str(workdir / "pretrain" / "tokenizer.model")}
    for step, (kind, init) in enumerate((("pretrained", str(workdir / "pretrain")),
                                         ("scratch", ""))):
        banner(f"T5 {2 + step}/3: translation fine-tuning, {kind}")
        c = load_config("t5_finetune_tiny", overrides, init_from=init, **tok, **data)
        scale_budget(c, s, evals=5)
        c.checkpoint.keep = 6  # every evaluated step, for the BLEU curve
        ft, run = train_run(f"t5_translate_{kind}", c, workdir / f"translate_{kind}")
        curve = bleu_curve(ft, run, tokenizer, spread(test, settings.t5_curve_verses),
                           max_source, c, settings.decode_batch)
        decoding, hyps, scores, decode_s = decode_test(
            ft.model, ft.state.params, tokenizer, select, test, max_len=max_source,
            batch=settings.decode_batch, decoder_start_id=int(c.objective.decoder_start_id),
            beam_size=settings.beam_size, length_penalties=settings.t5_length_penalties,
            no_repeat_ngrams=settings.t5_no_repeat_ngrams)
        run.extra.update(scores, test_verses=len(test), decode_seconds=round(decode_s, 1),
                         decoding=decoding, model_params=count_params(ft.state.params),
                         bleu_curve=curve)
        print(f"  {kind}: test BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.1f} on "
              f"{len(test)} verses ({describe_decoding(decoding)}, {decode_s:.0f} s)", flush=True)
        results[kind] = run.summary()
        shown[kind] = hyps[:settings.show_verses]
        curves[kind] = run.rows
    samples = [{"id": r["id"], "source": r["source"], "reference": r["target"],
                **{k: v[i] for k, v in shown.items()}}
               for i, r in enumerate(test[:settings.show_verses])]
    for smp in samples:
        print(f"\n  [{smp['id']}] EN: {smp['source']}\n    reference: {smp['reference']}\n"
              f"    pretrained: {smp['pretrained']}\n    scratch:    {smp['scratch']}")
    return {
        "pretrain": {**pre.summary(), "model_params": count_params(trainer.state.params),
                     "vocab_size": tokenizer.vocab_size, "seconds_per_step": round(
                         pre.seconds / max(pre.steps, 1), 3)},
        "length_limit": {"source_tokens": max_source, "target_tokens": max_target, **counts},
        "translate": results, "samples": samples, "curves": curves,
    }
