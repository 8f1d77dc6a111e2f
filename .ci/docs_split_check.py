#!/usr/bin/env python3
"""Checks that the README's move into README.md + docs/*.md lost nothing.

Usage: python3 .ci/docs_split_check.py [REV]   (REV: the commit whose README.md was whole,
default 074292e, the last before the split; `relay:README.md`-style paths work too, e.g.
`python3 .ci/docs_split_check.py relay` to see which lines a branch added to its README
that the docs do not have yet).

Every non-blank line of the old README must appear in the new README.md or in a docs/*.md
file, compared after what the move was allowed to change: a heading's level, and a link's
target (`[text](#anchor)` -> `[text](file.md#anchor)`). Lines missing are printed; the
lines deliberately rewritten (the old table of contents, the Layout's prose turned into the
list of files, the few reworded below) are listed apart, so a reader sees each of them.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# Old lines reworded on purpose, by a piece of each, with the reason.
REWORDED = {
    "| `message_timeout` |": "the reload claim corrected (issue 33 item 6): next request, not next check",
    "| `idle_timeout` |": "the reload claim corrected (issue 33 item 6)",
    "| `write_timeout` |": "the reload claim corrected (issue 33 item 6)",
    "config, the unit, and this README where": "systemd: the README and the docs/ it links to",
    "the metrics listed under [Operating it]": "the metrics moved to docs/metrics.md: the link says so",
}


def norm(line):
    line = line.strip()
    line = re.sub(r"^#{1,6} ", "# ", line)
    line = re.sub(r"\[([^\]]*)\]\([^)\s]*\)", r"[\1]()", line)
    return line


def main():
    rev = sys.argv[1] if len(sys.argv) > 1 else "074292e"
    spec = rev if ":" in rev else f"{rev}:README.md"
    old = subprocess.run(["git", "show", spec], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    new_text = (ROOT / "README.md").read_text()
    for f in sorted((ROOT / "docs").glob("*.md")):
        new_text += "\n" + f.read_text()
    new_lines = [norm(l) for l in new_text.split("\n")]
    new_set = set(new_lines)
    new_joined = " ".join(l for l in new_lines if l)

    # The old Layout section became docs/layout.md's list of files: its prose is read
    # there file by file, not line by line.
    in_layout = False
    missing, rewritten, reworded = [], [], []
    for n, line in enumerate(old, 1):
        if line.startswith("## "):
            in_layout = line.strip() == "## Layout"
        if not line.strip():
            continue
        key = norm(line)
        if key in new_set or (len(key) > 30 and key in new_joined):
            continue
        why = next((w for k, w in REWORDED.items() if k in line), None)
        if why:
            reworded.append((n, f"{line[:60]}... ({why})"))
            continue
        (rewritten if in_layout or n <= 20 else missing).append((n, line))
    for title, rows in (("rewritten (table of contents, Layout prose)", rewritten),
                        ("reworded on purpose", reworded),
                        ("MISSING", missing)):
        print(f"{title}: {len(rows)} lines")
        for n, line in rows:
            print(f"  {n:5}: {line[:150]}")
    total = sum(1 for l in old if l.strip())
    print(f"old README: {len(old)} lines, {total} non-blank; "
          f"{total - len(missing) - len(rewritten) - len(reworded)} found as they were, "
          f"{len(rewritten)} rewritten, {len(reworded)} reworded, {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
