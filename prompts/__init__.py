"""Prompt templates, one file each, filled with str.format."""

from pathlib import Path

_HERE = Path(__file__).parent


def load(name: str) -> str:
    return (_HERE / f"{name}.md").read_text()
