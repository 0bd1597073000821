#!/bin/sh
# Install WordNet 3.0 from Debian/Ubuntu (wordnet-base, wordnet-sense-index) for the tests,
# which compare our measures with NLTK's. Works as root (no sudo needed, as on a fresh
# machine) and as a user with sudo; does nothing when WordNet is already there.
set -eu
dir="${WORDNET_DIR:-/usr/share/wordnet}"
if [ -f "$dir/data.noun" ] && [ -f "$dir/index.sense" ]; then
  echo "WordNet 3.0 is already in $dir"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=""
elif command -v sudo >/dev/null 2>&1; then
  as_root="sudo"
else
  echo "install-wordnet: not root and no sudo: run as root: apt-get update &&" \
    "apt-get install -y wordnet-base wordnet-sense-index" >&2
  exit 1
fi
# A fresh machine has no package lists yet.
$as_root apt-get update -q
$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q wordnet-base wordnet-sense-index
