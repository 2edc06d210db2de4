"""Source text as the interpreter reads it: decoding bytes (BOM, coding cookie, UTF-8)."""

from __future__ import annotations

import io
import tokenize


def decode_source(data: bytes) -> str:
    """Decode Python source like the interpreter does (BOM, coding cookie, UTF-8)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    text = data.decode(encoding)
    return text.removeprefix("\ufeff")
