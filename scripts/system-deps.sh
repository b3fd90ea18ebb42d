#!/usr/bin/env bash
# Debian packages gpulease needs. `server`: the job sandbox: bubblewrap (namespaces),
# slirp4netns (a job's own user-mode network), nftables (the rules inside that network) and
# util-linux's setpriv (dropping to the instance's uid). `test` (default): also chromium for
# the browser tests and rsync for the dataset push benchmark's baseline.
set -euo pipefail
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v slirp4netns >/dev/null || missing+=(slirp4netns)
command -v nft >/dev/null || missing+=(nftables)
command -v setpriv >/dev/null || missing+=(util-linux)
if [ "${1:-test}" = "test" ]; then
  command -v chromium >/dev/null || missing+=(chromium)
  command -v rsync >/dev/null || missing+=(rsync)
fi
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]} from Debian" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
