"""Checkpoint conversion: Hugging Face directories (GPT-2, BERT, ALBERT, RoBERTa, DistilBERT, T5 /
mT5, BART, Llama / Mistral / Qwen2) ↔ jaxformer configs and params.

`load_hf` / `save_hf` convert in memory (`from_hf`: straight to an NNX model); the jaxformer side
is a run directory (`jaxformer.checkpoint.save_params` / `load_params`);
``python -m jaxformer.cli.convert`` runs both directions from the command line.
"""

from jaxformer.convert.hf import from_hf, load_hf, param_shapes, save_hf
from jaxformer.convert.hf_io import is_hf_directory

__all__ = ["load_hf", "from_hf", "save_hf", "is_hf_directory", "param_shapes"]
