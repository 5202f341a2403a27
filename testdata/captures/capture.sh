#!/usr/bin/env bash
# Regenerates the golden PDU captures in this folder: libiscsi's tools talking to a private tgtd
# on loopback, recorded with tcpdump, then split into one file per PDU by split.py (which
# cross-checks its PDU count against tshark's iSCSI dissector).
#   Needs: tgt libiscsi-bin tcpdump tshark (apt-get install -y ...), root.
#   Usage: testdata/captures/capture.sh   (from the repository root)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS=${PEERS:-$HERE/../../../shared/peers}
PORT=${PORT:-3271}
IQN=iqn.2026-11.io.riser.test:capture
WORK=$(mktemp -d)
trap 'kill $TCPDUMP 2>/dev/null || true; "$PEERS/start-tgtd.sh" stop $PORT >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
"$PEERS/start-tgtd.sh" start $PORT $IQN 64M file > "$WORK/tgtd.out"
T="tgtadm -C $PORT --lld iscsi"
URL=iscsi://127.0.0.1:$PORT/$IQN/1

run() { # name, then the command
  local name=$1; shift
  tcpdump -U --immediate-mode -i lo -w "$WORK/$name.pcap" "tcp port $PORT" 2> "$WORK/tcpdump.err" &
  TCPDUMP=$!
  for _ in $(seq 50); do grep -q listening "$WORK/tcpdump.err" && break; sleep 0.1; done
  sleep 0.3
  "$@" > "$WORK/$name.log" 2>&1 || echo "note: $name exited $?"
  sleep 1
  kill -INT $TCPDUMP; wait $TCPDUMP 2>/dev/null || true
  rm -rf "$HERE/$name"; mkdir -p "$HERE/$name"
  python3 "$HERE/split.py" "$WORK/$name.pcap" $PORT "$HERE/$name"
}

run discovery iscsi-ls -s iscsi://127.0.0.1:$PORT
run inquiry iscsi-inq -e 1 -c 0x83 $URL
run readcap iscsi-readcapacity16 $URL
run rw iscsi-test-cu --dataloss --test=SCSI.CompareAndWrite.Miscompare $URL
run residuals iscsi-test-cu --dataloss --test=iSCSI.iSCSIResiduals.Write10Residuals $URL
run modesense iscsi-test-cu --dataloss --test=SCSI.ModeSense6.AllPages $URL
run tmf iscsi-test-cu --dataloss --test=iSCSI.iSCSITMF.AbortTaskSimpleAsync $URL
# CHAP one-way.
$T --mode account --op new --user riseruser --password risersecret1234
$T --mode account --op bind --tid 1 --user riseruser
run chap iscsi-inq "iscsi://riseruser%risersecret1234@127.0.0.1:$PORT/$IQN/1"
