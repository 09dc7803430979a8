"""Evaluation beyond the training loss: classification reports, decoding scores (BLEU, chrF, exact
match), and scoring a finished run (`jaxformer.evaluate_run`, the library side of
``python -m jaxformer.evaluate``; import it from there: it reads checkpoints, so it sits above
`jaxformer.train`, which uses this package's metrics)."""

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
