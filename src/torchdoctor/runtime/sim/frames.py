"""Which stack frames belong to the user (not torch, torchdoctor or the standard library)."""

from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType

import torch

import torchdoctor


def _dir(path: str) -> str:
    return os.path.normcase(os.path.dirname(os.path.abspath(path))) + os.sep


_PACKAGES = (_dir(torch.__file__), _dir(torchdoctor.__file__))
_STDLIB = os.path.normcase(os.path.abspath(sysconfig.get_paths()["stdlib"])) + os.sep
_cache: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    hit = _cache.get(filename)
    if hit is None:
        norm = os.path.normcase(os.path.abspath(filename))
        if filename.startswith(("<frozen", "<built-in")) or norm.startswith(_PACKAGES):
            hit = False
        elif norm.startswith(_STDLIB):
            hit = "site-packages" in norm or "dist-packages" in norm
        else:
            hit = True
        _cache[filename] = hit
    return hit


def user_frame(start: FrameType | None = None) -> FrameType | None:
    """The innermost frame of user code above `start` (default: the caller)."""
    frame: FrameType | None = start if start is not None else sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def user_site(what: str, depth: int = 2) -> tuple[str, int, str, str] | None:
    """(file, line, what, function) of the innermost user frame: where a tensor was made."""
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return (code.co_filename, frame.f_lineno, what, code.co_name)
        frame = frame.f_back
    return None
