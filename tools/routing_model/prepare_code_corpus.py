#!/usr/bin/env python3
"""The routing model's text: the Python sources of an installed Python, no network needed.

    python3 tools/routing_model/prepare_code_corpus.py [--glob PATTERN] LIB_DIR [LIB_DIR ...] OUT_DIR

Walks each LIB_DIR for *.py files (or PATTERN's, e.g. '*.h' for C headers; sorted paths; test suites, files over 512 KB and files that
are not UTF-8 skipped), and writes OUT_DIR/train.txt and OUT_DIR/heldout.txt: every 50th file
is held out and never trained on. Files are joined by a blank line. Also writes
OUT_DIR/files.json (which file went where, and the byte counts).
"""
import json
import pathlib
import sys

MAX_BYTES = 512 * 1024
HOLD_OUT_EVERY = 50


def sources(lib: pathlib.Path, pattern: str = "*.py"):
    for p in sorted(lib.rglob(pattern)):
        parts = set(p.parts)
        if parts & {"test", "tests", "testing", "idle_test"} or not p.is_file():
            continue
        if p.stat().st_size > MAX_BYTES or p.stat().st_size == 0:
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        yield p, text


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    args, pattern = sys.argv[1:], "*.py"
    if args[:1] == ["--glob"]:
        pattern, args = args[1], args[2:]
    if len(args) < 2:
        sys.exit(__doc__)
    libs, out = [pathlib.Path(a) for a in args[:-1]], pathlib.Path(args[-1])
    out.mkdir(parents=True, exist_ok=True)
    train, held, listing = [], [], {"train": [], "heldout": []}
    i = 0
    for lib in libs:
        for p, text in sources(lib, pattern):
            side = "heldout" if i % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1 else "train"
            (held if side == "heldout" else train).append(text)
            listing[side].append(str(p))
            i += 1
    (out / "train.txt").write_text("\n\n".join(train), encoding="utf-8")
    (out / "heldout.txt").write_text("\n\n".join(held), encoding="utf-8")
    listing["bytes"] = {"train": sum(len(t.encode()) for t in train), "heldout": sum(len(t.encode()) for t in held)}
    (out / "files.json").write_text(json.dumps(listing, indent=1))
    print(f"{len(listing['train'])} train files ({listing['bytes']['train'] / 1e6:.1f} MB), "
          f"{len(listing['heldout'])} held out ({listing['bytes']['heldout'] / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
