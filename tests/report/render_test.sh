#!/usr/bin/env bash
# Renders a `shardtrain report` page in headless Chromium and checks that its charts were drawn
# without a JavaScript error, from the DOM as it stands after the page's scripts ran:
#   - <body data-errors> is 0 (the page counts window errors, unhandled rejections and
#     console.error calls there),
#   - <body data-rendered> equals <body data-charts> (the page's chart placeholders), the number
#     of uPlot roots (div.uplot) in the DOM and, with --expect-charts, N;
#   - every uPlot root has its canvas, and a screenshot is written.
#
# Usage: render_test.sh [--expect-charts N] [--screenshot PNG] [--size WxH] REPORT.html
#                       [-- COMMAND ARGS...]
# With a COMMAND (for example `shardtrain report RUN_DIR --out REPORT.html`) it is run first and
# must write REPORT.html. --screenshot keeps the PNG (docs/images/report.png is made this way);
# --size sets the window (default 1280x2400).
#
# Exits 0 when the page passes, 1 when it does not, 77 (ctest's SKIP_RETURN_CODE) when
# Chromium is not installed. tests/report/fixture_run holds the files of a real run: the demo
# (configs/demo.toml, 2 ranks, steps 100-102 traced) and the scaling.json of the run in
# bench/results/scaling.md; its page draws 8 charts.
set -uo pipefail

expect=""
screenshot=""
size="1280,2400"
html=""
command=()
while [ $# -gt 0 ]; do
  case "$1" in
    --expect-charts) expect="$2"; shift 2 ;;
    --screenshot) screenshot="$2"; shift 2 ;;
    --size) size="${2/x/,}"; shift 2 ;;
    --) shift; command=("$@"); break ;;
    -*) echo "render_test: unknown option '$1'" >&2; exit 2 ;;
    *)
      if [ -n "$html" ]; then echo "render_test: one REPORT.html only ('$1')" >&2; exit 2; fi
      html="$1"; shift ;;
  esac
done
if [ -z "$html" ]; then
  echo "usage: render_test.sh [--expect-charts N] [--screenshot PNG] REPORT.html [-- COMMAND...]" >&2
  exit 2
fi

browser=""
for candidate in chromium chromium-browser; do
  if command -v "$candidate" >/dev/null 2>&1; then
    browser="$(command -v "$candidate")"
    break
  fi
done
if [ -z "$browser" ]; then
  echo "SKIPPED: chromium is not installed (bash scripts/setup.sh --test installs it)"
  exit 77
fi

if [ ${#command[@]} -gt 0 ]; then
  mkdir -p "$(dirname "$html")"
  rm -f "$html"
  "${command[@]}"
  status=$?
  if [ $status -ne 0 ]; then
    echo "FAIL: the command exited with status $status: ${command[*]}"
    exit 1
  fi
fi
if [ ! -s "$html" ]; then
  echo "FAIL: '$html' does not exist or is empty"
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
url="file://$(cd "$(dirname "$html")" && pwd)/$(basename "$html")"
# A profile of its own per run: Chromium refuses a second instance on one profile, and ctest may
# run tests in parallel. --virtual-time-budget lets the page's scripts finish before the dump.
chrome_flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars
  --no-first-run --user-data-dir="$work/profile" --virtual-time-budget=5000)

if ! timeout 120 "$browser" "${chrome_flags[@]}" --dump-dom "$url" >"$work/dom.html" \
  2>"$work/dump.err"; then
  echo "FAIL: chromium --dump-dom failed:"
  tail -20 "$work/dump.err"
  exit 1
fi
png="${screenshot:-$work/report.png}"
mkdir -p "$(dirname "$png")"
rm -f "$png"
timeout 120 "$browser" "${chrome_flags[@]}" --window-size="$size" --screenshot="$png" "$url" \
  >"$work/shot.out" 2>&1

body="$(grep -o -m1 '<body[^>]*>' "$work/dom.html" | head -1)"
attribute() {
  sed -n "s/.* $1=\"\\([^\"]*\\)\".*/\\1/p" <<<"$body"
}
errors="$(attribute data-errors)"
messages="$(attribute data-error-messages)"
rendered="$(attribute data-rendered)"
charts="$(attribute data-charts)"
roots="$(grep -o 'class="uplot[ "]' "$work/dom.html" | wc -l)"
canvases="$(grep -o '<canvas' "$work/dom.html" | wc -l)"

failures=()
[ "$errors" = "0" ] || failures+=("the page recorded ${errors:-no count of} errors: $messages")
[ -n "$charts" ] || failures+=("the page's script did not finish (no data-charts on <body>)")
[ "$rendered" = "$charts" ] || failures+=("drew $rendered of its $charts charts")
[ "$roots" = "$rendered" ] || failures+=("$roots uPlot roots (div.uplot) in the DOM, $rendered charts drawn")
[ "$canvases" -ge "$roots" ] || failures+=("$canvases canvases for $roots uPlot roots")
if [ -n "$expect" ] && [ "$rendered" != "$expect" ]; then
  failures+=("expected $expect charts, drew $rendered")
fi
if [ "$(head -c 8 "$png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" != "89504e470d0a1a0a" ]; then
  failures+=("no screenshot: $(tail -3 "$work/shot.out")")
fi

if [ ${#failures[@]} -gt 0 ]; then
  echo "FAIL: $html"
  for f in "${failures[@]}"; do echo "  - $f"; done
  exit 1
fi
echo "PASS: $html: $rendered charts drawn (uPlot roots $roots, canvases $canvases), no errors;" \
  "screenshot ${screenshot:-taken}"
