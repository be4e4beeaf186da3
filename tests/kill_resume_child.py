"""The child that ``tests/monitor/test_kill_resume.py`` kills with SIGKILL and resumes.

    python tests/kill_resume_child.py OUT [resume]

Trains a tiny GRPOTrainer for ``STEPS`` steps with an ``LLDMonitor`` on ``OUT/run``, a checkpoint
every step in ``OUT/trainer``, and a pause at the start of each step (so that a kill lands at a
random moment of a run in progress). ``resume``: the monitor continues ``OUT/run`` and training
resumes from the last checkpoint.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

STEPS = 10
PAUSE_S = 0.3


def main(out: str, mode: str = "fresh") -> None:
    from lld_grpo_script import make_grpo_trainer
    from transformers import TrainerCallback

    from lld_monitor import LLDMonitor

    class Pause(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            time.sleep(PAUSE_S)

    root = Path(out)
    resume = mode == "resume"
    monitor = LLDMonitor(root / "run", resume=resume, probe_fraction=1.0)
    trainer = make_grpo_trainer(
        root / "trainer",
        max_steps=STEPS,
        steps_per_generation=2,
        save_strategy="steps",
        save_steps=1,
        callbacks=[Pause()],
    )
    monitor.attach(trainer)
    trainer.train(resume_from_checkpoint=True if resume else None)


if __name__ == "__main__":
    main(*sys.argv[1:])
