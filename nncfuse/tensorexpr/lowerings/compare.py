"""Comparisons and selection: eq, ne, lt, le, gt, ge, isnan, logical_not, where, masked_fill,
maximum, minimum, max/min (binary), clamp, clamp_min, clamp_max."""

from __future__ import annotations
