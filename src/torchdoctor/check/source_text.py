"""Source text as the interpreter reads it: decoding bytes (BOM, coding cookie, UTF-8)."""

from __future__ import annotations

import io
import tokenize


def source_encoding(data: bytes) -> str:
    """The encoding Python reads `data` with: BOM, then a coding cookie, else UTF-8.

    A cookie naming a codec this interpreter does not know (`# -*- coding:
    future_fstrings -*-`, a codec a `.pth` file registers at start-up to rewrite the
    source) is read as UTF-8: those codecs decode UTF-8 text, and the file is
    checked as written rather than reported as undecodable.
    """
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if not str(exc.msg).startswith("unknown encoding"):
            raise
        return "utf-8"
    return encoding


def decode_source(data: bytes) -> str:
    """Decode Python source like the interpreter does (BOM, coding cookie, UTF-8)."""
    return data.decode(source_encoding(data)).removeprefix("\ufeff")
