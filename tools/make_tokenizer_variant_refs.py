#!/usr/bin/env python3
"""Reference encodings of pre-tokenizer and added-token variants of the Qwen3 tokenizer.

Runs on the GPU machine (which has `tokenizers`):
    python3 tools/make_tokenizer_variant_refs.py tests/fixtures/tokenizers
Takes qwen3/tokenizer.json, rewrites its pre_tokenizer / added_tokens in the ways VARIANTS
lists (GPT-2's ByteLevel regex, add_prefix_space, Digits, every Split behavior, invert,
added-token flags), and writes qwen3/variants.json: the texts (cases.json plus N_RANDOM random
strings mixing scripts, Unicode spaces, digits, contractions and added-token contents) and for
each variant the ids of every text; for "added" also the decoded text with and without
special tokens. tests/format/tokenizer_test.cpp rebuilds the same variants and compares.
"""
import copy
import json
import pathlib
import random
import sys

N_RANDOM = 150
PARTS = list("aZ09 '\t\n\r.,!?-_<>|/\\\"sS") + [
    "'s", "'S", "'ll", "'LL", "'ſ", "é", "e\u0301", "ß", "Ω", "я", "中", "日本", "한", "ع",
    "\u0915\u093f", "😀", "👍🏽", "\u200d", "\u00a0", "\u3000", "\u2003", "\u180e", "\u0085",
    "\u2028", "\u200b", "\ufeff", "\x0b", "\x0c", "\x1c", "٣", "０", "²", "Ⅻ", "½", "  ", "\n\n",
    "<|endoftext|>", "<|im_start|>", "<tool_call>", "<think>", "1234", " the", "ﬆ", "[X]",
    " [W] ", "aé", "Ġx"]


def byte_level(prefix_space, use_regex):
    return {"type": "ByteLevel", "add_prefix_space": prefix_space, "trim_offsets": False,
            "use_regex": use_regex}


def sequence(*steps):
    return {"type": "Sequence", "pretokenizers": list(steps)}


def split(behavior, invert=False):
    return sequence({"type": "Split", "pattern": {"Regex": "\\s+|[0-9]"}, "behavior": behavior,
                     "invert": invert}, byte_level(False, False))


def add_tokens(t):
    # (content, lstrip, rstrip, single_word, normalized); the first two are special.
    # "Ġx" is also a vocabulary entry: tokenizers gives it that entry's id.
    for j, (c, l, r, s, n) in enumerate([("[X]", 1, 1, 0, 0), ("[W]", 0, 0, 1, 0),
                                         ("aé", 0, 0, 0, 1), ("Ġx", 0, 0, 0, 0)]):
        t["added_tokens"].append(dict(id=151669 + j, content=c, lstrip=bool(l), rstrip=bool(r),
                                      single_word=bool(s), normalized=bool(n), special=j < 2))


VARIANTS = {
    "qwen3": lambda t: None,
    "gpt2": lambda t: t.update(pre_tokenizer=byte_level(False, True), normalizer=None),
    "gpt2_prefix_space": lambda t: t.update(pre_tokenizer=byte_level(True, True)),
    "digits_individual": lambda t: t.update(pre_tokenizer=sequence(
        {"type": "Digits", "individual_digits": True}, byte_level(False, True))),
    "digits_contiguous": lambda t: t.update(pre_tokenizer=sequence(
        {"type": "Digits", "individual_digits": False}, byte_level(True, True))),
    "split_removed": lambda t: t.update(pre_tokenizer=split("Removed")),
    "split_merged_with_previous": lambda t: t.update(pre_tokenizer=split("MergedWithPrevious")),
    "split_merged_with_next": lambda t: t.update(pre_tokenizer=split("MergedWithNext")),
    "split_contiguous": lambda t: t.update(pre_tokenizer=split("Contiguous")),
    "split_isolated_inverted": lambda t: t.update(pre_tokenizer=split("Isolated", True)),
    "added": add_tokens,
}


def main() -> None:
    from tokenizers import Tokenizer, __version__
    root = pathlib.Path(sys.argv[1])
    base = json.loads((root / "qwen3" / "tokenizer.json").read_text(encoding="utf-8"))
    texts = json.loads((root / "cases.json").read_text(encoding="utf-8"))
    random.seed(7)
    texts += ["".join(random.choice(PARTS) for _ in range(random.randint(1, 40)))
              for _ in range(N_RANDOM)]
    out = {"tokenizers_version": __version__, "texts": texts, "ids": {}}
    for name, edit in VARIANTS.items():
        t = copy.deepcopy(base)
        edit(t)
        tok = Tokenizer.from_str(json.dumps(t))
        ids = [tok.encode(x, add_special_tokens=False).ids for x in texts]
        out["ids"][name] = ids
        if name == "added":
            out["added_decoded"] = [tok.decode(i, skip_special_tokens=False) for i in ids]
            out["added_decoded_skip_special"] = [tok.decode(i, skip_special_tokens=True) for i in ids]
    (root / "qwen3" / "variants.json").write_text(
        json.dumps(out, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    print(f"{len(texts)} texts x {len(VARIANTS)} variants")


if __name__ == "__main__":
    main()
