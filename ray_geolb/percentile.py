"""The project's one percentile definition (no Ray import).

Every reported percentile (simulator metrics, the demo, the benchmarks) is numpy's default
``method="linear"``: with the ``n`` values sorted, the q-th percentile sits at rank
``(n - 1) * q / 100`` and is interpolated linearly between the two closest ranks (type 7 of
Hyndman and Fan, R's and Excel's ``PERCENTILE.INC`` default). It is not nearest-rank: the median
of ``[1, 2, 3, 4]`` is 2.5.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import numpy as np

__all__ = ["percentile"]


def percentile(xs: Sequence[float], q: Union[float, Sequence[float]]
               ) -> Union[Optional[float], List[Optional[float]]]:
    """The ``q``-th percentile(s) of ``xs`` (``0 <= q <= 100``) by linear interpolation.

    ``q`` a number gives a float, ``q`` a sequence a list of floats (same order). Empty ``xs``
    gives ``None`` (one per requested percentile).
    """
    a = np.asarray(xs, dtype=float)
    if a.size == 0:
        return None if np.ndim(q) == 0 else [None] * len(q)
    r = np.percentile(a, q, method="linear")
    return float(r) if np.ndim(r) == 0 else [float(v) for v in r]
