#!/usr/bin/env bash
# Install what specops and its sandbox fleet need on a Debian machine, as root.
# Idempotent: a second run only checks.  Leaves the project in .venv.  Says only its [setup] lines
# (and the builds' [sandbox] ones) unless a step fails: then that step's whole output.
set -euo pipefail

# quiet CMD...: CMD with its output kept, and shown only if it fails.  A pip whose config names a
# file:// index or find-links location with no page for a project warns once per project ("Location
# 'file:///…' is ignored": some thirty lines on a machine with a local mirror), none of it wrong.
# The builds' progress lines ([sandbox] ..., minutes apart) pass as they come.
quiet() {
  local log status
  log=$(mktemp)
  if "$@" 2>&1 | tee "$log" | { grep --line-buffered '^\[sandbox\] ' >&2 || true; }; then
    status=0
  else
    status=${PIPESTATUS[0]}
  fi
  if [ "$status" -ne 0 ]; then
    echo "[setup] failed (exit $status): $*" >&2
    cat "$log" >&2
  fi
  rm -f "$log"
  return "$status"
}

# install_specops VENV: specops and its test tools, editable, into VENV, from the repository's root.
install_specops() {
  if [ ! -x "$1/bin/python" ]; then
    echo "[setup] creating $1"
    quiet python3 -m venv "$1"
  fi
  echo "[setup] installing specops and its test tools into $1"
  quiet "$1/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' --config-settings editable_mode=compat
  # An editable install compiles nothing: every `inv` would compile specops's modules again where
  # the environment sets PYTHONDONTWRITEBYTECODE.  Their bytecode, as a regular install leaves it.
  quiet "$1/bin/python" -m compileall -q tasks.py specops roles sandbox bench
}

# Sourced (tests/test_setup.py), the script only defines its steps.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi
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
apt_update() { [ -n "$updated" ] || { quiet apt-get update -qq; updated=1; }; }
apt_install() { quiet env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; }
if ((${#packages[@]})); then
  echo "[setup] apt-get install ${packages[*]}"
  apt_update
  apt_install "${packages[@]}"
fi
# promtool checks and unit-tests the alerts `inv monitoring` writes (prometheus 2.42 on bookworm).
# Only the tool is wanted: the server its postinst starts is stopped and disabled, so nothing listens.
if ! command -v promtool >/dev/null 2>&1; then
  echo "[setup] apt-get install prometheus (for promtool)"
  apt_update
  apt_install --no-install-recommends prometheus
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
  apt_install --no-install-recommends prometheus-alertmanager
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
  (cd "$debs" && quiet apt-get download -qq -o APT::Sandbox::User=root prometheus-node-exporter)
fi

install_specops .venv

# The fleet's root filesystem and SGLang layer: built once (about a minute), then cached.
quiet .venv/bin/python -c 'from sandbox import provision; provision.layer("gpubox")'
# The real sglang wheels whose files the patch tests read (never installed): downloaded once.
quiet .venv/bin/python -c 'from sandbox import real_sglang; real_sglang.wheels()'
echo "[setup] ready"
