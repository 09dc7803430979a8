"""Make the committed TRL reference of the DPO loss (tests/data/golden/trl_dpo/reference.npz).

    PYTHONPATH=/work/venvs/trl_pkgs /work/venvs/hfcheck/bin/python tests/make_golden_trl.py

(trl installed with ``pip install --target /work/venvs/trl_pkgs trl accelerate datasets --no-deps``
plus the few modules datasets imports; torch and transformers are the live-HF tier's.)

TRL (1.16) has no standalone ``dpo_loss`` any more: the loss, its rewards and metrics are computed
inside ``DPOTrainer._compute_loss``. This script runs that very method, unbound, on a stand-in for
the trainer (the attributes it reads: β, the loss type, an identity ``accelerator``) and a stand-in
model whose output ``log_probs`` are fixed per-token log-probabilities (a leaf tensor, so
``backward`` gives TRL's gradient with respect to them); the reference's sequence log-probabilities
are given as precomputed (``precompute_ref_logps``), TRL's own path for them. Saved per case: the
per-token log-probabilities `[2N, T-1]` (chosen rows, then rejected), the completion mask `[2N, T]`,
the reference's ``ref_chosen_logps`` / ``ref_rejected_logps`` `[N]`, TRL's loss, its gradient and
its logged ``rewards/*`` and ``logps/*``. `tests/test_dpo.py` compares `jaxformer.objectives.dpo`
with them, without torch.
"""

from __future__ import annotations

import collections
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
import trl
from trl.trainer.dpo_trainer import DPOTrainer

OUT = Path(__file__).resolve().parent / "data" / "golden" / "trl_dpo"
CASES = {"sigmoid_beta0.1": ("sigmoid", 0.1), "sigmoid_beta0.5": ("sigmoid", 0.5),
         "ipo_beta0.3": ("ipo", 0.3)}
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected")


def _inputs(seed: int, n: int = 6, length: int = 12) -> dict[str, np.ndarray]:
    """2n rows (n chosen, then n rejected): a prompt of 2–5 tokens, then a completion to a random end."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((2 * n, length), np.int64)
    for row in range(2 * n):
        start, end = rng.integers(2, 6), rng.integers(7, length + 1)
        mask[row, start:end] = 1
    token_logps = rng.normal(-2.0, 1.0, (2 * n, length - 1)) * mask[:, 1:]  # TRL: 0 off completion
    return {"completion_mask": mask, "token_logps": token_logps,
            "ref_chosen_logps": rng.normal(-18.0, 4.0, n), "ref_rejected_logps": rng.normal(-18.0, 4.0, n)}


def trl_dpo(inputs: dict[str, np.ndarray], loss_type: str, beta: float) -> dict[str, np.ndarray]:
    """TRL's ``DPOTrainer._compute_loss`` on ``inputs``: its loss, gradient and metrics."""
    logps = torch.tensor(inputs["token_logps"], dtype=torch.float64, requires_grad=True)
    zeros = torch.zeros_like(logps)
    model = lambda **kw: types.SimpleNamespace(log_probs=logps, entropy=zeros, mean_logits=zeros,
                                               is_top1=zeros.bool())
    model.training = True
    accelerator = types.SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x,
                                        gather=lambda x: x)
    metrics = collections.defaultdict(lambda: collections.defaultdict(list))
    trainer = types.SimpleNamespace(
        model=model, accelerator=accelerator, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[loss_type],
        loss_weights=[1.0], beta=beta, use_weighting=False, _metrics=metrics,
        _total_train_tokens=0, _tp_size=1)
    mask = torch.tensor(inputs["completion_mask"])
    batch = {"input_ids": torch.ones_like(mask), "attention_mask": torch.ones_like(mask),
             "completion_mask": mask,
             "ref_chosen_logps": torch.tensor(inputs["ref_chosen_logps"], dtype=torch.float64),
             "ref_rejected_logps": torch.tensor(inputs["ref_rejected_logps"], dtype=torch.float64)}
    loss = DPOTrainer._compute_loss(trainer, model, batch, False)
    loss.backward()
    out = {"loss": np.float64(loss.item()), "grad": logps.grad.numpy()}
    out.update({k.replace("/", "_"): np.float64(metrics["train"][k][-1]) for k in METRICS})
    return out


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for i, (name, (loss_type, beta)) in enumerate(CASES.items()):
        inputs = _inputs(seed=i)
        arrays.update({f"{name}/{k}": v for k, v in {**inputs, **trl_dpo(inputs, loss_type, beta),
                                                      "beta": np.float64(beta)}.items()})
    np.savez(OUT / "reference.npz", **arrays)
    (OUT / "MANIFEST.json").write_text(json.dumps(
        {"trl": trl.__version__, "torch": torch.__version__, "cases": CASES,
         "command": "PYTHONPATH=/work/venvs/trl_pkgs /work/venvs/hfcheck/bin/python "
                    "tests/make_golden_trl.py"}, indent=1) + "\n")
    print(f"wrote {len(CASES)} cases to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
