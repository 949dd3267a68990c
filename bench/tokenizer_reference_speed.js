// Throughput of the JavaScript reference (@lenml/tokenizers, a port of transformers.js's
// tokenizers) on the same text as build/bench_tokenizer: one encode() call on all FILEs
// concatenated, cold (a freshly loaded tokenizer) and warm (the same tokenizer again), 3 rounds,
// medians and bests (it is slow: about a minute per tokenizer). Node runs it on one thread.
//
// Usage: node bench/tokenizer_reference_speed.js --hf DIR [--hf DIR]... FILE...
//   DIR holds tokenizer.json and tokenizer_config.json; @lenml/tokenizers is resolved from there.
"use strict";
const fs = require("fs");
const path = require("path");

const dirs = [];
const files = [];
const args = process.argv.slice(2);
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--hf" && i + 1 < args.length) dirs.push(args[++i]);
  else files.push(args[i]);
}
if (dirs.length === 0 || files.length === 0) {
  console.error("usage: node bench/tokenizer_reference_speed.js --hf DIR [--hf DIR]... FILE...");
  process.exit(2);
}
const text = files.map((f) => fs.readFileSync(f, "utf8")).join("");
const megabytes = Buffer.byteLength(text, "utf8") / 1e6;
const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

const rows = [];
for (const dir of dirs) {
  const { TokenizerLoader } = require(require.resolve("@lenml/tokenizers", { paths: [dir] }));
  const label = path.basename(path.basename(dir) === "models" ? path.dirname(dir) : dir);
  const loads = [], cold = [], warm = [];
  let tokens = 0;
  for (let round = 1; round <= 3; ++round) {
    let start = process.hrtime.bigint();
    const read = (name) => JSON.parse(fs.readFileSync(path.join(dir, name), "utf8"));
    const tokenizer = TokenizerLoader.fromPreTrained({
      tokenizerJSON: read("tokenizer.json"),
      tokenizerConfig: read("tokenizer_config.json"),
    });
    const seconds = () => Number(process.hrtime.bigint() - start) / 1e9;
    loads.push(seconds());
    for (const list of [cold, warm]) {
      start = process.hrtime.bigint();
      tokens = tokenizer.encode(text, { add_special_tokens: false }).length;
      list.push(megabytes / seconds());
    }
    console.log(`${label} (js) round ${round}: load ${loads.at(-1).toFixed(2)} s, ` +
                `cold ${cold.at(-1).toFixed(1)} MB/s, warm ${warm.at(-1).toFixed(1)} MB/s`);
  }
  rows.push(`| ${label} (js) | ${median(loads).toFixed(2)} | ${tokens} | ` +
            `${median(cold).toFixed(1)} | ${median(warm).toFixed(1)} | ` +
            `${Math.max(...cold).toFixed(1)} | ${Math.max(...warm).toFixed(1)} |`);
}
console.log(`\n${megabytes.toFixed(2)} MB of text, node ${process.version}, 3 rounds: median and best\n`);
console.log("| tokenizer | load (s) | tokens | cold MB/s | warm MB/s | best cold | best warm |");
console.log("|---|---|---|---|---|---|---|");
for (const row of rows) console.log(row);
