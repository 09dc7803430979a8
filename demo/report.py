"""The demo's outputs: ``results.json`` (everything measured), ``results.md`` (the headline table,
the goals, each family's regimes) and ``curves.png`` (pretraining curves; each regime's
fine-tuning curves — the validation metric against the step, mean ± SE over seeds, per init)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from demo.output import curve
from demo.settings import MINILM
from demo.stats import fmt, mean_se

# family: (metric, scale, digits, higher is better, regime unit)
METRICS = {"gpt": ("KJV test perplexity", 1, 1, False, "verses"),
           "bert": ("sentiment test accuracy (%)", 100, 1, True, "labels"),
           "t5": ("greedy test BLEU", 1, 2, True, "pairs")}
# family: (the eval_* key each fine-tuning evaluation logs, its transform to the plotted value,
# the plotted validation metric)
CURVES = {"gpt": ("eval_loss", math.exp, "validation perplexity"),
          "bert": ("eval_accuracy", lambda a: 100 * a, "validation accuracy (%)"),
          "t5": ("eval_bleu", lambda b: b, "greedy BLEU, first validation verses")}
INIT_LABELS = {"pretrained": "pretrained", "scratch": "scratch", MINILM["init"]: MINILM["label"]}


def init_label(family: str, init: str) -> str:
    """How the report names an init (BERT's own pretraining: "own MLM")."""
    return "own MLM" if (family, init) == ("bert", "pretrained") else INIT_LABELS.get(init, init)

INIT_COLORS = {"pretrained": "C0", "scratch": "C1", MINILM["init"]: "C2"}
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


def _hf_regime(result: dict, row: dict) -> str:
    hf = result["hf_init"]
    return (f"{row['size']:,} labels, fine-tuned from {hf['label']} (Hugging Face `init_from`: "
            f"{hf['num_layers']} layers, d{hf['d_model']}, its {hf['vocab_size']:,}-piece "
            "tokenizer)")


def _difference(family: str, row: dict, t: dict | None = None) -> str:
    """The test gap of ``t`` (a `stats.compare`; default: the row's pretrained vs scratch)."""
    t = row["test"] if t is None else t
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
            for other in t.get("others", {}).values():  # BERT's Hugging Face init
                lines.append(f"| {family.upper()} | {_hf_regime(results[family], row)} | "
                             f"{metric} {arrow} | {fmt(other['pretrained'], scale, digits)} | "
                             f"{fmt(t['scratch'], scale, digits)} | "
                             f"{_difference(family, row, other)} |")
    return lines


def _hf_init_lines(result: dict) -> list[str]:
    """The Hugging Face init's paragraph (BERT with ``DemoSettings.bert_hf``), else none."""
    hf = result.get("hf_init")
    if not hf:
        return []
    params = result["regimes"][0]["inits"][MINILM["init"]]["runs"][0]["params"]
    return [f"Third init: {hf['label']} (`init_from={hf['directory']}`): {hf['num_layers']} "
            f"layers, d{hf['d_model']}, its own {hf['vocab_size']:,}-piece tokenizer; "
            f"{params:,} parameters with the classifier. Same head, labelled sentences, steps "
            "and evaluation as the other inits; its own learning-rate grid.", ""]


def _family_section(family: str, result: dict) -> list[str]:
    metric, scale, digits, _, unit = METRICS[family]
    p = result["pretrain"]
    lines = [f"## {TITLES[family]}", "",
             f"{p['model_params']:,} parameters, vocabulary {p['vocab_size']:,}; pretraining on "
             f"`{p['corpus']}`: {_budget(p)}.", "", *_hf_init_lines(result),
             f"| {unit} | init | learning rate (validation of each tried) | {metric}: "
             "validation | test | per seed (test) | fine-tuning budget (each) |",
             "|---:|---|---|---:|---:|---|---|"]
    for row in result["regimes"]:
        for init, r in row["inits"].items():
            tried = ", ".join(f"{t['lr']:g}: {scale * t['validation']:.{digits}f}"
                              for t in r["tuning"])
            seeds = ", ".join(f"{scale * x['test']:.{digits}f}" for x in r["runs"])
            lines.append(f"| {row['size']:,} | {init_label(family, init)} | {r['lr']:g} ({tried}) | "
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


def _rates(results: dict) -> str:
    """Where the learning rates came from: this run's search, or `CHOSEN_LR` and the inits this
    run searched because it had none for them."""
    if results["meta"]["settings"]["tune"]:
        return "chosen on validation in this run."
    searched = sorted({f"{family.upper()} {init_label(family, init)}" for family in METRICS
                       if family in results for row in results[family]["regimes"]
                       for init, v in row["inits"].items() if len(v["tuning"]) > 1})
    return ("the one an earlier search chose (`demo.settings.CHOSEN_LR`, `--no_tune`)"
            + (f"; chosen on validation in this run for {', '.join(searched)}, which had none."
               if searched else "."))


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
             "parameters, dropout, data order); pretrained and scratch share the tokenizer, the "
             "labelled data, the steps and the evaluation, and each init has its own learning "
             "rate, " + _rates(results)
             + " Test figures come from the checkpoint with the best validation metric.", "",
             "## Goals", "", "| goal | measured | reached |", "|---|---|---|"]
    lines += [f"| {g} | {m} | {'yes' if ok else '**no**'} |" for g, m, ok in goals(results)]
    lines.append("")
    for family in METRICS:
        if family in results:
            lines += _family_section(family, results[family])
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Per family: the pretraining validation loss (top row), and below it each regime's
    fine-tuning curves (`curve_panel`)."""
    import matplotlib  # the plot's backend is chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [f for f in METRICS if f in results]
    if not families:
        return
    rows = 1 + max(len(results[f]["regimes"]) for f in families)
    fig, axes = plt.subplots(rows, len(families), figsize=(5.2 * len(families), 3.9 * rows),
                             squeeze=False)
    for col, family in enumerate(families):
        r = results[family]
        ax = axes[0, col]
        ax.plot(*zip(*curve(r["curves"]["pretrain"], "eval_loss")), marker=".")
        ax.set(title=f"{family.upper()} pretraining", xlabel="step", ylabel="validation loss")
        for i, row in enumerate(r["regimes"]):
            curve_panel(axes[1 + i, col], family, row)
        for ax in axes[1 + len(r["regimes"]):, col]:
            ax.axis("off")
        for ax in axes[:1 + len(r["regimes"]), col]:
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def curve_panel(ax, family: str, row: dict) -> None:
    """One regime's fine-tuning: per init, each seed's validation metric against the step (thin)
    and their mean ± SE (thick, shaded); the legend gives each init's learning rate and test
    metric (mean ± SE, the checkpoint chosen on validation)."""
    key, transform, ylabel = CURVES[family]
    metric, scale, digits, _, unit = METRICS[family]
    for init, v in row["inits"].items():
        color = INIT_COLORS.get(init)
        seeds = [[(step, transform(x)) for step, x in curve(run["curve"], key)]
                 for run in v["runs"]]
        for points in seeds:
            ax.plot(*zip(*points), color=color, alpha=0.3, lw=0.8)
        steps = [step for step, _ in seeds[0]]
        stats = [mean_se([points[i][1] for points in seeds]) for i in range(len(steps))]
        mean = [m["mean"] for m in stats]
        ax.fill_between(steps, [m["mean"] - m["se"] for m in stats],
                        [m["mean"] + m["se"] for m in stats], color=color, alpha=0.2)
        ax.plot(steps, mean, color=color, marker="o", lw=2,
                label=f"{init_label(family, init)}, lr {v['lr']:g}: test "
                      f"{fmt(row['test'][init], scale, digits)}")
    ax.set(title=f"{family.upper()} fine-tuning, {row['size']:,} {unit}", xlabel="step",
           ylabel=ylabel)
    ax.legend(fontsize=7, title=f"mean ± SE of {len(v['runs'])} seeds; {metric}",
              title_fontsize=7)


def write(results: dict, out_dir: Path) -> None:
    """results.json (curves included, for re-plotting), results.md, curves.png."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out_dir / "results.md").write_text(markdown(results))
    plot(results, out_dir / "curves.png")
