#!/usr/bin/env bash
# matrix.sh - the kernel's iSCSI stack against riser, inside the lab VM (../shared/lab/rdma-lab.sh).
#
#   cd <worktree> && bash ../shared/lab/rdma-lab.sh run --links "rxe siw" --timeout 1800 \
#       -e CELLS="4 6 fault lio-selftest" --script xtask/lab/matrix.sh
#
# Cells (CELLS, in the order given; default: every cell below but the self-tests):
#   traps         the rdma-core provider's driver-trap tests (RDMA_LAB_TESTS: the test binary of
#                 crates/verbs/tests/rdma_core_lab.rs), one line per test.
#   1             riser initiator -> riser target, both on rdma-core, once per link in LINKS:
#                 discovery over iSER, `verify` of DD_MIB MiB, the target's RDMA resources back.
#   2             open-iscsi + ib_iser -> riser target on rdma-core, once per link in LINKS
#                 (rxe: 10.233.0.1, siw: 10.233.1.1). The target command comes from
#                 CELL2_TARGET_CMD (default $RDMA_TARGET_CMD), {addr} replaced by the link's address
#                 ({target} = $RISER_TARGET). CELL2_LABEL names the target in the cell's name.
#   3             riser initiator (CELL3_INITIATOR + CELL3_ARGS, default $RISER_INITIATOR
#                 --rdma-provider rdma-core) -> LIO + ib_isert on rxe (10.233.0.1:3260):
#                 discovery over iSER and `verify` of 64 MiB.
#   3b            riser initiator on rdma-core -> tgt's iSER target on siw (TGTD_IN_GUEST).
#   5             riser initiator on its software iWARP RNIC -> tgt's iSER target on siw.
#   7             riser's rping (software RNIC) against the kernel's siw rping, both ways
#                 (xtask/lab/iwarp-rping.sh; RPING: the rping example).
#   fault-rinit   riser initiator (rdma-core) killed mid-transfer against the riser target
#                 (rdma-core), per link: the target's RDMA resources back, a fresh verify passes.
#   fault-target  riser target (rdma-core, file LUN) killed mid-soak and restarted, per link: the
#                 initiator's I/O fails with its cause, works again within FAULT_RECOVER_S (15)
#                 seconds of the target's return, and no data mismatch.
#   4             open-iscsi + ib_iser over siw -> riser target on its software iWARP RNIC
#                 (CELL4_TARGET_CMD, default '{target} --iser-portal 10.233.1.1:3260 --lun ram:256MiB').
#   6 (6a, 6b)   6a open-iscsi + iscsi_tcp -> riser target over TCP (CELL6_TARGET_CMD, default
#                 '{target} --portal {addr}:3260 --lun ram:256MiB'); 6b riser initiator over TCP
#                 -> LIO over TCP (`verify iscsi://...` of 64 MiB). {addr} = TCP_IP.
#   fault         open-iscsi + ib_iser over siw against the riser target (FAULT_TARGET_CMD, default
#                 the rdma-core target on siw), killed mid-transfer: iscsid SIGKILLed, then the initiator's connection
#                 aborted with `ss -K` (RST) while O_DIRECT writes are in flight; then a fresh
#                 iscsid, the stale session logged out, a fresh login and a 16 MiB verify, and the
#                 target's connections and the guest's RDMA resources back to the baseline.
#                 ss -K sees TCP and iWARP (siw) connections only: on RoCE (rxe) give
#                 FAULT_ABORT_CMD, a command ({addr}, {port} replaced) that aborts the initiator's
#                 connection and prints one line per connection aborted.
#   fault-tcp     the same over iscsi_tcp against the riser target's TCP portal (CELL6_TARGET_CMD).
#   ops           riser as an operable service: open-iscsi + iscsi_tcp -> the riser target's TCP
#                 portal on TCP_IP (three RAM LUNs, 64/32/16 MiB, and --control; RISERCTL: the
#                 riserctl example; jq). Every LUN seen with its size; a LUN added live
#                 (store_add + lun_add LUN 5, iscsiadm --rescan: a 4th sdX, O_DIRECT
#                 write/read/compare); lun1 resized to 64 MiB (rescan: the new size, its new end
#                 readable); session_logout (the target's Async Message: iscsid logs out and in
#                 again, another TSIH, the same sdX, data kept, I/O works); LUN 2 removed live
#                 (rescan: Linux keeps the disk with 0 bytes after LOGICAL UNIT NOT SUPPORTED, it
#                 is deleted through sysfs; the kernel's SCSI commands of that rescan are counted
#                 from trace events; the other LUNs still work); logout: `riserctl session_list`
#                 empty, no sdX.
#   ops-iser      the same over open-iscsi + ib_iser on siw -> the riser target's software iWARP
#                 RNIC (10.233.1.1:3260).
#   rbd-mpath     HA gateways on Ceph RBD under the kernel's multipath (not in --quick: minutes
#                 under TCG; its own budget MPATH_BUDGET, 900 s): a Ceph cluster in the guest
#                 (CEPH_UP, memstore), one RBD image served by two riser gateways (RISER_RBD_TARGET,
#                 built with `rbd`; service config files, one target name, implicit ALUA: A on
#                 MPATH_A (rxe's address) port group 1, optimized; B on MPATH_B (siw's) group 2,
#                 non-optimized). udevd, multipathd (group_by_prio, prio alua, hardware_handler
#                 "1 alua", failback immediate, no_path_retry 12, tur), open-iscsi logged in to
#                 both: one map, A's path active (prio 50), B's enabled (prio 10). A writer puts
#                 MPATH_CHUNK_KIB chunks through the map with O_DIRECT, each read back and
#                 compared; A is SIGKILLed: I/O must go on through B (the stall is measured), and
#                 B must take the unit over (it fences A through the cluster, then reports its
#                 group active/optimized: prio 50); A is started again: its path must be
#                 active/ready again (enabled: B keeps the unit) while the writes go on through
#                 B; then the whole region is
#                 read back and compared. MPATH_SCSI_TIMEOUT (90): both paths' SCSI timeout.
#   lio-selftest  self-test of the LIO iSER setup used by cell 3: open-iscsi + ib_iser -> LIO +
#                 ib_isert on rxe, the full block-device test. Not cell 3.
#   lio-selftest-tcp  the same over TCP (the LIO setup of 6b).
#
# Kernel-initiator cells: discovery (SendTargets, over iSER itself with -I iser), login, sdX from
# sysfs, DD_MIB (64) MiB O_DIRECT write + read + compare, mkfs.ext4 + files + e2fsck -fn + remount
# check, logout, then no session, no sdX, and `rdma res` qp/mr/cm_id (whole guest and the target's
# pid) and the target's socket count as before the login.
#
# Environment: RISER_TARGET, RISER_INITIATOR, RISERCTL (paths; default target/release/examples/...),
# RISER_RBD_TARGET (default target/rbd/release/examples/target), CEPH_UP, MPATH_* (rbd-mpath),
# CELLS, LINKS (cell 2; default "rxe siw"), TCP_IP (default siw's 10.233.1.1, else rxe's),
# RISER_IQN (the riser target's name), LIO_IQN, DD_MIB, DD_BS, FAULT_LOAD_BS, TARGET_RUST_LOG (RUST_LOG of the riser
# target), ISCSID_CONF_EXTRA (more iscsid.conf lines), PCAP=1 (tcpdump per cell), LAB_LOGS
# (default /lab/logs = the run dir on the host; one directory per cell).
set -u
# rdma-lab.sh --script copies this file into the run dir and starts it in the shared worktree.
LIB=$(dirname "$0")/lib.sh
[ -f "$LIB" ] || LIB=$PWD/xtask/lab/lib.sh
# shellcheck source=lib.sh
. "$LIB" || exit 2

RISER_TARGET=${RISER_TARGET:-$PWD/target/release/examples/target}
RISER_INITIATOR=${RISER_INITIATOR:-$PWD/target/release/examples/initiator}
CELLS=${CELLS:-traps 1 2 3 3b 4 5 6 7 fault fault-tcp fault-rinit fault-target ops ops-iser rbd-mpath}
LINKS=${LINKS:-rxe siw}
RXE_IP=10.233.0.1
SIW_IP=10.233.1.1
RISER_IQN=${RISER_IQN:-iqn.2026-11.io.riser:target0}
LIO_IQN=${LIO_IQN:-iqn.2003-01.org.linux-iscsi.lab:lio}
RDMA_TARGET_CMD=${RDMA_TARGET_CMD:-{target\} --portal none --rdma-provider rdma-core --iser-portal {addr\}:3260 --lun ram:256MiB}
CELL2_TARGET_CMD=${CELL2_TARGET_CMD:-$RDMA_TARGET_CMD}
CELL4_TARGET_CMD=${CELL4_TARGET_CMD:-{target\} --iser-portal $SIW_IP:3260 --lun ram:256MiB}
CELL6_TARGET_CMD=${CELL6_TARGET_CMD:-{target\} --portal {addr\}:3260 --lun ram:256MiB}
FAULT_TARGET_CMD=${FAULT_TARGET_CMD:-$RDMA_TARGET_CMD}
CELL3_INITIATOR=${CELL3_INITIATOR:-$RISER_INITIATOR}
CELL3_ARGS=${CELL3_ARGS:---rdma-provider rdma-core}
RINIT_IQN=iqn.2026-11.io.riser:initiator
TGT_IQN=iqn.2001-04.org.example.lab:tgtd-iser
TGTD_IN_GUEST=${TGTD_IN_GUEST:-/work/shared/lab/tgtd-in-guest.sh}
RPING=${RPING:-$(dirname "$RISER_TARGET")/rping}
RISERCTL=${RISERCTL:-$(dirname "$RISER_TARGET")/riserctl}

has_ip() { ip -4 -o addr show 2>/dev/null | grep -q " $1/"; }
has_dev() { [ -e "/sys/class/infiniband/$1" ]; }
link_ip() { case $1 in rxe) echo $RXE_IP ;; siw) echo $SIW_IP ;; esac; }
if [ -z "${TCP_IP:-}" ]; then
  if has_ip $SIW_IP; then TCP_IP=$SIW_IP; elif has_ip $RXE_IP; then TCP_IP=$RXE_IP; else TCP_IP=127.0.0.1; fi
fi

# target_argv CMD ADDR: the target command line as an array TARGET_ARGV ({target}, {addr} replaced).
target_argv() {
  local c=${1//\{target\}/$RISER_TARGET}
  c=${c//\{addr\}/$2}
  read -ra TARGET_ARGV <<< "$c"
}

# kinit_vs_riser IFACE ADDR:PORT CMD: starts the riser target, the block-device test, stops it.
kinit_vs_riser() {
  local iface=$1 portal=$2
  target_argv "$3" "${portal%:*}"
  if ! riser_target_start target "$portal" "${TARGET_ARGV[@]}"; then
    cell_fail "target start" "$TARGET_ERR"
    return
  fi
  kinit_blocktest "$portal" "$iface" "$RISER_IQN" "$TARGET_PID"
  riser_target_stop
}

cell_2() {
  local l cmd
  for l in $LINKS; do
    cell_begin "2 open-iscsi ib_iser/$l -> riser target (${CELL2_LABEL:-rdma-core provider})"
    has_dev "${l}0" || { cell_skip "no ${l}0 in this guest (--links)"; continue; }
    cmd=$CELL2_TARGET_CMD
    kinit_vs_riser iser "$(link_ip "$l"):3260" "$cmd"
  done
}

cell_4() {
  cell_begin "4 open-iscsi ib_iser/siw -> riser target (software iWARP RNIC)"
  has_dev siw0 || { cell_skip "no siw0 in this guest"; return; }
  kinit_vs_riser iser "$SIW_IP:3260" "$CELL4_TARGET_CMD"
}

# rinit_vs_lio MODE ADDR:PORT URL_SCHEME CMD...: LIO with one portal, riser's initiator: discover
# (TCP only: the software RNIC speaks no RoCE), verify 64 MiB, then LIO has no session left.
rinit_vs_lio() {
  local mode=$1 np=$2 scheme=$3 base disc
  shift 3
  base=$(res_snapshot)
  if ! lio_setup "$LIO_IQN" "$np" "$mode"; then lio_teardown; cell_fail "LIO setup" "$LIO_ERR"; return; fi
  if ! timeout 120 "$@" discover "$scheme://$np" > "$CELL_LOG/rinit-discover.txt" 2>&1 || ! grep -qx "$LIO_IQN" "$CELL_LOG/rinit-discover.txt"; then
    lio_teardown
    cell_fail discovery "$LIO_IQN not discovered: $(tail_log "$CELL_LOG/rinit-discover.txt")"
    return
  fi
  disc="discovery over $scheme ok, "
  if ! rinit_verify "$scheme://$np/$LIO_IQN/0" "${DD_MIB}MiB" "$@"; then
    lio_teardown
    cell_fail verify "$RINIT_ERR"
    return
  fi
  if ! wait_for "$WAIT_GONE" _lio_idle "$LIO_IQN"; then
    local s
    s=$(lio_sessions "$LIO_IQN")
    lio_teardown
    cell_fail leftovers "LIO still has a session after the initiator exited: $s"
    return
  fi
  if ! lio_teardown; then cell_fail "LIO teardown" "configfs entries left"; return; fi
  if ! wait_for "$WAIT_GONE" _res_is "$base"; then cell_fail leftovers "rdma resources before [$base] after [$(res_snapshot)]"; return; fi
  cell_pass "${disc:-}$RINIT_DETAIL; LIO session gone after logout, LIO torn down, $(res_snapshot) as before"
}

cell_3() {
  cell_begin "3 riser initiator (rdma-core) -> LIO ib_isert/rxe"
  has_dev rxe0 || { cell_skip "no rxe0 in this guest"; return; }
  local argv
  read -ra argv <<< "$CELL3_INITIATOR"
  # shellcheck disable=SC2206  # CELL3_ARGS: extra options, split on blanks
  argv+=($CELL3_ARGS)
  T_RINIT=${CELL3_TIMEOUT:-300} rinit_vs_lio iser "$RXE_IP:3260" iser "${argv[@]}"
}

cell_6() { cell_6a; cell_6b; }
cell_6a() {
  cell_begin "6a open-iscsi iscsi_tcp -> riser target TCP"
  kinit_vs_riser default "$TCP_IP:3260" "$CELL6_TARGET_CMD"
}
cell_6b() {
  cell_begin "6b riser initiator TCP -> LIO TCP"
  rinit_vs_lio tcp "$TCP_IP:3260" iscsi "$RISER_INITIATOR"
}

cell_lio-selftest() {
  cell_begin "lio-selftest (NOT cell 3) open-iscsi ib_iser/rxe -> LIO ib_isert/rxe"
  has_dev rxe0 || { cell_skip "no rxe0 in this guest"; return; }
  local base
  base=$(res_snapshot)
  if ! lio_setup "$LIO_IQN" "$RXE_IP:3260" iser; then lio_teardown; cell_fail "LIO setup" "$LIO_ERR"; return; fi
  kinit_blocktest "$RXE_IP:3260" iser "$LIO_IQN" || { lio_teardown; return; }
  lio_teardown || note "LIO teardown left configfs entries"
  wait_for "$WAIT_GONE" _res_is "$base" || note "after LIO teardown: rdma resources before [$base] after [$(res_snapshot)]"
}

cell_lio-selftest-tcp() {
  cell_begin "lio-selftest-tcp open-iscsi iscsi_tcp -> LIO TCP"
  if ! lio_setup "$LIO_IQN" "$TCP_IP:3260" tcp; then lio_teardown; cell_fail "LIO setup" "$LIO_ERR"; return; fi
  kinit_blocktest "$TCP_IP:3260" default "$LIO_IQN"
  lio_teardown || note "LIO teardown left configfs entries"
}


# ------------------------------------------------------------------------------ riser <-> riser, tgt, rping, traps

# rinit_discover URL CMD...: CMD discover URL lists IQN (the riser initiator, any provider).
rinit_discover() { # IQN URL CMD...
  local iqn=$1 url=$2
  shift 2
  timeout 120 "$@" discover "$url" > "$CELL_LOG/rinit-discover.txt" 2>&1 && grep -qx "$iqn" "$CELL_LOG/rinit-discover.txt"
}

# rdma_cell_start LINK: for a cell per link against the riser target on rdma-core: skips the cell
# without the link's device, else starts the target on the link's address. Sets ip, pid, base
# (the resources before anything connected); false when the cell is over.
rdma_cell_start() {
  has_dev "${1}0" || { cell_skip "no ${1}0 in this guest"; return 1; }
  ip=$(link_ip "$1")
  target_argv "$RDMA_TARGET_CMD" "$ip"
  if ! riser_target_start target "$ip:3260" "${TARGET_ARGV[@]}"; then cell_fail "target start" "$TARGET_ERR"; return 1; fi
  pid=$TARGET_PID
  base=$(res_snapshot "$pid")
}

cell_1() {
  local l ip base pid
  for l in $LINKS; do
    cell_begin "1 riser initiator (rdma-core) -> riser target (rdma-core), $l"
    rdma_cell_start "$l" || continue
    if ! rinit_discover "$RISER_IQN" "iser://$ip:3260" "$RISER_INITIATOR" --rdma-provider rdma-core; then
      riser_target_stop
      cell_fail discovery "$(tail_log "$CELL_LOG/rinit-discover.txt")"
      continue
    fi
    if ! rinit_verify "iser://$ip:3260/$RISER_IQN/0" "${DD_MIB}MiB" "$RISER_INITIATOR" --rdma-provider rdma-core; then
      riser_target_stop
      cell_fail verify "$RINIT_ERR | target: $(tail_log "$TARGET_LOG" 2)"
      continue
    fi
    if ! wait_for "$WAIT_GONE" _res_is "$base" "$pid"; then
      local now_
      now_=$(res_snapshot "$pid")
      riser_target_stop
      cell_fail leftovers "before [$base] after [$now_]"
      continue
    fi
    local keys
    keys=$(grep -ho 'iSER through [^ ]* ([A-Za-z]* keys)' "$CELL_LOG/rinit-verify.txt" | head -1)
    riser_target_stop
    cell_pass "discovery over iSER ok, ${keys:+$keys, }$RINIT_DETAIL, logged out; target $base as before"
  done
}

TGT_PID=""
# tgt_start: tgt's iSER target (LUN 1) on siw, bound to the riser initiator's name.
tgt_start() {
  TGT_LOG=$CELL_LOG/tgtd.log
  [ -f "$TGTD_IN_GUEST" ] || { TGT_ERR="$TGTD_IN_GUEST not found (share ../shared with -v)"; return 1; }
  TGTD_INITIATOR_NAME=$RINIT_IQN bash "$TGTD_IN_GUEST" "$SIW_IP" 3260 iser 128 > "$TGT_LOG" 2>&1 &
  TGT_PID=$!
  if ! wait_for 60 grep -q 'tgtd-in-guest: ready' "$TGT_LOG"; then
    TGT_ERR="tgt did not come up: $(tail_log "$TGT_LOG")"
    tgt_stop
    return 1
  fi
}
tgt_stop() {
  stop_pid "$TGT_PID" 20
  TGT_PID=""
}

# rinit_vs_tgt CMD...: the riser initiator CMD against tgt's iSER target on siw.
rinit_vs_tgt() {
  has_dev siw0 || { cell_skip "no siw0 in this guest"; return; }
  local base
  base=$(res_snapshot)
  if ! tgt_start; then cell_fail "tgt start" "$TGT_ERR"; return; fi
  if ! rinit_discover "$TGT_IQN" "iser://$SIW_IP:3260" "$@"; then
    tgt_stop
    cell_fail discovery "$(tail_log "$CELL_LOG/rinit-discover.txt")"
    return
  fi
  if ! rinit_verify "iser://$SIW_IP:3260/$TGT_IQN/1" "${DD_MIB}MiB" "$@"; then
    tgt_stop
    cell_fail verify "$RINIT_ERR"
    return
  fi
  tgt_stop
  if ! wait_for "$WAIT_GONE" _res_is "$base"; then cell_fail leftovers "rdma resources before [$base] after [$(res_snapshot)]"; return; fi
  cell_pass "discovery over iSER ok, $RINIT_DETAIL; $(res_snapshot) as before"
}

cell_3b() {
  cell_begin "3b riser initiator (rdma-core) -> tgt iSER/siw"
  rinit_vs_tgt "$RISER_INITIATOR" --rdma-provider rdma-core
}

cell_5() {
  cell_begin "5 riser initiator (software iWARP RNIC) -> tgt iSER/siw"
  rinit_vs_tgt "$RISER_INITIATOR"
}

# report_sub LABEL FILE: the PASS/FAIL lines of a sub-script, counted as cells of this run.
report_sub() {
  local line
  while IFS= read -r line; do
    case $line in
      "PASS "*) echo "PASS $1 ${line#PASS }"; LAB_PASS=$((LAB_PASS + 1)) ;;
      "FAIL "*) echo "FAIL $1 ${line#FAIL }"; LAB_FAIL=$((LAB_FAIL + 1)) ;;
    esac
  done < "$2"
}

cell_7() {
  CELL=7
  CELL_LOG=$LAB_LOGS/7
  mkdir -p "$CELL_LOG"
  has_dev siw0 || { echo "SKIP 7: no siw0 in this guest"; LAB_SKIP=$((LAB_SKIP + 1)); return; }
  RPING=$RPING bash "$(dirname "$LIB")/iwarp-rping.sh" > "$CELL_LOG/rping.txt" 2> "$CELL_LOG/rping.err"
  grep -q '^PASS \|^FAIL ' "$CELL_LOG/rping.txt" || { echo "FAIL 7 rping: no result: $(tail_log "$CELL_LOG/rping.err")"; LAB_FAIL=$((LAB_FAIL + 1)); return; }
  report_sub 7 "$CELL_LOG/rping.txt"
  CELL=""
}

cell_traps() {
  CELL=traps
  CELL_LOG=$LAB_LOGS/traps
  mkdir -p "$CELL_LOG"
  if [ ! -x "${RDMA_LAB_TESTS:-}" ]; then echo "FAIL traps: RDMA_LAB_TESTS (the rdma_core_lab test binary) not given"; LAB_FAIL=$((LAB_FAIL + 1)); return; fi
  timeout 600 "$RDMA_LAB_TESTS" --ignored --test-threads 1 > "$CELL_LOG/tests.txt" 2>&1
  local line n=0
  # (A file, not a process substitution: the guest has no /dev/fd.)
  sed -n 's/^\(test [a-z_0-9]* \.\.\. \(ok\|FAILED\)\)$/\1/p' "$CELL_LOG/tests.txt" > "$CELL_LOG/results.txt"
  while IFS= read -r line; do
    case $line in
      "test "*" ... ok") line=${line#test }; echo "PASS traps ${line% ... ok}"; LAB_PASS=$((LAB_PASS + 1)); n=$((n + 1)) ;;
      "test "*" ... FAILED") echo "FAIL traps ${line#test }: $(grep -A3 "^---- ${line#test } stdout" "$CELL_LOG/tests.txt" | grep -m1 panicked | cut -c1-300)"; LAB_FAIL=$((LAB_FAIL + 1)); n=$((n + 1)) ;;
    esac
  done < "$CELL_LOG/results.txt"
  [ $n -gt 0 ] || { echo "FAIL traps: the tests ran none: $(tail_log "$CELL_LOG/tests.txt")"; LAB_FAIL=$((LAB_FAIL + 1)); }
  CELL=""
}

# ------------------------------------------------------------------------------ riser-side faults

# cell fault-rinit: the riser initiator SIGKILLed in the middle of a verify; the target notices,
# its queue pairs and registrations go, and it serves the next login.
cell_fault-rinit() {
  local l ip base pid t0 during
  for l in $LINKS; do
    cell_begin "fault-rinit riser initiator (rdma-core) killed mid-transfer -> riser target (rdma-core), $l"
    rdma_cell_start "$l" || continue
    # (Started directly, not under timeout(1): the SIGKILL must reach the initiator itself.)
    "$RISER_INITIATOR" --rdma-provider rdma-core verify "iser://$ip:3260/$RISER_IQN/0" --size 256MiB > "$CELL_LOG/victim.txt" 2>&1 &
    local victim=$!
    # Strike once the session's registrations exist (commands in flight), a little into it.
    local mr0
    mr0=$(rdma res show mr 2>/dev/null | grep -c '^dev ')
    if ! wait_for 60 eval '[ "$(rdma res show mr 2>/dev/null | grep -c "^dev ")" -gt '"$mr0"' ]'; then
      kill -KILL "$victim" 2>/dev/null
      riser_target_stop
      cell_fail load "no registrations appeared: $(tail_log "$CELL_LOG/victim.txt")"
      continue
    fi
    sleep 2
    rdma res show qp > "$CELL_LOG/res-qp-during.txt" 2>&1
    rdma res show mr > "$CELL_LOG/res-mr-during.txt" 2>&1
    during=$(res_snapshot "$pid")
    if ! kill -0 "$victim" 2>/dev/null; then
      riser_target_stop
      cell_fail load "the initiator ended before it could be killed: $(tail_log "$CELL_LOG/victim.txt")"
      continue
    fi
    t0=$(now)
    kill -KILL "$victim"
    wait "$victim" 2>/dev/null
    if ! wait_for "$WAIT_GONE" _res_is "$base" "$pid"; then
      local now_
      now_=$(res_snapshot "$pid")
      riser_target_stop
      cell_fail leftovers "initiator killed with [$during]; $WAIT_GONE s later [$now_], baseline [$base]"
      continue
    fi
    local gone
    gone=$(secs "$t0")
    if ! kill -0 "$pid" 2>/dev/null; then cell_fail target "died: $(tail_log "$TARGET_LOG")"; TARGET_PID=""; continue; fi
    local cut
    cut=$(grep -c 'write data not received' "$TARGET_LOG")
    if ! rinit_verify "iser://$ip:3260/$RISER_IQN/0" 16MiB "$RISER_INITIATOR" --rdma-provider rdma-core; then
      riser_target_stop
      cell_fail "next login" "$RINIT_ERR"
      continue
    fi
    wait_for "$WAIT_GONE" _res_is "$base" "$pid"
    local after
    after=$(res_snapshot "$pid")
    riser_target_stop
    cell_pass "killed with [$during]; target back to [$base] ${gone} s later (${cut} writes cut off, its warnings); next session: $RINIT_DETAIL; after it [$after]"
  done
}

# cell fault-target: the riser target SIGKILLed under a running soak, then started again.
cell_fault-target() {
  local l ip
  for l in $LINKS; do
    cell_begin "fault-target riser target (rdma-core) killed mid-transfer -> riser initiator (rdma-core), $l"
    has_dev "${l}0" || { cell_skip "no ${l}0 in this guest"; continue; }
    ip=$(link_ip "$l")
    rm -f /tmp/fault-lun.img
    local cmd="{target} --portal none --rdma-provider rdma-core --iser-portal {addr}:3260 --lun file:/tmp/fault-lun.img:128MiB"
    target_argv "$cmd" "$ip"
    if ! riser_target_start target "$ip:3260" "${TARGET_ARGV[@]}"; then cell_fail "target start" "$TARGET_ERR"; continue; fi
    local secs_=${FAULT_SOAK_S:-40}
    timeout $((secs_ + 120)) "$RISER_INITIATOR" --rdma-provider rdma-core soak "iser://$ip:3260/$RISER_IQN/0" \
      --seconds "$secs_" --size 32MiB --block-size 256KiB --queue-depth 4 > "$CELL_LOG/soak.txt" 2>&1 &
    local soak=$!
    sleep 8
    local t_kill t_back
    t_kill=$(now)
    kill -KILL "$TARGET_PID"
    wait "$TARGET_PID" 2>/dev/null
    TARGET_PID=""
    sleep "${FAULT_DOWN_S:-8}"
    t_back=$(now)
    if ! riser_target_start target2 "$ip:3260" "${TARGET_ARGV[@]}"; then kill "$soak"; cell_fail "target restart" "$TARGET_ERR"; continue; fi
    wait "$soak"
    local rc=$? failing works
    riser_target_stop
    failing=$(grep -m1 'I/O failing' "$CELL_LOG/soak.txt")
    works=$(grep -m1 'works again' "$CELL_LOG/soak.txt")
    if [ $rc != 0 ] || [ -z "$failing" ] || [ -z "$works" ]; then
      cell_fail soak "rc=$rc: $(tail_log "$CELL_LOG/soak.txt" 6)"
      continue
    fi
    # How long after the target was started again the session worked (the soak's clock starts
    # with its session, a little before the kill; this includes the target's own start-up).
    local t_fail t_ok lag
    t_fail=$(echo "$failing" | sed -n 's/^t=\([0-9.]*\)s.*/\1/p')
    t_ok=$(echo "$works" | sed -n 's/^t=\([0-9.]*\)s.*/\1/p')
    lag=$(awk -v f="$t_fail" -v o="$t_ok" -v k="$t_kill" -v b="$t_back" 'BEGIN { printf "%.1f", (o - f) - (b - k) }')
    if awk -v l="$lag" -v m="${FAULT_RECOVER_S:-15}" 'BEGIN { exit !(l > m) }'; then
      cell_fail recovery "the session worked again only ${lag} s after the target was back: $(tail_log "$CELL_LOG/soak.txt" 4)"
      continue
    fi
    cell_pass "target killed, restarted $(secs "$t_kill" "$t_back") s later; initiator: '${failing#t=*: }', works again ${lag} s after the restart; $(tail -1 "$CELL_LOG/soak.txt")"
  done
}

# ------------------------------------------------------------------------------ fault
# Why this way: an initiator that dies sends no Logout and answers nothing. SIGKILL to iscsid takes
# away the control plane (no logout, no reconnect can follow), `ss -K` then aborts the
# initiator's end of the connection exactly as a dying host's stack would: the target gets a RST
# in the middle of O_DIRECT writes (for iSER over siw the connection is siw's kernel TCP socket,
# so the RDMA connection dies mid-RDMA-Read). The kernel (5.14+) stops the failed connection by
# itself without iscsid. `iscsiadm -m session -u` alone would be a clean logout; deleting the
# SCSI device in sysfs would leave the session up. Afterwards a new iscsid (the initiator coming
# back) takes the stale session over and it is logged out; then a fresh login must work.
cell_fault() { fault_cell iser "${FAULT_PORTAL:-$SIW_IP:3260}" "$FAULT_TARGET_CMD"; }
cell_fault-tcp() { fault_cell default "$TCP_IP:3260" "$CELL6_TARGET_CMD"; }

# kill_load PID: the load loop and its dd (a dd blocked in the failed session dies once it fails).
kill_load() {
  kill -KILL "$1" $(pgrep -P "$1") 2>/dev/null
  wait "$1" 2>/dev/null
}

# fault_cell IFACE ADDR:PORT TARGET_CMD
fault_cell() {
  local iface=$1 portal=$2 base dev st0 st1 mib_before killed load t0 detail
  cell_begin "fault open-iscsi $(if [ "$iface" = iser ]; then echo ib_iser; else echo iscsi_tcp; fi) killed mid-transfer -> riser target ($portal)"
  [ "$iface" != iser ] || has_dev siw0 || { cell_skip "no siw0 in this guest"; return; }
  target_argv "$3" "${portal%:*}"
  if ! riser_target_start target "$portal" "${TARGET_ARGV[@]}"; then cell_fail "target start" "$TARGET_ERR"; return; fi
  base=$(res_snapshot "$TARGET_PID")
  note "baseline: $base"
  if ! kinit_discover "$portal" "$iface" "$RISER_IQN" || ! kinit_login "$portal" "$iface" "$RISER_IQN" || ! wait_for "$WAIT_DEV" _has_dev "$RISER_IQN"; then
    kinit_cleanup "$RISER_IQN" "$portal" "$iface"
    riser_target_stop
    cell_fail "first login" "$(_oneline "$DISC_OUT") $(tail_log "$CELL_LOG/login.txt")"
    return
  fi
  dev=$(kinit_dev "$RISER_IQN")
  local during
  during=$(res_snapshot "$TARGET_PID")
  # The load: O_DIRECT writes over the whole LUN, again and again until the fault (each pass
  # exactly the LUN's size: a dd that runs into the end fails with ENOSPC, which ended the load
  # before the fault once a pass took less than FAULT_AFTER).
  # (1 MiB: bs=4M over ib_iser runs into the riser target's receive shortage, see DD_BS in lib.sh.)
  local bs_bytes pass_blocks
  bs_bytes=$(numfmt --from=iec "${FAULT_LOAD_BS:-1M}")
  pass_blocks=$(($(cat "/sys/block/$dev/size") * 512 / bs_bytes))
  (while dd if=/dev/zero of="/dev/$dev" bs="$bs_bytes" count="$pass_blocks" oflag=direct status=none 2>> "$CELL_LOG/load.err"; do :; done) &
  load=$!
  st0=$(awk '{print $7}' "/sys/block/$dev/stat")
  sleep "${FAULT_AFTER:-6}"
  st1=$(awk '{print $7}' "/sys/block/$dev/stat")
  mib_before=$(((st1 - st0) / 2048))
  if [ "$mib_before" -lt 1 ] || ! kill -0 $load 2>/dev/null; then
    kill_load $load
    kinit_cleanup "$RISER_IQN" "$portal" "$iface"
    riser_target_stop
    cell_fail "load" "no writes in flight before the fault ($mib_before MiB in ${FAULT_AFTER:-6} s)"
    return
  fi
  if ! conn_errors_none; then
    kill_load $load
    kinit_cleanup "$RISER_IQN" "$portal" "$iface"
    riser_target_stop
    cell_fail "load" "the connection failed before the fault was injected: $CONN_ERR"
    return
  fi
  ss -Htn state established "dst ${portal%:*} and dport = :${portal##*:}" > "$CELL_LOG/conns-before.txt" 2>&1
  local inflight=0 r w i
  # Strike while requests are in flight: a busy poll of the queue, then at once.
  for ((i = 0; i < 200000 && inflight == 0; i++)); do
    read -r r w < "/sys/block/$dev/inflight"
    inflight=$((r + w))
  done
  t0=$(now)
  kill -KILL "$ISCSID_PID"
  if [ -n "${FAULT_ABORT_CMD:-}" ]; then
    local abort=${FAULT_ABORT_CMD//\{addr\}/${portal%:*}}
    bash -c "${abort//\{port\}/${portal##*:}}" > "$CELL_LOG/ss-K.txt" 2>&1
  else
    ss -K -Htn state established "dst ${portal%:*} and dport = :${portal##*:}" > "$CELL_LOG/ss-K.txt" 2>&1
  fi
  killed=$(grep -c . "$CELL_LOG/ss-K.txt")
  wait "$ISCSID_PID" 2>/dev/null
  ISCSID_PID=""
  note "load was running: $mib_before MiB written, $inflight requests in flight when iscsid was killed"
  note "aborted $killed connection(s): $(tr '\n' ' ' < "$CELL_LOG/ss-K.txt")"
  detail="killed after $mib_before MiB of O_DIRECT writes, $inflight requests in flight (iscsid SIGKILL + ${FAULT_ABORT_CMD:+FAULT_ABORT_CMD}${FAULT_ABORT_CMD:-ss -K} aborted $killed conn)"
  if [ "$killed" -lt 1 ]; then
    kill_load $load
    iscsid_start
    kinit_cleanup "$RISER_IQN" "$portal" "$iface"
    riser_target_stop
    cell_fail "fault" "ss -K found no connection to abort: $(tail_log "$CELL_LOG/conns-before.txt")"
    return
  fi
  # The target must notice on its own: its sockets back to the listening ones.
  local tsock=${base##*sockets(pid $TARGET_PID) }
  if ! wait_for "$WAIT_GONE" eval '[ "$(sock_count "$TARGET_PID")" = "$tsock" ]'; then
    note "target still has $(sock_count "$TARGET_PID") sockets (baseline $tsock) $(secs "$t0") s after the abort"
    detail="$detail, target kept the connection >${WAIT_GONE} s"
    local target_slow=1
  else
    detail="$detail, target dropped it in $(secs "$t0") s"
  fi
    if ! kill -0 "$TARGET_PID" 2>/dev/null; then
    wait "$TARGET_PID"
    cell_fail "fault" "the target died (rc $?): $(tail_log "$TARGET_LOG")"
    TARGET_PID=""
    kill_load $load
    iscsid_start
    kinit_cleanup "$RISER_IQN" "$portal" "$iface"
    return
  fi
  # The initiator comes back: a fresh iscsid takes the stale session over (it recovers it: a
  # reinstating login), and it is logged out.
  kill_load $load
  iscsid_start
  sleep 2
  kinit_logout "$portal" "$iface" "$RISER_IQN" || timeout 120 iscsiadm -m session -u >> "$CELL_LOG/logout.txt" 2>&1
  if ! wait_for "$WAIT_GONE" _no_sessions; then
    kinit_cleanup "$RISER_IQN" "$portal" "$iface"
    riser_target_stop
    cell_fail "stale session" "not gone after logout: $(tail_log "$CELL_LOG/logout.txt")"
    return
  fi
  grep -q "operational after recovery" "$LAB_LOGS/iscsid.$ISCSID_N.log" && detail="$detail, the new iscsid recovered the stale session (relogin)"
  detail="$detail, logged out $(secs "$t0") s after the fault"
  # A fresh login and a short verify.
  if ! kinit_login "$portal" "$iface" "$RISER_IQN" || ! wait_for "$WAIT_DEV" _has_dev "$RISER_IQN"; then
    kinit_cleanup "$RISER_IQN" "$portal" "$iface"
    riser_target_stop
    cell_fail "fresh login" "$(tail_log "$CELL_LOG/login.txt") | target: $(tail_log "$TARGET_LOG" 2)"
    return
  fi
  dev=$(kinit_dev "$RISER_IQN")
  if ! DD_MIB=16 dd_roundtrip "$dev" 16; then
    kinit_cleanup "$RISER_IQN" "$portal" "$iface"
    riser_target_stop
    cell_fail "verify after the fault" "$IO_ERR"
    return
  fi
  detail="$detail; fresh login: $IO_DETAIL"
  kinit_logout "$portal" "$iface" "$RISER_IQN"
  iscsiadm -m node -o delete -T "$RISER_IQN" > /dev/null 2>&1
  iscsiadm -m discoverydb -t st -p "$portal" -I "$iface" -o delete > /dev/null 2>&1
  if ! kinit_leftovers "$base" "$TARGET_PID" "$dev"; then
    riser_target_stop
    cell_fail leftovers "$LEFT_ERR"
    return
  fi
  riser_target_stop
  if [ -n "${target_slow:-}" ]; then cell_fail "fault" "$detail"; return; fi
  local cut
  cut=$(grep -c 'write data not received' "$TARGET_LOG")
  [ "$cut" -gt 0 ] && detail="$detail; target: $cut writes cut off by the abort (its warnings)"
  cell_pass "$detail; no session/sdX left, $(res_snapshot "$TARGET_PID") as before (logged in: $during); kernel: $(dmesg | grep -c 'detected conn error') conn error(s) (the injected one), target: $(grep -c WARN "$TARGET_LOG") warnings"
}

# ------------------------------------------------------------------------------ ops: riser as a service
# The riser target run as an operator runs it: several LUNs, changed live through its control
# socket (riserctl), while the kernel's initiator is logged in. Linux learns of new LUNs and of
# a new capacity only by a rescan (the target's unit attentions make the kernel log them, no
# more; iscsid scans by itself only on an Async Message carrying 3F/0E, which riser does not
# send); it never removes a SCSI device on a rescan: a LUN unmapped under it stays as a disk of
# 0 bytes until it is deleted (sysfs `delete`, as rescan-scsi-bus.sh -r does). iscsid answers
# the Async Message "logout requested" with a Logout and, on the Logout Response, logs in
# again (usr/initiator.c: iscsi_recv_async_msg, iscsi_recv_logout_rsp -> __conn_error_handle:
# session reopen) with TSIH 0 and the same ISID: the same kernel session and disks.

OPS_SOCK=""
OPS_DIR=""
OPS_PORTAL=""
OPS_IFACE=""

# ctl METHOD [KEY=VALUE...]: riserctl on the cell's control socket; the answer in CTL_OUT (and
# in the cell's riserctl.txt). Fails as riserctl does.
ctl() {
  local rc
  CTL_OUT=$(timeout 30 "$RISERCTL" --socket "$OPS_SOCK" "$@" 2>&1)
  rc=$?
  printf '[%s] $ riserctl %s\n%s\n[rc %s]\n' "$(uptime_s)" "$*" "$CTL_OUT" "$rc" >> "$CELL_LOG/riserctl.txt"
  return $rc
}

# ops_tsihs: the TSIHs of the normal sessions on RISER_IQN, one a line.
ops_tsihs() {
  ctl --json session_list || return 1
  printf '%s' "$CTL_OUT" | jq -r --arg t "$RISER_IQN" '.[] | select(.target == $t) | .tsih'
}
# _ops_no_target_sessions: riserctl session_list lists no session at all (discovery ones too).
_ops_no_target_sessions() { ctl --json session_list && [ "$(printf '%s' "$CTL_OUT" | jq length)" = 0 ]; }

# ops_devs: "LUN sdX" for each disk of the kernel's session with RISER_IQN (from sysfs).
ops_devs() {
  local s d b
  s=$(kinit_session "$RISER_IQN") || return 1
  for d in "$s"/device/target*/*:*:*:*; do
    [ -d "$d" ] || continue
    for b in "$d"/block/*; do
      [ -e "$b" ] && [ -b "/dev/${b##*/}" ] && echo "${d##*:} ${b##*/}"
    done
  done
}
ops_dev() { ops_devs | awk -v l="$1" '$1 == l { print $2 }'; }
ops_luns() { ops_devs | awk '{ print $1 }' | sort -n | tr '\n' ' ' | sed 's/ $//'; }
_ops_luns_are() { [ "$(ops_luns)" = "$1" ]; }
ops_bytes() { echo $(($(cat "/sys/block/$1/size" 2>/dev/null || echo 0) * 512)); }
_ops_bytes_are() { [ "$(ops_bytes "$1")" = "$2" ]; }
ops_sid() { local s; s=$(kinit_session "$RISER_IQN") || return 1; echo "${s##*/session}"; }
# _ops_relogged TSIH SID: riser has one session on RISER_IQN, not TSIH (OPS_TSIH), and the
# kernel's session SID is logged in.
_ops_relogged() {
  OPS_TSIH=$(ops_tsihs)
  [ -n "$OPS_TSIH" ] && [ "$(echo "$OPS_TSIH" | wc -l)" = 1 ] && [ "$OPS_TSIH" != "$1" ] \
    && [ "$(cat "/sys/class/iscsi_session/session$2/state" 2>/dev/null)" = LOGGED_IN ]
}
# ops_view: the kernel's disks of the session, for a log line: "LUN:sdX:MiB:state ...".
ops_view() {
  local l d
  ops_devs | while read -r l d; do
    printf '%s:%s:%sMiB:%s ' "$l" "$d" "$(($(ops_bytes "$d") >> 20))" "$(cat "/sys/block/$d/device/state" 2>/dev/null)"
  done
}

# ops_rescan: iscsiadm --rescan of the session (existing disks revalidated, new LUNs scanned).
ops_rescan() {
  local sid
  sid=$(ops_sid) || return 1
  echo "[$(uptime_s)] iscsiadm -m session -r $sid --rescan" >> "$CELL_LOG/rescan.txt"
  timeout 120 iscsiadm -m session -r "$sid" --rescan >> "$CELL_LOG/rescan.txt" 2>&1
}

# ops_read DEV MIB [SKIP_MIB]: an O_DIRECT read of MIB MiB at SKIP_MIB, all of it (a disk of
# 0 bytes reads nothing without an error); the data in /tmp/lab-ops-read.bin.
ops_read() {
  rm -f /tmp/lab-ops-read.bin
  timeout "$T_IO" dd if="/dev/$1" of=/tmp/lab-ops-read.bin bs=1M count="$2" skip="${3:-0}" iflag=direct status=none 2> "$CELL_LOG/dd-read-$1.err" || return 1
  local got
  got=$(stat -c %s /tmp/lab-ops-read.bin 2>/dev/null || echo 0)
  [ "$got" = $(($2 << 20)) ] || { echo "$got of $(($2 << 20)) bytes" >> "$CELL_LOG/dd-read-$1.err"; return 1; }
}

# ops_trace on|off: the kernel's SCSI commands (trace events; in the cell's scsi-trace.txt).
ops_trace() {
  local t=/sys/kernel/tracing
  [ -e $t/trace ] || mount -t tracefs nodev $t 2>/dev/null || return 0
  if [ "$1" = on ]; then
    echo 8192 > $t/buffer_size_kb
    echo > $t/trace
    echo 1 > $t/events/scsi/enable
  else
    echo 0 > $t/events/scsi/enable
    cat $t/trace > "$CELL_LOG/scsi-trace.txt"
  fi
}

# ops_end: the cell's target and socket directory gone (after a pass or a failure).
ops_end() {
  riser_target_stop
  [ -n "$OPS_DIR" ] && rm -rf "$OPS_DIR"
  OPS_DIR=""
}

# ops_fail STEP WHY: cleans up (logout, target stopped) and fails the cell with the kernel's
# view, the target's last lines.
ops_fail() {
  iscsiadm -m session -P3 > "$CELL_LOG/session-P3.txt" 2>&1
  local view
  view=$(ops_view)
  kinit_cleanup "$RISER_IQN" "$OPS_PORTAL" "$OPS_IFACE"
  ops_end
  cell_fail "$1" "$2 | kernel disks: [${view% }]$(conn_context) | target: $(tail_log "$TARGET_LOG" 2)"
}

# ops_cell IFACE ADDR:PORT TARGET_CMD ({target}, {addr}, {control} replaced).
ops_cell() {
  local iface=$1 portal=$2 cmd t0 t dev d0 d1 d2 d5 l mib bytes obs="" detail tsih tsih2 sid sid2 before after
  OPS_IFACE=$iface
  OPS_PORTAL=$portal
  [ -x "$RISERCTL" ] || { cell_fail setup "no riserctl at $RISERCTL (RISERCTL)"; return; }
  command -v jq > /dev/null || { cell_fail setup "jq not installed"; return; }
  # The control socket's directory: no group or other write (the target checks).
  OPS_DIR=$(mktemp -d /tmp/riser-ops.XXXXXX)
  OPS_SOCK=$OPS_DIR/control.sock
  cmd=${3//\{control\}/$OPS_SOCK}
  target_argv "$cmd" "${portal%:*}"
  if ! riser_target_start target "$portal" "${TARGET_ARGV[@]}"; then ops_end; cell_fail "target start" "$TARGET_ERR"; return; fi
  if ! wait_for 20 test -S "$OPS_SOCK" || ! ctl version; then ops_fail control "no control socket at $OPS_SOCK: $CTL_OUT"; return; fi
  ctl target_list
  ctl store_list

  # 1. Multi-LUN: every LUN, each with its size.
  t0=$(now)
  if ! kinit_discover "$portal" "$iface" "$RISER_IQN"; then ops_fail discovery "$RISER_IQN not offered by $portal (-I $iface): $(_oneline "$DISC_OUT")"; return; fi
  if ! kinit_login "$portal" "$iface" "$RISER_IQN"; then ops_fail login "$(tail_log "$CELL_LOG/login.txt")"; return; fi
  if ! wait_for "$WAIT_DEV" _ops_luns_are "0 1 2"; then ops_fail "multi-LUN" "the kernel has LUNs [$(ops_luns)] after $WAIT_DEV s, not [0 1 2]"; return; fi
  for l in 0:64 1:32 2:16; do
    dev=$(ops_dev "${l%:*}")
    mib=${l#*:}
    bytes=$(blockdev --getsize64 "/dev/$dev" 2>&1)
    if [ "$bytes" != $((mib << 20)) ]; then ops_fail "multi-LUN" "LUN ${l%:*} (/dev/$dev) is $bytes bytes, not $mib MiB"; return; fi
  done
  d0=$(ops_dev 0) d1=$(ops_dev 1) d2=$(ops_dev 2)
  sid=$(ops_sid)
  step_t login
  detail="1 LUNs 0/1/2: $d0/$d1/$d2 64/32/16 MiB ($(secs "$t0") s)"
  note "$detail"

  # 2. A LUN added live: LUN 5, 8 MiB.
  t0=$(now)
  if ! ctl store_add name=extra backing=ram:8MiB; then ops_fail "lun add" "store_add: $CTL_OUT"; return; fi
  if ! ctl lun_add target="$RISER_IQN" lun=5 store=extra; then ops_fail "lun add" "lun_add: $CTL_OUT"; return; fi
  # A command on LUN 0 meets REPORTED LUNS DATA HAS CHANGED (the kernel logs it, scans nothing).
  ops_read "$d0" 1 || { ops_fail "lun add" "O_DIRECT read of LUN 0 after lun_add: $(tail_log "$CELL_LOG/dd-read-$d0.err")"; return; }
  if dmesg | grep -q 'LUN assignments on this target have changed'; then obs="UA 3F/0E logged"; else obs="no 3F/0E UA logged"; fi
  if [ -n "$(ops_dev 5)" ]; then obs="$obs, LUN 5 there before a rescan"; else obs="$obs, no scan until a rescan"; fi
  if ! ops_rescan; then ops_fail "lun add" "iscsiadm --rescan: $(tail_log "$CELL_LOG/rescan.txt")"; return; fi
  if ! wait_for 60 _ops_luns_are "0 1 2 5"; then ops_fail "lun add" "after lun_add LUN 5 + rescan the kernel has LUNs [$(ops_luns)]"; return; fi
  d5=$(ops_dev 5)
  bytes=$(blockdev --getsize64 "/dev/$d5" 2>&1)
  if [ "$bytes" != $((8 << 20)) ]; then ops_fail "lun add" "LUN 5 (/dev/$d5) is $bytes bytes, not 8 MiB"; return; fi
  if ! dd_roundtrip "$d5" 8; then ops_fail "lun add" "LUN 5 (/dev/$d5): $IO_ERR"; return; fi
  step_t lun-add
  detail="$detail; 2 lun_add 5 + rescan: $d5 8 MiB, O_DIRECT w/r/cmp ok ($(secs "$t0") s)"
  note "$detail"

  # 3. lun1 resized to 64 MiB.
  t0=$(now)
  if ! ctl store_resize name=lun1 size=64MiB; then ops_fail resize "store_resize: $CTL_OUT"; return; fi
  case $CTL_OUT in *67108864*) ;; *) ops_fail resize "store_resize answered '$(_oneline "$CTL_OUT")', not size 67108864"; return ;; esac
  ops_read "$d1" 1 || { ops_fail resize "O_DIRECT read of LUN 1 after the resize: $(tail_log "$CELL_LOG/dd-read-$d1.err")"; return; }
  before=$(($(ops_bytes "$d1") >> 20))
  if dmesg | grep -q 'Capacity data has changed'; then obs="$obs; UA 2A/09 logged, $before MiB until a rescan"; else obs="$obs; no 2A/09 UA logged"; fi
  if ! ops_rescan; then ops_fail resize "iscsiadm --rescan: $(tail_log "$CELL_LOG/rescan.txt")"; return; fi
  if ! wait_for 30 _ops_bytes_are "$d1" $((64 << 20)); then
    # The disk's own rescan, should iscsiadm's not have revalidated it.
    echo 1 > "/sys/block/$d1/device/rescan"
    if ! wait_for 30 _ops_bytes_are "$d1" $((64 << 20)); then ops_fail resize "/dev/$d1 is $(ops_bytes "$d1") bytes after the resize and a rescan, not 64 MiB"; return; fi
    obs="$obs, needed /sys/block/$d1/device/rescan"
  fi
  bytes=$(blockdev --getsize64 "/dev/$d1" 2>&1)
  if [ "$bytes" != $((64 << 20)) ]; then ops_fail resize "blockdev --getsize64 /dev/$d1: $bytes, not 64 MiB"; return; fi
  # Its new end is readable.
  if ! ops_read "$d1" 1 63; then ops_fail resize "O_DIRECT read of the last MiB of /dev/$d1: $(tail_log "$CELL_LOG/dd-read-$d1.err")"; return; fi
  step_t resize
  detail="$detail; 3 resize lun1 64 MiB + rescan: $d1 64 MiB, last MiB read ($(secs "$t0") s)"
  note "$detail"

  # 4. session_logout: the Async Message; iscsid logs out and logs back in.
  t0=$(now)
  tsih=$(ops_tsihs)
  if [ -z "$tsih" ] || [ "$(echo "$tsih" | wc -l)" != 1 ]; then ops_fail "session_logout" "riserctl session_list: not one session on $RISER_IQN: $(_oneline "$CTL_OUT")"; return; fi
  local ilog=$LAB_LOGS/iscsid.$ISCSID_N.log dropped0 logouts0
  dropped0=$(grep -c 'no logout in time' "$TARGET_LOG")
  logouts0=$(grep -c 'closing the connection.*why=Logout' "$TARGET_LOG")
  before=$(ops_devs | tr '\n' ' ')
  if ! ctl session_logout tsih="$tsih"; then ops_fail "session_logout" "session_logout tsih=$tsih: $CTL_OUT"; return; fi
  if ! wait_for 60 _ops_relogged "$tsih" "$sid"; then
    ops_fail "session_logout" "60 s after session_logout tsih=$tsih: riser sessions [$(_oneline "$(ops_tsihs)")], kernel session$sid $(cat "/sys/class/iscsi_session/session$sid/state" 2>/dev/null); iscsid: $(grep -E 'logout|Logout|recovery|error' "$ilog" | tail -n 3 | tr '\n' ' ')"
    return
  fi
  t=$(secs "$t0")
  tsih2=$OPS_TSIH
  sid2=$(ops_sid)
  # What the initiator did: a Logout (iscsid answers the Async Message with one) or nothing
  # (the target drops the connection after limits.logout_timeout).
  local how
  if [ "$(grep -c 'no logout in time' "$TARGET_LOG")" != "$dropped0" ]; then
    ops_fail "session_logout" "the kernel did not log out: riser dropped the connection after its logout_timeout, then the kernel logged in again (TSIH $tsih -> $tsih2 in $t s); iscsid: $(grep -E 'logout|Logout' "$ilog" | tail -n 2 | tr '\n' ' ')"
    return
  fi
  how=$(grep -m1 -o 'Target requests logout[^"]*' "$ilog" | head -1)
  if [ -z "$how" ]; then ops_fail "session_logout" "iscsid logged no 'Target requests logout' (its log: $ilog), yet the session changed TSIH $tsih -> $tsih2"; return; fi
  if [ "$(grep -c 'closing the connection.*why=Logout' "$TARGET_LOG")" = "$logouts0" ]; then ops_fail "session_logout" "the target logged no Logout of TSIH $tsih, yet the session changed to TSIH $tsih2"; return; fi
  if [ "$sid2" != "$sid" ]; then obs="$obs; relogin as a new kernel session ($sid -> $sid2)"; fi
  if ! wait_for 60 _ops_luns_are "0 1 2 5"; then ops_fail "session_logout" "after the relogin the kernel has LUNs [$(ops_luns)]"; return; fi
  after=$(ops_devs | tr '\n' ' ')
  local same="same sdX"
  [ "$after" = "$before" ] || same="disks [$after], before [$before]"
  if ! timeout 30 iscsiadm -m session > "$CELL_LOG/sessions-relogin.txt" 2>&1 || ! grep -q "$RISER_IQN" "$CELL_LOG/sessions-relogin.txt"; then
    ops_fail "session_logout" "iscsiadm -m session does not list $RISER_IQN: $(tail_log "$CELL_LOG/sessions-relogin.txt")"
    return
  fi
  # LUN 5 kept its data (step 2's pattern), and LUN 0 takes a write/read/compare.
  if ! ops_read "$d5" 8 || ! cmp -n $((8 << 20)) "$PATTERN" /tmp/lab-ops-read.bin > /dev/null 2>&1; then ops_fail "session_logout" "LUN 5 after the relogin: read failed or differs from what step 2 wrote"; return; fi
  if ! dd_roundtrip "$d0" 8; then ops_fail "session_logout" "LUN 0 (/dev/$d0) after the relogin: $IO_ERR"; return; fi
  step_t session-logout
  detail="$detail; 4 session_logout: iscsid '${how% }', Logout, relogin (TSIH $tsih->$tsih2, $same) in $t s, LUN 5 data kept, LUN 0 w/r/cmp ok"
  note "$detail"

  # 5. LUN 2 removed live while the kernel has it.
  t0=$(now)
  if ! ctl lun_remove target="$RISER_IQN" lun=2; then ops_fail "lun remove" "lun_remove: $CTL_OUT"; return; fi
  ops_read "$d0" 1 || { ops_fail "lun remove" "O_DIRECT read of LUN 0 right after lun_remove: $(tail_log "$CELL_LOG/dd-read-$d0.err")"; return; }
  local tr0 trescan ncmd
  tr0=$(now)
  ops_trace on
  if ! ops_rescan; then ops_trace off; ops_fail "lun remove" "iscsiadm --rescan: $(tail_log "$CELL_LOG/rescan.txt")"; return; fi
  trescan=$(secs "$tr0")
  ops_trace off
  ncmd=$(grep -c 'scsi_dispatch_cmd_start:.* lun=2 ' "$CELL_LOG/scsi-trace.txt" 2>/dev/null)
  # INQUIRY of VPD page 00h to the unmapped LUN, again and again: Linux's scsi_attach_vpd asks
  # for page 00h once per 00h byte in the supported-pages list it was given.
  local nvpd
  nvpd=$(grep -c 'scsi_dispatch_cmd_start:.* lun=2 .*raw=12 01 00 ' "$CELL_LOG/scsi-trace.txt" 2>/dev/null)
  local vpd=""
  [ "${nvpd:-0}" -gt 16 ] && vpd=", $nvpd INQUIRY VPD 00h: riser answers EVPD on an unmapped LUN with standard data"
  # Linux keeps the SCSI device of a LUN gone from REPORT LUNS; its rescan of the disk meets
  # LOGICAL UNIT NOT SUPPORTED (TEST UNIT READY, READ CAPACITY) and leaves it with 0 bytes, so
  # that reads end at once (no command reaches the target any more).
  local gone state sense rd
  if [ ! -e "/sys/block/$d2" ]; then
    gone="$d2 gone after the rescan"
  else
    state=$(cat "/sys/block/$d2/device/state" 2>/dev/null)
    bytes=$(ops_bytes "$d2")
    sense=$(dmesg | grep -F "[$d2]" | grep -m1 -o 'Add. Sense: .*')
    if ops_read "$d2" 1; then rd="a 1 MiB O_DIRECT read PASSED"; else rd="reads: $(tail_log "$CELL_LOG/dd-read-$d2.err" 1)"; fi
    gone="Linux keeps $d2 ($state, $bytes bytes, ${rd% }, rescan: ${sense#Add. Sense: })"
    if [ "$state" != offline ] && { [ "$bytes" != 0 ] || [ "$sense" != "Add. Sense: Logical unit not supported" ]; }; then
      ops_fail "lun remove" "LUN 2 removed and rescanned, yet $gone"
      return
    fi
    # The administrator's step (rescan-scsi-bus.sh -r does it): the SCSI device deleted.
    echo 1 > "/sys/block/$d2/device/delete"
    wait_for 30 test ! -e "/sys/block/$d2" || { ops_fail "lun remove" "$gone; /sys/block/$d2/device/delete did not remove it"; return; }
    gone="$gone, deleted via sysfs"
  fi
  if ! wait_for 30 _ops_luns_are "0 1 5"; then ops_fail "lun remove" "the kernel has LUNs [$(ops_luns)], not [0 1 5]; $gone"; return; fi
  if ! ops_read "$d5" 8 || ! cmp -n $((8 << 20)) "$PATTERN" /tmp/lab-ops-read.bin > /dev/null 2>&1; then ops_fail "lun remove" "LUN 5 after LUN 2's removal: read failed or differs"; return; fi
  if ! ops_read "$d1" 1; then ops_fail "lun remove" "O_DIRECT read of LUN 1 after LUN 2's removal: $(tail_log "$CELL_LOG/dd-read-$d1.err")"; return; fi
  if ! dd_roundtrip "$d0" 4; then ops_fail "lun remove" "LUN 0 after LUN 2's removal: $IO_ERR"; return; fi
  step_t lun-remove
  detail="$detail; 5 lun_remove 2 + rescan ($trescan s; ${ncmd:-?} cmds to LUN 2$vpd): $gone; LUNs 0/1/5 ok ($(secs "$t0") s)"
  note "$detail"

  # 6. Logout: no session left anywhere.
  t0=$(now)
  if ! kinit_logout "$portal" "$iface" "$RISER_IQN"; then ops_fail logout "$(tail_log "$CELL_LOG/logout.txt")"; return; fi
  iscsiadm -m node -o delete -T "$RISER_IQN" > /dev/null 2>&1
  iscsiadm -m discoverydb -t st -p "$portal" -I "$iface" -o delete > /dev/null 2>&1
  if ! wait_for "$WAIT_GONE" _ops_no_target_sessions; then ops_fail logout "riserctl session_list after the logout: $(_oneline "$CTL_OUT")"; return; fi
  if ! wait_for "$WAIT_GONE" _no_sessions; then ops_fail logout "the kernel still has a session: $(ls /sys/class/iscsi_session/ | tr '\n' ' ')"; return; fi
  for dev in "$d0" "$d1" "$d5"; do
    [ -e "/sys/block/$dev" ] && { ops_fail logout "/dev/$dev still present after the logout"; return; }
  done
  step_t logout
  detail="$detail; 6 logout: session_list empty, no sdX ($(secs "$t0") s)"
  ctl stats_get
  local conn
  conn=$(dmesg | grep -c 'detected conn error')
  ops_end
  echo "$detail | kernel: $obs" > "$CELL_LOG/summary.txt"
  cell_pass "$detail | kernel: $obs; $conn conn errors, $(grep -c WARN "$TARGET_LOG") target warnings"
}

cell_ops() {
  cell_begin "ops open-iscsi iscsi_tcp -> riser target TCP, changed live through riserctl"
  ops_cell default "$TCP_IP:3260" "{target} --portal {addr}:3260 --lun ram:64MiB --lun ram:32MiB --lun ram:16MiB --control {control}"
}

cell_ops-iser() {
  cell_begin "ops-iser open-iscsi ib_iser/siw -> riser target (software iWARP RNIC), changed live through riserctl"
  has_dev siw0 || { cell_skip "no siw0 in this guest"; return; }
  ops_cell iser "$SIW_IP:3260" "{target} --iser-portal {addr}:3260 --lun ram:64MiB --lun ram:32MiB --lun ram:16MiB --control {control}"
}

# ------------------------------------------------------------------------------ rbd-mpath
# Two riser gateways (the target built with `rbd`: RISER_RBD_TARGET), one RBD image of a Ceph
# cluster started in the guest (CEPH_UP: ../shared/ceph/ceph-up.sh, memstore), one target name,
# implicit ALUA: gateway A's port group 1 (MPATH_A) optimized, gateway B's group 2 (MPATH_B)
# non-optimized. Linux: open-iscsi (iscsi_tcp) logged in to both, dm-multipath (multipathd with
# udevd, the alua prioritiser, group_by_prio) makes one map; a writer puts MPATH_CHUNK_KIB chunks
# of two random patterns through it with O_DIRECT (each read back and compared at once); A is
# SIGKILLed under it, I/O must go on through B; A is started again, its path must come back and
# take the I/O again; at the end the whole region is read back and compared.
RISER_RBD_TARGET=${RISER_RBD_TARGET:-$PWD/target/rbd/release/examples/target}
CEPH_UP=${CEPH_UP:-$(dirname "$TGTD_IN_GUEST")/../ceph/ceph-up.sh}
MPATH_IQN=${MPATH_IQN:-iqn.2026-11.io.riser:ha}
MPATH_A=${MPATH_A:-$RXE_IP:3260}
MPATH_B=${MPATH_B:-$SIW_IP:3260}
# The cell's own time budget (seconds; every wait of the cell is cut to what is left of it).
MPATH_BUDGET=${MPATH_BUDGET:-900}
# The SCSI command timeout of both paths (/sys/block/sdX/device/timeout). The first write through
# B after A's death waits in librbd until the dead owner's exclusive lock can be broken (its
# watch expires: the OSD's osd_client_watch_timeout, 30 s, counted from A's last ping): measured
# 22-23 s on B, inside Linux's default 30 s (MPATH_SCSI_TIMEOUT=30 passed), but by little.
MPATH_SCSI_TIMEOUT=${MPATH_SCSI_TIMEOUT:-90}
MPATH_CHUNK_KIB=${MPATH_CHUNK_KIB:-256}
MPATH_REGION_MIB=${MPATH_REGION_MIB:-32}
# Writes (chunks) the writer must complete in each phase: before the kill, on B, after failback.
MPATH_PHASE_N=${MPATH_PHASE_N:-8}
MP_CEPH_DIR=/tmp/lab-ceph-mpath
MP_W=/tmp/lab-mp

# mp_left [CAP]: seconds left of the cell's budget (at most CAP), at least 1.
mp_left() {
  awk -v t0="$MP_T0" -v b="$MPATH_BUDGET" -v now="$(now)" -v cap="${1:-999999}" \
    'BEGIN { l = int(t0 + b - now); if (l > cap) l = cap; if (l < 1) l = 1; print l }'
}

# mp_gw_config a|b: gateway A's or B's configuration file (in the cell's logs).
mp_gw_config() {
  local me=$1 addr tag peer
  if [ "$me" = a ]; then addr=$MPATH_A tag=1 peer=2; else addr=$MPATH_B tag=2 peer=1; fi
  cat > "$CELL_LOG/gw-$me.toml" << EOT
# rbd-mpath gateway ${me^^}: port group $tag of $MPATH_IQN, the peer's group $peer remote.
portal = ["none"]

[limits]
drain_timeout = 5

[[store]]
name = "shared"
backing = "rbd:rbd/mpath,conf=$MP_CONF"

[[target]]
name = "$MPATH_IQN"

[[target.portal_group]]
tag = $tag
relative_port = $tag
port_group = $tag
portals = ["$addr"]

[[target.remote_port_group]]
port_group = $peer
relative_ports = [$peer]

[[target.lun]]
lun = 0
store = "shared"
optimized_port_group = 1
EOT
}

# mp_gw_start a|b LOGNAME: starts gateway A or B (GW_A_PID / GW_B_PID).
mp_gw_start() {
  local addr=$MPATH_A
  [ "$1" = a ] || addr=$MPATH_B
  riser_target_start "$2" "$addr" "$RISER_RBD_TARGET" --config "$CELL_LOG/gw-$1.toml" || return 1
  if [ "$1" = a ]; then GW_A_PID=$TARGET_PID; else GW_B_PID=$TARGET_PID; fi
  TARGET_PID=""
}

# mp_sd ADDR:PORT: the sdX of LUN 0 of the session to that portal.
mp_sd() {
  local s c b
  for s in /sys/class/iscsi_session/session*; do
    [ "$(cat "$s/targetname" 2>/dev/null)" = "$MPATH_IQN" ] || continue
    for c in "$s"/device/connection*/iscsi_connection/connection*; do
      [ "$(cat "$c/persistent_address" 2>/dev/null):$(cat "$c/persistent_port" 2>/dev/null)" = "$1" ] || continue
      for b in "$s"/device/target*/*:0/block/*; do
        [ -e "$b" ] && [ -b "/dev/${b##*/}" ] && { echo "${b##*/}"; return 0; }
      done
    done
  done
  return 1
}
_mp_sd() { mp_sd "$1" > /dev/null; }

# mp_topo: one line per path of the map, "sdX PRIO GROUP_STATUS DM_STATE CHECKER_STATE", from
# `multipath -ll` (also kept in $CELL_LOG/multipath-ll.txt).
mp_topo() {
  timeout 30 multipath -ll > "$CELL_LOG/multipath-ll.txt" 2>&1
  awk '
    /prio=/ { match($0, /prio=-?[0-9]+/); p = substr($0, RSTART + 5, RLENGTH - 5)
              match($0, /status=[a-z]+/); s = substr($0, RSTART + 7, RLENGTH - 7) }
    / [0-9]+:[0-9]+:[0-9]+:[0-9]+ sd[a-z]+ / { for (i = 1; i <= NF; i++) if ($i ~ /^sd[a-z]+$/) print $i, p, s, $(i + 2), $(i + 3) }
  ' "$CELL_LOG/multipath-ll.txt"
}
# mp_path SDX: that path's line of mp_topo.
mp_path() { mp_topo | awk -v d="$1" '$1 == d'; }
# _mp_two_up: the map has both paths, A's active/ready in the active group of prio 50, B's
# active/ready in an enabled group of prio 10.
_mp_two_up() {
  local t
  t=$(mp_topo)
  [ "$(echo "$t" | grep -c .)" = 2 ] || return 1
  echo "$t" | grep -qx "$MP_SDA 50 active active ready" && echo "$t" | grep -qx "$MP_SDB 10 enabled active ready"
}
_mp_b_optimized() { case $(mp_path "$MP_SDB") in *" 50 active active ready"*) return 0 ;; *) return 1 ;; esac; }
# _mp_back_b_owns: both paths active/ready again, B's in the active group of prio 50 (B took the
# unit over and keeps it: A, restarted, learns that from B) and A's in an enabled group of prio 10.
_mp_back_b_owns() {
  local t
  t=$(mp_topo)
  [ "$(echo "$t" | grep -c .)" = 2 ] || return 1
  echo "$t" | grep -qx "$MP_SDB 50 active active ready" && echo "$t" | grep -qx "$MP_SDA 10 enabled active ready"
}
_mp_map() { [ -n "$(dmsetup ls --target multipath 2>/dev/null | awk '$1 != "No" { print $1 }')" ]; }
# mp_writes SDX: write requests completed on a path (the 5th field of its stat).
mp_writes() { awk '{ print $5 }' "/sys/block/$1/stat"; }

# mp_writer DEV: writes chunk after chunk of the region (pass p: pattern p%2), each read back
# and compared; one line per chunk in $MP_W.log: "ok PASS CHUNK EPOCH" (or "ERR ..." and exit).
mp_writer() {
  local dev=$1 ch=$((MPATH_CHUNK_KIB << 10)) n p=0 i=0 pat
  n=$(((MPATH_REGION_MIB << 20) / ch))
  while [ ! -e "$MP_W.stop" ]; do
    pat=$MP_W-p$((p % 2)).bin
    if ! dd if="$pat" of="$dev" bs="$ch" count=1 skip="$i" seek="$i" oflag=direct conv=notrunc status=none 2>> "$MP_W.err"; then
      echo "ERR write $p $i $EPOCHREALTIME" >> "$MP_W.log"
      return 1
    fi
    if ! dd if="$dev" of="$MP_W-chunk.bin" bs="$ch" count=1 skip="$i" iflag=direct status=none 2>> "$MP_W.err" \
      || ! cmp -s -i "0:$((i * ch))" -n "$ch" "$MP_W-chunk.bin" "$pat"; then
      echo "ERR verify $p $i $EPOCHREALTIME" >> "$MP_W.log"
      return 1
    fi
    echo "ok $p $i $EPOCHREALTIME" >> "$MP_W.log"
    i=$((i + 1))
    [ "$i" -lt "$n" ] || { i=0; p=$((p + 1)); }
  done
}
# mp_oks_after T: chunks the writer completed after time T.
mp_oks_after() { awk -v t="$1" '$1 == "ok" && $4 > t { n++ } END { print n + 0 }' "$MP_W.log"; }
_mp_oks_after() { [ "$(mp_oks_after "$1")" -ge "$2" ]; }
_mp_writer_ok() { kill -0 "$MP_WRITER_PID" 2>/dev/null && ! grep -q '^ERR' "$MP_W.log"; }
_mp_progress() { _mp_writer_ok && _mp_oks_after "$1" "$2"; }
# mp_gap T0 T1: "FIRST MAX": seconds from T0 to the first chunk completed after it, and the
# longest time between two completions (T0 counting as one) up to T1.
mp_gap() {
  awk -v a="$1" -v b="$2" '$1 == "ok" && $4 > a && $4 <= b {
      d = $4 - (prev ? prev : a); if (!first) first = $4 - a; if (d > max) max = d; prev = $4 }
    END { printf "%.1f %.1f", first, max }' "$MP_W.log"
}
# mp_writer_fail: why the writer stopped (for a FAIL detail).
mp_writer_fail() {
  local e
  e=$(grep -m1 '^ERR' "$MP_W.log")
  if [ -n "$e" ]; then echo "writer: $e, $(tail_log "$MP_W.err" 2)"; elif ! kill -0 "$MP_WRITER_PID" 2>/dev/null; then echo "writer exited"; else echo "writer: $(grep -c '^ok' "$MP_W.log") chunks, the last at $(tail -n 1 "$MP_W.log" | cut -d' ' -f4)"; fi
}

# mp_down: everything the cell started, stopped (best effort, in order: writer, map, sessions,
# multipathd, udevd, gateways, cluster).
mp_down() {
  touch "$MP_W.stop"
  [ -n "${MP_WRITER_PID:-}" ] && { wait_for 60 _gone "$MP_WRITER_PID" || kill -KILL "$MP_WRITER_PID" $(pgrep -P "$MP_WRITER_PID") 2>/dev/null; wait "$MP_WRITER_PID" 2>/dev/null; }
  MP_WRITER_PID=""
  [ -n "${MP_MAP:-}" ] && timeout 60 multipath -f "$MP_MAP" >> "$CELL_LOG/teardown.txt" 2>&1
  timeout 60 multipath -F >> "$CELL_LOG/teardown.txt" 2>&1
  local p
  for p in "$MPATH_A" "$MPATH_B"; do
    timeout "$T_LOGIN" iscsiadm -m node -T "$MPATH_IQN" -p "$p" --logout >> "$CELL_LOG/teardown.txt" 2>&1
    iscsiadm -m discoverydb -t st -p "$p" -o delete > /dev/null 2>&1
  done
  iscsiadm -m node -o delete -T "$MPATH_IQN" > /dev/null 2>&1
  stop_pid "${MP_MPATHD_PID:-}" 15
  MP_MPATHD_PID=""
  stop_pid "${MP_UDEVD_PID:-}" 10
  MP_UDEVD_PID=""
  stop_pid "${GW_A_PID:-}" 20
  stop_pid "${GW_B_PID:-}" 20
  GW_A_PID="" GW_B_PID=""
  [ -n "${MP_CONF:-}" ] && CEPH_DIR=$MP_CEPH_DIR bash "$(dirname "$CEPH_UP")/ceph-down.sh" >> "$CELL_LOG/teardown.txt" 2>&1
  MP_CONF=""
  rm -f "$MP_W"-p0.bin "$MP_W"-p1.bin "$MP_W"-chunk.bin "$MP_W"-read.bin "$MP_W.stop"
}

# mp_fail STEP WHY: the kernel's and the gateways' view, cleanup, FAIL.
mp_fail() {
  local view
  view=$(mp_topo | tr '\n' ';')
  [ -f "$MP_W.log" ] && cp "$MP_W.log" "$MP_W.err" "$CELL_LOG/" 2>/dev/null
  mp_down
  cell_fail "$1" "$2 | paths: [${view%;}]$(conn_context) | gw A: $(tail_log "$CELL_LOG/gw-a.log" 1) | gw B: $(tail_log "$CELL_LOG/gw-b.log" 1)"
}

cell_rbd-mpath() {
  cell_begin "rbd-mpath open-iscsi + dm-multipath (ALUA) -> 2 riser gateways on 1 RBD image, A killed under O_DIRECT writes"
  MP_T0=$(now)
  GW_A_PID="" GW_B_PID="" MP_MPATHD_PID="" MP_UDEVD_PID="" MP_WRITER_PID="" MP_MAP="" MP_CONF=""
  local b t0 t detail ch watch
  ch=$((MPATH_CHUNK_KIB << 10))
  [ -x "$RISER_RBD_TARGET" ] || { cell_fail setup "no target built with rbd at $RISER_RBD_TARGET (RISER_RBD_TARGET)"; return; }
  [ -f "$CEPH_UP" ] || { cell_fail setup "no $CEPH_UP (CEPH_UP)"; return; }
  for b in multipathd multipath dmsetup udevadm rbd ceph-mon ceph-osd; do
    command -v "$b" > /dev/null || { cell_fail setup "$b not installed on the host (multipath-tools, udev, ceph-mon ceph-osd ceph-common)"; return; }
  done
  local udevd=/usr/lib/systemd/systemd-udevd
  [ -x "$udevd" ] || { cell_fail setup "no $udevd"; return; }
  rm -f "$MP_W".*

  # 1. The cluster and the image.
  t0=$(now)
  CEPH_DIR=$MP_CEPH_DIR timeout "$(mp_left 300)" bash "$CEPH_UP" > "$CELL_LOG/ceph-up.txt" 2>&1
  MP_CONF=$(sed -n 's/^CEPH_CONF=//p' "$CELL_LOG/ceph-up.txt" | tr -d '"')
  if [ -z "$MP_CONF" ]; then MP_CONF=$MP_CEPH_DIR/ceph.conf; mp_fail ceph "ceph-up.sh: $(tail_log "$CELL_LOG/ceph-up.txt" 4)"; return; fi
  if ! CEPH_CONF=$MP_CONF timeout 120 rbd create --size 64M rbd/mpath > "$CELL_LOG/rbd-create.txt" 2>&1; then mp_fail ceph "rbd create: $(tail_log "$CELL_LOG/rbd-create.txt")"; return; fi
  watch=$(CEPH_CONF=$MP_CONF timeout 60 ceph config get osd osd_client_watch_timeout 2>/dev/null)
  step_t ceph
  detail="ceph up + image $(secs "$t0") s (osd watch timeout ${watch:-?} s)"
  note "$detail"

  # 2. The two gateways.
  mp_gw_config a
  mp_gw_config b
  if ! mp_gw_start a gw-a; then mp_fail "gateway A" "$TARGET_ERR"; return; fi
  if ! mp_gw_start b gw-b; then mp_fail "gateway B" "$TARGET_ERR"; return; fi
  step_t gateways

  # 3. udevd, then multipathd (it learns of paths through udev's events; the WWID is udev's
  # ID_SERIAL).
  modprobe -a dm_mod dm_multipath dm_round_robin dm_service_time scsi_dh_alua 2> "$CELL_LOG/modprobe.err" || { mp_fail setup "modprobe: $(tail_log "$CELL_LOG/modprobe.err")"; return; }
  mkdir -p /run/udev /etc/multipath
  "$udevd" > "$CELL_LOG/udevd.log" 2>&1 &
  MP_UDEVD_PID=$!
  if ! wait_for 30 test -S /run/udev/control; then mp_fail udevd "no /run/udev/control: $(tail_log "$CELL_LOG/udevd.log")"; return; fi
  udevadm trigger --action=add --subsystem-match=block > /dev/null 2>&1
  timeout 60 udevadm settle
  cat > /etc/multipath.conf << EOT
defaults {
    user_friendly_names no
    find_multipaths greedy
    polling_interval 5
}
blacklist {
    device {
        vendor ".*"
        product ".*"
    }
}
blacklist_exceptions {
    device {
        vendor "RISER"
        product "RISER DISK"
    }
}
devices {
    device {
        vendor "RISER"
        product "RISER DISK"
        path_grouping_policy group_by_prio
        detect_prio no
        prio alua
        hardware_handler "1 alua"
        failback immediate
        no_path_retry 12
        path_checker tur
        fast_io_fail_tmo 5
    }
}
EOT
  cp /etc/multipath.conf "$CELL_LOG/multipath.conf"
  multipathd -d -s -v3 > "$CELL_LOG/multipathd.log" 2>&1 &
  MP_MPATHD_PID=$!
  if ! wait_for 30 eval 'timeout 10 multipathd show daemon > /dev/null 2>&1'; then mp_fail multipathd "no answer: $(tail_log "$CELL_LOG/multipathd.log")"; return; fi
  step_t multipathd

  # 4. Both paths: discovery and login at each gateway, the replacement timeout of a multipath
  # setup (5 s: a dead path's I/O fails over instead of waiting).
  t0=$(now)
  local p
  for p in "$MPATH_A" "$MPATH_B"; do
    if ! kinit_discover "$p" default "$MPATH_IQN"; then mp_fail discovery "$MPATH_IQN not offered by $p: $(_oneline "$DISC_OUT")"; return; fi
    iscsiadm -m node -T "$MPATH_IQN" -p "$p" -o update -n node.session.timeo.replacement_timeout -v 5 >> "$CELL_LOG/login.txt" 2>&1
    if ! kinit_login "$p" default "$MPATH_IQN"; then mp_fail login "$p: $(tail_log "$CELL_LOG/login.txt")"; return; fi
  done
  if ! wait_for "$(mp_left "$WAIT_DEV")" _mp_sd "$MPATH_A" || ! wait_for "$(mp_left "$WAIT_DEV")" _mp_sd "$MPATH_B"; then
    mp_fail "block devices" "sdX for A [$(mp_sd "$MPATH_A")], for B [$(mp_sd "$MPATH_B")]"
    return
  fi
  MP_SDA=$(mp_sd "$MPATH_A")
  MP_SDB=$(mp_sd "$MPATH_B")
  for b in "$MP_SDA" "$MP_SDB"; do echo "$MPATH_SCSI_TIMEOUT" > "/sys/block/$b/device/timeout"; done
  timeout 60 udevadm settle
  iscsiadm -m session -P3 > "$CELL_LOG/session-P3.txt" 2>&1
  local how="multipathd"
  if ! wait_for "$(mp_left 30)" _mp_map; then
    # multipathd made no map from the udev events: multipath(8) makes it (noted).
    timeout 60 multipath -v3 > "$CELL_LOG/multipath-v3.txt" 2>&1
    how="multipath(8)"
  fi
  if ! wait_for "$(mp_left 60)" _mp_two_up; then
    mp_fail "multipath map" "made by $how: not one map with A's $MP_SDA active (prio 50) and B's $MP_SDB enabled (prio 10): $(tr '\n' ' ' < "$CELL_LOG/multipath-ll.txt" | tr -s ' ') | udev ID_SERIAL $MP_SDA: $(udevadm info -q property -n "/dev/$MP_SDA" 2>/dev/null | sed -n 's/^ID_SERIAL=//p')"
    return
  fi
  MP_MAP=$(dmsetup ls --target multipath | awk 'NR == 1 { print $1 }')
  [ "$(dmsetup ls --target multipath | grep -c .)" = 1 ] || { mp_fail "multipath map" "more than one map: $(dmsetup ls --target multipath | tr '\n' ' ')"; return; }
  cp "$CELL_LOG/multipath-ll.txt" "$CELL_LOG/multipath-ll-start.txt"
  if ! wait_for 30 test -b "/dev/mapper/$MP_MAP"; then mp_fail "multipath map" "no /dev/mapper/$MP_MAP"; return; fi
  step_t login-map
  detail="$detail; 1 map $MP_MAP by $how ($(secs "$t0") s): A $MP_SDA prio 50 active, B $MP_SDB prio 10 enabled"
  note "$detail"

  # 5. The writer; A killed once it runs.
  head -c $((MPATH_REGION_MIB << 20)) /dev/urandom > "$MP_W-p0.bin"
  head -c $((MPATH_REGION_MIB << 20)) /dev/urandom > "$MP_W-p1.bin"
  : > "$MP_W.log"
  : > "$MP_W.err"
  mp_writer "/dev/mapper/$MP_MAP" &
  MP_WRITER_PID=$!
  t0=$(now)
  if ! wait_for "$(mp_left 300)" _mp_progress 0 "$MPATH_PHASE_N"; then mp_fail "writes (both paths up)" "$(mp_writer_fail)"; return; fi
  local rate wa0 wb0 wa1 wb1 t_kill t_on_b gap
  rate=$(awk -v n="$(mp_oks_after 0)" -v c="$MPATH_CHUNK_KIB" -v d="$(secs "$t0")" 'BEGIN { printf "%.2f", n * c / 1024 / (d > 0 ? d : 1) }')
  wa0=$(mp_writes "$MP_SDA")
  wb0=$(mp_writes "$MP_SDB")
  step_t writes-ab
  t_kill=$(now)
  kill -KILL "$GW_A_PID"
  wait "$GW_A_PID" 2>/dev/null
  GW_A_PID=""
  note "gateway A killed"
  if ! wait_for "$(mp_left 300)" _mp_progress "$t_kill" "$MPATH_PHASE_N"; then mp_fail "failover" "$(mp_oks_after "$t_kill") chunks written in $(secs "$t_kill") s after A's death; $(mp_writer_fail)"; return; fi
  t_on_b=$(now)
  gap=$(mp_gap "$t_kill" "$t_on_b")
  wa1=$(mp_writes "$MP_SDA")
  wb1=$(mp_writes "$MP_SDB")
  local pa pb
  pa=$(mp_path "$MP_SDA")
  pb=$(mp_path "$MP_SDB")
  cp "$CELL_LOG/multipath-ll.txt" "$CELL_LOG/multipath-ll-failover.txt"
  if [ "$wb1" -le "$wb0" ]; then mp_fail failover "$MPATH_PHASE_N chunks written after A's death, yet no write completed on B's $MP_SDB ($wb0 -> $wb1)"; return; fi
  case $pa in *" failed "*) ;; *) mp_fail failover "A's path after its death: [$pa], not failed"; return ;; esac
  # B took the unit over (it fenced A through the cluster first): its group active/optimized,
  # which multipathd reads from REPORT TARGET PORT GROUPS after the ASYMMETRIC ACCESS STATE
  # CHANGED unit attention.
  if ! wait_for "$(mp_left 60)" _mp_b_optimized; then mp_fail takeover "B's path after A's death: [$(mp_path "$MP_SDB")], not in the active group of prio 50"; return; fi
  pb=$(mp_path "$MP_SDB")
  step_t failover
  detail="$detail; writer: ${MPATH_CHUNK_KIB} KiB O_DIRECT chunks, each read back+compared, ${rate} MiB/s; A SIGKILLed: I/O went on via B, STALL ${gap#* } s, $MP_SDB +$((wb1 - wb0)) writes, A [${pa#* }], B [${pb#* }]"
  note "$detail"

  # 6. A again: its path comes back (active/ready). B took the unit over when A died and keeps
  # it (A, restarted, learns that from B: no failback that would move the lock back), so A's path
  # returns in the enabled group and the writes go on through B.
  local t_back t_path back
  t_back=$(now)
  if ! mp_gw_start a gw-a2; then mp_fail "gateway A restart" "$TARGET_ERR"; return; fi
  if ! wait_for "$(mp_left 240)" _mp_back_b_owns; then mp_fail "path back" "$(secs "$t_back") s after A's restart: $(tr '\n' ' ' < "$CELL_LOG/multipath-ll.txt" | tr -s ' ')"; return; fi
  t_path=$(now)
  back=$(secs "$t_back" "$t_path")
  cp "$CELL_LOG/multipath-ll.txt" "$CELL_LOG/multipath-ll-back.txt"
  local wb2
  wb2=$(mp_writes "$MP_SDB")
  if ! wait_for "$(mp_left 300)" _mp_progress "$t_path" "$MPATH_PHASE_N"; then mp_fail "after A's return" "$(mp_writer_fail)"; return; fi
  local wb3 gap2
  wb3=$(mp_writes "$MP_SDB")
  gap2=$(mp_gap "$t_back" "$(now)")
  if [ "$wb3" -le "$wb2" ]; then mp_fail "after A's return" "no write completed on B's $MP_SDB ($wb2 -> $wb3)"; return; fi
  step_t failback
  detail="$detail; A restarted: path back (active/ready, enabled: B keeps the unit) in $back s, $MP_SDB +$((wb3 - wb2)) writes, stall ${gap2#* } s"
  note "$detail"

  # 7. The writer stopped; the whole region read back and compared with what was last written.
  touch "$MP_W.stop"
  if ! wait_for "$(mp_left 120)" _gone "$MP_WRITER_PID"; then mp_fail "writer stop" "$(mp_writer_fail)"; return; fi
  wait "$MP_WRITER_PID"
  local rc=$? last lp li n total
  MP_WRITER_PID=""
  cp "$MP_W.log" "$MP_W.err" "$CELL_LOG/"
  if [ $rc != 0 ] || grep -q '^ERR' "$MP_W.log"; then mp_fail writer "rc=$rc $(mp_writer_fail)"; return; fi
  n=$(((MPATH_REGION_MIB << 20) / ch))
  total=$(grep -c '^ok' "$MP_W.log")
  last=$(grep '^ok' "$MP_W.log" | tail -n 1)
  lp=$(echo "$last" | cut -d' ' -f2)
  li=$(echo "$last" | cut -d' ' -f3)
  t0=$(now)
  if ! timeout "$T_IO" dd if="/dev/mapper/$MP_MAP" of="$MP_W-read.bin" bs=1M count="$MPATH_REGION_MIB" iflag=direct status=none 2> "$CELL_LOG/dd-read.err"; then mp_fail verify "dd read: $(tail_log "$CELL_LOG/dd-read.err")"; return; fi
  # Chunks 0..li hold pass lp's pattern, the rest pass lp-1's (none before the first pass ended).
  if ! cmp -n $(((li + 1) * ch)) "$MP_W-read.bin" "$MP_W-p$((lp % 2)).bin" > "$CELL_LOG/cmp.txt" 2>&1; then mp_fail verify "chunks 0..$li (pass $lp): $(tail_log "$CELL_LOG/cmp.txt" 1)"; return; fi
  local verified=$(((li + 1) * ch))
  if [ "$lp" -gt 0 ] && [ $((li + 1)) -lt "$n" ]; then
    if ! cmp -n $(((n - li - 1) * ch)) -i "$(((li + 1) * ch)):$(((li + 1) * ch))" "$MP_W-read.bin" "$MP_W-p$(((lp - 1) % 2)).bin" > "$CELL_LOG/cmp.txt" 2>&1; then mp_fail verify "chunks $((li + 1))..$((n - 1)) (pass $((lp - 1))): $(tail_log "$CELL_LOG/cmp.txt" 1)"; return; fi
    verified=$((n * ch))
  fi
  step_t verify
  detail="$detail; $total chunks ($((total * MPATH_CHUNK_KIB)) KiB) written, each read back identical; region re-read: $((verified >> 10)) KiB identical to the last writes"
  local scsi_to failing
  scsi_to=$(dmesg | grep -c 'timing out command\|scsi_eh\|Abort')
  failing=$(dmesg | grep -c 'Failing path')
  local conn
  conn=$(dmesg | grep -c 'detected conn error')
  mp_down
  if ! wait_for 60 _no_sessions || _mp_map; then
    cell_fail leftovers "after the teardown: sessions [$(ls /sys/class/iscsi_session/ | tr '\n' ' ')], maps [$(dmsetup ls --target multipath 2>&1 | tr '\n' ' ')]"
    return
  fi
  cell_pass "$detail; kernel: $failing 'Failing path', $scsi_to SCSI timeout/abort lines, $conn conn errors; no session/map left"
}

lab_init
iscsid_start || { echo "FAIL setup (iscsid): cannot start iscsid"; echo "0 passed, 1 failed"; exit 1; }
note "cells: $CELLS; links: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' '); TCP_IP $TCP_IP"
for c in $CELLS; do
  if declare -F "cell_$c" > /dev/null; then "cell_$c"; else cell_begin "$c"; cell_fail "selection" "no such cell (traps 1 2 3 3b 4 5 6 6a 6b 7 fault fault-tcp fault-rinit fault-target ops ops-iser rbd-mpath lio-selftest lio-selftest-tcp)"; fi
done
iscsid_stop
lab_summary
