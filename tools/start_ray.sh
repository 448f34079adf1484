#!/usr/bin/env bash
# Start (or stop) a Ray cluster over the machines of a hostfile, for multi-node training.
#
#   tools/start_ray.sh [HOSTFILE] [--head-ip IP] [--port 6379] [--timeout 300] [--stop]
#
# HOSTFILE (or $HOSTFILE): one machine per line, "host" or "host slots=8" (MPI style); blank lines and # comments are
# skipped. The head is the first line unless --head-ip names it. The head runs `ray start --head` here (or over ssh
# when it is another machine); every other host gets `ray start --address=HEAD:PORT` over ssh, after
# $RAY_ENV_SETUP (default: activating this checkout's .venv, e.g. RAY_ENV_SETUP="source ~/venvs/quiver/bin/activate"),
# so every node runs the same environment. Then it waits until `ray status` counts every node and prints their CPUs
# and GPUs. Exit status 1 names the hosts that could not be reached or did not join. --stop runs `ray stop` on all.
# Then: RAY_ADDRESS=HEAD:PORT python3 -m verl.trainer.main_ppo trainer.nnodes=N ...
# Commands can be swapped for tests: SSH (default "ssh -o BatchMode=yes -o ConnectTimeout=10"), RAY (default "ray").
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hostfile="${HOSTFILE:-}" head_ip="" port=6379 timeout=300 stop=0
while [ $# -gt 0 ]; do
  case "$1" in
    --head-ip) head_ip="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --stop) stop=1; shift ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "start_ray.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) hostfile="$1"; shift ;;
  esac
done
if [ -z "$hostfile" ]; then
  echo "start_ray.sh: no hostfile; pass it as the first argument or set HOSTFILE" >&2
  exit 2
fi
if [ ! -f "$hostfile" ]; then
  echo "start_ray.sh: hostfile $hostfile not found" >&2
  exit 2
fi

hosts=()
while IFS= read -r line || [ -n "$line" ]; do
  line="${line%%#*}"
  read -r host _ <<<"$line"
  [ -n "${host:-}" ] && hosts+=("$host")
done <"$hostfile"
if [ ${#hosts[@]} -eq 0 ]; then
  echo "start_ray.sh: $hostfile lists no host" >&2
  exit 2
fi
head="${head_ip:-${hosts[0]}}"
workers=()
for host in "${hosts[@]}"; do
  [ "$host" != "$head" ] && workers+=("$host")
done
nodes=$((${#workers[@]} + 1))

SSH="${SSH:-ssh -o BatchMode=yes -o ConnectTimeout=10}"
RAY="${RAY:-ray}"
setup="${RAY_ENV_SETUP:-source '$repo/.venv/bin/activate'}"

is_local() {
  case "$1" in
    localhost|127.0.0.1|"$(hostname)"|"$(hostname -f 2>/dev/null)") return 0 ;;
  esac
  hostname -I 2>/dev/null | tr ' ' '\n' | grep -qx "$1"
}

on_host() {  # on_host HOST COMMAND: run COMMAND in the cluster environment on HOST
  local host="$1" command="$2"
  if is_local "$host"; then
    bash -c "$command"
  else
    $SSH "$host" "cd '$repo' 2>/dev/null; $setup && $command"
  fi
}

if [ "$stop" = 1 ]; then
  failed=()
  for host in "$head" "${workers[@]}"; do
    echo "[start_ray] stopping ray on $host"
    on_host "$host" "$RAY stop --force" >/dev/null 2>&1 || failed+=("$host")
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "[start_ray] could not stop ray on: ${failed[*]}" >&2
    exit 1
  fi
  exit 0
fi

echo "[start_ray] head $head:$port, $nodes node(s): $head ${workers[*]}"
if ! on_host "$head" "$RAY start --head --port=$port --dashboard-host=0.0.0.0"; then
  echo "[start_ray] the head $head could not start ray (unreachable over ssh, or ray failed there)" >&2
  exit 1
fi
unreachable=()
for host in "${workers[@]}"; do
  echo "[start_ray] starting a worker on $host"
  on_host "$host" "$RAY start --address=$head:$port" || unreachable+=("$host")
done

deadline=$((SECONDS + timeout))
while :; do
  status="$(on_host "$head" "$RAY status --address=$head:$port" 2>/dev/null)"
  joined=$(grep -cE '^ *[0-9]+ node_' <<<"$status")
  if [ "$joined" -ge "$nodes" ] || [ $SECONDS -ge $deadline ]; then
    break
  fi
  sleep 2
done
echo "$status" | grep -E 'node_|CPU|GPU' | sed 's/^/[start_ray]   /'
if [ ${#unreachable[@]} -gt 0 ] || [ "$joined" -lt "$nodes" ]; then
  echo "[start_ray] $joined of $nodes nodes joined; hosts that could not be reached or did not start ray: ${unreachable[*]:-none}" >&2
  exit 1
fi
echo "[start_ray] all $nodes nodes joined. Train with: RAY_ADDRESS=$head:$port python3 -m verl.trainer.main_ppo trainer.nnodes=$nodes ..."
