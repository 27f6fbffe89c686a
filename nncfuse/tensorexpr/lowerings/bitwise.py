"""Bitwise ops: and, or, xor, not, shifts."""

from __future__ import annotations
