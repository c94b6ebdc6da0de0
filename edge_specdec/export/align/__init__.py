"""`edge-specdec align`: fine-tune a bundle's draft on its target's own text, and write an aligned bundle.

    from edge_specdec.export.align import align_bundle, AlignSettings
    align_bundle("bundles/qwen-smol", "bundles/qwen-smol-aligned", AlignSettings(minutes=60))

The export stage (torch and transformers train the draft). One module per job: prompts.py (what is trained on and
what is held out), generate.py (the target's continuations), train.py (the fine-tuning), evaluate.py (acceptance
before and after), assemble.py (the re-export and the new bundle), work.py (the resumable work folder and the
budget), run.py (the stages in order). How it works and what it records: docs/align.md.
"""
from .run import AlignSettings, align_bundle, default_work
from .train import TrainSettings
from .work import STAGES

__all__ = ["align_bundle", "AlignSettings", "TrainSettings", "STAGES", "default_work"]
