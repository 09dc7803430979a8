"""The end-to-end demo behind ``make demo``: for each family, pretrain on unlabelled text, then
fine-tune on scarce labelled data from that checkpoint and from random init — each init's own
learning rate, several seeds — and report pretrained vs scratch (mean ± SE), CPU-sized.

Not part of the installed library: it lives beside ``configs/`` (which it reads) in the source
tree and needs the ``[demo]`` extra (matplotlib, scikit-learn). From the repository
root::

    pip install -e '.[demo]'
    python -m demo [--workdir runs/demo] [--seeds 3] [--no_tune] [--full] [--only gpt,bert,t5]

(`make demo` runs it with the Makefile's ``DEMO_ARGS``.)

Writes ``demo_results/results.json``, ``results.md`` and ``curves.png``. `run_demo` is the same
from Python, with config overrides (tests run it with tiny models).
"""

from demo.main import FAMILIES, run_demo
from demo.settings import DemoSettings

__all__ = ["DemoSettings", "FAMILIES", "run_demo"]
