"""Conversions and views: to(dtype), type_as, expand."""

from __future__ import annotations
