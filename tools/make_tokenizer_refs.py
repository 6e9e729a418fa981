#!/usr/bin/env python3
"""Reference encodings for the tokenizer tests, made with the `tokenizers` library.

Runs on the GPU machine (which has `tokenizers`):
    python3 tools/make_tokenizer_refs.py tests/fixtures/tokenizers
Reads cases.json (a list of strings) and, for each tokenizer directory under the root that
holds a tokenizer.json, writes reference.json: for every case its ids (no special tokens
added) and the decoded text.
"""
import json
import pathlib
import sys

from tokenizers import Tokenizer


def main() -> None:
    root = pathlib.Path(sys.argv[1])
    cases = json.loads((root / "cases.json").read_text(encoding="utf-8"))
    for tok_json in sorted(root.glob("*/tokenizer.json")):
        tok = Tokenizer.from_file(str(tok_json))
        out = []
        for text in cases:
            ids = tok.encode(text, add_special_tokens=False).ids
            out.append({"text": text, "ids": ids,
                        "decoded": tok.decode(ids, skip_special_tokens=False)})
        ref = {"tokenizers_version": __import__("tokenizers").__version__, "cases": out}
        (tok_json.parent / "reference.json").write_text(
            json.dumps(ref, ensure_ascii=False, indent=0), encoding="utf-8")
        print(f"{tok_json.parent.name}: {len(out)} cases, {sum(len(c['ids']) for c in out)} ids")


if __name__ == "__main__":
    main()
