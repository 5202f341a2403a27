#!/usr/bin/env bash
# Runs inside the lab VM (../shared/lab/rdma-lab.sh, with /work/shared shared: -v /work/shared):
# riser's initiator on its software iWARP RNIC (user space, over a kernel TCP socket) against
# tgt's iSER target on the kernel's soft-iWARP device siw0 (10.233.1.1:3260). Cells: discovery
# over iSER, login (the readcap session), READ CAPACITY, INQUIRY, write + read-back verify of
# VERIFY_SIZE (default 64MiB). One PASS/FAIL line per cell, then "N passed, N failed".
#   RISER_INITIATOR  path of riser's example initiator (required)
#   TGTD_IN_GUEST    path of tgtd-in-guest.sh (default /work/shared/lab/tgtd-in-guest.sh)
#   LOG_DIR          where the tools' output goes (default: a fresh /tmp dir)
set -u
INIT=${RISER_INITIATOR:?path of the riser initiator example}
TGTD_IN_GUEST=${TGTD_IN_GUEST:-/work/shared/lab/tgtd-in-guest.sh}
IP=${SIW_IP:-10.233.1.1}
IQN=iqn.2001-04.org.example.lab:tgtd-iser
ME=iqn.2026-11.io.riser:initiator
SIZE=${VERIFY_SIZE:-64MiB}
LOG=${LOG_DIR:-$(mktemp -d /tmp/cell5.XXXXXX)}
mkdir -p "$LOG"
URL=iser://$IP:3260/$IQN/1
ulimit -l unlimited
pass=0
fail=0
cell() { # name rc detail
  local d; d=$(printf '%s' "$3" | tr '\n' ' ' | cut -c1-240)
  if [ "$2" = 0 ]; then echo "PASS $1: $d"; pass=$((pass + 1)); else echo "FAIL $1 (rc=$2): $d"; fail=$((fail + 1)); fi
}
# tgt binds the iSER initiator name from this file (tgt 1.0.85 needs an initiator-name ACL).
mkdir -p /etc/iscsi
echo "InitiatorName=$ME" > /etc/iscsi/initiatorname.iscsi
bash "$TGTD_IN_GUEST" "$IP" 3260 iser 128 > "$LOG/tgtd.log" 2>&1 &
tpid=$!
for _ in $(seq 120); do grep -q 'tgtd-in-guest: ready' "$LOG/tgtd.log" && break; kill -0 $tpid 2>/dev/null || break; sleep 0.5; done
if ! grep -q 'tgtd-in-guest: ready' "$LOG/tgtd.log"; then
  cell "tgt iSER target on siw" 1 "$(tail -5 "$LOG/tgtd.log")"
  kill $tpid 2>/dev/null; wait $tpid 2>/dev/null
  echo "$pass passed, $fail failed"
  exit 1
fi
run() { # name timeout command args...
  local name=$1 t=$2; shift 2
  RUST_LOG=${RUST_LOG:-warn} timeout "$t" "$INIT" "$@" > "$LOG/$name.out" 2> "$LOG/$name.err"
}
run discover 120 discover "iser://$IP:3260"
rc=$?
[ $rc = 0 ] && ! grep -q "^$IQN\$" "$LOG/discover.out" && rc=98
cell "discovery over iSER (riser soft RNIC -> tgt on siw)" $rc "$(cat "$LOG/discover.out" "$LOG/discover.err")"
run readcap 180 readcap "$URL"
rc=$?
# readcap logs in, runs READ CAPACITY (16) and logs out: the session's login shows in its
# getting a capacity at all.
if grep -q 'blocks of' "$LOG/readcap.out"; then lrc=0; else lrc=$rc; [ $lrc = 0 ] && lrc=97; fi
cell "login (normal session, RDMAExtensions=Yes)" $lrc "$(grep -h 'login\|error' "$LOG/readcap.err" | head -3)"
[ $rc = 0 ] && ! grep -q '^262144 blocks of 512 bytes' "$LOG/readcap.out" && rc=96
cell "readcap" $rc "$(cat "$LOG/readcap.out" "$LOG/readcap.err")"
run inquiry 180 inquiry "$URL"
rc=$?
[ $rc = 0 ] && ! grep -q '^vendor:' "$LOG/inquiry.out" && rc=95
cell "inquiry" $rc "$(cat "$LOG/inquiry.out" "$LOG/inquiry.err")"
run verify 900 verify "$URL" --size "$SIZE"
rc=$?
[ $rc = 0 ] && ! grep -q 'verified' "$LOG/verify.out" && rc=94
cell "verify $SIZE (write, read back, compare)" $rc "$(cat "$LOG/verify.out" "$LOG/verify.err")"
kill $tpid 2>/dev/null
wait $tpid 2>/dev/null
grep -q 'Segmentation fault\|tgtd died' "$LOG/tgtd.log" && echo "note: $(grep -h 'Segmentation fault\|tgtd died' "$LOG/tgtd.log" | head -1)"
echo "logs: $LOG"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
