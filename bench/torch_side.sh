# Sourced by the side-by-side scripts that run a PyTorch twin of a shardtrain benchmark: makes
# sure Debian's python3-torch is installed (with sudo when not root).
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
fi
