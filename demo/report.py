"""The demo's outputs: ``results.json`` (everything measured), ``results.md`` (the headline table,
the goals, each family's regimes) and ``curves.png`` (pretraining curves; test metric against
regime size, mean ± SE)."""

from __future__ import annotations

import json
from pathlib import Path

from demo.output import curve
from demo.stats import fmt

# family: (metric, scale, digits, higher is better, regime unit)
METRICS = {"gpt": ("KJV test perplexity", 1, 1, False, "verses"),
           "bert": ("sentiment test accuracy (%)", 100, 1, True, "labels"),
           "t5": ("greedy test BLEU", 1, 2, True, "pairs")}
TITLES = {"gpt": "Decoder-only (GPT): Shakespeare → King James Bible language modelling",
          "bert": "Encoder-only (BERT): in-domain MLM → movie-review sentiment",
          "t5": "Encoder-decoder (T5): denoising → KJV → Reina-Valera translation"}


def _budget(r: dict) -> str:
    return f"{r['steps']:,} steps / {r['tokens']:,} tokens / {r['minutes']:.1f} min"


def _regime(family: str, result: dict, row: dict) -> str:
    unit = METRICS[family][4]
    size = f"{row['size']:,} {unit}"
    if family == "gpt":
        return f"{size} (pretrained on Shakespeare, which has no Bible text)"
    if family == "bert":
        full = " (all)" if row["size"] >= result["train_examples"] else ""
        head = {"cloze": "; cloze through the MLM head"}.get(result.get("head"), "")
        return f"{size}{full} (MLM on `{result['pretrain']['corpus']}`, unlabelled{head})"
    return f"{size} (denoising pretraining on `{result['pretrain']['corpus']}`, no pairs)"


def _difference(family: str, row: dict) -> str:
    t = row["test"]
    _, scale, digits, _, _ = METRICS[family]
    if family == "gpt":
        return f"{t['ratio']:.2f}× scratch"
    unit = " points" if family == "bert" else ""
    return f"{scale * t['difference']:+.{digits}f} ± {scale * t['difference_se']:.{digits}f}{unit}"


def goals(results: dict) -> list[tuple[str, str, bool]]:
    """(goal, measured, reached) for each family that ran (issue 20's goals)."""
    out = []
    if "gpt" in results:
        for row in results["gpt"]["regimes"]:
            r = row["test"]["ratio"]
            out.append((f"GPT, {row['size']:,} KJV verses: held-out perplexity pretrained <= 0.7× "
                        "scratch", f"{r:.2f}×", r <= 0.7))
    if "t5" in results:
        for row in results["t5"]["regimes"]:
            t = row["test"]
            out.append((f"T5, {row['size']:,} pairs: BLEU pretrained > scratch, ±2 SE apart",
                        f"{t['difference']:+.2f} ± {t['difference_se']:.2f}",
                        t["intervals_apart"]))
    if "bert" in results:
        for row in results["bert"]["regimes"]:
            t = row["test"]
            out.append((f"BERT, {row['size']:,} labels: mean accuracy gap > 0",
                        f"{100 * t['difference']:+.1f} ± {100 * t['difference_se']:.1f} points",
                        t["difference"] > 0))
    return out


def headline(results: dict) -> list[str]:
    """One row per family and regime: pretrained vs scratch, mean ± SE over seeds."""
    lines = ["| family | regime | metric | pretrained | scratch | pretrained vs scratch |",
             "|---|---|---|---:|---:|---|"]
    for family, (metric, scale, digits, higher, _) in METRICS.items():
        if family not in results:
            continue
        arrow = "↑" if higher else "↓"
        for row in results[family]["regimes"]:
            t = row["test"]
            lines.append(f"| {family.upper()} | {_regime(family, results[family], row)} | "
                         f"{metric} {arrow} | {fmt(t['pretrained'], scale, digits)} | "
                         f"{fmt(t['scratch'], scale, digits)} | {_difference(family, row)} |")
    return lines


def _family_section(family: str, result: dict) -> list[str]:
    metric, scale, digits, _, unit = METRICS[family]
    p = result["pretrain"]
    lines = [f"## {TITLES[family]}", "",
             f"{p['model_params']:,} parameters, vocabulary {p['vocab_size']:,}; pretraining on "
             f"`{p['corpus']}`: {_budget(p)}.", "",
             f"| {unit} | init | learning rate (validation of each tried) | {metric}: "
             "validation | test | per seed (test) | fine-tuning budget (each) |",
             "|---:|---|---|---:|---:|---|---|"]
    for row in result["regimes"]:
        for init, r in row["inits"].items():
            tried = ", ".join(f"{t['lr']:g}: {scale * t['validation']:.{digits}f}"
                              for t in r["tuning"])
            seeds = ", ".join(f"{scale * x['test']:.{digits}f}" for x in r["runs"])
            lines.append(f"| {row['size']:,} | {init} | {r['lr']:g} ({tried}) | "
                         f"{fmt(row['validation'][init], scale, digits)} | "
                         f"{fmt(row['test'][init], scale, digits)} | {seeds} | "
                         f"{_budget(r['runs'][0])} |")
        if "ngram_baseline" in row:
            lines.append(f"| {row['size']:,} | n-gram LR (no pretraining) | – | "
                         f"{100 * row['ngram_baseline']['validation_accuracy']:.1f} | "
                         f"{100 * row['ngram_baseline']['test_accuracy']:.1f} | – | – |")
    if family == "t5":
        lim = result["length_limit"]
        lines += ["", f"Verse-length limit {lim['source_tokens']} source / {lim['target_tokens']}"
                  f" target tokens (EOS included): train {lim['train']['kept']:,} / "
                  f"{lim['train']['total']:,} pairs; BLEU on {result['validation_verses']} "
                  f"validation and {result['test_verses']} test verses (greedy decoding, "
                  "sacrebleu defaults).", "", "Translated test verses (seed 0, largest regime):", ""]
        for s in result["samples"]:
            lines += [f"- **{s['id']}** EN: {s['source']}", f"  - reference: {s['reference']}",
                      f"  - pretrained: {s['pretrained']}", f"  - scratch: {s['scratch']}"]
    return lines + [""]


def markdown(results: dict) -> str:
    meta = results["meta"]
    s = meta["settings"]
    lines = ["# jaxformer demo results", "",
             f"Command: `{meta['command']}` — total {meta['total_minutes']:.1f} min on "
             f"{meta['cpu_count']} CPU cores ({meta['cpu']}); load average "
             f"{meta['load_start']:.1f} at the start, {meta['load_end']:.1f} at the end.", "",
             "## Does pretraining pay off?", "",
             *headline(results), "",
             f"Mean ± standard error over {s['seeds']} fine-tuning seeds (initialisation of new "
             "parameters, dropout, data order); both inits share the tokenizer, the labelled "
             "data, the steps and the evaluation, and each init has its own learning rate, "
             + ("chosen on validation in this run." if s["tune"] else
                "the one an earlier search chose (`demo.settings.CHOSEN_LR`, `--no_tune`).")
             + " Test figures come from the checkpoint with the best validation metric.", "",
             "## Goals", "", "| goal | measured | reached |", "|---|---|---|"]
    lines += [f"| {g} | {m} | {'yes' if ok else '**no**'} |" for g, m, ok in goals(results)]
    lines.append("")
    for family in METRICS:
        if family in results:
            lines += _family_section(family, results[family])
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Per family: the pretraining validation loss, and the test metric against regime size
    (mean ± SE, pretrained vs scratch)."""
    import matplotlib  # the plot's backend is chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [f for f in METRICS if f in results]
    if not families:
        return
    fig, axes = plt.subplots(2, len(families), figsize=(5 * len(families), 7.2), squeeze=False)
    for col, family in enumerate(families):
        metric, scale, _, _, unit = METRICS[family]
        r = results[family]
        ax = axes[0, col]
        ax.plot(*zip(*curve(r["curves"]["pretrain"], "eval_loss")), marker=".")
        ax.set(title=f"{family.upper()} pretraining", xlabel="step", ylabel="validation loss")
        ax = axes[1, col]
        sizes = [row["size"] for row in r["regimes"]]
        for init in ("pretrained", "scratch"):
            m = [scale * row["test"][init]["mean"] for row in r["regimes"]]
            e = [2 * scale * row["test"][init]["se"] for row in r["regimes"]]
            ax.errorbar(sizes, m, yerr=e, marker="o", capsize=3, label=f"{init} (±2 SE)")
        ax.set(title=f"{family.upper()} fine-tuning", xlabel=unit, ylabel=metric)
        if len(sizes) > 1:
            ax.set_xscale("log")
        for a in axes[:, col]:
            a.grid(alpha=0.3)
        ax.legend(fontsize=7)
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
