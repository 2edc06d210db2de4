"""What a checkpoint file is, judged from its bytes alone: nothing in it is executed.

`load_checkpoint` asks this module why `torch.load` failed instead of reading torch's
error text, whose wording changes between versions (torch 2.13 says "unsupported GLOBAL
posix.system" where older versions said "Unsupported global"). The file's layout decides:
a zip archive with a `data.pkl` record (torch.save since 1.6), the legacy format (a chain
of pickles), a plain pickle, safetensors, or something else; whether its structure is
complete; and which globals its pickles name, read opcode by opcode with
`pickletools.genops`, which parses a pickle without running it.
"""

from __future__ import annotations

import io
import pickletools
import re
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

# Modules whose functions run code or touch the system: a pickle naming one of them does
# what the file's author wants the moment it is unpickled.
DANGEROUS_MODULES = frozenset(
    ("os", "posix", "nt", "subprocess", "sys", "shutil", "socket", "runpy", "pty",
     "webbrowser", "importlib", "code", "codeop", "pickle", "_pickle", "marshal", "ctypes",
     "multiprocessing", "signal", "asyncio", "commands", "platform", "pdb", "timeit")
)  # fmt: skip
# builtins are mostly harmless types (object, set); these run code or reach everything
DANGEROUS_BUILTINS = frozenset(
    ("eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr",
     "input", "breakpoint", "globals", "locals", "vars", "exit", "quit")
)  # fmt: skip
# Helpers protocols 0-2 name next to the real class: reported after it
_PICKLE_HELPERS = frozenset(
    ("copy_reg._reconstructor", "copyreg._reconstructor", "copyreg.__newobj__",
     "__builtin__.object", "builtins.object")
)  # fmt: skip
_IDENTIFIER_PATH = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*")
_LEGACY_PICKLES = 5  # magic number, protocol version, sys info, the object, storage keys
_ZIP_PREFIX = 64 << 20  # how much of a damaged zip is searched for its data.pkl record
_STRING_OPS = frozenset(
    ("STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
     "BINUNICODE8")
)  # fmt: skip
_GET_OPS = frozenset(("GET", "BINGET", "LONG_BINGET"))
_PUT_OPS = frozenset(("PUT", "BINPUT", "LONG_BINPUT"))


@dataclass(frozen=True)
class Global:
    """A global (class or function) a pickle names, and where."""

    module: str
    name: str
    record: str  # the zip record or the legacy pickle it is in
    offset: int  # byte offset of the opcode inside that record

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def dangerous(self) -> bool:
        """A function of a module that runs code or touches the system (os.system, eval, ...)."""
        if self.module in ("builtins", "__builtin__"):
            return self.name in DANGEROUS_BUILTINS
        return self.module.split(".")[0] in DANGEROUS_MODULES

    @property
    def where(self) -> str:
        return f"{self.record}, byte {self.offset}"


@dataclass
class FileReport:
    """The structure of a file as far as it could be read."""

    kind: str  # torch-zip, torch-legacy, pickle, zip, safetensors, empty, git-lfs, html, unknown
    complete: bool = True
    problem: str = ""  # why it is incomplete or damaged
    protocol: int | None = None  # pickle protocol of the (main) pickle
    globals: list[Global] = field(default_factory=list)

    def refused(self, allowed: frozenset[str]) -> list[Global]:
        """The globals outside `allowed`: dangerous ones first, pickle's own helpers last."""
        found = [g for g in self.globals if g.qualname not in allowed]
        return sorted(found, key=lambda g: (not g.dangerous, g.qualname in _PICKLE_HELPERS))


def inspect_file(path: Path) -> FileReport:
    """Read `path` and say what it is; never raises for unreadable contents (OSError only).

    Reads only what it needs (the header, the central directory and data.pkl of a zip,
    the leading pickles of the legacy format), never the weights: checkpoints can be
    larger than the memory.
    """
    with open(path, "rb") as handle:
        return inspect_stream(handle)


def inspect_bytes(data: bytes) -> FileReport:
    return inspect_stream(io.BytesIO(data))


def inspect_stream(stream: BinaryIO) -> FileReport:
    head = stream.read(64)
    size = stream.seek(0, io.SEEK_END)
    stream.seek(0)
    if not head:
        return FileReport("empty", complete=False, problem="the file is empty")
    if head.startswith(b"version https://git-lfs"):
        return FileReport("git-lfs")
    if head.lstrip()[:1] == b"<":
        return FileReport("html")
    if _is_safetensors(head, size):
        return FileReport("safetensors")
    if head.startswith(b"PK\x03\x04"):
        return _inspect_zip(stream, size)
    if head[:1] == b"\x80" or _parses_as_pickle(stream):
        stream.seek(0)
        return _inspect_pickles(stream, size)
    return FileReport("unknown")


def _is_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 10:
        return False
    (header_length,) = struct.unpack("<Q", head[:8])
    return head[8:9] == b"{" and 2 <= header_length <= size - 8


# --------------------------------------------------------------------------- zip


def _inspect_zip(stream: BinaryIO, size: int) -> FileReport:
    try:
        with zipfile.ZipFile(stream) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
            if not pickles:
                return FileReport("zip", problem="a zip archive without a data.pkl record")
            report = FileReport("torch-zip")
            _scan_pickle(archive.read(pickles[0]), pickles[0], report)
            return report
    except Exception as exc:  # zipfile raises many types on a damaged archive
        # No readable central directory (cut short) or a damaged record: read the local
        # records from the start, as far as they go, so a cut malicious file is still
        # recognised. torch.save writes data.pkl first.
        problem = f"damaged zip archive ({type(exc).__name__}: {exc})"
        stream.seek(max(0, size - (1 << 16) - 22))
        if b"PK\x05\x06" not in stream.read():
            problem = "no central directory, the index at the end of a zip archive: cut short"
        report = FileReport("torch-zip", complete=False, problem=problem)
        stream.seek(0)
        record = _local_record(stream.read(_ZIP_PREFIX), b"data.pkl")
        if record is None:
            report.problem = "damaged zip archive: no data.pkl record could be read"
            return report
        name, body = record
        _scan_pickle(body, name, report)
        report.complete, report.problem = False, problem
        return report


def _local_record(data: bytes, suffix: bytes) -> tuple[str, bytes] | None:
    """The (possibly cut) bytes of the first stored record whose name ends with `suffix`."""
    start = data.find(b"PK\x03\x04")
    while start >= 0 and start + 30 <= len(data):
        flags, method = struct.unpack("<HH", data[start + 6 : start + 10])
        (size,) = struct.unpack("<I", data[start + 18 : start + 22])
        name_length, extra_length = struct.unpack("<HH", data[start + 26 : start + 30])
        name = data[start + 30 : start + 30 + name_length]
        body_start = start + 30 + name_length + extra_length
        if flags & 0x08 or not size:  # sizes in a trailing data descriptor: read to the next
            following = data.find(b"PK\x03\x04", body_start)
            size = (following if following >= 0 else len(data)) - body_start
        if name.endswith(suffix) and method == 0:  # torch stores records uncompressed
            return name.decode("utf-8", "replace"), data[body_start : body_start + size]
        start = data.find(b"PK\x03\x04", body_start + size)
    return None


# --------------------------------------------------------------------------- pickles


def _parses_as_pickle(stream: BinaryIO) -> bool:
    """A protocol 0-1 pickle (no header byte) that reads to its STOP opcode."""
    stream.seek(0)
    try:
        for opcode, _arg, _pos in pickletools.genops(io.BytesIO(stream.read(1 << 20))):
            if opcode.name == "STOP":
                return True
    except Exception:  # genops raises ValueError and friends on anything that is not a pickle
        return False
    return False


def _inspect_pickles(stream: BinaryIO, size: int) -> FileReport:
    """A plain pickle, or torch's legacy format: several pickles, then raw storage bytes."""
    report = FileReport("pickle")
    for number in range(1, _LEGACY_PICKLES + 1):
        start = stream.tell()
        first = _scan_pickle_stream(stream, f"pickle {number}", report, base=start)
        if number == 1 and first == 0x1950A86A20F9469CFC6C:  # torch's legacy magic number
            report.kind = "torch-legacy"
        if not report.complete or report.kind != "torch-legacy" or stream.tell() >= size:
            break
    return report


def _scan_pickle(data: bytes, record: str, report: FileReport) -> None:
    _scan_pickle_stream(io.BytesIO(data), record, report, base=0)


def _scan_pickle_stream(stream: BinaryIO, record: str, report: FileReport, base: int) -> object:
    """Record every global of one pickle; return its first pushed integer (the legacy magic).

    Module and name of STACK_GLOBAL (protocol 4+) are the two strings pushed before it,
    directly or from the memo, so strings and memo slots are tracked; nothing is built.
    """
    strings: list[str | None] = []
    memo: dict[int, str | None] = {}
    first_int: object = None
    try:
        for opcode, arg, pos in pickletools.genops(stream):
            name = opcode.name
            offset = (pos or 0) - base
            number = arg if isinstance(arg, int) else -1  # memo index or protocol
            if name == "PROTO" and report.protocol is None:
                report.protocol = number
            elif name in _STRING_OPS:
                strings.append(arg if isinstance(arg, str) else None)
            elif name in _GET_OPS:
                strings.append(memo.get(number))
            elif name in _PUT_OPS:
                memo[number] = strings[-1] if strings else None
            elif name == "MEMOIZE":
                memo[len(memo)] = strings[-1] if strings else None
            elif name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                _add_global(report, module, attr, record, offset)
            elif name == "STACK_GLOBAL":
                module_name = strings[-2:] if len(strings) >= 2 else [None, None]
                _add_global(report, module_name[0] or "?", module_name[1] or "?", record, offset)
            elif first_int is None and name in ("LONG1", "LONG4", "INT", "BININT", "LONG"):
                first_int = arg
            elif name == "STOP":
                return first_int
    except Exception as exc:  # a cut or damaged pickle: what was read before still counts
        report.complete = False
        report.problem = f"{record} is damaged or cut short ({type(exc).__name__}: {exc})"
        return first_int
    report.complete = False
    report.problem = f"{record} ends before its STOP opcode"
    return first_int


def _add_global(report: FileReport, module: str, name: str, record: str, offset: int) -> None:
    if not (_IDENTIFIER_PATH.fullmatch(module) and _IDENTIFIER_PATH.fullmatch(name)):
        # not a name a real pickle would use: random bytes that happened to parse
        raise ValueError(f"a global with an impossible name at byte {offset}")
    report.globals.append(Global(module, name, record, offset))
