#!/usr/bin/env bash
# Installs what the build and the tests need, only what is missing: Debian packages (C++ libraries, header-
# only where possible) and the npm test clients / test data. Idempotent; safe to run on every build.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make pkg-config nlohmann-json3-dev libgtest-dev libfmt-dev libboost-dev libpcre2-dev
          libutf8proc-dev nodejs npm)
missing=()
for p in "${packages[@]}"; do
  # Node may come from elsewhere (e.g. a preinstalled Node 20 with its own npm): accept it.
  if [[ $p == nodejs ]] && command -v node >/dev/null; then continue; fi
  if [[ $p == npm ]] && command -v npm >/dev/null; then continue; fi
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm packages: test clients and test data only (never part of the build).
stamp=node_modules/.moeserve-lock
if [[ ! -f $stamp ]] || ! cmp -s package-lock.json "$stamp"; then
  echo "install-deps: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json "$stamp"
fi
