"""Evaluation beyond the training loss: classification reports and decoding scores (BLEU, chrF,
exact match), which the trainer uses. Scoring a finished run is `jaxformer.evaluate_run` (the
library side of ``python -m jaxformer.cli.evaluate``): it runs the trainer's eval step, so it sits above
`jaxformer.train`, outside this package."""

from jaxformer.evaluation.decoding import (
    DecodingExample,
    decode_prompts,
    decoding_examples,
    generation_config,
    score_decoding,
)
from jaxformer.evaluation.metrics import classification_report, exact_match, sequence_scores

__all__ = ["DecodingExample", "decode_prompts", "decoding_examples", "generation_config",
           "score_decoding", "classification_report", "exact_match", "sequence_scores"]
