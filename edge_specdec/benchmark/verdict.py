"""How a measured speedup over the target alone is told to a user: `run --compare`, `check` and `bench` say it alike.

Three cases. A run in which no round drafted (the drafting guard ran the target alone throughout) compared the
target alone with itself: its ratio is noise, so no ratio is printed, only that drafting loses here. A ratio
within the noise band of the measurement reads "no measurable difference". Any other ratio is printed as it is.
The noise band is the measured spread of paired ratios where there are enough of them (half the distance between
their quartiles), else NOISE_BAND: two runs of the same decoder on a shared CPU differ by about that much.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..runtime.generate import TARGET_ALONE_THROUGHOUT
from .stats import quantile

NOISE_BAND = 0.10  # relative: a ratio between 0.9 and 1.1 is no measured difference without a spread of its own
MIN_RATIOS_FOR_SPREAD = 3  # fewer paired ratios than this give no spread worth the name
NO_DIFFERENCE = "no measurable difference"


def noise_band(ratios: Sequence[float] = ()) -> float:
    """The relative band around 1 within which a median ratio is noise: half the distance between the quartiles
    of the paired ratios when there are at least MIN_RATIOS_FOR_SPREAD of them, else NOISE_BAND."""
    if len(ratios) < MIN_RATIOS_FOR_SPREAD:
        return NOISE_BAND
    return (quantile(list(ratios), 0.75) - quantile(list(ratios), 0.25)) / 2


def speedup_verdict(ratio: Optional[float], drafted: bool, ratios: Sequence[float] = ()) -> str:
    """What a speedup measurement says, in words: TARGET_ALONE_THROUGHOUT when nothing was drafted (the ratio is
    then not printed), NO_DIFFERENCE within the noise band (see noise_band), else the ratio as "1.23x"."""
    if not drafted:
        return TARGET_ALONE_THROUGHOUT
    if ratio is None:
        return "-"
    band = noise_band(ratios)
    if abs(ratio - 1.0) <= band:
        return f"{NO_DIFFERENCE} (within +-{100 * band:.0f} %)"
    return f"{ratio:.2f}x"
