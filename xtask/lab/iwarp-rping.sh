#!/usr/bin/env bash
# Runs inside the lab VM (../shared/lab/rdma-lab.sh): riser's rping (software iWARP RNIC, user
# space) against rdma-core's rping on the kernel's siw device, both ways, at a small and a
# large ping size. One line per cell, then "N passed, N failed".
set -u
RPING=${RPING:?path of the riser rping example}
IP=${SIW_IP:-10.233.1.1}
COUNT=${COUNT:-10}
ulimit -l unlimited
pass=0
fail=0
cell() { # name rc detail
  local d; d=$(printf '%s' "$3" | cut -c1-240)
  if [ "$2" = 0 ]; then echo "PASS $1: $d"; pass=$((pass + 1)); else echo "FAIL $1 (rc=$2): $d"; fail=$((fail + 1)); fi
}
# riser client against the kernel's rping server with extra client options.
client_cell() { # port size label riser-options...
  local port=$1 S=$2 label=$3
  shift 3
  timeout 300 rping -s -a "$IP" -p "$port" -C "$COUNT" -S "$S" -V > /tmp/k-server.log 2>&1 &
  local kpid=$!
  sleep 2
  timeout 300 "$RPING" -c -a "$IP" -p "$port" -C "$COUNT" -S "$S" "$@" > /tmp/r-client.log 2>&1
  local rc=$?
  wait $kpid
  local krc=$?
  [ $rc = 0 ] && [ $krc != 0 ] && rc=$krc
  cell "siw rping -s <- riser rping -c $label, -S $S" $rc "$(grep -h 'connected\|verified\|rping:' /tmp/r-client.log | tr '\n' ' ')"
}
port=7174
for S in 64 65000; do
  # The kernel's rping server on siw, riser's client.
  client_cell $port "$S" ""
  port=$((port + 1))
  # riser's server, the kernel's rping client on siw.
  timeout 300 "$RPING" -s -a "$IP" -p $port -C "$COUNT" -S "$S" > /tmp/r-server.log 2>&1 &
  rpid=$!
  sleep 1
  timeout 300 rping -c -a "$IP" -p $port -C "$COUNT" -S "$S" -V -v > /tmp/k-client.log 2>&1
  krc=$?
  wait $rpid
  rc=$?
  [ $rc = 0 ] && [ $krc != 0 ] && rc=$krc
  pings=$(grep -c '^ping data' /tmp/k-client.log)
  [ "$pings" = "$COUNT" ] || { [ $rc = 0 ] && rc=99; }
  cell "riser rping -s <- siw rping -c, -S $S" $rc "$(grep -h 'connection from\|rping:' /tmp/r-server.log | tr '\n' ' ') kernel client verified $pings pings"
  port=$((port + 1))
done
# MPA options: CRC on (riser asks, siw follows), peer-to-peer with the zero-length Write RTR.
client_cell 7190 4096 "--crc" --crc
client_cell 7191 4096 "--p2p" --p2p
echo "$pass passed, $fail failed"
[ $fail = 0 ]
