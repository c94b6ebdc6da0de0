"""What the subcommands share: messages on stderr, and help texts used by more than one."""
from __future__ import annotations

import sys


def say(message: str) -> None:
    """A message for the person at the terminal (stderr), so that stdout holds only the output."""
    print(message, file=sys.stderr, flush=True)


DRAFT_VOCAB_HELP = ("the draft computes logits only for its first N token ids and its special tokens: a smaller "
                    "output layer, a faster draft step (default 65536; 0 = its whole vocabulary). The output "
                    "stays exact either way.")
