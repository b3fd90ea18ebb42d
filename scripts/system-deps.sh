#!/usr/bin/env bash
# Debian packages the tests use: chromium for the browser tests, bubblewrap for sandboxing,
# rsync for the dataset push benchmark.
set -euo pipefail
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v rsync >/dev/null || missing+=(rsync)  # the dataset push benchmark's baseline
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]} from Debian" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
