# Sourced (with no arguments of its own) by the scripts that run a shardtrain benchmark and its
# PyTorch twin side by side. Takes [RANKS] [ROUNDS] off the caller's arguments (defaults 2 and
# 5), leaving the flags meant for both programs in "$@"; sets `root`, `ranks`, `rounds` and
# `launch` (shardtrain launch for RANKS ranks); makes sure Debian's python3-torch is installed
# (with sudo when not root).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ranks="${1:-2}"
rounds="${2:-5}"
shift $(( $# > 2 ? 2 : $# ))
launch=("$root/build/shardtrain" launch --nproc "$ranks" --no-prefix --)
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
fi
