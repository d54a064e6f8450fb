#!/usr/bin/env bash
# Install what specops and its sandbox fleet need on a Debian machine, as root.
# Idempotent: a second run only checks.  Leaves the project in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=()
need() { command -v "$1" >/dev/null 2>&1 || packages+=("$2"); }
need debootstrap debootstrap
need systemd-nspawn systemd-container
need ssh-keygen openssh-client
need ip iproute2
need nsenter util-linux
need openssl openssl  # the sandbox's password-sudo hosts (a shadow hash)
need git git          # the sandbox hub's model repositories
need chromium chromium  # renders `inv report`'s page headless, in a test
python3 -c 'import venv, ensurepip' 2>/dev/null || packages+=(python3-venv)
updated=
apt_update() { [ -n "$updated" ] || { apt-get update -qq; updated=1; }; }
if ((${#packages[@]})); then
  echo "[setup] apt-get install ${packages[*]}"
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
fi
# promtool checks and unit-tests the alerts `inv monitoring` writes (prometheus 2.42 on bookworm).
# Only the tool is wanted: the server its postinst starts is stopped and disabled, so nothing listens.
if ! command -v promtool >/dev/null 2>&1; then
  echo "[setup] apt-get install prometheus (for promtool)"
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  systemctl disable --now prometheus >/dev/null 2>&1 || true
  if [ ! -d /run/systemd/system ]; then  # no systemd as init: its SysV script may have started it
    service prometheus stop >/dev/null 2>&1 || true
  fi
fi
# Alertmanager, for the day-2 fleet test (a webhook receiver on loopback); like Prometheus, only the
# program is wanted: the service its postinst starts is stopped and disabled.
if ! command -v prometheus-alertmanager >/dev/null 2>&1; then
  echo "[setup] apt-get install prometheus-alertmanager"
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-alertmanager >/dev/null
  systemctl disable --now prometheus-alertmanager >/dev/null 2>&1 || true
  if [ ! -d /run/systemd/system ]; then
    service prometheus-alertmanager stop >/dev/null 2>&1 || true
  fi
fi
# node_exporter for the sandbox hosts' monitoring: the .deb only, downloaded once, never installed here.
debs=/var/cache/specops/debs
if ! compgen -G "$debs/prometheus-node-exporter_*.deb" >/dev/null; then
  echo "[setup] apt-get download prometheus-node-exporter into $debs"
  apt_update
  mkdir -p "$debs"
  (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root prometheus-node-exporter)
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
echo "[setup] installing specops and its test tools into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' --config-settings editable_mode=compat
# An editable install compiles nothing: every `inv` would compile specops's modules again where
# the environment sets PYTHONDONTWRITEBYTECODE.  Their bytecode, as a regular install leaves it.
.venv/bin/python -m compileall -q tasks.py specops roles sandbox bench >/dev/null

# The fleet's root filesystem and SGLang layer: built once (about a minute), then cached.
.venv/bin/python -c 'from sandbox import provision; provision.layer("gpubox")'
# The real sglang wheels whose files the patch tests read (never installed): downloaded once.
.venv/bin/python -c 'from sandbox import real_sglang; real_sglang.wheels()'
echo "[setup] ready"
