// The reference for the tiktoken-format tests: js-tiktoken 1.0.21 (a JavaScript port of
// tiktoken) encoding with a tiktoken.model file, Kimi K2's split pattern and special tokens.
//
//   node tiktoken_reference.mjs NODE_MODULES_DIR TIKTOKEN.model SPECIALS.json TEXTS.json OUT.json
//
// SPECIALS.json: {content: id}; TEXTS.json: a list of strings; OUT.json: per text
// {"ids": [...], "decoded": "..."}, encoded with every special token allowed (what
// tokenization_kimi.py's encode does: allowed_special="all").
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modulesDir, modelPath, specialsPath, textsPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: node tiktoken_reference.mjs NODE_MODULES_DIR TIKTOKEN.model SPECIALS.json TEXTS.json OUT.json");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(modulesDir), "resolve-from-here.js"));
const { Tiktoken } = require("js-tiktoken/lite");

// Kimi's pat_str (tokenization_kimi.py) in JavaScript's syntax: \p{Han} is \p{Script=Han};
// the class intersections [X&&[^\p{Han}]] are (?:(?!\p{Script=Han})[X]); the scoped
// (?i:'s|...) is spelled out case by case (s also folds to U+017F, as in Rust's regex);
// \s / \S are Unicode's White_Space, as in Rust's regex (JavaScript's \s differs: U+FEFF,
// U+0085).
const notHan = (cls) => `(?:(?!\\p{Script=Han})[${cls}])`;
const upper = notHan("\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}");
const lower = notHan("\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}");
const contraction = "(?:'[sS\\u017F]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?";
const ws = "\\p{White_Space}";
const kimiPattern = [
  "[\\p{Script=Han}]+",
  `[^\\r\\n\\p{L}\\p{N}]?${upper}*${lower}+${contraction}`,
  `[^\\r\\n\\p{L}\\p{N}]?${upper}+${lower}*${contraction}`,
  "\\p{N}{1,3}",
  ` ?[^${ws}\\p{L}\\p{N}]+[\\r\\n]*`,
  `${ws}*[\\r\\n]+`,
  `${ws}+(?!\\P{White_Space})`,
  `${ws}+`,
].join("|");

// tiktoken.model -> js-tiktoken's rank format: "! <offset> <base64>..." (one token a rank).
const lines = readFileSync(modelPath, "utf8").split("\n").filter(Boolean);
const byRank = [];
for (const line of lines) {
  const [b64, rank] = line.split(" ");
  byRank[Number(rank)] = b64;
}
const enc = new Tiktoken({
  pat_str: kimiPattern,
  special_tokens: JSON.parse(readFileSync(specialsPath, "utf8")),
  bpe_ranks: `! 0 ${byRank.join(" ")}`,
});
const out = JSON.parse(readFileSync(textsPath, "utf8")).map((text) => {
  const ids = enc.encode(text, "all");
  return { ids, decoded: enc.decode(ids) };
});
writeFileSync(outPath, JSON.stringify(out));
