"""The training config: an ``ml_collections.ConfigDict`` on the command line, a typed schema behind it.

Every ``configs/<name>.py`` starts from `base_config()` and overrides what it needs; any key can be
overridden on the command line (``train.py --config configs/X.py --config.optimizer.peak_lr=3e-4``)
and ``--print_config`` lists every key with its value and description. One module per purpose:

- `jaxformer.train.config.schema`: every section and key, declared once with its type, default,
  one-line doc, check and kind (`jaxformer.settings`); `base_config`, `check_schema`, `key_docs`;
  `TrainSettings`, the typed sections the run reads (`train_settings`, and `run_settings` of an
  old run's ``config.json``).
- `jaxformer.train.config.loading`: a config file, overrides, the absl ``--config`` flag.
- `jaxformer.train.config.validation`: the checks before anything compiles (each key alone by
  the schema, then the rules between keys and sections).
- `jaxformer.train.config.resume`: which keys a resumed run may change (from the keys' kinds).
- `jaxformer.train.config.printing`: ``--print_config``.

The names most code needs are re-exported here.
"""

from jaxformer.train.config.loading import (
    complete_config,
    config_node,
    define_config_flag,
    load_config,
    set_key,
    split_list_options,
)
from jaxformer.train.config.resume import check_resume
from jaxformer.train.config.schema import (
    HF_NAMES,
    LEGACY_KEYS,
    PARALLEL_MODES,
    TrainSettings,
    base_config,
    check_schema,
    key_docs,
    model_defaults,
    run_settings,
    schema,
    train_settings,
)
from jaxformer.train.config.validation import (
    check_config,
    check_context_parallel,
    check_vocabulary,
    position_lengths,
    validate_config,
    with_derived_model_fields,
)

__all__ = [
    "HF_NAMES", "LEGACY_KEYS", "PARALLEL_MODES", "TrainSettings", "base_config", "check_config",
    "check_context_parallel", "check_resume", "check_schema", "check_vocabulary", "complete_config",
    "config_node", "define_config_flag", "key_docs", "load_config", "model_defaults",
    "position_lengths", "run_settings", "schema", "set_key", "split_list_options",
    "train_settings", "validate_config", "with_derived_model_fields",
]
