#!/usr/bin/env bash
# evaluate.sh - the lab part of `cargo xtask evaluate --lab`, inside the lab VM (rdma-lab.sh).
#
# Per link in LINKS (rxe: RoCE on 10.233.0.1, siw: iWARP on 10.233.1.1) one riser target (the
# rdma-core provider's iSER portal on ADDR:3260, a TCP portal on ADDR:3261, a RAM LUN), measured
# by the riser initiator (iSER through rdma-core, and TCP) and by the Linux kernel's initiator
# (open-iscsi with ib_iser, and with iscsi_tcp; O_DIRECT dd on the block device): the paper's
# Figure 5 (kernel initiator, user-space target) on both RDMA transports. Repetitions (EVAL_REPS)
# interleave the transports.
#
# Output, one line per run:  EVAL LINK INITIATOR TRANSPORT OP IO_BYTES QD VALUE UNIT
# Failures:                  FAIL eval LINK ...: why
# The VM runs under TCG emulation: only ratios between these figures mean anything.
set -u
LIB=$(dirname "$0")/lib.sh
[ -f "$LIB" ] || LIB=$PWD/xtask/lab/lib.sh
# shellcheck source=lib.sh
. "$LIB" || exit 2

RISER_TARGET=${RISER_TARGET:-$PWD/target/release/examples/target}
RISER_INITIATOR=${RISER_INITIATOR:-$PWD/target/release/examples/initiator}
LINKS=${LINKS:-rxe siw}
EVAL_REPS=${EVAL_REPS:-2}
EVAL_MIB=${EVAL_MIB:-64}
EVAL_SECS=${EVAL_SECS:-3}
IQN=iqn.2026-11.io.riser:evaluate-lab
FAILED=0

link_ip() { case $1 in rxe) echo 10.233.0.1 ;; siw) echo 10.233.1.1 ;; esac; }
fail() { echo "FAIL eval $*"; FAILED=$((FAILED + 1)); }

# rinit LINK TRANSPORT URL: the riser initiator's 1 MiB writes and reads (QD 8) and 4 KiB random
# reads (QD 8) against URL.
rinit() {
  local link=$1 transport=$2 url=$3 op out v extra=()
  [ "$transport" = iser ] && extra=(--rdma-provider rdma-core)
  for op in write read; do
    out=$(timeout 600 "$RISER_INITIATOR" "$op" "$url" --size "${EVAL_MIB}MiB" --block-size 1MiB --queue-depth 8 "${extra[@]}" 2>&1)
    v=$(printf '%s' "$out" | sed -n 's/.*(\([0-9.]*\) MiB\/s).*/\1/p' | tail -n 1)
    if [ -n "$v" ]; then echo "EVAL $link riser $transport $op 1048576 8 $v MiB/s"; else fail "$link riser $transport $op: $(_oneline "$out")"; fi
  done
  out=$(timeout 600 "$RISER_INITIATOR" load "$url" --rw randread --block-size 4KiB --queue-depth 8 --seconds "$EVAL_SECS" --size 256MiB "${extra[@]}" 2>&1)
  v=$(printf '%s' "$out" | tr ' ' '\n' | sed -n 's/^iops=//p')
  if [ -n "$v" ]; then echo "EVAL $link riser $transport randread 4096 8 $v IOPS"; else fail "$link riser $transport randread: $(_oneline "$out")"; fi
}

# kinit LINK TRANSPORT IFACE PORTAL: open-iscsi logs in through IFACE, O_DIRECT dd of EVAL_MIB
# MiB in 1 MiB requests, written then read, logs out.
kinit() {
  local link=$1 transport=$2 iface=$3 portal=$4 dev t0 t1
  if ! kinit_discover "$portal" "$iface" "$IQN" || ! kinit_login "$portal" "$iface" "$IQN" || ! wait_for "$WAIT_DEV" _has_dev "$IQN"; then
    fail "$link kernel $transport: no block device ($(tail_log "$CELL_LOG/login.txt"))"
    kinit_cleanup "$IQN" "$portal" "$iface"
    return
  fi
  dev=/dev/$(kinit_dev "$IQN")
  pattern_file "$EVAL_MIB"
  t0=$(now)
  if timeout "$T_IO" dd if="$PATTERN" of="$dev" bs=1M count="$EVAL_MIB" oflag=direct status=none 2> "$CELL_LOG/dd.err"; then
    t1=$(now)
    echo "EVAL $link kernel $transport write 1048576 1 $(mibps "$EVAL_MIB" "$t0" "$t1") MiB/s"
  else
    fail "$link kernel $transport write: $(tail_log "$CELL_LOG/dd.err")"
  fi
  t0=$(now)
  if timeout "$T_IO" dd if="$dev" of=/dev/null bs=1M count="$EVAL_MIB" iflag=direct status=none 2> "$CELL_LOG/dd.err"; then
    t1=$(now)
    echo "EVAL $link kernel $transport read 1048576 1 $(mibps "$EVAL_MIB" "$t0" "$t1") MiB/s"
  else
    fail "$link kernel $transport read: $(tail_log "$CELL_LOG/dd.err")"
  fi
  kinit_logout "$portal" "$iface" "$IQN" || fail "$link kernel $transport: logout ($(tail_log "$CELL_LOG/logout.txt"))"
  kinit_cleanup "$IQN" "$portal" "$iface"
}

lab_init
iscsid_start || { echo "FAIL eval: iscsid did not start"; exit 1; }
for link in $LINKS; do
  cell_begin "eval $link"
  [ -e "/sys/class/infiniband/${link}0" ] || { fail "$link: no ${link}0 in this guest"; continue; }
  addr=$(link_ip "$link")
  if ! riser_target_start target "$addr:3261" "$RISER_TARGET" --target-name "$IQN" --portal "$addr:3261" \
    --rdma-provider rdma-core --iser-portal "$addr:3260" --lun ram:256MiB; then
    fail "$link: target: $TARGET_ERR"
    continue
  fi
  # The LUN written once, so no run pays for the target's first touch of its memory.
  timeout 600 "$RISER_INITIATOR" write "iscsi://$addr:3261/$IQN/0" --size 256MiB --block-size 1MiB > /dev/null 2>&1
  for rep in $(seq "$EVAL_REPS"); do
    note "repetition $rep"
    rinit "$link" iser "iser://$addr:3260/$IQN/0"
    rinit "$link" tcp "iscsi://$addr:3261/$IQN/0"
    kinit "$link" iser iser "$addr:3260"
    kinit "$link" tcp default "$addr:3261"
  done
  riser_target_stop
done
iscsid_stop
[ "$FAILED" = 0 ]
