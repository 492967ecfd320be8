#!/usr/bin/env bash
# Start a Docker daemon on a CI machine that has the docker client but no engine:
# docker.io from Debian, and --iptables=false because the sandbox has no netfilter to program (builds
# and cells use the host network anyway). Idempotent: returns at once when an engine already answers.
#
#   sudo docker/start-dockerd.sh        env: DOCKERD_LOG (default /var/log/dockerd.log), DOCKERD_WAIT_S (60)
set -euo pipefail

LOG=${DOCKERD_LOG:-/var/log/dockerd.log}
WAIT_S=${DOCKERD_WAIT_S:-60}

answers() { docker info >/dev/null 2>&1; }

if answers; then
  echo "docker: an engine already answers"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "start-dockerd.sh: must run as root to install and start dockerd" >&2
  exit 1
fi
if ! command -v dockerd >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi

# A daemon that is still starting (e.g. a second call racing the first) is waited for, not doubled:
# a second dockerd would only fail on the pid file.
if ! pid=$(pidof dockerd); then
  nohup dockerd --iptables=false >>"$LOG" 2>&1 &
  pid=$!
fi

for ((waited = 0; waited < WAIT_S; waited++)); do
  if answers; then
    echo "docker: daemon (pid $pid) answers after ${waited}s; log: $LOG"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    break
  fi
  sleep 1
done
echo "docker: the daemon did not answer within ${WAIT_S}s; last lines of $LOG:" >&2
tail -n 30 "$LOG" >&2
exit 1
