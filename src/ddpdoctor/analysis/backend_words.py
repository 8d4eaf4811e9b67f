"""The backend's own words: the lines of a rank's stderr tail that explain how it ended.

gloo aborts a rank on a failed check (``terminate called after throwing an instance of
'gloo::EnforceNotMet'`` then the check, e.g. "Received data size doesn't match expected size"),
raises on bad arguments ("ProcessGroupGloo::alltoall: invalid tensor size"), reports vanished
peers ("Connection closed by peer", "Connection reset by peer") and
timeouts; NCCL writes ``NCCL WARN`` lines, its watchdog's timeout and ``nccl*Error`` codes;
CUDA errors ("CUDA error: ...", out of memory, device-side asserts) come before a death too.
A script whose argument parser refused its command line says why only there as well.
Pure functions of the text the reader loaded (``RankTrace.stderr_tail``).
"""

from __future__ import annotations

import re

# One explaining line, by what it says. Group "text" is what is quoted.
_PATTERNS = (
    # gloo's failed check: "[enforce fail at .../pair.cc:456] <check>. <message>"
    re.compile(r"\[enforce fail at (?:[^\]]*/)?(?P<file>[^\]/]+)\]\s*(?P<text>.+)"),
    # The backend's own argument checks, raised as exceptions ("ProcessGroupGloo::alltoall:
    # invalid tensor size at index 1 (expected (6), got (4))").
    re.compile(r"(?P<text>ProcessGroup(?:Gloo|NCCL|MPI|UCC|XCCL)::\w+: .+)"),
    re.compile(r"(?P<text>NCCL WARN .+)"),
    re.compile(r"(?P<text>.*Watchdog caught collective operation timeout.*)"),
    re.compile(r"(?P<text>.*\bnccl(?:InternalError|SystemError|UnhandledCudaError|RemoteError"
               r"|InvalidUsage|InvalidArgument)\b.*)"),
    re.compile(r"(?P<text>.*(?:CUDA error|CUDA out of memory|device-side assert triggered"
               r"|CUBLAS_STATUS_\w+|cuDNN error).*)"),
    # The script's own argument parser refusing its command line (argparse's exit 2: "train.py:
    # error: the following arguments are required: --epochs"), the only word of why.
    re.compile(r"^(?P<text>(?:[\w.\-/]+\.py|python[\w.]* -m [\w.]+): error: .+)"),
    re.compile(r"(?P<text>.*(?:Connection closed by peer|Connection reset by peer"
               r"|Broken pipe|Timed out waiting|timed out after).*)", re.I),
)
# What launchers put in front of a worker's line ("[rank1]: ", "[default0]:").
_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
# Patterns from here on report a lost peer or a timeout: the consequence of a failure
# elsewhere, quoted only where no rank has words of a cause.
CONSEQUENCE = len(_PATTERNS) - 1
MAX_LINES = 3
MAX_CHARS = 300


def explaining_lines(text: str) -> list[tuple[int, str]]:
    """Up to :data:`MAX_LINES` distinct lines of ``text`` that explain a rank's end, each with
    the rank of its pattern (causes first, then in the order written), cut to
    :data:`MAX_CHARS` ("gloo pair.cc:456: ..." for a failed check)."""
    found: list[tuple[int, int, str]] = []
    for n, raw in enumerate(text.splitlines()):
        line = _PREFIX.sub("", raw.strip()).removeprefix("what():").strip()
        if not line or len(line) > 8 * MAX_CHARS:
            continue
        for kind, pattern in enumerate(_PATTERNS):
            hit = pattern.search(line)
            if hit is None:
                continue
            quoted = hit.group("text").strip()
            if "file" in pattern.groupindex:
                quoted = f"gloo {hit.group('file')}: {quoted}"
            found.append((kind, n, quoted[:MAX_CHARS]))
            break
    out: list[tuple[int, str]] = []
    for kind, _, quoted in sorted(found):
        if not any(quoted in seen or seen in quoted for _, seen in out):
            out.append((kind, quoted))
        if len(out) >= MAX_LINES:
            break
    return out


def evidence(lines_by_rank: dict[int, list[tuple[int, str]]],
             silent: frozenset[int] | set[int] = frozenset()) -> list[str]:
    """'rank 1's stderr: "..."' for each quoted line: the ranks' words of a cause; where no
    rank has any, the words of a lost peer or a timeout of the ``silent`` ranks (killed by a
    signal: no exception of theirs says it)."""
    causes = any(kind < CONSEQUENCE for lines in lines_by_rank.values() for kind, _ in lines)
    return [f'rank {rank}\'s stderr: "{text}"' for rank, lines in sorted(lines_by_rank.items())
            for kind, text in lines
            if kind < CONSEQUENCE or (not causes and rank in silent)]
