// Validates replies against their JSON schemas with ajv (the reference validator): CASES_FILE
// holds [{schema, text}]; prints {"checked": N, "failures": [{index, text, errors}]}.
import { readFileSync } from "node:fs";
import Ajv from "ajv";

const cases = JSON.parse(readFileSync(process.env.CASES_FILE, "utf8"));
const ajv = new Ajv({ strict: false, allErrors: true });
const failures = [];
cases.forEach((c, index) => {
  let value;
  try {
    value = JSON.parse(c.text);
  } catch (e) {
    failures.push({ index, text: c.text, errors: "not JSON: " + e.message });
    return;
  }
  const validate = ajv.compile(c.schema);
  if (!validate(value)) failures.push({ index, text: c.text, errors: validate.errors });
});
console.log(JSON.stringify({ checked: cases.length, failures }));
