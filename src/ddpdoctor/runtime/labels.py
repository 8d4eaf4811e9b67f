"""What a collective is for and where it came from, read off the Python stack of the caller.

The recording process group knows *what* ran; the frames above it know *why*. A collective
issued from inside DDP's ``_sync_buffers`` is a buffer broadcast, one issued by the autograd
engine with no Python collective API on the stack is a Reducer gradient bucket, and so on.
Rules (:mod:`ddpdoctor.trace.ddp_sites`) match a torch function (and, where one function
issues several collectives, the text of the line it is executing). Everything is cached per
code object (by identity) and instruction, so the walk costs a few microseconds wherever the
caller's code is, a long module included. Standard library only.
"""

from __future__ import annotations

import itertools
import linecache
import os
import threading
from types import CodeType, FrameType

from ddpdoctor.runtime.thread_frames import current_frames
from ddpdoctor.trace.ddp_sites import API_FILE as _API_FILE
from ddpdoctor.trace.ddp_sites import BACKWARD as _BACKWARD
from ddpdoctor.trace.ddp_sites import BUCKET, USER
from ddpdoctor.trace.ddp_sites import RULES as _RULES

STACK_DEPTH = 6
# Frames of an installed library (Accelerate's gather, Lightning's loops: 30 deep) that
# may come before the user's first frame without using up STACK_DEPTH: the user's line that
# led into the library is then in the record.
MAX_LIBRARY_FRAMES = 64
MAX_CACHED_STACKS = 4096
MAX_PLACES = 65536  # frames in the tree of call paths (place_id), at most: ~20 MB
_LIBRARY_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

_NO_RULE = ()


_GENERATED = ("<frozen", "<eval_with_key>")


class _Place:
    """A frame's place in :class:`StackLabeler`'s tree of the call paths seen: its code (kept
    alive, so compared by identity), the places of the frames out from it by their instruction
    offset (``outer``), another code at the same offset (``other``), and the id of the call
    path that ends here: ``stop`` when :meth:`StackLabeler.places` stops at this frame whatever
    lies beyond, ``top`` when it stopped because no frame lies beyond."""

    __slots__ = ("code", "outer", "other", "stop", "top")

    def __init__(self, code: CodeType, other: _Place | None) -> None:
        self.code = code
        self.outer: dict[int, _Place] = {}
        self.other = other
        self.stop: int | None = None
        self.top: int | None = None


class StackLabeler:
    """Classifies code objects once and labels each call from its frames."""

    def __init__(self, internal_dirs: list[str]) -> None:
        self.reset(internal_dirs)

    def reset(self, internal_dirs: list[str]) -> None:
        """Start over with ``internal_dirs`` as the folders that are not user code: every
        classification and call path forgotten (the recording group holds this object's
        ``place_id``, so the labeler is reset, never replaced)."""
        self.internal = tuple(os.path.join(os.path.abspath(d), "") for d in internal_dirs)
        # Code objects are keyed by id(), never hashed: a code object's hash covers its
        # constants, recomputed on every lookup (tens of µs for a long module, where tutorials
        # put their training loops). _codes keeps every keyed code object alive: no id reuse.
        self._codes: dict[int, CodeType] = {}
        self._kinds: dict[int, tuple] = {}
        self._library: dict[int, bool] = {}  # id(code) -> in an installed library
        self._line_rules: dict[tuple[int, int], tuple] = {}
        # Call stacks by where each frame is: (id(code), f_lasti) per frame, flattened. A
        # frame's f_lineno is computed by scanning its code's line table up to the current
        # instruction: ~1 µs in a small function, 35 µs deep in a 3,000-line module. The
        # instruction offset identifies the line.
        self._stacks: dict[tuple[int, ...], tuple] = {}
        # (label, api, stack) by the places of the internal frames and the user's above them.
        self._described: dict[tuple[int, ...], tuple[str, str | None, tuple]] = {}
        # The call paths seen, as a tree of _Place from the innermost frame out (place_id).
        self._tree: dict[int, _Place] = {}
        self._tree_size = 0  # _Place objects in it
        self._path_ids = itertools.count()

    def _classify(self, code: CodeType) -> tuple:
        """``()`` for user code, else (rules, api, backward) for an internal code object."""
        filename = code.co_filename
        self._codes[id(code)] = code
        # Frozen modules, and the code torch.fx generates for compiled graphs (compiled
        # autograd's backward): not where the user called from.
        if not (filename.startswith(self.internal) or filename.startswith(_GENERATED)):
            self._kinds[id(code)] = _NO_RULE
            return _NO_RULE
        norm = filename.replace(os.sep, "/")
        rules = tuple(r for r in _RULES if norm.endswith(r[0]) and r[1] in (code.co_name, "*"))
        api = code.co_name if norm.endswith(_API_FILE) and not code.co_name.startswith("_") \
            else None
        backward = norm.endswith(_BACKWARD[0]) and code.co_name == _BACKWARD[1]
        kind = ("internal", rules, api, backward)
        self._kinds[id(code)] = kind
        return kind

    def _rule_at(self, frame: FrameType, rules: tuple) -> tuple[str, int] | None:
        key = (id(frame.f_code), frame.f_lasti)  # the code is kept alive by _classify
        hit = self._line_rules.get(key)
        if hit is None:
            hit = ()
            for _suffix, _fn, text, label, prio in rules:
                if text is None or text in linecache.getline(frame.f_code.co_filename,
                                                             frame.f_lineno):
                    hit = (label, prio)
                    break
            self._line_rules[key] = hit
        return hit or None

    def describe(self, frame: FrameType | None) -> tuple[str, str | None, tuple]:
        """(label, api, stack) for a collective whose caller's frame is ``frame``.

        ``stack`` is a tuple of (file, line, function) from the first frame outside torch and
        ddpdoctor outwards, :data:`STACK_DEPTH` frames at most besides those of an installed
        library before the user's first (see :meth:`places`); empty when no user frame.
        ``frame`` None: C++ called the collective with no Python frame above it, as DDP's
        Reducer does from the autograd engine's device thread when gradients are on a GPU;
        the site is then where the main thread is (its ``loss.backward()``).
        """
        if frame is None:
            main = _main_thread_frame()
            if main is None:
                return BUCKET, None, ()
            main_label, main_api, main_stack = self.describe(main)
            return (BUCKET if main_label == USER else main_label), main_api, main_stack
        key, user, internal = self.places(frame)
        described = self._described.get(key)
        if described is None:
            if len(self._described) >= MAX_CACHED_STACKS:  # a program that never repeats
                self._described.clear()
            described = self._described[key] = self._label(frame, internal) + (
                self._stack_from(user, key[2 * internal:]),)
        return described

    def place_id(self, frame: FrameType) -> int:
        """A number for the places of ``frame`` and the frames out from it (what
        :meth:`places` keys), never given to other places: once a call path is known, the
        same number each time it is seen again. On the hot path of every collective: a known
        call path is followed through a tree of them, each frame's code and instruction
        compared, at less than half the cost of building and hashing the key
        (bench/RESULTS.md, session 37)."""
        # Each step's instructions count: this runs once per frame of every collective's
        # call path, after the training thread's wait, when its caches are cold
        # (bench/RESULTS.md, sessions 42-43). The common step: a place at this offset, of
        # this code, not the path's end.
        outer = self._tree
        f = frame
        while True:
            place = outer.get(f.f_lasti)
            if place is None:
                break
            if place.code is not f.f_code:  # another code at the same offset
                code = f.f_code
                while place is not None and place.code is not code:
                    place = place.other
                if place is None:
                    break
            if place.stop is not None:
                return place.stop
            f = f.f_back  # type: ignore[assignment]
            if f is None:
                if place.top is not None:
                    return place.top
                break
            outer = place.outer
        return self._new_path(frame)

    def _new_path(self, frame: FrameType) -> int:
        """Add the call path from ``frame`` out, as :meth:`places` walks it, to the tree."""
        walked = len(self.places(frame)[0]) // 2
        if self._tree_size + walked > MAX_PLACES:  # a program that never repeats a call path
            self._tree.clear()
            self._tree_size = 0
        outer, place = self._tree, None
        f: FrameType | None = frame
        for _ in range(walked):
            assert f is not None  # places() walked this many frames
            code, offset = f.f_code, f.f_lasti
            first = place = outer.get(offset)
            while place is not None and place.code is not code:
                place = place.other
            if place is None:
                place = outer[offset] = _Place(code, first)
                self._tree_size += 1
            outer, f = place.outer, f.f_back
        assert place is not None  # the caller's own frame at least
        path = next(self._path_ids)
        if f is None:
            place.top = path
        else:
            place.stop = path
        return path

    def places(self, frame: FrameType) -> tuple[tuple[int, ...], FrameType | None, int]:
        """(key, user frame, n): the places of the ``n`` internal frames (torch's,
        ddpdoctor's) from ``frame`` outwards, then of up to :data:`STACK_DEPTH` frames from
        the first one after them (frames of an installed library before the user's first one
        not counted, up to :data:`MAX_LIBRARY_FRAMES`), each as (id(code), instruction),
        flattened into ``key``. The same key, the same (label, api, stack): what
        :meth:`describe` returns is cached by it."""
        kinds = self._kinds
        where: list[int] = []
        f: FrameType | None = frame
        while f is not None:
            code = f.f_code
            kind = kinds.get(id(code))
            if kind is None:
                kind = self._classify(code)
            if not kind:
                break
            where.append(id(code))
            where.append(f.f_lasti)
            f = f.f_back
        user, internal = f, len(where) // 2
        depth, library = STACK_DEPTH, self._library
        while f is not None and len(where) < 2 * (internal + depth):
            code = f.f_code
            where.append(id(code))
            where.append(f.f_lasti)
            in_library = library.get(id(code))
            if in_library is None:
                self._codes[id(code)] = code
                in_library = library[id(code)] = any(d in code.co_filename
                                                     for d in _LIBRARY_DIRS)
            if in_library and depth < STACK_DEPTH + MAX_LIBRARY_FRAMES and \
                    len(where) == 2 * (internal + depth - STACK_DEPTH + 1):
                depth += 1  # still in the library, before any frame of the user's
            f = f.f_back
        return tuple(where), user, internal

    def _label(self, frame: FrameType, internal: int) -> tuple[str, str | None]:
        """(label, api) from the ``internal`` frames of torch and ddpdoctor from ``frame``
        outwards (classified already)."""
        label: str | None = None
        api: str | None = None
        prio, backward = -1, False
        f: FrameType | None = frame
        while f is not None and internal:
            internal -= 1
            _, rules, fn_api, is_bwd = self._kinds[id(f.f_code)]
            if rules:
                hit = self._rule_at(f, rules)
                if hit and hit[1] > prio:
                    label, prio = hit
            if fn_api:
                api = fn_api  # the outermost API: all_gather_object, not its all_gather
            backward = backward or is_bwd
            f = f.f_back
        if label is None:
            label = BUCKET if api is None and backward else USER
        return label, api

    def _stack_from(self, frame: FrameType | None, key: tuple[int, ...]) -> tuple:
        """(file, line, function) of ``frame`` and the frames outwards whose places are
        ``key`` (:meth:`places`); the same tuple object for the same places, whatever torch
        function was called there (cached)."""
        stack = self._stacks.get(key)
        if stack is None:
            if len(self._stacks) >= MAX_CACHED_STACKS:  # a program that never repeats a stack
                self._stacks.clear()
            frames: list[tuple[str, int, str]] = []
            f = frame
            while f is not None and len(frames) < len(key) // 2:
                code = f.f_code
                self._codes[id(code)] = code
                frames.append((code.co_filename, f.f_lineno, code.co_name))
                f = f.f_back
            stack = self._stacks[key] = tuple(frames)
        return stack


def _main_thread_frame() -> FrameType | None:
    """The main thread's current frame, or None when called on the main thread itself (a
    collective from C++ with no Python frame *there* has no other site to show)."""
    main = threading.main_thread().ident
    if main is None or main == threading.get_ident():
        return None
    return current_frames().get(main)
