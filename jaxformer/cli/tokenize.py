"""Command line: tokenize a run's data source once, into sharded ArrayRecord files of token ids.

    jaxformer-tokenize --config configs/gpt_pretrain_tiny.py --out data/shakespeare_tokens \\
        [--splits train,validation] [--shards 8] [--processes 4] [--config.data.source=…]

The source is the config's ``data.source`` (overrides as for ``jaxformer-train``); the tokenizer is
the run's: ``data.tokenizer.path``, or else one trained on the train split exactly as the trainer
would, saved as ``<out>/tokenizer.model``. Then train from the shards, with no tokenizer on the input
path (`jaxformer.data.token_shards`):

    jaxformer-train --config configs/gpt_pretrain_tiny.py --workdir runs/gpt \\
        --config.data.source=tokens:data/shakespeare_tokens \\
        --config.data.tokenizer.path=data/shakespeare_tokens/tokenizer.model
"""

from __future__ import annotations

import sys
import time

from absl import flags

from jaxformer.cli import exit_with_error, run_absl
from jaxformer.cli.train import config_first
from jaxformer.data.pipeline import DataSettings
from jaxformer.data.sources import get_source, source_splits, source_texts
from jaxformer.data.token_shards import write_token_shards
from jaxformer.data.tokenizer import load_or_train_tokenizer
from jaxformer.settings import read
from jaxformer.train.config import define_config_flag


def define_flags() -> None:
    define_config_flag("config")
    flags.declare_key_flag("config")
    flags.DEFINE_string("out", None, "directory to write the shards, manifest.json and "
                        "tokenizer.model into")
    flags.DEFINE_list("splits", None, "splits to tokenize (default: every split the source has)")
    flags.DEFINE_integer("shards", 4, "ArrayRecord files per split")
    flags.DEFINE_integer("processes", 1, "worker processes tokenizing shards in parallel")


def main(argv) -> None:
    del argv
    prog = "jaxformer-tokenize"
    config, out = flags.FLAGS.config, flags.FLAGS.out
    if config is None or out is None:
        exit_with_error(prog, "--config (the run's configs/<name>.py) and --out (a directory) are "
                        "required")
    try:
        data = read(DataSettings, config.data)
        if data.source.startswith(("tokens:", "mix:")):
            raise ValueError(f"data.source={data.source!r}: tokenize each text source of a mixture "
                             "on its own; shards are made from text")
        splits = flags.FLAGS.splits or source_splits(data) or ["train", "validation"]
        tokenizer = load_or_train_tokenizer(data.tokenizer, None,
                                            lambda: source_texts(get_source(data, "train")))
        t0 = time.perf_counter()
        manifest = write_token_shards(data, tokenizer, out, splits, num_shards=flags.FLAGS.shards,
                                      processes=flags.FLAGS.processes)
    except (ValueError, FileNotFoundError) as e:
        exit_with_error(prog, e)
    dt = time.perf_counter() - t0
    for split, s in manifest["splits"].items():
        print(f"{split}: {s['records']:,} records, {s['tokens']:,} tokens in {len(s['shards'])} "
              f"shards")
    print(f"wrote {out} ({manifest['dtype']} ids, tokenizer sha256 "
          f"{manifest['tokenizer_sha256'][:12]}…) in {dt:.1f}s; train with "
          f"--config.data.source=tokens:{out} --config.data.tokenizer.path={out}/tokenizer.model")


def run() -> None:
    """The console script (`[project.scripts]`)."""
    define_flags()
    sys.argv = config_first(sys.argv)
    run_absl(main, __name__, prog="jaxformer-tokenize")


if __name__ == "__main__":
    run()
