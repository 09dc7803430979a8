"""Reader for CrossWire SWORD ``zText`` Bible modules (KJV versification) and OSIS clean-up.

zText files of one testament ``<t>`` (``ot`` or ``nt``), all integers little-endian:

- ``<t>.bzs`` block index, 12 bytes per block: uint32 offset into ``.bzz``, uint32 compressed
  size, uint32 uncompressed size.
- ``<t>.bzv`` verse index, 10 bytes per entry: uint32 block number, uint32 start offset inside
  the uncompressed block, uint16 length in bytes (UTF-8 for these modules).
- ``<t>.bzz`` the blocks, each a zlib stream (``BlockType=BOOK``: one block per book).

The verse index follows the versification: entry 0 is the module heading, 1 the testament
heading, then for every book one book-introduction entry and for every chapter one
chapter-heading entry followed by one entry per verse.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping

import numpy as np

from jaxformer.data.builders.kjv_versification import BOOKS, NUM_OT_BOOKS, Book

_BZS = np.dtype([("offset", "<u4"), ("compressed", "<u4"), ("size", "<u4")])
_BZV = np.dtype([("block", "<u4"), ("start", "<u4"), ("length", "<u2")])


def testament_layout(books: tuple[Book, ...]) -> list[str | None]:
    """Verse-index entries of one testament: the OSIS id of each verse, None for headings."""
    layout: list[str | None] = [None, None]  # module heading, testament heading
    for book in books:
        layout.append(None)  # book introduction
        for chapter, n in enumerate(book.verses, 1):
            layout.append(None)  # chapter heading
            layout.extend(f"{book.osis}.{chapter}.{v}" for v in range(1, n + 1))
    return layout


def read_testament(files: Mapping[str, bytes], prefix: str) -> list[str]:
    """All verse-index entries of one testament, decoded; ``prefix`` is e.g. ``.../ot``."""
    blocks_index = np.frombuffer(files[prefix + ".bzs"], dtype=_BZS)
    verse_index = np.frombuffer(files[prefix + ".bzv"], dtype=_BZV)
    compressed = files[prefix + ".bzz"]
    blocks: dict[int, bytes] = {}
    entries = []
    for block, start, length in verse_index.tolist():
        if length == 0:
            entries.append("")
            continue
        if block not in blocks:
            offset, size, expected = blocks_index[block].tolist()
            blocks[block] = zlib.decompress(compressed[offset:offset + size])
            if len(blocks[block]) != expected:
                raise ValueError(f"{prefix}.bzz block {block}: {len(blocks[block])} bytes after "
                                 f"decompression, the .bzs index says {expected}")
        entries.append(blocks[block][start:start + length].decode("utf-8"))
    return entries


def read_module(files: Mapping[str, bytes], module_dir: str) -> dict[str, str]:
    """``{OSIS verse id: OSIS markup}`` of a zText module with KJV versification (31,102)."""
    verses: dict[str, str] = {}
    for testament, books in (("ot", BOOKS[:NUM_OT_BOOKS]), ("nt", BOOKS[NUM_OT_BOOKS:])):
        entries = read_testament(files, f"{module_dir.rstrip('/')}/{testament}")
        layout = testament_layout(books)
        if len(entries) != len(layout):
            raise ValueError(f"{module_dir}/{testament}.bzv has {len(entries)} entries; the KJV "
                             f"versification has {len(layout)}: not a KJV-versified module")
        verses.update((key, text) for key, text in zip(layout, entries) if key is not None)
    return verses


# Elements removed with their content: notes (footnotes, cross references) and non-canonical
# titles (book titles, section headings, Psalm 119's acrostic letters). Canonical titles (the
# Psalm superscriptions, part of the verse in both the English and the Spanish text) are kept.
_REMOVE = re.compile(
    r"<note\b[^>]*>.*?</note>|<title\b(?![^>]*canonical=\"true\")[^>]*>.*?</title>", re.S)
# Removed elements, milestones and block boundaries become a space; any other tag is dropped,
# its text kept (<w lemma=…>word</w>, <transChange>, <divineName>, <q>, <seg>, <foreign>).
_BREAK = re.compile(r"<(?:l|lg|lb|p|div|chapter|milestone|verse|title)\b[^>]*>"
                    r"|</(?:l|lg|p|title)>")
_TAG = re.compile(r"<[^>]*>")
_STRONGS = re.compile(r"\blemma=\"([^\"]*)\"")
_STRONGS_ID = re.compile(r"strong:([HG]\d+)|\b([HG]\d+)\b")


def osis_to_text(markup: str) -> str:
    """Plain verse text of OSIS markup: notes removed, tags stripped, pilcrows and XML
    entities resolved, whitespace collapsed."""
    text = _TAG.sub("", _BREAK.sub(" ", _REMOVE.sub(" ", markup)))
    text = text.replace("¶", " ").replace("&lt;", "<").replace("&gt;", ">")
    text = text.replace("&quot;", '"').replace("&apos;", "'").replace("&amp;", "&")
    return " ".join(text.split())


def strongs_numbers(markup: str) -> frozenset[str]:
    """Strong's numbers (``H7225``, ``G2424``) of the ``<w lemma="strong:…">`` tags."""
    return frozenset(a or b for lemma in _STRONGS.findall(markup)
                     for a, b in _STRONGS_ID.findall(lemma))
