"""The algorithm registry: one table that the Pipeline, `auto`, the CLI and the benchmark read."""
from __future__ import annotations

import pytest

from edge_specdec.cli import build_parser
from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.algorithms import ALGORITHMS, REGISTRY, benchmark_algorithms
from support import OTHER_VOCAB


def test_the_cli_offers_exactly_the_registry():
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions
               if "--algorithm" in a.option_strings)
    assert tuple(run.choices) == ALGORITHMS == ("auto", *REGISTRY)


@pytest.mark.parametrize("relation", ["identical", "heterogeneous", "target-only"])
def test_benchmark_rows_serve_their_relation(relation):
    names = benchmark_algorithms(relation)
    assert names and all(relation in REGISTRY[n].relations for n in names)
    assert names[-1] == "suffix"  # the rows with a draft model come first


@pytest.mark.slow
def test_each_algorithm_runs_where_it_serves_and_reports_its_drafters_statistics(bundle_dir):
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    config = GenerationConfig(max_new_tokens=8, ignore_eos=True, temperature=0.7, top_k=5, seed=3)
    for name, entry in REGISTRY.items():
        if "heterogeneous" not in entry.relations:
            with pytest.raises(EdgeSpecdecError, match=name):
                pipe.generate("def f(", config, algorithm=name)
            continue
        result = pipe.generate("def f(", config, algorithm=name)
        assert result.extra["algorithm"] == name and len(result.token_ids) == 8
        assert ("free_rounds" in result.extra) == entry.needs_draft  # FreeFirst wraps a draft model's drafter
        assert ("slrs_rounds" in result.extra) == (name == "slrs")
