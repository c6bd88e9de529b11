"""Embedded sources that need no download.

The text corpus is the Python documentation that ships inside every CPython
(`pydoc_data.topics`: one document per help topic); the images are the 8x8 handwritten
digits that ship inside scikit-learn.
"""
from __future__ import annotations

from typing import List


def pydoc_documents() -> List[str]:
    """The help topics of this CPython, in a stable (sorted) order, one string each."""
    from pydoc_data.topics import topics

    return [topics[k].strip() for k in sorted(topics) if topics[k].strip()]
