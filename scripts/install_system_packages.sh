#!/usr/bin/env bash
# Debian packages used by the corpus regeneration and the local SLURM cluster tests (needs root).
set -euo pipefail
PACKAGES=(
  # Bible modules for the SWORD library and mod2imp (corpus regeneration)
  sword-text-sparv sword-text-web sword-text-kjv libsword-utils
  # a real SLURM cluster on loopback, with accounting
  slurmctld slurmd slurm-client slurmdbd munge mariadb-server
)
missing=()
for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
