"""Token ids of greedy runs on the code prompts (128 tokens, the chat template), target alone and SLEM, as JSON:
to show that two versions of the runtime write the same tokens.

    python benchmarks/same_tokens.py BUNDLE OUT.json          # then compare two OUT files
"""
import json, sys
from edge_specdec.runtime import Pipeline, GenerationConfig
from edge_specdec.benchmark.prompt_set import load_prompt_set
pipe = Pipeline(sys.argv[1])
prompts = load_prompt_set()
out = {}
for cat in ("code_generation", "code_editing"):
    for p in prompts[cat]:
        ids = pipe.chat_prompt([{"role": "user", "content": p["text"]}])
        for alg in ("none", "slem"):
            out[f"{cat}/{p['name'] if 'name' in p else p.get('id')}/{alg}"] = pipe.generate(ids, GenerationConfig(max_new_tokens=128), algorithm=alg).token_ids
json.dump(out, open(sys.argv[2], "w"))
print(len(out))
