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
  if [ "$2" = 0 ]; then echo "PASS $1: $3"; pass=$((pass + 1)); else echo "FAIL $1 (rc=$2): $3"; fail=$((fail + 1)); fi
}
port=7174
for S in 64 65000; do
  # The kernel's rping server on siw, riser's client.
  timeout 300 rping -s -a "$IP" -p $port -C "$COUNT" -S "$S" -V > /tmp/k-server.log 2>&1 &
  kpid=$!
  sleep 2
  timeout 300 "$RPING" -c -a "$IP" -p $port -C "$COUNT" -S "$S" > /tmp/r-client.log 2>&1
  rc=$?
  wait $kpid
  krc=$?
  [ $rc = 0 ] && [ $krc != 0 ] && rc=$krc
  cell "siw rping -s <- riser rping -c, -S $S" $rc "$(grep -h 'connected\|verified\|rping:' /tmp/r-client.log | tr '\n' ' ') $(tail -2 /tmp/k-server.log | tr '\n' ' ')"
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
  cell "riser rping -s <- siw rping -c, -S $S" $rc "$(grep -h 'connection from\|rping:' /tmp/r-server.log | tr '\n' ' ') kernel client verified $pings pings; $(grep -v '^ping data' /tmp/k-client.log | tail -2 | tr '\n' ' ')"
  port=$((port + 1))
done
dmesg | grep -i siw | tail -5
echo "$pass passed, $fail failed"
[ $fail = 0 ]
