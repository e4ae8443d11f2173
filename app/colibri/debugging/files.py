"""Atomic writes for the debugger's outputs: see colibri.files (the one implementation)."""

from colibri.files import atomic_write

__all__ = ["atomic_write"]
