// The reference tests/data/chat_template_test.cpp compares with: Hugging Face's JavaScript Jinja
// renderer (@huggingface/jinja, installed by `bash scripts/setup.sh --test`), rendering the same
// templates with the same variables. One process renders every job, each template parsed once.
//
// Usage: node chat_template_reference.js JINJA_PACKAGE_DIR JOBS_JSON OUT_JSON
//   JOBS_JSON: {"templates": {"<id>": "<source>", ...},
//               "jobs": [{"template": "<id>", "variables": {...}}, ...]}
//   OUT_JSON:  one {"ok": true, "text": "..."} or {"ok": false, "error": "..."} per job, in order.
"use strict";
const fs = require("fs");

const [packageDir, jobsPath, outPath] = process.argv.slice(2);
const { Template } = require(packageDir);
const input = JSON.parse(fs.readFileSync(jobsPath, "utf8"));

// A template that does not parse fails every job that uses it, as a render would.
const parsed = new Map();
for (const [id, source] of Object.entries(input.templates)) {
  try {
    parsed.set(id, { template: new Template(source) });
  } catch (e) {
    parsed.set(id, { error: `parse: ${e.message}` });
  }
}

const results = input.jobs.map((job) => {
  const entry = parsed.get(job.template);
  if (!entry) return { ok: false, error: `no template '${job.template}'` };
  if (entry.error) return { ok: false, error: entry.error };
  try {
    return { ok: true, text: entry.template.render(job.variables) };
  } catch (e) {
    return { ok: false, error: String(e && e.message) };
  }
});
fs.writeFileSync(outPath, JSON.stringify(results));
