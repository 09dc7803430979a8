"""Sequence-level evaluation by real decoding: prompts and references from a split, generations in
batches of similar lengths, scored by `jaxformer.evaluation.metrics.sequence_scores`.

What is decoded, per data task (``objective.name`` decides it):

* ``seq2seq`` (translation, summarisation; an encoder-decoder): the encoder reads ``source </s>``
  (cut to ``data.seq_len``, as in training); the reference is the ``target`` text.
* ``sft`` (a decoder fine-tuned on prompt/response pairs): the model continues ``<s>? prompt``
  (the BOS only with ``data.framing="bos_eos"``, as in training); the reference is the response.
* ``lm`` with a decoder (plain ``clm``): an example has no prompt of its own, so its first
  ``data.seq_len`` tokens (one training row) are cut in half: the first half is the prompt and the
  decoded second half the reference (a continuation score: how much of held-out text the model
  reproduces, the measure of Carlini et al. 2021's extraction test). Examples shorter than 2
  tokens are skipped.

The examples are the first ones of the split in the source's order (the same every time: a fixed
sample, never shuffled). Other objectives (mlm, span corruption, denoise, classify) are not
decoded: their targets are no text to generate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jaxformer.config import ModelConfig
from jaxformer.data.containers import read_records
from jaxformer.data.pipeline import example_framing
from jaxformer.data.sources import get_source
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.decode.api import GenerationConfig, generate_batches
from jaxformer.evaluation.metrics import sequence_scores
from jaxformer.models import Model
from jaxformer.objectives.registry import check_data_task
from jaxformer.settings import at_least, positive, setting

DECODING_STRATEGIES = ("greedy", "beam")  # sampling would make the scores noisy


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """``config.eval``: evaluation during training (the ``generate_*`` keys together:
    `check_generation`)."""

    every_steps: int = setting(
        500, "evaluate every this many steps (and at the last step)", check=positive)
    num_batches: int = setting(
        20, "batches of eval.split per evaluation (0 = no evaluation)", check=at_least(0))
    split: str = setting("validation", "the split evaluated during training: 'validation' or 'test'")
    generate_examples: int = setting(
        0, "decode the first N examples of eval.split at each evaluation and log eval_bleu / "
        "eval_chrf / eval_exact_match (0 = off; seq2seq, sft, clm)")
    generate_max_new_tokens: int = setting(
        0, "tokens generated per example in that scoring (0 = data.target_len)")
    generate_strategy: str = setting("greedy", "decoding for that scoring: 'greedy' or 'beam'")
    generate_beam_size: int = setting(4, "beams when eval.generate_strategy='beam'")


@dataclasses.dataclass(frozen=True)
class DecodingExample:
    """One example to decode: ``prompt`` token ids (the source of an encoder-decoder) and the
    ``reference`` text its generation is scored against."""

    prompt: list[int]
    reference: str


def data_task(settings: Any) -> str:
    """The data task of a run's `TrainSettings` (``jaxformer.train.config``): its objective's, as
    its options choose it (`jaxformer.objectives.Objective.resolve`)."""
    return check_data_task(settings.objective.name, settings.objective_options).data_task


def decodes(settings: Any, model_cfg: ModelConfig) -> bool:
    """Whether runs of ``settings`` (a `TrainSettings`) have text to decode (module docstring)."""
    task = data_task(settings)
    if model_cfg.head != "lm":
        return False
    return (task == "seq2seq" and model_cfg.family == "encoder_decoder") or (
        task in ("sft", "lm") and model_cfg.family == "decoder")


def max_new_tokens(settings: Any) -> int:
    """``eval.generate_max_new_tokens``, or ``data.target_len`` when it is 0 (unset)."""
    return settings.eval.generate_max_new_tokens or settings.data.target_len


def check_generation(settings: Any, model_cfg: ModelConfig) -> None:
    """ValueError naming the ``eval.generate_*`` key that does not fit ``settings`` (a training
    config's `TrainSettings`): in-training decoding (``eval.generate_examples > 0``) needs a
    decoding objective."""
    ev = settings.eval
    n = ev.generate_examples
    if n < 0:
        raise ValueError(f"eval.generate_examples={n!r} must be an integer >= 0 (0 = off)")
    if ev.generate_strategy not in DECODING_STRATEGIES:
        raise ValueError(f"eval.generate_strategy={ev.generate_strategy!r} must be one of "
                         f"{DECODING_STRATEGIES}")
    for key in ("generate_max_new_tokens", "generate_beam_size"):
        if getattr(ev, key) < 0:
            raise ValueError(f"eval.{key}={getattr(ev, key)!r} must be an integer >= 0")
    if n == 0:
        return
    if not decodes(settings, model_cfg):
        raise ValueError(f"eval.generate_examples={n} decodes text, which objective.name="
                         f"{settings.objective.name!r} with a {model_cfg.family} model "
                         f"(head {model_cfg.head!r}) does not produce; use it with seq2seq, sft or "
                         "clm runs, or set eval.generate_examples=0")
    if ev.num_batches == 0:
        raise ValueError(f"eval.generate_examples={n} needs evaluation: eval.num_batches=0 "
                         "turns it off")
    new = max_new_tokens(settings)
    if model_cfg.family == "decoder" and model_cfg.position == "learned" and new >= model_cfg.max_len:
        raise ValueError(f"generating eval.generate_max_new_tokens={new} tokens (0 = "
                         f"data.target_len) leaves no room for a prompt in model.max_len="
                         f"{model_cfg.max_len}, the learned position table; lower it")


def generation_config(settings: Any, tokenizer: Tokenizer, *, strategy: str | None = None,
                      beam_size: int | None = None, max_new: int | None = None) -> GenerationConfig:
    """The decoding settings of a run (its `TrainSettings`): its ``eval.generate_*`` keys unless
    given, its tokenizer's EOS and padding, its objective's decoder start id."""
    special, ev = tokenizer.special, settings.eval
    return GenerationConfig(
        strategy=strategy or ev.generate_strategy, beam_size=beam_size or ev.generate_beam_size,
        max_new_tokens=max_new or max_new_tokens(settings), eos_id=special.eos_id,
        pad_id=max(special.pad_id, 0), decoder_start_id=settings.objective.decoder_start_id)


def decoding_examples(settings: Any, tokenizer: Tokenizer, split: str, *, limit: int = 0,
                      source: Sequence[dict] | None = None) -> list[DecodingExample]:
    """The first ``limit`` (0 = all) examples of ``split`` (or of ``source``) as prompts and
    references, framed as training framed them (module docstring); ``settings``: the run's
    `TrainSettings`."""
    task, data = data_task(settings), settings.data
    framing = example_framing(data, settings.objective.name)
    special, seq_len = tokenizer.special, data.seq_len
    prefix = {"bos_eos": [special.bos_id], "cls_sep": [special.cls_id]}.get(framing, [])
    source = get_source(data, split, task=task) if source is None else source
    out = []
    for ex in read_records(source, range(len(source) if not limit else min(limit, len(source)))):
        if task == "seq2seq":
            ids = tokenizer.encode(ex["source"])[:seq_len - 1] + [special.eos_id]
            out.append(DecodingExample(ids, ex["target"]))
        elif task == "sft":
            prompt, response = (ex["prompt"], ex["response"]) if "prompt" in ex else (
                ex["source"], ex["target"])
            out.append(DecodingExample((prefix + tokenizer.encode(prompt))[:seq_len], response))
        else:
            tokens = (prefix + tokenizer.encode(ex["text"]))[:seq_len]
            if len(tokens) >= 2:
                half = len(tokens) // 2
                out.append(DecodingExample(tokens[:half], tokenizer.decode(tokens[half:])))
    if not out:
        raise ValueError(f"split {split!r} has no example to decode (texts of 2 tokens or more)")
    return out


def decode_prompts(model: Model, params: Any, prompts: Sequence[Sequence[int]],
                   gen: GenerationConfig, *, batch_size: int, progress: bool | None = False,
                   refill: bool = False) -> list[list[int]]:
    """Generated token ids (EOS and what follows removed) for each prompt, decoded in batches of
    ``batch_size`` prompts of similar lengths (`jaxformer.decode.generate_batches`); ``refill``:
    greedy rows that finish take the next prompt (same tokens; beam search ignores it).

    A decoder with learned positions keeps the last ``model.max_len - max_new_tokens`` tokens of a
    longer prompt (its position table ends there).
    """
    cfg = model.cfg
    if cfg.family == "decoder" and cfg.position == "learned":
        room = cfg.max_len - gen.max_new_tokens
        prompts = [p[-room:] if room > 0 else p for p in prompts]
    return generate_batches(model, params, prompts, gen, batch_size=batch_size, progress=progress,
                            refill=refill)


def score_decoding(model: Model, params: Any, tokenizer: Tokenizer,
                   examples: Sequence[DecodingExample], gen: GenerationConfig, *, batch_size: int,
                   progress: bool | None = False, refill: bool = False
                   ) -> tuple[dict[str, Any], list[str]]:
    """(`sequence_scores` of the generations against the references, the generated texts)."""
    ids = decode_prompts(model, params, [e.prompt for e in examples], gen, batch_size=batch_size,
                         progress=progress, refill=refill)
    hypotheses = [tokenizer.decode(s) for s in ids]
    return sequence_scores(hypotheses, [e.reference for e in examples]), hypotheses
