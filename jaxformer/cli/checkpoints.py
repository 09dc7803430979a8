"""Command line: list a training run's checkpoints, verified, with their metrics; remove the damaged.

    python -m jaxformer.cli.checkpoints --workdir runs/gpt                    # list
    python -m jaxformer.cli.checkpoints --workdir runs/gpt --remove-damaged   # and delete <step>.damaged

Each step of ``<workdir>/checkpoints`` is checked against its manifest of checksums
(`jaxformer.checkpoint.verify.verify_step`, as a resume does) and shown with the metrics saved with it
(or its ``metrics.jsonl`` row). Steps a resume set aside as ``<step>.damaged`` are listed with what
is wrong with them, and interrupted saves (``<step>.orbax-checkpoint-tmp…``, removed by the run's
next save) as such. ``--remove-damaged`` deletes the ``.damaged`` directories, holding the
workdir's lock (`jaxformer.checkpoint.lock`), so never under a running trainer.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from jaxformer.checkpoint.lock import WorkdirBusy, WorkdirLock
from jaxformer.checkpoint.run_files import workdir_hint
from jaxformer.checkpoint.select import committed_steps, saved_metrics
from jaxformer.checkpoint.verify import CheckpointDamaged, verify_step
from jaxformer.cli import FAILED, REFUSED, error_line

SHOWN = ("loss", "accuracy")  # train metrics listed, besides every eval_* one


def damaged_dirs(ckpt_dir: Path) -> list[Path]:
    """``<step>.damaged`` and ``<step>.damaged-<n>`` directories (`Checkpointer.set_aside`)."""
    return sorted(p for p in ckpt_dir.glob("*.damaged*") if p.is_dir())


def state_of(step_dir: Path) -> str:
    """"intact (<MB> verified)", "unverified (…)" for a step older than manifests, or
    "damaged: <the first bad file>"."""
    try:
        manifest = verify_step(step_dir, ("state", "data"))
    except CheckpointDamaged as e:
        return f"damaged: {e.problem}"
    if manifest is None:
        return "unverified (written before checkpoints carried checksums)"
    return f"intact ({manifest['verified']['bytes'] / 1e6:.1f} MB verified)"


def listing(workdir: Path) -> list[str]:
    """One line per step, set-aside step and interrupted save of ``workdir``'s checkpoints."""
    ckpt_dir = workdir / "checkpoints"
    steps = committed_steps(ckpt_dir)
    metrics = saved_metrics(ckpt_dir, steps)
    lines = [f"{ckpt_dir}: {len(steps)} step(s)"]
    for step in steps:
        shown = {k: v for k, v in metrics[step].items()
                 if (k in SHOWN or k.startswith("eval_")) and isinstance(v, (int, float))}
        values = "  ".join(f"{k}={v:.4g}" for k, v in shown.items())
        lines.append(f"  {step:>8}  {state_of(ckpt_dir / str(step))}" + (f"  {values}" if values
                                                                       else ""))
    for path in damaged_dirs(ckpt_dir):
        lines.append(f"  {path.name:>8}  set aside by a resume, never read: "
                     f"{state_of(path).removeprefix('damaged: ')} (--remove-damaged deletes it)")
    for path in sorted(ckpt_dir.glob("*.orbax-checkpoint-tmp*")):
        lines.append(f"  {path.name:>8}  an interrupted save (the run's next save removes it)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxformer.cli.checkpoints", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="training workdir (holds checkpoints/)")
    ap.add_argument("--remove-damaged", action="store_true",
                    help="delete the <step>.damaged directories a resume set aside")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir)
    if not (workdir / "checkpoints").is_dir():
        print(error_line(ap.prog, f"{workdir / 'checkpoints'} is not a directory: is {str(workdir)!r} "
                         f"a training workdir?{workdir_hint(workdir)}"), file=sys.stderr)
        return REFUSED
    print("\n".join(listing(workdir)))
    if args.remove_damaged:
        try:
            lock = WorkdirLock(workdir).acquire()
        except WorkdirBusy as e:
            print(error_line(ap.prog, e), file=sys.stderr)
            return FAILED
        try:
            for path in damaged_dirs(workdir / "checkpoints"):
                shutil.rmtree(path)
                print(f"removed {path}")
        finally:
            lock.release(undo=True)  # leaves no .lock behind that was not there
    return 0


def run() -> None:
    """The console script (`[project.scripts]`): exits with `main`'s status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
