// The reference renders for the Jinja tests: @huggingface/jinja (the Jinja of transformers.js)
// run by node on a file of cases, its outputs (or its errors) written back as JSON.
//
//   node jinja_reference.mjs NODE_MODULES_DIR CASES.json RESULTS.json
//
// CASES.json: [{"template": "...", "context": {...}, "now": MS_SINCE_EPOCH or null}]; with
// "now", Date is fixed to that instant while the case renders (the tests run node with
// TZ=UTC), so that strftime_now prints a known date.
// RESULTS.json: per case {"ok": true, "output": "..."} or {"ok": false, "phase": "parse" |
// "render", "error": "..."}.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modulesDir, casesPath, resultsPath] = process.argv.slice(2);
if (!resultsPath) {
  console.error("usage: node jinja_reference.mjs NODE_MODULES_DIR CASES.json RESULTS.json");
  process.exit(2);
}
// Resolve the package from the tests' own node_modules (scripts/fetch-test-data installs it).
const require = createRequire(path.join(modulesDir, "resolve-from-here.js"));
const { Template } = require("@huggingface/jinja");

const RealDate = Date;
function withNow(ms, fn) {
  if (ms === null || ms === undefined) return fn();
  class FixedDate extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(ms);
      else super(...args);
    }
    static now() {
      return ms;
    }
  }
  globalThis.Date = FixedDate;
  try {
    return fn();
  } finally {
    globalThis.Date = RealDate;
  }
}

const cases = JSON.parse(readFileSync(casesPath, "utf8"));
const results = cases.map(({ template, context, now }) => {
  let parsed;
  try {
    parsed = new Template(template);
  } catch (e) {
    return { ok: false, phase: "parse", error: String(e && e.message !== undefined ? e.message : e) };
  }
  try {
    return { ok: true, output: withNow(now, () => parsed.render(context)) };
  } catch (e) {
    return { ok: false, phase: "render", error: String(e && e.message !== undefined ? e.message : e) };
  }
});
writeFileSync(resultsPath, JSON.stringify(results));
