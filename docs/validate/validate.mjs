// Parse an AsyncAPI document with the official parser; print every diagnostic and
// exit 1 if any is an error or a warning (severity 0 or 1). Usage: node validate.mjs FILE
import { readFile } from "node:fs/promises";
import { Parser, DiagnosticSeverity } from "@asyncapi/parser";

const file = process.argv[2];
const text = await readFile(file, "utf8");
const { document, diagnostics } = await new Parser().parse(text, { source: file });
const severities = ["error", "warning", "information", "hint"];
let failed = document === undefined;
for (const d of diagnostics) {
  const path = d.path.join("/");
  process.stdout.write(`${severities[d.severity]} ${d.code} at /${path}: ${d.message}\n`);
  if (d.severity === DiagnosticSeverity.Error || d.severity === DiagnosticSeverity.Warning) {
    failed = true;
  }
}
process.stdout.write(failed ? "asyncapi: invalid\n" : "asyncapi: valid\n");
process.exit(failed ? 1 : 0);
