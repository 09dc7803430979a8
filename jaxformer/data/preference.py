"""Preference pairs (TRL's ``prompt`` / ``chosen`` / ``rejected``) → the examples DPO reads.

One pair is one example, packed whole (`jaxformer.objectives.dpo` splits it back on the device):

- decoder-only (data task ``preference``): ``<s>? x y_w </s> <s>? x y_l </s>`` as ``inputs``, with
  ``inputs_pair`` (1 on the chosen half, 2 on the rejected) and ``inputs_loss_mask`` (1 on the
  responses and their EOS);
- encoder-decoder (``preference_seq2seq``): ``x </s> x </s>`` as ``inputs``, ``y_w </s> y_l </s>`` as
  ``targets``, each with its ``*_pair``.

A pair longer than its row loses tokens from the *left of the prompt* first (the responses are what
the loss reads; TRL's ``truncation_mode="keep_end"`` for the prompt); a response that alone does
not fit is cut at its end. Every token cut is returned, so the pipeline counts the pair as truncated
(`jaxformer.data.packing.TruncationCounter`).
"""

from __future__ import annotations

import numpy as np

PAIR_FEATURES = {"preference": ("inputs_loss_mask", "inputs_pair"),
                 "preference_seq2seq": ("inputs_pair", "targets_pair")}


def _i32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int32)


def _fit_responses(chosen: np.ndarray, rejected: np.ndarray, room: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Both responses (EOS included) cut at their ends to fit ``room`` tokens together, the longer
    one first."""
    while len(chosen) + len(rejected) > room:
        if len(chosen) >= len(rejected):
            chosen = chosen[:-1]
        else:
            rejected = rejected[:-1]
    return chosen, rejected


def decoder_pair(prompt: np.ndarray, chosen: np.ndarray, rejected: np.ndarray, *, bos: np.ndarray,
                 eos: int, seq_len: int) -> tuple[dict, int]:
    """(``{inputs, inputs_pair, inputs_loss_mask}`` `[n ≤ seq_len]` int32, tokens cut) of one pair
    for a decoder-only model; ``bos`` holds the BOS id or nothing."""
    c, r = np.append(chosen, eos), np.append(rejected, eos)
    c, r = _fit_responses(c, r, max(seq_len - 2 * len(bos), 0))
    keep = max((seq_len - len(c) - len(r)) // 2 - len(bos), 0)
    p = prompt[len(prompt) - min(keep, len(prompt)):]
    head = np.concatenate([bos, p])
    inputs = np.concatenate([head, c, head, r])
    pair = np.concatenate([np.ones(len(head) + len(c)), np.full(len(head) + len(r), 2)])
    mask = np.concatenate([np.zeros(len(head)), np.ones(len(c)), np.zeros(len(head)), np.ones(len(r))])
    cut = 2 * (len(bos) + len(prompt)) + len(chosen) + len(rejected) + 2 - len(inputs)
    return {"inputs": _i32(inputs), "inputs_pair": _i32(pair), "inputs_loss_mask": _i32(mask)}, cut


def seq2seq_pair(prompt: np.ndarray, chosen: np.ndarray, rejected: np.ndarray, *, eos: int,
                 seq_len: int, target_len: int) -> tuple[dict, int]:
    """(``{inputs, inputs_pair, targets, targets_pair}`` int32, tokens cut) of one pair for an
    encoder-decoder: the prompt (and its EOS) twice in ``seq_len``, the responses in
    ``target_len``."""
    keep = max(seq_len // 2 - 1, 0)
    p = np.append(prompt[len(prompt) - min(keep, len(prompt)):], eos)
    c, r = _fit_responses(np.append(chosen, eos), np.append(rejected, eos), target_len)
    out = {"inputs": _i32(np.concatenate([p, p])),
           "inputs_pair": _i32(np.concatenate([np.ones(len(p)), np.full(len(p), 2)])),
           "targets": _i32(np.concatenate([c, r])),
           "targets_pair": _i32(np.concatenate([np.ones(len(c)), np.full(len(r), 2)]))}
    cut = 2 * (len(prompt) - len(p) + 1) + len(chosen) + len(rejected) + 2 - len(c) - len(r)
    return out, cut
