// Writes the fine-tuning demo's data from Debian's `fortunes` package (no download):
//   OUT/fortunes.txt   the fortunes of every topic, for the brief pre-training (data.format text)
//   OUT/chat.jsonl     conversations: a system message, then one or two requests for a fortune on
//                      a topic, each answered with a fortune of that topic (data.format chat)
// Usage: node scripts/sft_data.js OUT_DIR [FORTUNES_DIR]. Deterministic: the same files in, the
// same bytes out.
"use strict";
const fs = require("fs");
const path = require("path");

const out = process.argv[2];
const source = process.argv[3] || "/usr/share/games/fortunes";
if (!out) {
  console.error("usage: node scripts/sft_data.js OUT_DIR [FORTUNES_DIR]");
  process.exit(2);
}
// Topics whose fortunes are short prose (the others are mostly ASCII art or long poems).
const topics = ["computers", "education", "food", "humorists", "law", "love", "medicine",
                "science", "sports", "wisdom", "work"];
const requests = [
  (t) => `Tell me a fortune about ${t}.`,
  (t) => `Give me a saying about ${t}.`,
  (t) => `Something wise about ${t}, please.`,
];

// A small linear congruential generator: the data must not depend on Math.random.
let state = 20240601;
const random = (n) => {
  state = (state * 1103515245 + 12345) % 2147483648;
  return state % n;
};

const fortunes = {};
for (const topic of topics) {
  const file = path.join(source, topic);
  if (!fs.existsSync(file)) {
    console.error(`sft_data: ${file} not found (Debian's fortunes package: bash scripts/setup.sh)`);
    process.exit(2);
  }
  fortunes[topic] = fs
    .readFileSync(file, "utf8")
    .split(/\n%\n/)
    .map((f) => f.replace(/\t/g, " ").trim())
    .filter((f) => f.length > 0 && f.length <= 240 && !f.includes("\n\n"));
}

fs.mkdirSync(out, { recursive: true });
const text = topics.map((t) => fortunes[t].join("\n\n")).join("\n\n");
fs.writeFileSync(path.join(out, "fortunes.txt"), text + "\n");

const lines = [];
for (let i = 0; i < 2400; ++i) {
  const messages = [{ role: "system", content: "You are a fortune cookie. Answer with one fortune." }];
  for (let turn = 0; turn < 1 + (i % 2); ++turn) {
    const topic = topics[random(topics.length)];
    const pool = fortunes[topic];
    messages.push({ role: "user", content: requests[random(requests.length)](topic) });
    messages.push({ role: "assistant", content: pool[random(pool.length)] });
  }
  lines.push(JSON.stringify({ messages }));
}
fs.writeFileSync(path.join(out, "chat.jsonl"), lines.join("\n") + "\n");
const total = topics.reduce((n, t) => n + fortunes[t].length, 0);
console.log(`sft_data: ${total} fortunes of ${topics.length} topics, ${lines.length} conversations ` +
            `in ${out}`);
