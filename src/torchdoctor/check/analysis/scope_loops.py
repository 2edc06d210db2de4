"""Loops of the scope interpreter: silent passes until the loop head is stable, then
one recording pass; the first pass's meetings, and the second iteration's."""

from __future__ import annotations

import ast
import dataclasses

from torchdoctor.check.analysis.loop_passes import (
    carries_new_place,
    one_pass_branches,
    runs_once,
    stands,
)
from torchdoctor.check.analysis.loop_splits import UseLog, splits
from torchdoctor.check.analysis.scope_core import _LoopFrame
from torchdoctor.check.analysis.scope_objects import ScopeObjects
from torchdoctor.check.analysis.syntax import _weaken
from torchdoctor.check.analysis.values import UNKNOWN, Env, Value, join_env


class ScopeLoops(ScopeObjects):
    """`for` and `while` to a fixpoint (ScopeFlow runs the statements)."""

    def _exec_for(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.For | ast.AsyncFor)
        iterable = self.eval(stmt.iter)
        element = self._element(iterable, stmt.iter)
        self._loop(stmt, stmt.body, stmt.orelse, target=stmt.target, element=element)

    def _exec_while(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.While)
        self.eval(stmt.test)
        self._loop(stmt, stmt.body, stmt.orelse, target=None, element=UNKNOWN, test=stmt.test)

    def _loop(
        self,
        stmt: ast.stmt,
        body: list[ast.stmt],
        orelse: list[ast.stmt],
        *,
        target: ast.expr | None,
        element: Value,
        test: ast.expr | None = None,
    ) -> None:
        entry = self.env
        assert entry is not None
        head: Env = dict(entry)
        recording, meeting = self._recording, self._meeting
        # silent passes until the loop head is stable, then one recording pass; the
        # first pass (from the state before the loop) records meetings of devices
        self._recording = False
        log = UseLog(stmt)
        if meeting:
            self._use_logs.append(log)
        try:
            for n in range(self.MAX_LOOP_PASSES):
                self._meeting = meeting and n == 0
                log.phase = 1 if self._meeting else 0
                end, _frame = self._loop_pass(head, body, target, element, test)
                log.phase = 0
                new_head = join_env(entry, end)
                for cont in _frame.continues:
                    new_head = join_env(new_head, cont)
                assert new_head is not None
                if n == 0 and meeting:
                    self._second_pass(stmt, entry, end, _frame, body, target, element, test, log)
                if new_head == head:
                    break
                head = new_head
            else:
                head = _weaken(head, entry)
        finally:
            self._recording, self._meeting = recording, meeting
            if meeting:
                self._use_logs.remove(log)
        end, frame = self._loop_pass(head, body, target, element, test)
        self.env = dict(head)  # the loop may run zero times, or end after any pass
        self.env = join_env(self.env, end)
        self._exec_block(orelse)
        for brk in frame.breaks:
            self.env = join_env(self.env, brk) if self.env is not None else dict(brk)

    def _second_pass(
        self,
        stmt: ast.stmt,
        entry: Env,
        end: Env | None,
        frame: _LoopFrame,
        body: list[ast.stmt],
        target: ast.expr | None,
        element: Value,
        test: ast.expr | None,
        log: UseLog,
    ) -> None:
        """Meetings of the loop's second iteration, run from the state the first one
        leaves, not joined with the state before the loop (analysis/loop_passes.py)."""
        second = end
        for cont in frame.continues:
            second = join_env(second, cont)
        if not second or not carries_new_place(entry, second) or runs_once(stmt):
            return
        before = dict(self._mismatches)
        log.phase = 2
        try:
            self._loop_pass(second, body, target, element, test)
        finally:
            log.phase = 0
        skipped = one_pass_branches(stmt)
        for key, m in list(self._mismatches.items()):
            if key in before:
                self._mismatches[key] = before[key]  # the first iteration's meeting stands
            elif not stands(m, skipped):
                del self._mismatches[key]
            elif not m.later:
                self._mismatches[key] = dataclasses.replace(m, later=True)
        # where no meeting is proven: the values a moved model's method gets on the two
        for split in splits(log, self._mismatches, skipped):
            self._splits.setdefault((id(split.site), id(split.node)), split)

    def _loop_pass(
        self,
        head: Env,
        body: list[ast.stmt],
        target: ast.expr | None,
        element: Value,
        test: ast.expr | None,
    ) -> tuple[Env | None, _LoopFrame]:
        self.env = dict(head)
        frame = _LoopFrame()
        self._loops.append(frame)
        try:
            if test is not None:
                self.eval(test)
            if target is not None:
                self._bind(target, element)
            self._exec_block(body)
        finally:
            self._loops.pop()
        return self.env, frame
