"""Go/no-go for a two-branch tree from the draft model's top two at its first drafted position.

Runs the default (`auto`: SLEM on a pair of other vocabularies) greedily without the clock or the guard on the
package's 20 prompts (each in the target's chat template), records at every draft-model round the draft's second
most likely token at its first position, and counts the rounds whose first drafted token the target rejected but
whose second choice spells the target's token: with that branch verified in the same call, each such round would
keep at least one token more. Prints the count and the share of the output it is (an upper bound: the second
branch taken as free, which it is not: it needs at least two tokens and a draft step of its own).

    python benchmarks/tree_draft_top2.py BUNDLE
"""
from __future__ import annotations

import json
import sys

import numpy as np

from edge_specdec.runtime import Engine, GenerationConfig, heterogeneous

PROMPTS = "edge_specdec/benchmark/prompts.json"


def main(bundle: str) -> None:
    engine = Engine(bundle)
    categories = json.load(open(PROMPTS))["categories"]
    prompts = [p["text"] for ps in categories.values() for p in ps]
    target_pieces, draft_pieces = engine.vocab_map.target, engine.vocab_map.draft
    rounds = []
    original = heterogeneous.SLEMDrafter.slem_round

    def slem_round(self, sequence, row, k):  # records the round's place, first token and the draft's second choice
        proposal = original(self, sequence, row, k)
        shaped = self.shape(row)
        if shaped is not None and proposal.tokens:
            second = int(np.argsort(-shaped)[1])
            rounds.append((len(sequence), proposal.tokens[0], draft_pieces.piece(second) or b""))
        return proposal
    heterogeneous.SLEMDrafter.slem_round = slem_round

    config = GenerationConfig(max_new_tokens=64, temperature=0.0).with_defaults(engine.default_config)
    tokens = passes = model_rounds = rejected = rescued = 0
    for text in prompts:
        ids = engine.chat_prompt([{"role": "user", "content": text}])
        rounds.clear()
        result = engine.session().generate(ids, config, algorithm="auto", clock=False, guard=False, pool_scope=None)
        sequence = ids + list(result.token_ids)
        for at, first, second in rounds:
            if at >= len(sequence):
                continue
            model_rounds += 1
            if first != sequence[at]:
                rejected += 1
                rescued += second.startswith(target_pieces.piece(sequence[at]) or b"\0")
        tokens += result.stats.new_tokens
        passes += result.stats.target_passes
    print(f"{len(prompts)} prompts: {tokens} tokens in {passes} target passes; {model_rounds} draft-model rounds, "
          f"{rejected} with the first drafted token rejected, {rescued} of them spelled by the draft's second "
          f"choice: +{rescued / tokens:.1%} of the output at most")


if __name__ == "__main__":
    main(sys.argv[1])
