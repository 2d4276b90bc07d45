"""The code blocks of docs/python.md, which the tests run as they stand so that the document
cannot drift from what works. A fenced block that follows a line `<!-- test: NAME -->` (the next
line that is not blank) is block NAME; other blocks have no name.

As a program, `python3 doc_blocks.py NAME` prints block NAME, for scripts/test-python.sh."""

import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"

MARKER = re.compile(r"<!-- test: (\S+) -->")
FENCE = re.compile(r"(\s*)```\S*\s*$")


class Block:
    def __init__(self, name, line, text):
        self.name = name  # None for an unmarked block
        self.line = line  # the fence's line number, from 1
        self.text = text  # the content, without the fence's indentation

    def first_line(self):
        return next((s for s in self.text.splitlines() if s.strip()), "")


def blocks(path=DOC):
    """Every fenced block of the document, in order. Raises ValueError for a marker that no
    block follows, a block left open, or a name used twice."""
    lines = path.read_text().splitlines()
    found, names = [], set()
    pending = None  # (name, marker line) waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.fullmatch(line.strip())
        fence = FENCE.fullmatch(line)
        if marker:
            if pending:
                raise ValueError(f"{path}:{pending[1]}: marker '{pending[0]}' has no block")
            pending = (marker.group(1), i + 1)
        elif fence:
            indent, start = len(fence.group(1)), i + 1
            body = []
            i += 1
            while i < len(lines) and not FENCE.fullmatch(lines[i]):
                body.append(lines[i][indent:])
                i += 1
            if i == len(lines):
                raise ValueError(f"{path}:{start}: the block is not closed")
            name = pending[0] if pending else None
            if name is not None:
                if name in names:
                    raise ValueError(f"{path}:{start}: a second block named '{name}'")
                names.add(name)
            found.append(Block(name, start, "\n".join(body) + "\n"))
            pending = None
        elif line.strip() and pending:
            raise ValueError(f"{path}:{pending[1]}: marker '{pending[0]}' has no block")
        i += 1
    if pending:
        raise ValueError(f"{path}:{pending[1]}: marker '{pending[0]}' has no block")
    return found


def block(name, path=DOC):
    """The text of block NAME; KeyError when there is none."""
    for b in blocks(path):
        if b.name == name:
            return b.text
    raise KeyError(f"{path} has no block marked <!-- test: {name} -->")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: doc_blocks.py NAME")
    try:
        sys.stdout.write(block(sys.argv[1]))
    except (KeyError, ValueError) as e:
        sys.exit(f"doc_blocks.py: {e.args[0]}")
