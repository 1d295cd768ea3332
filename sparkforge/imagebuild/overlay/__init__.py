"""Overlay images: a verified image plus a reviewed series of Python-only patches (docs/overlays.md)."""
