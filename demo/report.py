"""The demo's outputs: ``results.json`` (everything measured), ``results.md`` (the tables for the
README) and ``curves.png`` (learning curves read from each run's ``metrics.jsonl``)."""

from __future__ import annotations

import json
from pathlib import Path

from demo.common import curve
from demo.t5 import describe_decoding

GOALS = {
    "gpt": "pretrained perplexity <= 20% of the unigram perplexity",
    "bert_full": "sentiment test accuracy >= 75% on the full training split",
    "bert_low": "pretrained >= scratch + 3 points on the low-resource split",
    "t5": "test BLEU >= 5",
}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _budget(r: dict) -> str:
    return f"{r['steps']:,} steps / {r['tokens']:,} tokens / {r['minutes']:.1f} min"


def goals(results: dict) -> list[tuple[str, str, bool]]:
    """(goal, measured, reached) for each family that ran."""
    out = []
    if "gpt" in results:
        t = results["gpt"]["pretrain"]["test"]
        out.append((GOALS["gpt"], f"{100 * t['ratio']:.1f}% ({t['model_perplexity']:.1f} vs "
                    f"{t['unigram_perplexity']:.1f}, test)", t["ratio"] <= 0.20))
    if "bert" in results:
        b = results["bert"]
        acc = max(b["full"]["pretrained"]["test_accuracy"], b["full"]["scratch"]["test_accuracy"])
        out.append((GOALS["bert_full"], _pct(acc), acc >= 0.75))
        gap = b["low_resource"]["gap_curve"][-1]["gap_points"]
        out.append((GOALS["bert_low"], f"{gap:+.1f} points", gap >= 3.0))
    if "t5" in results:
        best = max(r["bleu"] for r in results["t5"]["translate"].values())
        out.append((GOALS["t5"], f"{best:.2f}", best >= 5.0))
    return out


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = ["# jaxformer demo results", "",
             f"Command: `{meta['command']}` — total {meta['total_minutes']:.1f} min on "
             f"{meta['cpu_count']} CPU cores ({meta['cpu']}); load average "
             f"{meta['load_start']:.1f} at the start, {meta['load_end']:.1f} at the end (shared "
             "machine: minutes vary, steps and tokens do not). Budgets: optimizer steps, "
             "non-padding tokens seen (inputs + targets), wall minutes of the training loop "
             "(compilation and periodic evaluation included).", ""]
    if "gpt" in results:
        g = results["gpt"]
        p = g["pretrain"]
        lines += ["## Decoder-only (GPT): causal LM on Shakespeare", "",
                  f"{p['model_params']:,} parameters, vocabulary {p['vocab_size']:,} "
                  f"(SentencePiece); pretraining {_budget(p)}.", "",
                  "| split | tokens scored | model perplexity | unigram perplexity | ratio |",
                  "|---|---:|---:|---:|---:|"]
        for split in ("validation", "test"):
            r = p[split]
            lines.append(f"| {split} | {r['tokens']:,} | {r['model_perplexity']:.1f} | "
                         f"{r['unigram_perplexity']:.1f} | {100 * r['ratio']:.1f}% |")
        s = g["sentiment"]
        lines += ["", f"Sentiment fine-tuning from this checkpoint: test accuracy "
                  f"**{_pct(s['test_accuracy'])}** ({_budget(s)}).", ""]
    if "bert" in results or "sentiment_baseline" in results:
        lines += _bert_section(results)
    if "t5" in results:
        lines += _t5_section(results["t5"])
    lines += ["## Goals", "", "| goal | measured | reached |", "|---|---|---|"]
    lines += [f"| {g} | {m} | {'yes' if ok else '**no**'} |" for g, m, ok in goals(results)]
    if "checks" in results:
        c = results["checks"]
        lines += ["", f"XLA CPU denormals: flush-to-zero {c['flush_to_zero']}, denormals-are-zero "
                  f"{c['denormals_are_zero']}, denormal/normal time {c['denormal_slowdown']}x."]
    return "\n".join(lines) + "\n"


def _bert_section(results: dict) -> list[str]:
    base = results.get("sentiment_baseline", {})
    lines = ["## Encoder-only (BERT): MLM, then sentiment", ""]
    if "bert" in results:
        b = results["bert"]
        p = b["pretrain"]
        lines += [f"{p['model_params']:,} parameters, vocabulary {p['vocab_size']:,}; MLM corpus "
                  f"`{p['corpus']}` (sentiment training sentences without labels, then "
                  "Shakespeare); "
                  f"pretraining {_budget(p)}.", ""]
    lines += ["Movie-review sentences (train 8,495 / validation 1,034 / test 1,076 by our hash "
              "split — not 9.5k). Test accuracy of the checkpoint with the best validation "
              "accuracy; pretrained and scratch runs share tokenizer, hyper-parameters and steps.",
              "", "| training labels | pretrained | scratch | gap | n-gram LR | "
              "fine-tuning budget (each) |", "|---|---:|---:|---:|---:|---|"]
    rows = []
    if "bert" in results:
        b = results["bert"]
        rows.append(("full", b["full"]["pretrained"], b["full"]["scratch"]))
        low = b["low_resource"]
        rows.append(("low", low["pretrained"], low["scratch"]))
    for name, pre, scr in rows:
        n = "8,495 (full)" if name == "full" else f"{results['bert']['low_resource']['examples']:,}"
        lr = base.get(name, {}).get("test_accuracy")
        lines.append(f"| {n} | {_pct(pre['test_accuracy'])} | {_pct(scr['test_accuracy'])} | "
                     f"{100 * (pre['test_accuracy'] - scr['test_accuracy']):+.1f} | {_pct(lr)} | "
                     f"{_budget(pre)} |")
    if not rows and base:
        lines += [f"| {k} | – | – | – | {_pct(v['test_accuracy'])} | – |" for k, v in base.items()]
    if "bert" in results:
        lines += ["", "Low-resource gap against pretraining time (checkpoints of the one "
                  "pretraining run):", "",
                  "| pretraining steps | tokens | minutes | pretrained | scratch | gap |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for g in results["bert"]["low_resource"]["gap_curve"]:
            lines.append(f"| {g['pretrain_steps']:,} | {g['pretrain_tokens']:,} | "
                         f"{g['pretrain_minutes']:.1f} | {_pct(g['pretrained_test_accuracy'])} | "
                         f"{_pct(g['scratch_test_accuracy'])} | {g['gap_points']:+.1f} |")
    if base:
        lines += ["", "n-gram LR: TF-IDF word 1-2-grams + logistic regression, C chosen on "
                  "validation (scikit-learn)."]
    return lines + [""]


def _decoding(r: dict) -> str:
    """The chosen decoding and its validation BLEU."""
    d = r["decoding"]
    return (f"{describe_decoding(d)} (validation BLEU {d['validation_bleu']:.2f} on "
            f"{d['validation_verses']} verses)")


def _t5_section(t: dict) -> list[str]:
    p, lim = t["pretrain"], t["length_limit"]
    lines = ["## Encoder-decoder (T5): span corruption, then KJV → Reina-Valera", "",
             f"{p['model_params']:,} parameters, shared EN/ES vocabulary {p['vocab_size']:,}; "
             f"span-corruption pretraining {_budget(p)} ({p['seconds_per_step']} s/step). "
             f"Verse-length limit "
             f"{lim['source_tokens']} source / {lim['target_tokens']} target tokens (EOS "
             f"included): train {lim['train']['kept']:,}/{lim['train']['total']:,} pairs, test "
             f"{lim['test']['kept']:,}/{lim['test']['total']:,} verses.", "",
             "| init | test BLEU | chrF | verses | fine-tuning budget | decoding |",
             "|---|---:|---:|---:|---|---|"]
    for kind, r in t["translate"].items():
        lines.append(f"| {kind} | {r['bleu']:.2f} | {r['chrf']:.1f} | {r['test_verses']:,} | "
                     f"{_budget(r)} | {_decoding(r)}, {r['decode_seconds']:.0f} s |")
    curves = {k: r.get("bleu_curve", []) for k, r in t["translate"].items()}
    if any(curves.values()):
        first = next(c for c in curves.values() if c)
        lines += ["", f"Greedy test BLEU ({first[0]['verses']} verses) against fine-tuning "
                  "steps:", "", "| step | tokens | minutes | " + " | ".join(curves) + " |",
                  "|---:|---:|---:|" + "---:|" * len(curves)]
        for i, row in enumerate(first):
            vals = [f"{c[i]['bleu_greedy']:.2f}" if i < len(c) else "–" for c in curves.values()]
            lines.append(f"| {row['step']:,} | {row['tokens']:,} | {row['minutes']:.1f} | "
                         + " | ".join(vals) + " |")
    lines += ["", f"BLEU: sacrebleu `{next(iter(t['translate'].values()))['bleu_signature']}`.",
              "", "Translated test verses:", ""]
    for s in t["samples"]:
        lines += [f"- **{s['id']}** EN: {s['source']}", f"  - reference: {s['reference']}",
                  f"  - pretrained: {s['pretrained']}", f"  - scratch: {s['scratch']}"]
    return lines + [""]


def plot(results: dict, path: Path) -> None:
    """Learning curves (validation metrics against steps) of every run, one panel per stage."""
    import matplotlib  # the plot's backend is chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if "gpt" in results:
        g = results["gpt"]["curves"]
        uni = results["gpt"]["pretrain"]["validation"]["unigram_perplexity"]
        panels.append(("GPT pretraining: validation perplexity",
                       [("model", curve(g["pretrain"], "eval_perplexity"))], "perplexity",
                       [("unigram", uni)], True))
    if "bert" in results:
        c = results["bert"]["curves"]
        panels.append(("BERT MLM: validation loss", [("MLM", curve(c["pretrain"], "eval_loss"))],
                       "loss", [], False))
        runs = [(k.replace("_", " "), curve(v, "eval_accuracy")) for k, v in c.items()
                if k != "pretrain"]
        panels.append(("BERT sentiment: validation accuracy", runs, "accuracy", [], False))
        gap = results["bert"]["low_resource"]["gap_curve"]
        n = results["bert"]["low_resource"]["examples"]
        panels.append((f"BERT {n} labels: test acc. vs pretraining steps",
                       [("pretrained", [(g["pretrain_steps"], g["pretrained_test_accuracy"])
                                        for g in gap])], "accuracy",
                       [("scratch", gap[0]["scratch_test_accuracy"])], False))
    if "t5" in results:
        c = results["t5"]["curves"]
        panels.append(("T5 span corruption: validation loss",
                       [("span corruption", curve(c["pretrain"], "eval_loss"))], "loss", [], False))
        panels.append(("T5 translation: validation loss",
                       [(k, curve(v, "eval_loss")) for k, v in c.items() if k != "pretrain"],
                       "loss", [], False))
        bleu = [(k, [(r["step"], r["bleu_greedy"]) for r in v.get("bleu_curve", [])])
                for k, v in results["t5"]["translate"].items()]
        panels.append(("T5 translation: greedy test BLEU", bleu, "BLEU", [("goal", 5.0)], False))
    if not panels:
        return
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (title, series, ylabel, hlines, logy) in zip(axes.flat, panels):
        for label, pts in series:
            if pts:
                ax.plot(*zip(*pts), marker=".", label=label)
        for label, y in hlines:
            ax.axhline(y, ls="--", color="gray", label=label)
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(results: dict, out_dir: Path) -> None:
    """results.json (curves included, for re-plotting), results.md, curves.png."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out_dir / "results.md").write_text(markdown(results))
    plot(results, out_dir / "curves.png")
