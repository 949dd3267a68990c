#!/usr/bin/env bash
# Two hosts made of network namespaces on this machine (a veth pair, 10.99.0.1 and 10.99.0.2,
# hostnames resolving to loopback, no GLOO_SOCKET_IFNAME: the ranks find their address by
# themselves) against the same 4 ranks on one host over loopback:
# - all_reduce bus bandwidth (`shardtrain bench collectives`, nccl-tests' busbw) at 1 MiB and
#   64 MiB, median of ROUNDS runs, the two layouts alternating;
# - step time of the demo model (configs/demo.toml: GPT-2 family, d_model 128, 4 blocks,
#   sequences of 128, global batch 8) under ddp and fsdp hybrid_shard (one replica per host),
#   median of steps 3..STEPS of rank 0, ROUNDS runs each, alternating;
# - how long after one host's link goes down both launchers have ended, with --timeout 10.
# Needs root (network namespaces). Usage: bash bench/multihost.sh [ROUNDS] [STEPS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-3}"
steps="${2:-20}"
bin="$root/build/shardtrain"
work="$(mktemp -d)"
a="stbench$$a"
b="stbench$$b"
cleanup() {
  for ns in "$a" "$b"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work" "/etc/netns/$a" "/etc/netns/$b"
}
trap cleanup EXIT
ip netns add "$a" && ip netns add "$b" || {
  echo "multihost.sh: cannot create network namespaces here (needs root)" >&2
  exit 1
}
ip link add "v$$a" netns "$a" type veth peer name "v$$b" netns "$b"
ip -n "$a" addr add 10.99.0.1/24 dev "v$$a"
ip -n "$b" addr add 10.99.0.2/24 dev "v$$b"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "v$$a" up
ip -n "$b" link set "v$$b" up
# Inside the namespaces the hostname resolves to loopback (as in many containers and VMs).
for ns in "$a" "$b"; do
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$(hostname)" >"/etc/netns/$ns/hosts"
done

# FLAGS PROGRAM...: 2 ranks on each namespace host (host 0's output on stdout), or 4 on this one.
two_hosts() {
  local flags="$1"
  shift
  ip netns exec "$b" env -u GLOO_SOCKET_IFNAME "$bin" launch --nproc 2 --nnodes 2 --node-rank 1 \
    --master-addr 10.99.0.1 --master-port 29500 $flags -- "$@" >"$work/host1.log" 2>&1 &
  local other=$!
  ip netns exec "$a" env -u GLOO_SOCKET_IFNAME "$bin" launch --nproc 2 --nnodes 2 --node-rank 0 \
    --master-addr 10.99.0.1 --master-port 29500 $flags -- "$@"
  wait "$other"
}
one_host() {
  local flags="$1"
  shift
  "$bin" launch --nproc 4 $flags -- "$@"
}

median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.4g\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "# $(date -u +%Y-%m-%d) $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
echo
echo "## all_reduce bus bandwidth (GB/s), 4 ranks, median of $rounds runs"
for size in 1M 64M; do
  for layout in one_host two_hosts; do : >"$work/bw_${layout}_$size"; done
done
for round in $(seq "$rounds"); do
  for layout in one_host two_hosts; do
    "$layout" "--no-prefix" "$bin" bench collectives --op all_reduce --min-bytes 1M --max-bytes 64M \
      --step-factor 64 --iters 10 --warmup 2 2>/dev/null | grep -v '^#' |
      awk -v dir="$work" -v layout="$layout" '$2 == 1048576 { print $6 >> dir "/bw_" layout "_1M" }
        $2 == 67108864 { print $6 >> dir "/bw_" layout "_64M" }'
  done
done
echo "| size | one host (loopback) | two hosts (veth) | two hosts / one host |"
echo "|---|---|---|---|"
for size in 1M 64M; do
  one=$(median <"$work/bw_one_host_$size")
  two=$(median <"$work/bw_two_hosts_$size")
  echo "| $size | $one | $two | $(awk -v a="$two" -v b="$one" 'BEGIN { printf "%.2f", a / b }') |"
done

echo
echo "## demo model step time (s), 4 ranks, median of steps 3..$steps, median of $rounds runs"
settings=(--set "train.steps=$steps" --set train.eval_every=0 --set train.checkpoint_every=0
  --set train.final_checkpoint=false --set train.sample_tokens=0 --set train.micro_batch=2
  --set run.log_every=1000)
echo "| strategy | one host | two hosts | two hosts / one host |"
echo "|---|---|---|---|"
for strategy in ddp hybrid_shard; do
  if [ "$strategy" = ddp ]; then
    extra=(--set parallel.strategy=ddp)
  else
    extra=(--set parallel.strategy=fsdp --set parallel.fsdp.sharding=hybrid_shard
      --set parallel.fsdp.replicate=2)
  fi
  for layout in one_host two_hosts; do : >"$work/step_$layout"; done
  for round in $(seq "$rounds"); do
    for layout in one_host two_hosts; do
      run="$work/run_${strategy}_${layout}_$round"
      (cd "$root" && "$layout" "" "$bin" train --config configs/demo.toml "${settings[@]}" \
        "${extra[@]}" --set "run.dir=$run" >/dev/null 2>&1)
      python3 - "$run/metrics.jsonl" >>"$work/step_$layout" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median(r["step_time_s"] for r in rows if r["rank"] == 0 and r["step"] >= 3))
PY
    done
  done
  one=$(median <"$work/step_one_host")
  two=$(median <"$work/step_two_hosts")
  echo "| $strategy | $one | $two | $(awk -v a="$two" -v b="$one" 'BEGIN { printf "%.2f", a / b }') |"
done

echo
echo "## a link taken down (--timeout 10): seconds until each launcher ended"
down_run() {  # host-index namespace
  (ip netns exec "$2" env -u GLOO_SOCKET_IFNAME "$bin" launch --nproc 2 --nnodes 2 \
    --node-rank "$1" --master-addr 10.99.0.1 --master-port 29500 --timeout 10 --kill-timeout 1 -- \
    "$bin" train --config "$root/configs/demo.toml" "${settings[@]}" --set train.steps=100000 \
    --set parallel.strategy=ddp --set "run.dir=$work/down" >"$work/down$1.log" 2>&1 || true
  date +%s.%N >"$work/end$1") &
}
down_run 1 "$b"
down_run 0 "$a"
for _ in $(seq 600); do [ -s "$work/down/metrics.jsonl" ] && break; sleep 0.2; done
sleep 2
down=$(date +%s.%N)
ip -n "$b" link set "v$$b" down
wait
awk -v d="$down" -v a="$(cat "$work/end0")" -v b="$(cat "$work/end1")" \
  'BEGIN { printf "host 0: %.1f s, host 1: %.1f s\n", a - d, b - d }'
echo "host 0 said: $(grep -o 'waiting for data from global rank [0-9]* at [0-9.]*\|sending to global rank [0-9]* at [0-9.]*\|lost contact with [^:]*' "$work/down0.log" | head -1)"
echo "host 1 said: $(grep -o 'waiting for data from global rank [0-9]* at [0-9.]*\|sending to global rank [0-9]* at [0-9.]*\|lost contact with [^:]*' "$work/down1.log" | head -1)"
