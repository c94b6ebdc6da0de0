"""The server's counters, gauges and histograms, written in Prometheus' text format (no client library)."""
from __future__ import annotations

import bisect
import threading
from typing import Callable, Optional

PREFIX = "edge_specdec_"
# seconds: from a request's arrival to its first token, and between output tokens
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        for j in range(i, len(self.buckets)):
            self.counts[j] += 1
        self.sum += value
        self.count += 1


class Metrics:
    """What /metrics reports. Counters only grow; gauges are read when scraped (gauges: name -> (help, function)),
    and so are the counters others keep (read_counters, the same form: the engine's batched calls)."""

    COUNTERS = {
        "requests_total": "requests answered, by endpoint and outcome (ok, cancelled, rejected = queue full, "
                          "client_error, server_error)",
        "prompt_tokens_total": "prompt tokens of completed requests",
        "prompt_tokens_reused_total": "prompt tokens whose KV a slot kept from its earlier requests (not prefilled)",
        "prompt_tokens_prefilled_total": "prompt tokens the target prefilled",
        "slot_prefix_hits_total": "requests whose slot's cache shared a prefix with their prompt",
        "prefix_store_hits_total": "requests whose slot got its cache from the prefix store (--prefix-cache-mb)",
        "prefix_store_evictions_total": "caches the prefix store dropped to stay within its bound",
        "connections_timed_out_total": "connections closed for sending no request head within --idle-timeout "
                                       "(phase idle), and requests whose body did not arrive within --body-timeout "
                                       "(phase body: answered 408)",
        "generation_tokens_total": "tokens generated",
        "draft_tokens_proposed_total": "tokens the drafter proposed to the target",
        "draft_tokens_accepted_total": "proposed tokens the target accepted",
        "target_passes_total": "target model passes (each verifies one proposal and adds one token of its own)",
    }

    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]],
                 read_counters: Optional[dict[str, tuple[str, Callable[[], float]]]] = None):
        self._lock = threading.Lock()
        self.read_counters = read_counters or {}
        self.counters: dict[str, dict[tuple, float]] = {name: {} for name in self.COUNTERS}
        self.histograms = {"time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
                           "time_per_output_token_seconds": Histogram(TPOT_BUCKETS)}
        self.gauges = gauges

    def count(self, name: str, value: float = 1, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self.counters[name][key] = self.counters[name].get(key, 0) + value

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self.histograms[name].observe(value)

    def value(self, name: str, **labels: str) -> float:
        return self.counters[name].get(tuple(sorted(labels.items())), 0)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name, help_text in self.COUNTERS.items():
                lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} counter"]
                for key, value in sorted(self.counters[name].items()) or [((), 0)]:
                    lines.append(f"{PREFIX}{name}{_labels(key)} {_number(value)}")
            for kind, read_at_scrape in (("counter", self.read_counters), ("gauge", self.gauges)):
                for name, (help_text, read) in read_at_scrape.items():
                    lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}",
                              f"{PREFIX}{name} {_number(read())}"]
            for name, h in self.histograms.items():
                lines += [f"# HELP {PREFIX}{name} {name.replace('_', ' ')}", f"# TYPE {PREFIX}{name} histogram"]
                for bound, count in zip(h.buckets, h.counts):
                    lines.append(f'{PREFIX}{name}_bucket{{le="{bound}"}} {count}')
                lines += [f'{PREFIX}{name}_bucket{{le="+Inf"}} {h.count}', f"{PREFIX}{name}_sum {h.sum!r}",
                          f"{PREFIX}{name}_count {h.count}"]
        return "\n".join(lines) + "\n"


def _labels(key: tuple) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in key) + "}" if key else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
